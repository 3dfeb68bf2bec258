"""What our rollout path costs per sample when there is nothing to reuse (a run's first epoch), engine left out.

A step of `--prompts` prompts x `--n` samples goes through `AsyncSpeculativeGenerator` over a stand-in engine that
answers at once (every response `--max-tokens` tokens), with a local draft store and fresh prompts, so no sample
finds a draft; each output is then turned into OpenRLHF's output (`request_output`) with the rule's `reuse/`
metrics, as the agent hook does. The same stand-in engine called directly is the baseline. Prints the best of
`--repeats` steps per rule, in ms per sample; multiply by a step's samples and compare with a step's rollout time
(docs/benchmarks.md, section 1).

    python scripts/bench_sample_path.py [--prompts 32 --n 8 --max-tokens 64 --repeats 5 --rules lossless spec]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from types import SimpleNamespace


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=8, help="samples per prompt")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rules", nargs="+", default=["lossless", "spec"])
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    from vllm import SamplingParams

    import specrl_openrlhf as sr
    from specrl_openrlhf.integration.openrlhf.agent import request_output
    from specrl_openrlhf.integration.rollout.generator import (
        AsyncSpeculativeGenerator,
        LocalDraftStore,
        gather_samples,
    )
    from specrl_openrlhf.metrics import sample_metric_names

    tokens = list(range(10, 10 + args.max_tokens))
    entries = [{t: SimpleNamespace(logprob=-1.0, rank=1)} for t in tokens]
    answer = SimpleNamespace(
        outputs=[SimpleNamespace(token_ids=tokens, logprobs=entries, finish_reason="length")], num_cached_tokens=0
    )

    async def engine(prompt, params, priority=0):
        return answer

    samples = args.prompts * args.n
    params = SamplingParams(n=args.n, max_tokens=args.max_tokens, logprobs=1)
    best = float("inf")
    for _ in range(args.repeats):
        start = time.perf_counter()
        asyncio.run(_direct(engine, samples, params))
        best = min(best, time.perf_counter() - start)
    print(f"stand-in engine alone: {best / samples * 1e3:.3f} ms per sample")
    for name in args.rules:
        policy = sr.make(name)
        planner = sr.SpeculativePlanner(policy, stop_token_ids=[0])
        names = sample_metric_names(policy)
        best = float("inf")
        for repeat in range(args.repeats):
            generator = AsyncSpeculativeGenerator(
                engine, policy, LocalDraftStore(), samples_per_visit=args.n, planner=planner
            )
            prompts = [[repeat * 100_000 + p, 5, 6] for p in range(args.prompts)]  # fresh: nothing to reuse
            start = time.perf_counter()
            batch = asyncio.run(gather_samples(generator, prompts, params))
            for prompt, row in zip(prompts, batch.outputs):
                for output in row:
                    request_output(prompt, output, "")
                    {key: value for key, value in output.stats.as_dict().items() if key in names}
            best = min(best, time.perf_counter() - start)
        print(
            f"{name}: {best / samples * 1e3:.3f} ms per sample ({len(names)} reuse/ metrics), "
            f"{best * 1e3:.1f} ms per step of {samples} samples"
        )


async def _direct(engine, samples, params):
    return await asyncio.gather(*[engine([p], params) for p in range(samples)])


if __name__ == "__main__":
    main()
