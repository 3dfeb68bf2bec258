"""Grids as data: the shipped grids resolve to cells and commands, bad grids fail before anything runs, and the local
runner skips finished cells and retries failed ones."""

import json
import math
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from specrl_openrlhf.analysis import grid as grid_module
from specrl_openrlhf.analysis.grid import GridError, load_grid, parse_lenience, run_cells
from tests.helpers import ADAPTIVE, REPO

GRIDS = REPO / "configs" / "grids"


def flag_value(command: list[str], flag: str) -> str | None:
    """The last value given to `flag` (argparse keeps the last)."""
    values = [command[i + 1] for i, word in enumerate(command[:-1]) if word == flag]
    return values[-1] if values else None


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


def test_seeds_on_the_command_line_replace_the_grids(capsys, tmp_path):
    assert grid_module.main([str(GRIDS / "cpu.yaml"), "--out", str(tmp_path), "--dry-run", "--seeds", "0,1,2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4 * 3 and {flag_value(line.split(), "--seeds") for line in lines} == {"0", "1", "2"}
    assert grid_module.main([str(GRIDS / "cpu.yaml"), "--dry-run", "--seeds", "0,x"]) == 2
    assert "'x' is not a seed" in capsys.readouterr().err


def test_rule_paths_resolve_against_the_grid_file(tmp_path, monkeypatch):
    path = write_grid(tmp_path, "runner: cpu\nsweep: [{policy: ../../rules/keep.py:Keep}]\n")
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "keep.py").write_text(
        "import torch\nimport specrl_openrlhf as sr\n\n\nclass Keep(sr.ReusePolicy):\n"
        "    needs_scores = False\n\n    def cut(self, batch):\n        return batch.lengths\n"
    )
    monkeypatch.chdir(REPO)  # anywhere but beside the grid
    [cell] = load_grid(path).cells()
    assert cell.policy == f"{rules / 'keep.py'}:Keep"


def test_cells_tell_the_report_their_group_regime_and_rule(tmp_path):
    grid = load_grid(GRIDS / "lenience.yaml").with_seeds([1, 2])
    cells = {c.name: c for c in grid.cells()}
    spec = cells["grpo-spec-le0.5-s2"]
    assert (spec.group, spec.regime, spec.method) == ("lenience/grpo/s2", "lenience/grpo", "spec-le0.5")
    assert cells["grpo-off-s1"].group == "lenience/grpo/s1" != spec.group


def test_dry_run_and_ray_jobs_print_one_command_per_cell(capsys, tmp_path):
    out = tmp_path / "out"
    assert grid_module.main([str(GRIDS / "lenience.yaml"), "--out", str(out), "--dry-run", "--", "--x.y", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 8 and all(shlex.split(line)[-2:] != ["--x.y", "1"] for line in lines)
    assert all("--x.y 1" in line for line in lines) and not out.exists()
    assert grid_module.main([str(GRIDS / "cpu.yaml"), "--out", str(out), "--emit", "ray-job"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4 and lines[0].startswith("ray job submit --no-wait --submission-id cpu-off-s0 -- python -m")


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


@pytest.mark.parametrize(
    "value, expected, label",
    [(1, 1.0, "1"), (1.65, 1.65, "1.65"), ("e^0.5", math.exp(0.5), "e0.5"), ("exp(2)", math.exp(2), "e2")],
)
def test_lenience_spellings(value, expected, label):
    assert parse_lenience(value, "x") == (pytest.approx(expected), label)


def write_grid(tmp_path, text: str) -> Path:
    (tmp_path / "configs" / "grids").mkdir(parents=True, exist_ok=True)
    for name in ("common", "grpo"):
        (tmp_path / "configs" / f"{name}.args").write_text("--rollout.n_samples_per_prompt 8\n")
    path = tmp_path / "configs" / "grids" / "g.yaml"
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize(
    "text, message",
    [
        ("presets: [grpo]\nsweeep: [spec]\n", "unknown key 'sweeep'. Did you mean 'sweep'?"),
        ("presets: [grpo]\nsweep: [specc]\n", "sweep[0]: policy: unknown reuse policy 'specc'. Did you mean 'spec'?"),
        ("presets: [grpo]\nsweep: []\n", "`sweep` is empty"),
        ("presets: [grpo]\n", "`sweep` is missing"),
        ("presets: [grpo]\nsweep: [{policy: spec, lenience: [1, -2]}]\n", "lenience must be > 0, got -2.0"),
        ("presets: [grpo]\nsweep: [{policy: spec, lenience: 0}]\n", "lenience must be > 0"),
        ("presets: [grpo]\nsweep: [{policy: spec, lenience: []}]\n", "`lenience` is empty"),
        ("presets: [grpo]\nsweep: [{policy: spec, lenience: e^x}]\n", "lenience 'e^x' is not a number"),
        ("presets: [grpo]\nsweep: [{policy: random, lenience: 2}]\n", "policy 'random' takes no lenience"),
        ("presets: [grpo]\nsweep: [{policy: spec, lenient: 2}]\n", "unknown key 'lenient'. Did you mean 'lenience'?"),
        ("presets: [gpro]\nsweep: [spec]\n", "presets: gpro: no"),
        ("presets: [grpo]\nseeds: [-1]\nsweep: [spec]\n", "-1 is not a seed"),
        ("runner: slurm\nsweep: [spec]\n", "runner 'slurm' is not one of openrlhf, cpu"),
        ("presets: [grpo]\nsweep: [spec]\nargs: {--lenience: 2}\n", "--lenience is set per cell by the grid"),
        ("presets: [grpo]\nsweep: [spec]\nargs: {--logger.wandb.group: g}\n", "--logger.wandb.group is set per cell"),
        ("runner: cpu\nsweep: [spec]\nargs: {--seeds: 3}\n", "--seeds is set per cell"),
        ("presets: [grpo]\nsweep: [spec]\nargs: {--reuse.trace_dir: t}\n", "--reuse.trace_dir is set per cell"),
        (
            f"presets: [grpo]\nsweep: [{{policy: '{ADAPTIVE}', lenience: [2, 0.5]}}]\n",
            "lenience 0.5: adaptive_lenience: need 1 <= lenience",
        ),
        ("presets: [grpo]\nsweep: [spec]\nargs: [model]\n", "'model' is not a flag"),
        ("runner: cpu\npresets: [ppo]\nsweep: [spec]\n", "the cpu runner trains GRPO only"),
        ("presets: [grpo]\nsweep: [{policy: spec, params: {floor: 1}}]\n", "'spec' takes no floor"),
        ("presets: [grpo]\nsweep: [{policy: spec, params: [1]}]\n", "give a mapping of the rule's parameters"),
        ("sweep: [spec\n", "not valid YAML"),
        ("- spec\n", "a grid is a mapping"),
    ],
)
def test_bad_grids_name_the_key_and_the_fix(tmp_path, text, message):
    with pytest.raises(GridError, match="g.yaml") as error:
        load_grid(write_grid(tmp_path, text))
    assert message in str(error.value)


def test_bad_grid_exits_2_before_running_anything(tmp_path, capsys):
    path = write_grid(tmp_path, "presets: [grpo]\nsweep: [specc]\n")
    assert grid_module.main([str(path), "--out", str(tmp_path / "out")]) == 2
    assert "Did you mean 'spec'" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_yaml_off_is_the_off_policy(tmp_path):
    grid = load_grid(write_grid(tmp_path, "presets: [grpo]\nsweep: [off, {policy: off}]\n"))
    assert [c.policy for c in grid.cells()] == ["off", "off"]


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
