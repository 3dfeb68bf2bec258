"""What a verifying engine costs when there is nothing to draft (a run's first epoch, or a policy too diffuse for any
draft to pay): the same requests on a stock engine and on one with our proposer and no histories, side by side,
alternating which goes first, on the tiny model of `bench_rollout`'s overhead regime.

    python scripts/bench_idle_proposer.py                 # 512 requests x 128 tokens, 8 rounds
    python scripts/bench_idle_proposer.py --max-num-seqs 32

The last line: RESULT overhead=<verifying time / stock time - 1>, over rounds that alternate which engine goes first.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--max-num-seqs", type=int, default=None, help="engine concurrency (default: all requests)")
    parser.add_argument("--rounds", type=int, default=8, help="paired rounds (even: half with each engine first)")
    parser.add_argument("--logprobs", action="store_true", help="ask for the sampled tokens' log-probs")
    parser.add_argument("--model", default=None, help="a model folder (default: the overhead regime's tiny model)")
    from specrl_openrlhf.miniature.engine import add_dtype_argument

    add_dtype_argument(parser, default="float32")  # a real model (--model): --dtype auto
    parser.add_argument(
        "--stock-async-scheduling",
        choices=["auto", "off"],
        default="auto",
        help="off: the stock engine without async scheduling, which vLLM turns off under a custom proposer",
    )
    return parser.parse_args(argv)


async def run(args) -> int:
    import vllm

    import specrl_openrlhf as sr
    from specrl_openrlhf.integration.vllm.edge import engine_generate
    from specrl_openrlhf.integration.vllm.engine_args import engine_kwargs
    from specrl_openrlhf.miniature.engine import cpu_dtype, cpu_engine_kwargs, dtype_line
    from specrl_openrlhf.miniature.tiny_model import build_tiny_model

    model_dir = Path(args.model) if args.model else Path(tempfile.gettempdir()) / "specrl_bench_idle"
    if not args.model:
        build_tiny_model(model_dir, hidden_size=128, num_layers=2, intermediate_size=256, eos_logit=0.0)
    base = cpu_engine_kwargs(
        kv_cache_bytes=1 << 30,
        max_model_len=32 + args.max_tokens + 8,
        max_num_seqs=args.max_num_seqs or args.requests,
        dtype=cpu_dtype(args.dtype),
    )
    stock = dict(base, async_scheduling=False) if args.stock_async_scheduling == "off" else base
    plain = vllm.AsyncLLMEngine.from_engine_args(vllm.AsyncEngineArgs(model=str(model_dir), **stock))
    verifying = vllm.AsyncLLMEngine.from_engine_args(
        vllm.AsyncEngineArgs(model=str(model_dir), **engine_kwargs(sr.make("lossless"), base))
    )
    prompts = [[1 + (i * 7 + j) % 90 for j in range(32)] for i in range(args.requests)]
    params = vllm.SamplingParams(
        max_tokens=args.max_tokens, ignore_eos=True, temperature=1.0, logprobs=0 if args.logprobs else None
    )

    async def round_of(engine) -> float:
        generate = engine_generate(engine)
        start = time.perf_counter()
        await asyncio.gather(*[generate(p, params) for p in prompts])
        return time.perf_counter() - start

    await round_of(plain)  # warm-up: compiled kernels, allocator
    await round_of(verifying)
    times = {"stock": [], "verifying": []}
    for r in range(args.rounds):
        for name, engine in (
            (("stock", plain), ("verifying", verifying))
            if r % 2 == 0
            else (
                ("verifying", verifying),
                ("stock", plain),
            )
        ):
            seconds = await round_of(engine)
            times[name].append(seconds)
            print(f"round {r}  {name:<9} {seconds:7.2f} s", flush=True)
    for engine in (plain, verifying):
        engine.shutdown()
    del plain, verifying, engine
    gc.collect()  # gone before the interpreter's exit, where vLLM's __del__ would fail
    ratios = [v / s for v, s in zip(times["verifying"], times["stock"])]
    # rounds alternate which engine goes first: the mean over both orders cancels what going first or second costs
    first, second = ratios[0::2], ratios[1::2]
    balanced = math.exp((statistics.fmean(map(math.log, first)) + statistics.fmean(map(math.log, second))) / 2)
    print(dtype_line(args.dtype))
    print(
        f"RESULT overhead={balanced - 1:+.3f} (geometric mean over both orders; stock first "
        f"{statistics.fmean(first) - 1:+.3f}, verifying first {statistics.fmean(second) - 1:+.3f}; {len(ratios)} "
        f"rounds) stock_s={statistics.median(times['stock']):.2f} "
        f"verifying_s={statistics.median(times['verifying']):.2f}"
    )
    return 0


if __name__ == "__main__":
    from specrl_openrlhf.miniature.engine import run_on_cpu_engines

    sys.exit(run_on_cpu_engines(lambda: run(parse_args())))
