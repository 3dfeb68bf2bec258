"""The report on metrics from a real CPU run: the quickstart's lenience grid (tests/data, recorded on a 2-core
machine with `bash scripts/quickstart.sh --grid lenience`). The TensorBoard reader is tested end to end on a fresh
run in tests/docs/test_prototyping.py."""

import csv
import gzip
import io
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specrl_openrlhf.analysis import plots, report
from specrl_openrlhf.analysis.run_series import RunSeries, step_row

DATA = Path(__file__).parents[1] / "data" / "lenience_grid_metrics.json.gz"


@pytest.fixture
def grid_run(tmp_path) -> Path:
    folder = tmp_path / "lenience_grid"
    folder.mkdir()
    (folder / "metrics.json").write_bytes(gzip.decompress(DATA.read_bytes()))
    return folder


def totals(metrics: dict, run: str, key: str) -> float:
    return sum(r[key] for r in metrics["rows"] if r["run"] == run and r["kind"] == "step")


def test_table_matches_the_runs_own_rows_against_its_groups_baseline(grid_run):
    metrics = json.loads((grid_run / "metrics.json").read_text())
    rows = {r["run"]: r for r in report.table_rows(report.load_cpu_metrics(grid_run / "metrics.json"))}
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


def test_markdown_and_csv_have_the_papers_table_shape(grid_run):
    rows = report.table_rows(report.load_cpu_metrics(grid_run / "metrics.json"))
    text = report.markdown(rows)
    assert text.splitlines()[0] == "| run | policy | ℓ | Tokens (M) | Speedup | held_out |"
    assert "| run | rollout_s | scoring_s | sync_s | train_s |" in text  # the time breakdown by stage
    parsed = list(csv.DictReader(io.StringIO(report.to_csv(rows))))
    assert [r["run"] for r in parsed] == [r["run"] for r in rows]
    assert all(math.isclose(float(p["speedup"]), r["speedup"]) for p, r in zip(parsed, rows))


def a_real_picture(path: Path) -> bool:
    """A PNG that decodes to a figure with something drawn on it (not blank)."""
    from PIL import Image

    with Image.open(path) as image:
        pixels = np.asarray(image.convert("L"), dtype=np.float64)
    return image.format == "PNG" and min(pixels.shape) > 100 and pixels.std() > 10


def test_runs_not_trained_yet_are_left_out(grid_run):
    metrics = json.loads((grid_run / "metrics.json").read_text())
    planned = dict(metrics["runs"][0], name="planned-later")  # a grid's later group, written before it trains
    (grid_run / "metrics.json").write_text(json.dumps(dict(metrics, runs=metrics["runs"] + [planned])))
    names = [run.name for run in report.load_cpu_metrics(grid_run / "metrics.json")]
    assert "planned-later" not in names and len(names) == len(metrics["runs"])


@pytest.mark.slow  # the tutorial's test checks the quickstart's plots on every run
def test_plots_per_run_per_grid_and_against_lenience(grid_run, tmp_path):
    files = report.write_report(report.load_cpu_metrics(grid_run / "metrics.json"), tmp_path / "out")
    assert sorted(files) == ["csv", "frontier", "lenience", "markdown", "paired", "paired_csv", "plot"]
    pngs = [files["plot"], files["lenience"], *sorted((tmp_path / "out" / "per_run").glob("*.png"))]
    assert len(pngs) == 2 + 10 and all(a_real_picture(p) for p in pngs)


def test_step_rows_from_openrlhfs_logs():
    """OpenRLHF logs per-sample info as means over samples: totals are means x samples; per-draft values are means
    over the samples that had a draft (a sample without one logs 0)."""
    logs = {
        "rollout/num_samples": 8.0,
        "rollout/reward_mean": 0.25,
        "reuse/drafts_found": 0.5,
        "reuse/decoded_tokens": 10.0,
        "reuse/reused_tokens": 4.0,
        "reuse/draft_tokens": 8.0,
        "reuse/kl_prev_curr": 0.01,
        "reuse/excess_acceptance": 0.002,
        "reuse/time_scoring_s": 1.0,
        "reuse/time_generation_s": 3.0,
        "timing/generation": 2.0,
    }
    row = step_row(3, logs)
    assert row["decoded_tokens"] == 80 and row["reused_tokens"] == 32 and row["drafts_found"] == 4
    assert row["kl_prev_curr"] == pytest.approx(0.02) and row["excess_acceptance"] == pytest.approx(0.004)
    assert row["kept_share"] == 0.5 and row["scoring_s"] == pytest.approx(0.5) and row["reward"] == 0.25
    stock = step_row(3, {"rollout/num_samples": 8.0, "rollout/response_length_mean": 30.0})
    assert stock["decoded_tokens"] == 240 and "kl_prev_curr" not in stock


def test_mean_and_95_interval_over_seeds():
    mean, lo, hi = report.mean_interval([0.01, 0.03, 0.02])
    assert mean == pytest.approx(0.02) and (hi - mean) == pytest.approx(4.303 * 0.01 / math.sqrt(3), rel=1e-3)
    assert lo == pytest.approx(2 * mean - hi)
    one = report.mean_interval([0.05])
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
    [spec, exact] = report.paired_rows(runs)
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
    rows = report.table_rows([stock, engine])
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
    rows = report.table_rows([stock, rule])
    assert rows[1]["projected"] == pytest.approx(3.0) and rows[1]["tail_share"] == pytest.approx(0.2)
    assert "| lossless | 28 | 0.2 | 0.2 | 3 | 0.4 | 3 |" in report.markdown(rows)
    paired = report.engine_step_columns([(rule, stock)])
    assert paired["projected"] == pytest.approx(3.0) and paired["projected8"] == pytest.approx(3.0)
    assert paired["rows_per_step"] == 24 and paired["rows_per_step_off"] == 32


def two_runs_of(grid_run: Path, keep=("off_g1", "spec_l7.39")) -> Path:
    """The grid cut to one rule and its baseline, in a folder of its own (the report draws a figure a run)."""
    metrics = json.loads((grid_run / "metrics.json").read_text())
    metrics["settings"]["runs"] = list(keep)
    metrics["runs"] = [r for r in metrics["runs"] if r["name"] in keep]
    metrics["rows"] = [r for r in metrics["rows"] if r["run"] in keep]
    folder = grid_run.parent / "two_runs"
    folder.mkdir()
    (folder / "metrics.json").write_text(json.dumps(metrics))
    return folder


def test_command_line(grid_run, tmp_path, capsys):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "specrl_openrlhf.report", *args], capture_output=True, text=True)

    two_runs = two_runs_of(grid_run)
    done = run(str(two_runs))  # the module's command, in a process of its own
    assert done.returncode == 0 and "| spec_l7.39 | spec | 7.39 |" in done.stdout
    assert (two_runs / "report" / "table.md").read_text().startswith("| run | policy | ℓ |")
    assert len(list((two_runs / "report" / "per_run").glob("*.png"))) == 2
    (tmp_path / "empty").mkdir()
    for folder, message in (
        ("nothing", "no such folder"),
        ("empty", "no metrics.json, TensorBoard event files or wandb runs"),
    ):  # its errors, in this process
        with pytest.raises(SystemExit) as exit_:
            report.main([str(tmp_path / folder)])
        assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_per_draft_values_in_tensorboard_logs_are_means_over_drafts(tmp_path):
    """OpenRLHF averages per-sample info over all samples; a sample without a draft logs 0 for the per-draft values,
    so the reader divides them by the share of samples that had a draft."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "run"))
    for step, hit_rate in ((1, 0.0), (2, 0.5), (3, 1.0)):
        writer.add_scalar("train/rollout/num_samples", 8.0, step)
        writer.add_scalar("train/reuse/drafts_found", hit_rate, step)
        writer.add_scalar("train/reuse/lenience", 1.65 * hit_rate, step)
        writer.add_scalar("train/reuse/mean_verified_prefix_len", 20.0 * hit_rate, step)
    writer.close()
    run = report.load_tensorboard_run(tmp_path / "run")
    assert [row.get("lenience") for row in run.steps] == [None, pytest.approx(1.65), pytest.approx(1.65)]
    assert [row.get("mean_verified_prefix_len") for row in run.steps] == [None, 20.0, 20.0]
    assert run.lenience == pytest.approx(1.65) and report.lenience_label(run) == "1.65"


def test_a_rule_has_one_colour_in_every_figure():
    known = plots.KNOWN_RULES
    assert len({plots.rule_colour(m) for m in known}) == len(known)  # the grids' rules never share a colour
    assert plots.rule_colour("my_rule.py:Mine") == plots.rule_colour("my_rule.py:Mine")
    assert (plots.seeds_label(1), plots.seeds_label(5)) == ("1 seed", "5 seeds")
