"""vLLM engines on CPU, with the KV cache sized in bytes.

vLLM's CPU backend reads `gpu_memory_utilization` as a share of the memory of the process's NUMA node, minus what
the process already holds. Some hosts report far less memory for that node than `free` shows (9.46 GiB of 24, or
less), so a fraction that works on one machine gives a negative budget on another. Every engine this package starts
on CPU therefore gets `kv_cache_memory_bytes`; the fraction stays for GPUs, where OpenRLHF users set it.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..params import check_value

DEFAULT_KV_CACHE_BYTES = 256 << 20  # 131k tokens of the 2-layer tiny model, 4k of a 100M one
# A record of every engine step (`integration.vllm.step_log`), and no log line per step from vLLM's own logger.
RECORD_STEPS = {"enable_logging_iteration_details": True, "disable_log_stats": True}
# The environment of processes that run vLLM engines on CPU. A synchronous engine (`vllm.LLM`) keeps its core in the
# engine's own process, saving a process and the queues between them on 2 cores; the async engine OpenRLHF starts
# always runs its core apart (docs/benchmarks.md, 'bench_rollout'). VLLM_LOGGING_LEVEL: quiet unless something goes
# wrong.
# VLLM_ALLOW_INSECURE_SERIALIZATION: `lossless` sends histories to the engine's proposer as a function over
# `collective_rpc` (engine_path.HistoryChannel); OpenRLHF's rollout actors set it too.
CPU_ENGINE_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_LOGGING_LEVEL": "ERROR",
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
}


def use_cpu_engine_env() -> None:
    """Set `CPU_ENGINE_ENV` where the caller has not, before vLLM is imported. As the quickstart's engines, and
    OpenRLHF's with one GPU each: the model runs in the engine core's process (on CPU vLLM would otherwise run it in
    a process of its own); histories reach the proposer (`vllm.proposer`)."""
    import os

    for key, value in CPU_ENGINE_ENV.items():
        os.environ.setdefault(key, value)


def run_on_cpu_engines(main) -> int:
    """A benchmark's `main()` coroutine, run under `CPU_ENGINE_ENV`: its exit status."""
    import asyncio

    use_cpu_engine_env()
    return asyncio.run(main())


# CPU features that compute bfloat16 natively. Without either (AVX2-only CPUs, AVX-512 without BF16), PyTorch emulates
# bfloat16 through float32 conversions, several times slower than float32 itself (docs/benchmarks.md).
NATIVE_BF16 = ("amx_bf16", "avx512_bf16")
DTYPES = ("auto", "float32", "bfloat16")


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags (the first processor's `flags` line); empty where the file can't be read."""
    try:
        for line in Path(cpuinfo).read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_dtype(requested: str = "auto", flags: frozenset[str] | None = None) -> str:
    """The dtype a CPU engine runs a model in: `requested`, or for "auto" bfloat16 where the CPU computes it natively
    (AMX or AVX-512 BF16) and float32 elsewhere.

    >>> cpu_dtype("auto", frozenset({"avx2"})), cpu_dtype("auto", frozenset({"avx2", "amx_bf16"}))
    ('float32', 'bfloat16')
    """
    if requested not in DTYPES:
        raise ValueError(f"--dtype must be one of {DTYPES}, got {requested!r}")
    if requested != "auto":
        return requested
    flags = cpu_flags() if flags is None else flags
    return "bfloat16" if any(flag in flags for flag in NATIVE_BF16) else "float32"


def machine(flags: frozenset[str] | None = None, cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """This machine as a figure names it: CPU model, cores, and how it computes bfloat16."""
    model = "unknown CPU"
    try:
        for line in Path(cpuinfo).read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    flags = cpu_flags(cpuinfo) if flags is None else flags
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if "amx_bf16" in flags:
        isa = "AMX" + (", AVX-512 BF16" if "avx512_bf16" in flags else "")
    elif "avx512_bf16" in flags:
        isa = "AVX-512 BF16 (no AMX)"
    elif "avx512f" in flags:
        isa = "AVX-512 without BF16 (no AMX)"
    else:
        isa = "AVX2 (no AVX-512, no AMX)" if "avx2" in flags else "no AVX2"
    native = any(flag in flags for flag in NATIVE_BF16)
    return f"{model}, {cores} cores, {isa}: bfloat16 {'native' if native else 'emulated'}"


def add_dtype_argument(parser, default: str = "auto") -> None:
    """`--dtype` for a command that starts CPU engines; `cpu_dtype(args.dtype)` resolves it."""
    tiny = " (the tiny model's default: it is bound by per-step overheads, and its figures are float32's)"
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        default=default,
        help="the engines' dtype; auto: bfloat16 where the CPU computes it natively (AMX or AVX-512 BF16), else "
        f"float32 (default: {default}{tiny if default == 'float32' else ''})",
    )


def dtype_line(requested: str) -> str:
    """What a report says of its engines' dtype: the choice, why, and the machine."""
    why = "as asked" if requested != "auto" else "--dtype auto: bfloat16 only where the CPU computes it natively"
    return f"engines in {cpu_dtype(requested)} ({why}); machine: {machine()}"


def cache_model_info(model_dir: str | Path) -> None:
    """Fill vLLM's per-user cache of what the model's class supports (under `VLLM_CACHE_ROOT`, keyed by the class's
    source file). An engine that misses it inspects the class in a subprocess of its own, a whole vLLM import;
    engines started together on an empty cache all miss it at once. One inspection here, before they start, serves
    them all. Never raises: where it fails, each engine inspects the class itself, as it would have."""
    try:
        from vllm.config import ModelConfig

        ModelConfig(model=str(model_dir))
    except Exception as error:  # the engines then report whatever is wrong with the model
        print(f"[engine] vLLM's model info not cached ahead ({type(error).__name__}: {error})", flush=True)


def cpu_engine_kwargs(*, kv_cache_bytes: int = DEFAULT_KV_CACHE_BYTES, **overrides) -> dict:
    """Engine arguments for `vllm.LLM`, `AsyncEngineArgs` or OpenRLHF's `RolloutRayActor` on a CPU machine.

    >>> cpu_engine_kwargs(kv_cache_bytes=1 << 28)["kv_cache_memory_bytes"]
    268435456
    """
    check_value("kv_cache_bytes", kv_cache_bytes, int, at_least=1, means="a positive number of bytes")
    if "gpu_memory_utilization" in overrides:
        raise ValueError(
            "gpu_memory_utilization is a share of the NUMA node's memory on CPU and breaks on hosts that report a "
            "small node; pass kv_cache_bytes instead"
        )
    kwargs = dict(
        dtype="float32",
        enforce_eager=True,
        block_size=32,  # vLLM's CPU attention needs a multiple of 32
        enable_prefix_caching=True,
        kv_cache_memory_bytes=int(kv_cache_bytes),
        seed=0,
        **RECORD_STEPS,
    )
    kwargs.update(overrides)
    return kwargs
