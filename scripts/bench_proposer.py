"""What our proposer costs per batch row and step, without an engine: `HistoryProposer.propose` over a persistent
batch of rows that follow their prompt's history (taking a history token with `--follow` probability, else another
token), as vLLM calls it once per decoding step. Its time is part of every step of a verifying engine, drafts or not.

Each batch size of `--rows` runs afresh (its own histories, the same seed); the first `--warmup` steps are not timed.
Per batch size it prints the proposer's wall time (`us_per_row_step`) and this thread's CPU time
(`cpu_us_per_row_step`, steadier on a loaded machine) per row and step, and the drafts' quality: draft tokens given,
accepted (the rows took them) and kept (accepted over given) per step. With two or more batch sizes, a line fitted to
the time per step tells what a call costs whatever its rows (`fixed_us_per_call`) from what each row adds
(`us_per_row`). With `--repeat`, each step counts at its fastest of that many runs (a loaded machine's other
processes, out); with the modeled clock every run drafts the same.

The budget prices slots on a modeled engine step (`--step-ms`: base, per row, per token carried, in ms), the time the
proposer reads between its calls (`--clock model`), so its drafts depend on the workload alone, not on this machine
or the proposer's own speed; `--clock real` times its calls as an engine's steps instead (drafts then vary by run).

    python scripts/bench_proposer.py                        # 128 and 512 rows, 8 responses of 128 tokens per prompt
    python scripts/bench_proposer.py --rows 32 --follow 0   # rows that never stay in their history
"""

from __future__ import annotations

import argparse
import gc
import time

import numpy as np


def run(args, rows: int) -> dict:
    from specrl_openrlhf.cache import prompt_key
    from specrl_openrlhf.integration.vllm.histories import params_message
    from specrl_openrlhf.integration.vllm.v1 import board as boards
    from specrl_openrlhf.integration.vllm.v1.proposer import HistoryProposer
    from specrl_openrlhf.policies.builtin import LosslessParams

    rng = np.random.default_rng(0)
    boards.BOARD = board = boards.HistoryBoard()  # every batch size afresh
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
    while board.pending:  # every history in before the first step, however slow this machine is today
        board.drain(set())
    width = 32 + args.length + args.k + 2
    config = type("C", (), {})()
    config.speculative_config = type("S", (), {"num_speculative_tokens": args.k})()
    config.model_config = type("M", (), {"max_model_len": width + 64})()
    proposer = HistoryProposer(config)
    proposer.cpu_fix_installed = True
    gc.collect()
    gc.freeze()  # as vLLM's engine core does once started: a collection sees what came after
    base, per_row, per_token = (ms / 1e3 for ms in args.step_ms)
    modeled = [0.0]
    if args.clock == "model":
        proposer.clock = lambda: modeled[0]
    tokens = np.zeros((rows, width + 64), np.int32)
    counts = np.zeros(rows, np.int64)
    plans = []
    for row in range(rows):
        prompt = prompts[row % args.prompts]
        tokens[row, : len(prompt)] = prompt
        counts[row] = len(prompt)
        plans.append(stems[tuple(prompt)])
    sampled = [[] for _ in range(rows)]
    drafts = [[] for _ in range(rows)]
    wall, cpu = np.zeros(args.steps), np.zeros(args.steps)  # each timed step's
    drafted = accepted = 0
    for step in range(args.warmup + args.steps):
        timed = step >= args.warmup
        for row in range(rows):
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
            kept = sum(1 for a, b in zip(taken, drafts[row]) if a == b)  # the prefix the engine would keep
            tokens[row, counts[row] : counts[row] + len(taken)] = taken
            counts[row] += len(taken)
            sampled[row] = taken
            if timed:
                accepted += kept
        carried = rows + sum(len(d) for d in drafts)
        modeled[0] += base + per_row * rows + per_token * carried  # the engine step that verified the drafts
        start_wall, start_cpu = time.perf_counter(), time.thread_time()
        drafts = proposer.propose(sampled, counts, tokens)
        cpu_s, wall_s = time.thread_time() - start_cpu, time.perf_counter() - start_wall
        if timed:
            wall[step - args.warmup], cpu[step - args.warmup] = wall_s, cpu_s
            drafted += sum(len(d) for d in drafts)
    steps = args.steps
    return {
        "rows": rows,
        "wall": wall,
        "cpu": cpu,
        "drafted_per_step": drafted / steps,
        "accepted_per_step": accepted / steps,
        "kept": accepted / max(drafted, 1),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="128,512", help="batch sizes, comma-separated")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--responses", type=int, default=8, help="history responses per prompt")
    parser.add_argument("--length", type=int, default=128, help="tokens per history response")
    parser.add_argument("--steps", type=int, default=200, help="steps timed")
    parser.add_argument("--warmup", type=int, default=20, help="steps before the timed ones")
    parser.add_argument("--follow", type=float, default=0.8, help="chance that a row takes the history's next token")
    parser.add_argument("--budget", choices=["goodput", "static"], default="goodput")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=1, help="runs of each batch size; each step's fastest counts")
    parser.add_argument("--clock", choices=["model", "real"], default="model")
    parser.add_argument(
        "--step-ms",
        type=lambda text: [float(x) for x in text.split(",")],
        default=[5.0, 0.02, 0.02],
        help="the modeled engine step: base, per row, per token carried (ms)",
    )
    args = parser.parse_args(argv)
    if len(args.step_ms) != 3:
        parser.error(f"--step-ms takes 3 numbers (base, per row, per token carried), not {args.step_ms}")
    sizes = [int(n) for n in args.rows.split(",")]
    results = []
    for rows in sizes:
        runs = [run(args, rows) for _ in range(args.repeat)]  # the same steps again (the same drafts, modeled)
        wall, cpu = (np.min([r[name] for r in runs], axis=0).sum() for name in ("wall", "cpu"))  # fastest of each
        per_row_step = 1e6 / (args.steps * rows)
        results.append(
            {
                **runs[0],
                "us_per_row_step": wall * per_row_step,
                "cpu_us_per_row_step": cpu * per_row_step,
                "ms_per_step": wall / args.steps * 1e3,
            }
        )
    for r in results:
        print(
            f"RESULT rows={r['rows']} follow={args.follow} budget={args.budget} clock={args.clock} "
            f"us_per_row_step={r['us_per_row_step']:.2f} cpu_us_per_row_step={r['cpu_us_per_row_step']:.2f} "
            f"ms_per_step={r['ms_per_step']:.3f} drafted_per_step={r['drafted_per_step']:.1f} "
            f"accepted_per_step={r['accepted_per_step']:.1f} kept={r['kept']:.3f}"
        )
    if len(set(sizes)) >= 2:  # time per step = fixed + per row x rows, least squares
        for name in ("us_per_row_step", "cpu_us_per_row_step"):
            per_step = [r[name] * r["rows"] for r in results]
            per_row, fixed = np.polyfit(sizes, per_step, 1)
            fit = name.removesuffix("_per_row_step")
            print(f"RESULT fit={fit} fixed_us_per_call={fixed:.1f} us_per_row={per_row:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
