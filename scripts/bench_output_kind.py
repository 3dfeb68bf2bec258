"""What streamed outputs cost vLLM's async engine on CPU: the default `CUMULATIVE` against `FINAL_ONLY`.

OpenRLHF's `RolloutRayActor.generate` iterates over every output of a request and keeps the last; with the default
output kind vLLM builds one per step holding every token so far. Our scoring and continuation requests ask for the
final output only. Generates the same batch (n concurrent single-sample requests per prompt, exactly
`--max-tokens` each, the sampled token's log-prob on, as OpenRLHF asks) with both kinds, alternating which goes
first, after one warm-up; prints each run and the ratio of the sums.

    python scripts/bench_output_kind.py [--prompts 32 --n 8 --max-tokens 256 --max-num-seqs 64 --repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import tempfile
import time


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=8, help="samples per prompt")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--max-num-seqs", type=int, default=64, help="engine concurrency (the quickstart's)")
    parser.add_argument("--repeats", type=int, default=3)
    from specrl_openrlhf.miniature.engine import add_dtype_argument

    add_dtype_argument(parser, default="float32")
    return parser.parse_args(argv)


async def run(args) -> None:
    import vllm
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    from specrl_openrlhf.integration.vllm.edge import engine_generate
    from specrl_openrlhf.miniature.engine import cpu_dtype, cpu_engine_kwargs, dtype_line
    from specrl_openrlhf.miniature.tiny_model import build_tiny_model

    model = build_tiny_model(tempfile.mkdtemp(prefix="bench_output_kind-"), hidden_size=128, eos_logit=0.0)
    engine = vllm.AsyncLLMEngine.from_engine_args(
        vllm.AsyncEngineArgs(
            model=str(model),
            **cpu_engine_kwargs(
                dtype=cpu_dtype(args.dtype),
                kv_cache_bytes=1 << 30,
                max_model_len=64 + args.max_tokens + 8,
                max_num_seqs=args.max_num_seqs,
            ),
        )
    )
    generate = engine_generate(engine)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 100) for _ in range(64)] for _ in range(args.prompts)]

    async def visit(kind) -> float:
        params = SamplingParams(
            max_tokens=args.max_tokens, min_tokens=args.max_tokens, logprobs=0, detokenize=False, output_kind=kind
        )
        start = time.perf_counter()
        await asyncio.gather(*[generate(p, params) for p in prompts for _ in range(args.n)])
        return time.perf_counter() - start

    kinds = [RequestOutputKind.CUMULATIVE, RequestOutputKind.FINAL_ONLY]
    await visit(kinds[0])
    times = {kind: [] for kind in kinds}
    for repeat in range(args.repeats):
        for kind in kinds if repeat % 2 == 0 else kinds[::-1]:
            times[kind].append(await visit(kind))
            print(f"  {kind.name:<11} {times[kind][-1]:6.2f} s", flush=True)
    cumulative, final = (sum(times[kind]) for kind in kinds)
    print(dtype_line(args.dtype))
    print(
        f"RESULT samples={args.prompts * args.n} max_tokens={args.max_tokens} max_num_seqs={args.max_num_seqs} "
        f"cumulative_s={cumulative:.2f} final_only_s={final:.2f} ratio={cumulative / final:.3f}"
    )
    engine.shutdown()


def main(argv=None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
