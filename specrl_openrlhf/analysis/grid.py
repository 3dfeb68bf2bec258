"""An ablation grid as data (`python -m specrl_openrlhf.grid GRID.yaml`, `grid_run`): its cells, one training run
each, and the command line that trains a cell. `grid_file` reads a grid file into a `Grid`.

Cells are presets x sweep entries (one per lenience value) x seeds. A sweep entry without `lenience` gets the
preset's own (the paper's value for that algorithm) if its rule takes one. `cell.json` is what the report reads to put
a cell in its group (same grid, preset and seed: one baseline).

Standard library only at import: the grid runs training as subprocesses.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from ..references import short_name

OPENRLHF_MODULE = "openrlhf.cli.train_ppo_ray"
CPU_MODULE = "specrl_openrlhf.miniature.quickstart"
REWARD_FILE = Path(__file__).resolve().parents[1] / "rewards" / "math_verify_reward.py"


def reuse_flags(**values) -> list[str]:
    """The words that set a cell's ReuseConfig fields (policy, lenience, params, trace_dir): generated from the
    config, the one source of our flags."""
    from ..config import cell_flags

    return cell_flags(**values)


class GridError(ValueError):
    """A grid file that can't be run; the message names the file, the key and the fix."""


@dataclass(frozen=True)
class Cell:
    """One training run of a grid."""

    name: str
    policy: str
    lenience: float | None  # None: the preset's lenience, or the policy has none
    params: dict  # the rule's other parameters
    preset: str | None
    seed: int
    group: str  # the cells that share a baseline: same grid, preset and seed
    regime: str  # the group less its seed: the report pairs a rule's cells across seeds within it
    method: str  # the rule as compared across seeds: its name, lenience and parameters

    def describe(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Grid:
    name: str
    path: Path
    runner: str
    presets: tuple[str, ...]
    layout: str | None
    seeds: tuple[int, ...]
    traces: bool
    sweep: tuple[tuple[str, tuple[tuple[float, str] | None, ...], dict], ...]  # (policy, (lenience, label)s, params)
    args: tuple[str, ...]
    lenient: frozenset[str] = frozenset()  # the swept rules that take a lenience

    @property
    def configs_dir(self) -> Path:
        """Presets sit beside the grid folder: configs/grids/x.yaml -> configs/<preset>.args."""
        return self.path.resolve().parent.parent

    def cells(self) -> list[Cell]:
        cells = []
        for preset in self.presets:
            for seed in self.seeds:
                for policy, leniences, params in self.sweep:
                    for lenience in leniences:
                        parts = [preset, _policy_label(policy), *(f"{k}{flag_word(v)}" for k, v in params.items())]
                        if lenience is not None:
                            parts.append(f"l{lenience[1]}")
                        method = "-".join(p for p in parts[1:] if p)
                        parts.append(f"s{seed}")
                        regime = f"{self.name}/{preset or 'cpu'}"
                        cells.append(
                            Cell(
                                name="-".join(p for p in parts if p),
                                policy=policy,
                                lenience=None if lenience is None else lenience[0],
                                params=params,
                                preset=preset or None,
                                seed=seed,
                                group=f"{regime}/s{seed}",
                                regime=regime,
                                method=method,
                            )
                        )
        return cells

    def with_seeds(self, seeds: list[int]) -> Grid:
        return dataclasses.replace(self, seeds=tuple(seeds))

    def command(self, cell: Cell, cell_dir: Path, extra: list[str] = (), python: str = "python") -> list[str]:
        """The command line that trains one cell, writing under `cell_dir`."""
        cell_dir = Path(cell_dir).resolve()
        traces = str(cell_dir / "traces") if self.traces else None
        if self.runner == "cpu":
            command = [python, "-m", CPU_MODULE, "--only", "--seeds", str(cell.seed), "--out", str(cell_dir)]
            ours = reuse_flags(policy=cell.policy, lenience=cell.lenience, params=cell.params, trace_dir=traces)
            return command + ours + list(self.args) + list(extra)
        preset, preset_lenience = split_lenience(read_args_file(self.configs_dir / f"{cell.preset}.args"))
        lenience = cell.lenience
        if lenience is None and cell.policy in self.lenient:  # the paper's lenience for this algorithm
            lenience = preset_lenience
        command = [python, "-m", OPENRLHF_MODULE]
        command += read_args_file(self.configs_dir / "common.args")
        if self.layout:
            command += read_args_file(self.configs_dir / f"{self.layout}.args")
        command += preset
        if "--reward.remote_url" not in self.args and "--reward.remote_url" not in extra:
            command += ["--reward.remote_url", str(REWARD_FILE)]
        command += list(self.args) + list(extra)
        command += reuse_flags(policy=cell.policy, lenience=lenience, params=cell.params, trace_dir=traces)
        command += ["--train.seed", str(cell.seed)]
        command += ["--ckpt.path", str(cell_dir / "ckpt"), "--logger.tensorboard_dir", str(cell_dir / "tensorboard")]
        command += ["--logger.wandb.group", self.name, "--logger.wandb.run_name", f"{self.name}-{cell.name}"]
        return command


def split_lenience(words: list[str]) -> tuple[list[str], float | None]:
    """A preset's flags without its `--lenience VALUE` (the paper's lenience for that algorithm), and that value. The
    grid gives it to the cells whose rule takes a lenience: `--lenience` is an error for the others."""
    if "--lenience" not in words:
        return words, None
    i = words.index("--lenience")
    return words[:i] + words[i + 2 :], float(words[i + 1])


def read_args_file(path: Path) -> list[str]:
    """One flag per line (`configs/*.args`); '#' starts a comment."""
    words = []
    for line in Path(path).read_text().splitlines():
        words += shlex.split(line, comments=True)
    return words


def flag_word(value) -> str:
    """A value as a command-line word: a float's exact value (repr), anything else as written."""
    return repr(value) if isinstance(value, float) else str(value)


def _policy_label(policy: str) -> str:
    """A file-name-safe label: `path/rule.py:Class` becomes `Class`."""
    return re.sub(r"[^A-Za-z0-9_.]+", "_", short_name(policy))
