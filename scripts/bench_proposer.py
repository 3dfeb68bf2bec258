"""What our proposer costs per batch row and step, without an engine: `HistoryProposer.propose` over a persistent
batch of rows that follow their prompt's history (taking a history token with `--follow` probability, else another
token), as vLLM calls it once per decoding step. Its time is part of every step of a verifying engine, drafts or not.

    python scripts/bench_proposer.py                     # 256 rows, 8 responses of 128 tokens per prompt
    python scripts/bench_proposer.py --rows 32 --follow 0   # rows that never stay in their history
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--responses", type=int, default=8, help="history responses per prompt")
    parser.add_argument("--length", type=int, default=128, help="tokens per history response")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--follow", type=float, default=0.8, help="chance that a row takes the history's next token")
    parser.add_argument("--budget", choices=["goodput", "static"], default="goodput")
    parser.add_argument("--k", type=int, default=8)
    args = parser.parse_args(argv)

    from specrl_openrlhf.cache import prompt_key
    from specrl_openrlhf.integration.vllm.histories import BOARD, params_message
    from specrl_openrlhf.integration.vllm.proposer import HistoryProposer
    from specrl_openrlhf.policies.builtin import LosslessParams

    rng = np.random.default_rng(0)
    board = BOARD
    prompts = [[1, *rng.integers(3, 100, 31).tolist()] for _ in range(args.prompts)]
    stems = {}
    for prompt in prompts:
        stem = rng.integers(3, 100, args.length).tolist()
        responses = []
        for _ in range(args.responses):  # responses share a stem and part ways at random points
            split = int(rng.integers(0, args.length))
            responses.append(stem[:split] + rng.integers(3, 100, args.length - split).tolist())
        board.update(
            prompt_key(prompt),
            len(prompt),
            True,
            params_message(LosslessParams(budget=args.budget)),
            responses,
            [[-0.5] * args.length] * args.responses,
        )
        stems[tuple(prompt)] = responses[0]
    width = 32 + args.length + args.k + 2
    config = type("C", (), {})()
    config.speculative_config = type("S", (), {"num_speculative_tokens": args.k})()
    config.model_config = type("M", (), {"max_model_len": width + 64})()
    proposer = HistoryProposer(config)
    proposer.cpu_fix_installed = True
    tokens = np.zeros((args.rows, width + 64), np.int32)
    counts = np.zeros(args.rows, np.int64)
    plans = []
    for row in range(args.rows):
        prompt = prompts[row % args.prompts]
        tokens[row, : len(prompt)] = prompt
        counts[row] = len(prompt)
        plans.append(stems[tuple(prompt)])
    sampled = [[] for _ in range(args.rows)]
    drafts = [[] for _ in range(args.rows)]
    elapsed, drafted = 0.0, 0
    for _ in range(args.steps):
        for row in range(args.rows):
            position = counts[row] - 32
            if position >= args.length - 1:  # a fresh request in the row
                tokens[row, 32:] = 0
                counts[row] = 32
                position = 0
            plan, taken = plans[row], []
            for token in [*drafts[row], None]:  # accepted draft tokens, then one of the row's own
                want = plan[position + len(taken)] if rng.random() < args.follow else int(rng.integers(3, 100))
                taken.append(want)
                if token is None or want != token or position + len(taken) >= args.length - 1:
                    break
            tokens[row, counts[row] : counts[row] + len(taken)] = taken
            counts[row] += len(taken)
            sampled[row] = taken
        start = time.perf_counter()
        drafts = proposer.propose(sampled, counts, tokens)
        elapsed += time.perf_counter() - start
        drafted += sum(len(d) for d in drafts)
    per_row = elapsed / (args.steps * args.rows) * 1e6
    print(
        f"RESULT rows={args.rows} follow={args.follow} budget={args.budget} us_per_row_step={per_row:.1f} "
        f"ms_per_step={elapsed / args.steps * 1e3:.2f} drafted_per_step={drafted / args.steps:.1f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
