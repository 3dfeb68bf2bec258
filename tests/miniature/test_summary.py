"""What the quickstart prints at the end (`summary`): the advice on which rule, the RESULT line, the host's part."""

import json
import math

import pytest

from specrl_openrlhf.miniature import summary
from specrl_openrlhf.miniature.plan import Method

nan = math.nan


def paired_row(method, token_ratio, diff, lo, hi):
    return {
        "regime": "default",
        "method": method,
        "seeds": 3,
        "token_ratio": token_ratio,
        "time_ratio": 1.1,
        "acc": 0.7 + diff,
        "acc_off": 0.7,
        "acc_diff": diff,
        "acc_diff_lo": lo,
        "acc_diff_hi": hi,
        "kl_prev_curr": 0.02,
        "excess_acceptance": nan,
        "drift_since_decode": nan,
        "reused_token_age": nan,
    }


def test_the_summary_recommends_an_exact_rule_over_one_seeds_accuracy():
    """Recorded from a fresh clone's quickstart (seed 0, issue 29): lossless -4.9 points, spec -5.6 on one seed,
    where a seed's difference spreads by about 5 points. The biased rule must not win on that."""
    spec = dict(paired_row("spec@1.65", 2.27, -0.056, nan, nan), policy="spec", seeds=1, time_ratio=1.08)
    lossless = dict(paired_row("lossless", 2.14, -0.049, nan, nan), policy="lossless", seeds=1, time_ratio=1.20)
    line = summary.advice([spec, lossless])
    assert line.startswith(
        "which rule: lossless (exact in RL; 2.14x fewer decoded tokens, rollout time ratio 1.20): exact, and faster"
    )
    assert "spec@1.65 (biased in RL; 2.27x fewer decoded tokens, rollout time ratio 1.08): what its bias costs" in line
    assert line.endswith("--seeds 0,1,2,3,4 gives each rule's difference with a 95% interval")


def test_the_summary_reports_a_loss_the_seeds_resolve():
    """5 seeds (docs/benchmarks.md, section 1): spec@1.65 -6.1 [-8.8, -3.3], lossless -1.5 [-3.5, +0.5]."""
    spec = dict(paired_row("spec@1.65", 2.14, -0.061, -0.088, -0.033), policy="spec", seeds=5, time_ratio=1.06)
    lossless = dict(paired_row("lossless", 2.12, -0.015, -0.035, 0.005), policy="lossless", seeds=5)
    line = summary.advice([spec, lossless])
    assert line.startswith("which rule: lossless (exact in RL;")
    assert (
        "spec@1.65 (biased in RL; 2.14x fewer decoded tokens, rollout time ratio 1.06) lost 6.1 points over 5 " in line
    )
    assert "[-8.8, -3.3]" in line and "one seed" not in line
    # a biased rule whose seeds resolve parity, where no exact rule is faster than stock, may be recommended
    kept = dict(paired_row("spec@1.65", 2.1, -0.005, -0.02, 0.01), policy="spec", seeds=5)
    assert summary.advice([kept, dict(lossless, time_ratio=0.9)]).startswith(
        "which rule: spec@1.65 (biased in RL; 2.10x fewer decoded tokens, rollout time ratio 1.10): kept the "
        "baseline's accuracy over 5 seeds"
    )


def test_the_summary_says_stock_when_the_exact_rule_rolls_out_slower():
    """Last round's quickstart: lossless (own draft) decoded 1.49x fewer tokens at a rollout-time ratio of 0.89."""
    spec = dict(paired_row("spec@1.65", 2.17, -0.049, -0.108, 0.011), policy="spec", seeds=5, time_ratio=1.07)
    lossless = dict(paired_row("lossless", 1.49, 0.012, -0.037, 0.061), policy="lossless", seeds=5, time_ratio=0.89)
    line = summary.advice([spec, lossless])
    assert line.startswith(
        "which rule: off (stock) on this machine: lossless (exact in RL; 1.49x fewer decoded tokens, rollout time "
        "ratio 0.89) rolled out slower than stock"
    )
    assert "spec@1.65" in line and "not resolved" in line  # wide interval, mean 4.9 points off: no parity
    assert summary.advice([spec]).startswith("which rule: off (stock): no rule here is exact in RL and kept")


def test_the_result_line_carries_the_main_rule_and_the_others():
    spec = paired_row("spec@1.65", 2.3, -0.08, -0.12, -0.04)
    lossless = paired_row("lossless", 2.0, -0.005, -0.03, 0.02)
    result = summary.result_line([spec, lossless], "spec@1.65", 0.4, tmp := "/out")
    assert result.startswith("RESULT token_ratio=2.30 time_ratio=1.10 acc_before=0.400 acc_off=0.700")
    assert "acc_diff=-0.080 acc_diff_lo=-0.120 acc_diff_hi=-0.040 seeds=3" in result
    assert "token_ratio[lossless]=2.00 time_ratio[lossless]=1.10 acc_diff[lossless]=-0.005" in result
    assert result.endswith(f"out={tmp}") and "projected" not in result  # runs that recorded no engine steps
    projected = summary.result_line(
        [spec, {**lossless, "projected": 2.5, "projected8": 1.5, "rows_per_step": 28.0}], "spec@1.65", 0.4, tmp
    )
    assert "projected[lossless]=2.50 projected8[lossless]=1.50 rows_per_step[lossless]=28.0" in projected
    shown = {"projected_async": 2.7, "projected_async8": 1.9, "breakeven_host_ms": 3.25, "breakeven_host_ms8": 0.5}
    host = {**lossless, "projected": 2.5, "projected8": 1.5, "rows_per_step": 28.0, **shown}
    line = summary.result_line([spec, {**host, "missing": ("host",), "prefill": "modelled"}], "spec@1.65", 0.4, tmp)
    assert (
        "projected[lossless]=2.50 projected8[lossless]=1.50 projected_async[lossless]=2.70 "
        "projected_async8[lossless]=1.90 breakeven_host_ms[lossless]=3.25 breakeven_host_ms8[lossless]=0.50 "
        "rows_per_step[lossless]=28.0 missing=host prefill=modelled out=/out"
    ) in line
    text = summary.projected_text({**host, "missing": (), "prefill": "measured"})
    assert "with the host hidden 2.70 / 1.90, breakeven host 3.25 / 0.50 ms a full-batch step" in text
    assert "(missing=none, prefill=measured)" in text


def test_the_summary_shows_each_rules_host_part_from_its_recorded_steps(tmp_path, monkeypatch):
    """The rule's steps against its baseline's, every rollout's together (`steps/<run>.jsonl`): the host hidden, the
    breakeven host time and what is missing, by hand on a 2 x 2 curve and a flat host curve."""
    from types import SimpleNamespace

    from specrl_openrlhf.analysis.run_series import RunSeries
    from specrl_openrlhf.pricing.curves import HostCurve, StepCurve
    from specrl_openrlhf.pricing.steps import EngineSteps

    monkeypatch.setenv("SPECRL_MEASURE_CACHE", str(tmp_path / "measured"))  # no proposer measured here
    curve = StepCurve([{"rows": r, "tokens": q, "seconds": 0.004 + 1e-5 * r * q} for r in (32, 64) for q in (1, 2)])
    host = HostCurve([{"rows": 32, "seconds": 0.002}, {"rows": 512, "seconds": 0.002}])
    steps = tmp_path / "steps"
    steps.mkdir()
    # off: two 64-row steps of 1 token a row (4.64 ms each); lossless: one 64-row step of 2 tokens a row (5.28 ms)
    off, lossless = EngineSteps.of([(0.1, 0, 0, 64, 64, 0, 0)] * 2), EngineSteps.of([(0.1, 0, 0, 64, 128, 64, 60)])
    for name, recorded in (("off", off), ("lossless", lossless)):
        (steps / f"{name}.jsonl").write_text(json.dumps({"epoch": 0, "step": 0, **recorded.as_dict()}) + "\n")
    series = [RunSeries(name, name, None, "g", "metrics.json", regime="default") for name in ("off", "lossless")]
    runs = [SimpleNamespace(label=n, method=Method.of(n)) for n in ("off", "lossless")]
    row = {"regime": "default", "method": "lossless", "projected": 1.0, "projected8": 1.0}
    (shown,) = summary.host_figures([row], series, [SimpleNamespace(runs=runs)], steps, curve, host)
    # lossless verifies in the engine: async scheduling off, its host (2 ms) paid serially; its proposer never measured
    assert shown["missing"] == ("proposer_cost",) and shown["prefill"] == "modelled"
    assert shown["projected_async"] == pytest.approx(2 * 0.00464 / 0.00528)
    # 5.28 + 2h ms against 9.28 ms: h = 2, 4 ms of host a full-batch step
    assert shown["breakeven_host_ms"] == pytest.approx(4.0)


def test_the_time_ratio_moves_by_its_steps_scatter_within_each_epoch():
    """The delta method by hand: stock's steps take 2 s, the rule's 1 s, each step of an epoch off by +-d with
    correlation c between the two; the ratio's error is then R x sqrt(var_a / a^2 + var_b / b^2 - 2 cov / ab)."""
    from specrl_openrlhf.analysis.run_series import RunSeries

    def series(stock, rule, epochs):
        made = [RunSeries(name, name, None, "g", "metrics.json", regime="default") for name in ("off", "lossless")]
        for run, times in zip(made, (stock, rule)):
            run.steps = [{"step": i, "epoch": e, "rollout_s": t} for i, (e, t) in enumerate(zip(epochs, times))]
        return made

    # stock 2.2, 1.8 and the rule 1.1, 0.9 in one epoch, 2.0 and 1.0 alone in another: no scatter there
    runs = series([2.2, 1.8, 2.0], [1.1, 0.9, 1.0], [0, 0, 1])
    a, b = 6.0, 3.0  # sums; within epoch 0, n/(n-1) x sums of squares: 2 x (0.08, 0.02, 0.04)
    expected = a / b * math.sqrt(0.16 / a**2 + 0.04 / b**2 - 2 * 0.08 / (a * b))  # perfectly correlated: 0
    assert summary.time_ratio_spread(runs, "lossless", "default") == pytest.approx(expected, abs=1e-12)
    moved = series([2.2, 1.8, 2.0], [0.9, 1.1, 1.0], [0, 0, 1])  # anti-correlated: the ratio moves most
    spread = summary.time_ratio_spread(moved, "lossless", "default")
    assert spread == pytest.approx(a / b * math.sqrt(0.16 / a**2 + 0.04 / b**2 + 2 * 0.08 / (a * b)))
    assert math.isnan(summary.time_ratio_spread(series([2.0, 2.0], [1.0, 1.0], [0, 1]), "lossless", "default"))
    assert summary.time_ratio_spread(series([2.0, 2.0], [1.0, 1.0], [0, 0]), "lossless", "default") == 0.0
    assert summary.spread_text(spread) == f" ± {spread:.2f} run to run (its steps' scatter on this machine)"
    assert summary.spread_text(nan) == ""
    lines = summary.summary_lines([paired_row("lossless", 4.0, 0.0, nan, nan)], moved, None, "what reproduces: x")
    assert lines[2].startswith(f"    rollout time    ratio 1.10 ± {spread:.2f} run to run")
    assert lines[-1] == "  what reproduces: x"
