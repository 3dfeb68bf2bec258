"""The report's rows (`analysis.report_rows`): a real CPU run's rows against its group's baseline (the quickstart's
lenience grid in tests/data, recorded on a 2-core machine with `bash scripts/quickstart.sh --grid lenience`), the
paired rows over seeds with their interval, what the engine verified and the engine's steps."""

import json
import math

import pytest

from specrl_openrlhf.analysis import plots, report, report_rows, run_readers
from specrl_openrlhf.analysis.run_series import RunSeries, step_row
from tests.helpers import a_real_picture


def totals(metrics: dict, run: str, key: str) -> float:
    return sum(r[key] for r in metrics["rows"] if r["run"] == run and r["kind"] == "step")


def test_table_matches_the_runs_own_rows_against_its_groups_baseline(grid_run):
    metrics = json.loads((grid_run / "metrics.json").read_text())
    rows = {r["run"]: r for r in report_rows.table_rows(run_readers.load_cpu_metrics(grid_run / "metrics.json"))}
    assert list(rows) == metrics["settings"]["runs"]
    groups = {r["name"]: r["group"] for r in metrics["runs"]}
    for name, row in rows.items():
        base = "off" if groups[name] == 0 else "off_g1"  # each group trained beside its own baseline
        assert row["tokens_decoded_M"] == pytest.approx(totals(metrics, name, "decoded_tokens") / 1e6)
        assert row["speedup"] == pytest.approx(totals(metrics, base, "rollout_s") / totals(metrics, name, "rollout_s"))
        final = [r for r in metrics["rows"] if r["run"] == name and r["kind"] == "epoch"][-1]
        assert row["acc_held_out"] == final["held_out_accuracy"]
    assert rows["off"]["speedup"] == rows["off_g1"]["speedup"] == 1.0
    assert rows["spec_l1.65"]["lenience"] == "1.65" and rows["full"]["lenience"] == ""


def test_mean_and_95_interval_over_seeds():
    mean, lo, hi = report_rows.mean_interval([0.01, 0.03, 0.02])
    assert mean == pytest.approx(0.02) and (hi - mean) == pytest.approx(4.303 * 0.01 / math.sqrt(3), rel=1e-3)
    assert lo == pytest.approx(2 * mean - hi)
    one = report_rows.mean_interval([0.05])
    assert one[0] == 0.05 and math.isnan(one[1]) and math.isnan(one[2])


def run_series(name, policy, seed, accuracy, decoded, kl=None, regime="r"):
    steps = [{"step": 0, "decoded_tokens": decoded, "rollout_s": decoded / 100, "drafts_found": 8.0}]
    if kl is not None:
        steps[0].update(kl_prev_curr=kl, excess_acceptance=kl / 10, drift_since_decode=-kl)
    return RunSeries(
        name=name,
        policy=policy,
        lenience=None,
        group=f"{regime}/s{seed}",
        source="-",
        method=policy,
        regime=regime,
        seed=seed,
        steps=steps,
        evals=[{"step": 1, "held_out": accuracy}],
    )


def test_paired_rows_pair_each_seed_with_its_own_baseline(tmp_path):
    runs = []
    for seed, (base, rule) in enumerate([(0.70, 0.66), (0.60, 0.55), (0.75, 0.72)]):
        runs += [run_series("off", "off", seed, base, 300.0), run_series("spec", "spec", seed, rule, 100.0, kl=0.02)]
    runs += [
        run_series("off", "off", 0, 0.5, 300.0, regime="q"),
        run_series("exact", "exact", 0, 0.5, 150.0, 0.01, "q"),
    ]
    [spec, exact] = report_rows.paired_rows(runs)
    assert (spec["regime"], spec["method"], spec["seeds"]) == ("r", "spec", 3)
    assert spec["token_ratio"] == pytest.approx(3.0) and spec["acc_diff"] == pytest.approx(-0.04)
    assert spec["acc_diff_lo"] < spec["acc_diff"] < spec["acc_diff_hi"] < 0
    assert spec["kl_prev_curr"] == pytest.approx(0.02)
    assert exact["seeds"] == 1 and exact["acc_diff"] == 0.0 and math.isnan(exact["acc_diff_lo"])
    gap = plots.plot_staleness_gap([spec, exact], tmp_path / "gap.png")
    assert gap is not None and a_real_picture(gap)
    frontier = plots.plot_frontier([spec, exact], tmp_path / "frontier.png")
    assert frontier is not None and a_real_picture(frontier)
    assert plots.plot_frontier([dict(spec, acc_diff=math.nan)], tmp_path / "none.png") is None
    assert "| r | spec | 3 | 3.00× |" in report.paired_markdown([spec, exact])


def test_what_the_engine_verified_has_a_table_of_its_own():
    logs = {"rollout/num_samples": 8.0, "reuse/decoded_tokens": 10.0, "reuse/accepted_per_step": 2.5}
    logs.update({"reuse/engine_reports": 0.5, "reuse/predicted_acceptance": 0.3, "reuse/observed_acceptance": 0.25})
    engine_steps = [step_row(step, {**logs, "reuse/reentries": 0.5 * step}) for step in (1, 2)]
    engine = RunSeries("lossless", "lossless", None, "g", "test", steps=engine_steps)
    stock = RunSeries("off", "off", None, "g", "test", steps=[step_row(1, {"rollout/num_samples": 8.0})])
    rows = report_rows.table_rows([stock, engine])
    assert "accepted_per_step" not in rows[0]
    assert rows[1]["accepted_per_step"] == 2.5 and rows[1]["reentries_per_sample"] == pytest.approx(0.75)
    assert rows[1]["predicted_acceptance"] == 0.6 and rows[1]["observed_acceptance"] == 0.5  # over reporting samples
    table = report.markdown(rows)
    assert (
        "| run (verified in the engine) | accepted/step | re-entries/sample | drafted/step | predicted acc." in table
    )
    assert "| lossless | 2.5 | 0.75 | - | 0.6 | 0.5 |" in table


def test_recorded_engine_steps_give_rows_the_tail_and_gpu_time_projected():
    """Rows a run's steps carry (`miniature.training.engine_columns`): the report's step table, and the paired row's
    projected speedups and rows per step from the second epoch on."""

    def steps(run, gpu_s, rows):
        return [
            {"step": e, "epoch": e, "samples": 8, "rollout_s": 1.0, "engine_steps": 10, "mean_rows": rows[e]}
            | {"full_s": 0.8, "tail_s": 0.2, "gpu_s": gpu_s, "gpu8_s": 2 * gpu_s}
            for e in (0, 1)
        ]

    stock = RunSeries("off", "off", None, "g", "test", seed=0, steps=steps("off", 0.3, [32, 32]))
    rule = RunSeries("lossless", "lossless", None, "g", "test", seed=0, steps=steps("lossless", 0.1, [32, 24]))
    rows = report_rows.table_rows([stock, rule])
    assert rows[1]["projected"] == pytest.approx(3.0) and rows[1]["tail_share"] == pytest.approx(0.2)
    assert "| lossless | 28 | 0.2 | 0.2 | 3 | 0.4 | 3 |" in report.markdown(rows)
    paired = report_rows.engine_step_columns([(rule, stock)])
    assert paired["projected"] == pytest.approx(3.0) and paired["projected8"] == pytest.approx(3.0)
    assert paired["rows_per_step"] == 24 and paired["rows_per_step_off"] == 32
