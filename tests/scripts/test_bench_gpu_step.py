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


@pytest.mark.slow  # the GPU script end to end in a process of its own; the tests below check its parts in-process
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


def load_bench(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    import bench_gpu_step

    return bench_gpu_step


def test_several_contexts_write_one_curve_file_each(tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers")
    bench = load_bench(monkeypatch)
    out = tmp_path / "c.json"
    args = ["--shape", "tiny", "--device", "cpu", "--rows", "2,4", "--tokens", "1,2", "--context", "8,16"]
    assert bench.main([*args, "--prefill", "", "--repeats", "1", "--out", str(out)]) == 0
    from specrl_openrlhf.pricing.curves import StepCurve

    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["c_ctx16.json", "c_ctx8.json"]
    for context in (8, 16):
        path = tmp_path / f"c_ctx{context}.json"
        record = json.loads(path.read_text())
        assert record["context"] == context and set(record) >= {"curve", "fit", "fit_eager"}
        assert StepCurve.load(path).context == context
    stdout = capsys.readouterr().out
    assert "context 8, attention grouped" in stdout and "context 16, attention grouped" in stdout
    assert stdout.count("fit: base") == 2


def test_a_recorded_step_is_projected_on_a_saved_curve(tmp_path, monkeypatch, capsys):
    """The projection prices the verification step and plain decoding on the curve itself (`StepCurve.time`)."""
    bench = load_bench(monkeypatch)
    from specrl_openrlhf.pricing.curves import StepCurve

    grid = [
        {"rows": r, "tokens": q, "seconds": 0.005 + 2e-5 * r + 3e-5 * r * q**1.2} for r in (32, 128) for q in (1, 4)
    ]
    path = tmp_path / "curve.json"
    path.write_text(json.dumps({"device": "test", "shape": "tiny", "context": 512, "curve": grid}))
    assert bench.main(["--curve", str(path), "--project", '{"rows": 100, "carried": 300, "produced": 250}']) == 0
    curve = StepCurve.load(path)
    verify, plain = curve.time(100, 3.0), curve.time(100, 1.0)
    ratio = (250 / verify) / (100 / plain)
    stdout = capsys.readouterr().out
    expected = f"verification step {verify * 1e3:.2f} ms, plain {plain * 1e3:.2f} ms, tokens/s ratio {ratio:.2f}"
    assert expected in stdout and "fit: base" in stdout


def test_a_bad_context_or_step_is_refused_before_measuring(monkeypatch):
    bench = load_bench(monkeypatch)
    for args in (
        ["--context", "8,x"],
        ["--context", "8,8"],
        ["--project", '{"rows": 0, "carried": 1, "produced": 1}'],
    ):
        with pytest.raises(SystemExit):
            bench.main(args)


def test_the_grouped_attention_gives_transformers_logits(monkeypatch):
    """The benchmark's attention reads the cache once per key-value head; it must compute what transformers' SDPA
    path computes, for a decoding step and for verification steps, each written after `context` cached positions."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    bench = load_bench(monkeypatch)
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
