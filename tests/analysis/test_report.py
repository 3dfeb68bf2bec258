"""The report (`analysis.report`) on metrics from a real CPU run: the quickstart's lenience grid (tests/data,
recorded on a 2-core machine with `bash scripts/quickstart.sh --grid lenience`): its tables, files, figures and
command."""

import csv
import io
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from specrl_openrlhf.analysis import plots, report, report_rows, run_readers
from tests.helpers import a_real_picture


def test_markdown_and_csv_have_the_papers_table_shape(grid_run):
    rows = report_rows.table_rows(run_readers.load_cpu_metrics(grid_run / "metrics.json"))
    text = report.markdown(rows)
    assert text.splitlines()[0] == "| run | policy | ℓ | Tokens (M) | Speedup | held_out |"
    assert "| run | rollout_s | scoring_s | sync_s | train_s |" in text  # the time breakdown by stage
    parsed = list(csv.DictReader(io.StringIO(report.to_csv(rows))))
    assert [r["run"] for r in parsed] == [r["run"] for r in rows]
    assert all(math.isclose(float(p["speedup"]), r["speedup"]) for p, r in zip(parsed, rows))


@pytest.mark.slow  # the tutorial's test checks the quickstart's plots on every run
def test_plots_per_run_per_grid_and_against_lenience(grid_run, tmp_path):
    files = report.write_report(run_readers.load_cpu_metrics(grid_run / "metrics.json"), tmp_path / "out")
    assert sorted(files) == ["csv", "frontier", "lenience", "markdown", "paired", "paired_csv", "plot"]
    pngs = [files["plot"], files["lenience"], *sorted((tmp_path / "out" / "per_run").glob("*.png"))]
    assert len(pngs) == 2 + 10 and all(a_real_picture(p) for p in pngs)


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


def test_a_rule_has_one_colour_in_every_figure():
    known = plots.KNOWN_RULES
    assert len({plots.rule_colour(m) for m in known}) == len(known)  # the grids' rules never share a colour
    assert plots.rule_colour("my_rule.py:Mine") == plots.rule_colour("my_rule.py:Mine")
    assert (plots.seeds_label(1), plots.seeds_label(5)) == ("1 seed", "5 seeds")
