"""Engines on CPU get a byte-sized KV cache, so they start wherever the NUMA node reports little memory."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

import specrl_openrlhf as sr
from specrl_openrlhf.miniature import engine, quickstart_args, real_model, warm_start
from specrl_openrlhf.miniature.engine import cpu_engine_kwargs

pytestmark = pytest.mark.engine

# Runs in a fresh process with the engine core in-process, so that the patched node report reaches vLLM's worker.
SMALL_NODE = textwrap.dedent(
    """
    import json, os, sys
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import vllm.v1.worker.cpu_worker as cpu_worker
    from vllm.utils.cpu_resource_utils import MemoryNodeInfo
    from vllm import LLM
    from specrl_openrlhf.miniature.engine import cpu_engine_kwargs

    GiB = 1 << 30
    # A host whose NUMA node 0 reports 2 GiB: 8% of it is less than the process already holds.
    cpu_worker.get_memory_node_info = lambda node=0: MemoryNodeInfo(total_memory=2 * GiB, available_memory=GiB)
    budget = int(sys.argv[2])
    results = {}
    fraction = {k: v for k, v in cpu_engine_kwargs(max_model_len=512).items() if k != "kv_cache_memory_bytes"}
    try:
        LLM(model=sys.argv[1], gpu_memory_utilization=0.08, **fraction)
        results["fraction"] = "started"
    except Exception as error:
        results["fraction"] = str(error)
    llm = LLM(model=sys.argv[1], **cpu_engine_kwargs(kv_cache_bytes=budget, max_model_len=512))
    cache = llm.llm_engine.vllm_config.cache_config
    results["blocks"], results["block_size"] = cache.num_gpu_blocks, cache.block_size
    results["tokens"] = len(llm.generate([{"prompt_token_ids": [5, 6, 7]}], use_tqdm=False)[0].outputs[0].token_ids)
    print("RESULT " + json.dumps(results))
    """
)


@pytest.mark.slow  # a second engine in a subprocess: in .ci/run's slow pass
def test_engine_starts_with_its_byte_budget_on_a_small_numa_node(tiny_model_dir):
    budget = 64 << 20
    result = subprocess.run(
        [sys.executable, "-c", SMALL_NODE, str(tiny_model_dir), str(budget)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, result.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT ") :])
    assert "less than requested memory for kv" in out["fraction"]  # the fraction fails on this node...
    # ...the byte budget does not, and it is exactly what the engine got: 2 (K, V) x 2 layers x 2 heads x 64 x 4 B
    bytes_per_token = 2 * 2 * 2 * 64 * 4
    assert out["blocks"] * out["block_size"] * bytes_per_token == budget
    assert out["tokens"] > 0


def test_the_model_info_is_cached_ahead_once_and_a_broken_model_only_warns(tmp_path):
    """`cache_model_info` leaves vLLM's model-info file in an empty cache (so engines started together skip their own
    inspections); where the model can't be read it prints why and returns."""
    shipped = next(warm_start.SHIPPED.iterdir())
    script = (
        "import sys; from specrl_openrlhf.miniature.engine import cache_model_info; "
        "cache_model_info(sys.argv[1]); cache_model_info(sys.argv[2])"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(shipped), str(tmp_path / "no-model")],
        env={**os.environ, "VLLM_CACHE_ROOT": str(tmp_path / "vllm")},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (cached,) = (tmp_path / "vllm" / "modelinfos").iterdir()  # vLLM names it by the model's class
    assert cached.name.endswith("Qwen3ForCausalLM.json")
    assert "vLLM's model info not cached ahead" in result.stdout


def test_fractions_are_refused_on_cpu():
    with pytest.raises(ValueError, match="kv_cache_bytes"):
        cpu_engine_kwargs(gpu_memory_utilization=0.3)
    with pytest.raises(ValueError, match="positive number of bytes"):
        cpu_engine_kwargs(kv_cache_bytes=0)


CPUINFO = "processor\t: 0\nmodel name\t: {model}\nflags\t\t: fpu sse2 avx2 {extra}\n\nprocessor\t: 1\n"


@pytest.mark.parametrize(
    "extra, dtype, isa",
    [
        ("", "float32", "AVX2 (no AVX-512, no AMX): bfloat16 emulated"),
        ("avx512f avx512bw", "float32", "AVX-512 without BF16 (no AMX): bfloat16 emulated"),
        ("avx512f avx512_bf16", "bfloat16", "AVX-512 BF16 (no AMX): bfloat16 native"),
        ("avx512f avx512_bf16 amx_tile amx_bf16", "bfloat16", "AMX, AVX-512 BF16: bfloat16 native"),
    ],
)
def test_auto_dtype_follows_what_the_cpu_computes_natively(tmp_path, monkeypatch, extra, dtype, isa):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(CPUINFO.format(model="AMD EPYC 7B13", extra=extra))
    flags = engine.cpu_flags(cpuinfo)
    assert "avx2" in flags and engine.cpu_dtype("auto", flags) == dtype
    assert engine.cpu_dtype("float32", flags) == "float32" and engine.cpu_dtype("bfloat16", flags) == "bfloat16"
    line = engine.machine(cpuinfo=cpuinfo)
    assert line.startswith("AMD EPYC 7B13, ") and line.endswith(isa)
    # every command resolves `--dtype auto` through the flags of the machine it runs on
    monkeypatch.setattr(engine, "cpu_flags", lambda cpuinfo="/proc/cpuinfo": flags)
    settings = real_model.parse_args(["--seeds", "0"])
    assert settings.dtype == "auto"
    assert real_model.engine_args(tmp_path, settings, sr.make("off"), 40)["dtype"] == dtype
    assert f"engines in {dtype} (--dtype auto" in engine.dtype_line("auto")
    assert (
        real_model.engine_args(tmp_path, real_model.parse_args(["--dtype", "float32"]), sr.make("off"), 40)["dtype"]
        == "float32"
    )


def test_an_unreadable_cpuinfo_means_float32_and_a_bad_dtype_is_refused(tmp_path):
    assert engine.cpu_flags(tmp_path / "missing") == frozenset()
    assert engine.cpu_dtype("auto", frozenset()) == "float32"
    with pytest.raises(ValueError, match="--dtype must be one of"):
        engine.cpu_dtype("fp8")
    with pytest.raises(SystemExit):
        real_model.parse_args(["--dtype", "fp8"])
    with pytest.raises(SystemExit):
        quickstart_args.parse_args(["--dtype", "half"])
    assert quickstart_args.parse_args(["--rollout_reuse", "spec"]).dtype == "float32"  # the tiny model's default
