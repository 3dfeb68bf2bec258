"""Grids as data: the shipped grids resolve to cells, and each cell to the command that trains it."""

import json
import math
import subprocess
import sys

import pytest

from specrl_openrlhf.analysis.grid_file import load_grid
from tests.helpers import GRIDS, flag_value


@pytest.mark.parametrize(
    "name, cells",
    [
        ("main", ["grpo-off-s42", "grpo-spec-s42", "ppo-off-s42", "ppo-spec-s42", "dapo-off-s42", "dapo-spec-s42"]),
        ("variants", ["grpo-off-s42", "grpo-spec-s42", "grpo-random-s42", "grpo-delayed-s42"]),
        ("lenience", ["grpo-off-s42"] + [f"grpo-spec-le{x}-s42" for x in ("0.2", "0.5", "0.8", "1", "2")]),
        ("cpu", ["off-s0", "spec-l1-s0", "spec-le0.5-s0", "AdaptiveLenience-target_kept0.9-s0"]),
    ],
)
def test_shipped_grids_resolve(name, cells):
    grid = load_grid(GRIDS / f"{name}.yaml")
    names = [cell.name for cell in grid.cells()]
    assert [n for n in names if n in cells] == cells


def test_lenience_grid_commands_carry_each_cells_flags(tmp_path):
    grid = load_grid(GRIDS / "lenience.yaml")
    commands = {cell.name: grid.command(cell, tmp_path / cell.name) for cell in grid.cells()}
    assert list(commands) == [
        "grpo-off-s42",
        "grpo-spec-l1-s42",
        *[f"grpo-spec-le{x}-s42" for x in ("0.2", "0.5", "0.8", "1", "2")],
        "grpo-full-s42",
    ]
    for name, command in commands.items():
        assert command[:3] == ["python", "-m", "openrlhf.cli.train_ppo_ray"]
        assert flag_value(command, "--rollout_reuse") == name.split("-")[1]
        assert flag_value(command, "--train.seed") == "42"
        assert flag_value(command, "--logger.tensorboard_dir") == str(tmp_path / name / "tensorboard")
    # The cell's own lenience; the preset's (e^0.5) only for a lenient rule without one; none for the others.
    assert float(flag_value(commands["grpo-spec-le0.8-s42"], "--lenience")) == pytest.approx(math.exp(0.8))
    assert float(flag_value(commands["grpo-spec-l1-s42"], "--lenience")) == 1.0
    assert flag_value(commands["grpo-off-s42"], "--lenience") is None
    assert flag_value(commands["grpo-full-s42"], "--lenience") is None
    assert all(command.count("--lenience") <= 1 for command in commands.values())
    # wandb: one group per grid, one run name per cell
    assert {flag_value(c, "--logger.wandb.group") for c in commands.values()} == {"lenience"}
    assert flag_value(commands["grpo-off-s42"], "--logger.wandb.run_name") == "lenience-grpo-off-s42"


def test_main_grid_uses_each_algorithms_paper_lenience(tmp_path):
    grid = load_grid(GRIDS / "main.yaml")
    spec = {c.preset: grid.command(c, tmp_path) for c in grid.cells() if c.policy == "spec"}
    paper = {"grpo": 0.5, "ppo": 0.3, "dapo": 0.15}
    assert {k: math.log(float(flag_value(v, "--lenience"))) for k, v in spec.items()} == pytest.approx(paper)


def test_a_rules_parameters_reach_its_cells_command(tmp_path):
    grid = load_grid(GRIDS / "cpu.yaml")
    cell = next(c for c in grid.cells() if c.params)
    command = grid.command(cell, tmp_path)
    assert json.loads(flag_value(command, "--reuse.params")) == {"target_kept": 0.9} == cell.params
    assert flag_value(command, "--seeds") == "0" and "--only" in command  # the quickstart's cell interface


def test_the_variants_grid_gives_the_preset_lenience_to_lenient_rules_only(tmp_path):
    grid = load_grid(GRIDS / "variants.yaml")
    lenience = {c.policy: flag_value(grid.command(c, tmp_path), "--lenience") for c in grid.cells()}
    assert lenience["off"] is None and lenience["random"] is None
    assert float(lenience["spec"]) == float(lenience["delayed"]) == pytest.approx(math.exp(0.5))


def test_cells_tell_the_report_their_group_regime_and_rule(tmp_path):
    grid = load_grid(GRIDS / "lenience.yaml").with_seeds([1, 2])
    cells = {c.name: c for c in grid.cells()}
    spec = cells["grpo-spec-le0.5-s2"]
    assert (spec.group, spec.regime, spec.method) == ("lenience/grpo/s2", "lenience/grpo", "spec-le0.5")
    assert cells["grpo-off-s1"].group == "lenience/grpo/s1" != spec.group


@pytest.mark.openrlhf
@pytest.mark.slow  # a longer variant: OpenRLHF's module in a fresh process; test_cli runs its parser in-process
def test_a_cell_command_parses_with_openrlhfs_own_command(tmp_path):
    """The dry run's commands are real: OpenRLHF's module (through our hook) accepts one, flag for flag."""
    grid = load_grid(GRIDS / "lenience.yaml")
    cell = next(c for c in grid.cells() if c.name == "grpo-spec-le0.5-s42")
    command = grid.command(cell, tmp_path / cell.name, ["--data.prompt_dataset", "DATA", "--reuse.dry_run"])
    process = subprocess.run([sys.executable, *command[1:]], capture_output=True, text=True, timeout=120)
    assert process.returncode == 0, process.stderr[-3000:]
    resolved = json.loads(process.stdout[process.stdout.index("{") :])
    assert resolved["policy"] == f"spec(lenience={math.exp(0.5)!r})"
    assert resolved["openrlhf_args"]["logger"]["tensorboard_dir"] == str(tmp_path / cell.name / "tensorboard")
