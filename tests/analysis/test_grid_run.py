"""The grid's command: seeds from the command line, dry runs and ray jobs, bad grids exit 2, and the local runner
skips finished cells and retries failed ones."""

import json
import shlex
import textwrap

from specrl_openrlhf.analysis import grid_run
from specrl_openrlhf.analysis.grid_file import load_grid
from specrl_openrlhf.analysis.grid_run import run_cells
from tests.helpers import GRIDS, flag_value, write_grid


def test_seeds_on_the_command_line_replace_the_grids(capsys, tmp_path):
    assert grid_run.main([str(GRIDS / "cpu.yaml"), "--out", str(tmp_path), "--dry-run", "--seeds", "0,1,2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4 * 3 and {flag_value(line.split(), "--seeds") for line in lines} == {"0", "1", "2"}
    assert grid_run.main([str(GRIDS / "cpu.yaml"), "--dry-run", "--seeds", "0,x"]) == 2
    assert "'x' is not a seed" in capsys.readouterr().err


def test_dry_run_and_ray_jobs_print_one_command_per_cell(capsys, tmp_path):
    out = tmp_path / "out"
    assert grid_run.main([str(GRIDS / "lenience.yaml"), "--out", str(out), "--dry-run", "--", "--x.y", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 8 and all(shlex.split(line)[-2:] != ["--x.y", "1"] for line in lines)
    assert all("--x.y 1" in line for line in lines) and not out.exists()
    assert grid_run.main([str(GRIDS / "cpu.yaml"), "--out", str(out), "--emit", "ray-job"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4 and lines[0].startswith("ray job submit --no-wait --submission-id cpu-off-s0 -- python -m")


def test_bad_grid_exits_2_before_running_anything(tmp_path, capsys):
    path = write_grid(tmp_path, "presets: [grpo]\nsweep: [specc]\n")
    assert grid_run.main([str(path), "--out", str(tmp_path / "out")]) == 2
    assert "Did you mean 'spec'" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_rerun_skips_finished_cells_and_retries_failed_ones(tmp_path, monkeypatch):
    """Cells run as subprocesses; here each is a tiny script that fails once for the `random` cell."""
    grid = load_grid(write_grid(tmp_path, "presets: [grpo]\nsweep: [off, spec, random]\n"))
    attempts = tmp_path / "attempts"
    attempts.mkdir()
    script = textwrap.dedent(
        """
        import pathlib, sys
        name, attempts = sys.argv[1], pathlib.Path(sys.argv[2])
        tries = len(list(attempts.glob(name + "-*")))
        (attempts / f"{name}-{tries}").touch()
        print("training", name)
        sys.exit(3 if name.startswith("grpo-random") and tries == 0 else 0)
        """
    )
    monkeypatch.setattr(
        type(grid),
        "command",
        lambda self, cell, cell_dir, extra=(), python="python": [python, "-c", script, cell.name, str(attempts)],
    )
    out = tmp_path / "out"
    first = run_cells(grid, out, log=lambda line: None)
    assert first == {"done": ["grpo-off-s0", "grpo-spec-s0"], "skipped": [], "failed": ["grpo-random-s0"]}
    assert (out / "grpo-random-s0" / "log.txt").read_text() == "training grpo-random-s0\n"
    assert json.loads((out / "grpo-random-s0" / "done.json").read_text())["returncode"] == 3
    assert json.loads((out / "grpo-spec-s0" / "cell.json").read_text())["policy"] == "spec"
    second = run_cells(grid, out, log=lambda line: None)
    assert second == {"done": ["grpo-random-s0"], "skipped": ["grpo-off-s0", "grpo-spec-s0"], "failed": []}
    assert sorted(p.name for p in attempts.iterdir()) == [
        "grpo-off-s0-0",
        "grpo-random-s0-0",
        "grpo-random-s0-1",
        "grpo-spec-s0-0",
    ]
