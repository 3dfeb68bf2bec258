"""scripts/bench_gpu_step.py, run on CPU with a tiny shape: the curve, its fit, and a projection from a saved curve.
On a lent GPU machine the same script measures the Qwen3-1.7B shape (docs/benchmarks.md, 'GPU step cost')."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_gpu_step.py"


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


def test_the_gpu_curve_on_cpu_with_a_tiny_shape(tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "curve.json"
    done = run(
        *("--shape", "tiny", "--device", "cpu", "--rows", "2,8", "--tokens", "1,4", "--repeats", "2"),
        *("--prefill", "16,64", "--out", str(out)),
    )
    assert done.returncode == 0, done.stderr
    record = json.loads(out.read_text())
    assert [p["tokens"] for p in record["prefill"]] == [16, 64] and all(p["seconds"] > 0 for p in record["prefill"])
    from specrl_openrlhf.pricing.curves import StepCurve

    assert StepCurve.load(out).prefill_measured  # the simulator prices prefill on it
    assert [(p["rows"], p["tokens"]) for p in record["curve"]] == [(2, 1), (2, 4), (8, 1), (8, 4)]
    assert all(p["seconds"] > 0 for p in record["curve"]) and set(record["fit"]) >= {"base_s", "per_token_s"}
    assert "fit: base" in done.stdout


def test_a_recorded_step_is_projected_on_a_saved_curve(tmp_path):
    curve = tmp_path / "curve.json"
    fit = {"base_s": 0.010, "per_row_s": 0.0, "per_token_s": 0.0001, "rel_rms": 0.0}
    curve.write_text(json.dumps({"device": "test", "shape": "tiny", "context": 1, "curve": [], "fit": fit}))
    done = run("--curve", str(curve), "--project", '{"rows": 100, "carried": 300, "produced": 250}')
    assert done.returncode == 0, done.stderr
    # verification: 10 + 30 ms for 250 tokens; plain: 10 + 10 ms for 100 tokens: (250 / 40) / (100 / 20) = 1.25
    assert "verification step 40.00 ms, plain 20.00 ms, tokens/s ratio 1.25" in done.stdout


def test_the_grouped_attention_gives_transformers_logits(monkeypatch):
    """The benchmark's attention reads the cache once per key-value head; it must compute what transformers' SDPA
    path computes, for a decoding step and for verification steps, each written after `context` cached positions."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    import bench_gpu_step as bench

    context = 16
    reference, config = bench.build("tiny", "cpu", torch.float32)
    grouped, grouped_config = bench.build("tiny", "cpu", torch.float32, context)
    grouped.load_state_dict(reference.state_dict())
    for tokens in (1, 4, 9):
        logits = []
        for model, model_config in ((reference, config), (grouped, grouped_config)):
            cache = bench.static_cache(model_config, context, 9)
            torch.manual_seed(tokens)
            ids, positions, cache_position = bench.step_inputs(model_config, 3, tokens, context, "cpu")
            with torch.inference_mode():
                for _ in range(2):  # a repeat is the same step
                    bench.rewind(cache, context)
                    step = bench.forward(model, cache, ids, positions, cache_position)
                logits.append(step.logits)
        assert torch.allclose(logits[0], logits[1], atol=1e-5), tokens
