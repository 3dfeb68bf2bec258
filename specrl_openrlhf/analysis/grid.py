"""`python -m specrl_openrlhf.grid GRID.yaml`: an ablation grid as data, one training run per cell.

A grid file (see `configs/grids/`) names the runner, the algorithm presets, the policies and lenience values to sweep,
the seeds and the flags every cell shares::

    runner: openrlhf           # openrlhf: OpenRLHF's train_ppo_ray; cpu: the CPU quickstart's task
    presets: [grpo]            # configs/<preset>.args, after configs/common.args
    layout: node_8gpu          # configs/<layout>.args (hardware), optional
    seeds: [42]
    traces: false              # record draft traces per cell, for `python -m specrl_openrlhf replay`
    sweep:
      - policy: off
      - policy: spec
        lenience: [1, e^0.2, e^0.5]
      - policy: full
    args:                      # flags shared by every cell; `true` is a bare flag
      --actor.model_name_or_path: Qwen/Qwen3-1.7B-Base

Cells are presets x sweep entries (one per lenience value) x seeds (`--seeds 0,1,2` replaces the file's). A sweep
entry without `lenience` gets the preset's own (the paper's value for that algorithm) if its rule takes one. A rule
given by path (`rules/my_rule.py:Class`) is found relative to the grid file. `--dry-run` prints one command per cell,
`--emit ray-job` one `ray job submit` per cell; otherwise the cells run here one after another, each in its own folder
with its log, `cell.json` and metrics, and a rerun skips the cells that finished. `cell.json` is what the report
reads to put a cell in its group (same grid, preset and seed: one baseline). `python -m specrl_openrlhf.report OUT`
then prints the paper's tables.

Standard library and PyYAML only at import: the grid runs training as subprocesses (validating a grid loads the
rules it names).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import math
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..params import is_integer
from ..references import absolute_reference, short_name

RUNNERS = ("openrlhf", "cpu")
GRID_KEYS = ("description", "runner", "presets", "layout", "seeds", "traces", "sweep", "args")
SWEEP_KEYS = ("policy", "lenience", "params")  # ReuseConfig fields a sweep entry sets (see `reuse_flags`)
OPENRLHF_MODULE = "openrlhf.cli.train_ppo_ray"
CPU_MODULE = "specrl_openrlhf.miniature.quickstart"
REWARD_FILE = Path(__file__).resolve().parents[1] / "rewards" / "math_verify_reward.py"
# Flags of the training commands the grid sets per cell, besides our per-cell ReuseConfig flags.
RUNNER_CELL_FLAGS = {
    "openrlhf": (
        "--train.seed",
        "--ckpt.path",
        "--logger.tensorboard_dir",
        "--logger.wandb.group",
        "--logger.wandb.run_name",
    ),
    "cpu": ("--seeds", "--out", "--only", "--grid", "--tensorboard"),
}
DONE_FILE = "done.json"


def reuse_flags(**values) -> list[str]:
    """The words that set a cell's ReuseConfig fields (policy, lenience, params, trace_dir): generated from the
    config, the one source of our flags."""
    from ..config import cell_flags

    return cell_flags(**values)


def cell_flag_names(runner: str) -> tuple[str, ...]:
    """Flags the grid sets per cell; a grid's `args` must not set them."""
    import dataclasses

    from ..config import ReuseConfig, cell_fields

    ours = [f.metadata["flag"] for f in dataclasses.fields(ReuseConfig) if f.name in cell_fields()]
    return (*ours, *RUNNER_CELL_FLAGS[runner])


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
                        parts = [preset, _policy_label(policy), *(f"{k}{_number(v)}" for k, v in params.items())]
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


def parse_lenience(value, where: str) -> tuple[float, str]:
    """A lenience written as a number, `e^0.5`, `exp(0.5)` or `inf`: (value, label for cell names)."""
    if isinstance(value, bool):
        raise GridError(f"{where}: lenience {value!r} is not a number; write 1.65 or e^0.5")
    if isinstance(value, (int, float)):
        number, label = float(value), _number(value)
    else:
        text = str(value).strip().replace(" ", "")
        match = re.fullmatch(r"(?:e\^|exp\()([-+0-9.eE]+)\)?", text)
        try:
            number, label = (math.exp(float(match.group(1))), f"e{match.group(1)}") if match else (float(text), text)
        except ValueError:
            raise GridError(f"{where}: lenience {value!r} is not a number; write 1.65, e^0.5 or exp(0.5)") from None
    from ..params import check_lenience

    try:
        check_lenience(where, number)
    except (TypeError, ValueError) as error:
        raise GridError(str(error)) from None
    return number, label


def load_grid(path: str | Path) -> Grid:
    """Read and validate a grid file. Every error names the file, the key and the fix, before anything runs."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise GridError(f"{path}: no such grid file; the shipped grids are in configs/grids/")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise GridError(f"{path}: not valid YAML ({error})") from None
    where = str(path)
    if not isinstance(data, dict):
        raise GridError(f"{where}: a grid is a mapping with the keys {', '.join(GRID_KEYS)}")
    _check_keys(data, GRID_KEYS, where)

    runner = data.get("runner", "openrlhf")
    if runner not in RUNNERS:
        raise GridError(f"{where}: runner {runner!r} is not one of {', '.join(RUNNERS)}")
    presets = _list(data, "presets", where, default=[] if runner == "cpu" else None)
    if runner == "cpu":
        if presets not in ([], ["grpo"]):
            raise GridError(f"{where}: presets: the cpu runner trains GRPO only; remove `presets`")
        presets = [""]
    grid = Grid(
        name=path.stem,
        path=path,
        runner=runner,
        presets=tuple(str(p) for p in presets),
        layout=data.get("layout"),
        seeds=tuple(_seed(s, f"{where}: seeds") for s in _list(data, "seeds", where, default=[0])),
        traces=_bool(data.get("traces", False), f"{where}: traces"),
        sweep=tuple(
            _sweep_entry(entry, f"{where}: sweep[{i}]", path.parent)
            for i, entry in enumerate(_list(data, "sweep", where))
        ),
        args=tuple(_args(data.get("args") or {}, f"{where}: args", runner)),
    )
    from ..policies import takes_lenience

    grid = dataclasses.replace(grid, lenient=frozenset(p for p, _, _ in grid.sweep if takes_lenience(p)))
    if runner == "openrlhf":
        needed = [("common", "common.args")] + [(f"presets: {p}", f"{p}.args") for p in grid.presets]
        if grid.layout:
            needed.append((f"layout: {grid.layout}", f"{grid.layout}.args"))
        for key, name in needed:
            if not (grid.configs_dir / name).is_file():
                have = sorted(p.stem for p in grid.configs_dir.glob("*.args"))
                raise GridError(
                    f"{where}: {key}: no {grid.configs_dir / name}; the presets there: {', '.join(have) or 'none'}"
                )
    return grid


def _check_keys(mapping: dict, valid, where: str) -> None:
    for key in mapping:
        if key not in valid:
            close = difflib.get_close_matches(str(key), valid, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise GridError(f"{where}: unknown key {key!r}.{hint} Valid keys: {', '.join(valid)}")


def _list(data: dict, key: str, where: str, default=None) -> list:
    if key not in data:
        if default is None:
            raise GridError(f"{where}: `{key}` is missing; it takes a list")
        return list(default)
    value = data[key]
    if not isinstance(value, list):
        value = [value]
    if not value:
        raise GridError(f"{where}: `{key}` is empty; list at least one value")
    return value


def _seed(value, where: str) -> int:
    if not is_integer(value) or value < 0:
        raise GridError(f"{where}: {value!r} is not a seed; seeds are integers >= 0")
    return value


def _int(text: str, where: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise GridError(f"{where}: {text!r} is not a seed; seeds are integers >= 0, e.g. 0,1,2") from None


def _bool(value, where: str) -> bool:
    if not isinstance(value, bool):
        raise GridError(f"{where}: {value!r} is not true or false")
    return value


def _sweep_entry(entry, where: str, base: Path) -> tuple[str, tuple]:
    if isinstance(entry, (str, bool)):
        entry = {"policy": entry}
    if not isinstance(entry, dict):
        raise GridError(f"{where}: a sweep entry is a mapping such as {{policy: spec, lenience: [1, e^0.5]}}")
    _check_keys(entry, SWEEP_KEYS, where)
    if "policy" not in entry:
        raise GridError(f"{where}: `policy` is missing; name a policy such as spec")
    from ..policies import PluginError, UnknownPolicyError, policy_class

    # YAML reads `off` as false; a rule file is found relative to the grid file
    policy = "off" if entry["policy"] is False else absolute_reference(str(entry["policy"]), base)
    try:
        cls = policy_class(policy)
    except (UnknownPolicyError, PluginError) as error:
        raise GridError(f"{where}: policy: {error}") from None
    accepted = {f.name for f in dataclasses.fields(cls.Params)}
    params = entry.get("params") or {}
    if not isinstance(params, dict):
        raise GridError(f"{where}: params: give a mapping of the rule's parameters, e.g. {{target_kept: 0.9}}")
    unknown = sorted(set(params) - (accepted - {"lenience"}))
    if unknown:
        raise GridError(
            f"{where}: params: {policy!r} takes no {', '.join(unknown)}; its parameters: "
            f"{', '.join(sorted(accepted)) or 'none'} (lenience goes in `lenience`)"
        )
    try:
        cls.Params(**params)
    except (TypeError, ValueError) as error:
        raise GridError(f"{where}: params: {error}") from None
    if "lenience" not in entry:
        return policy, (None,), params
    if "lenience" not in accepted:
        raise GridError(f"{where}: policy {policy!r} takes no lenience; remove `lenience` from this entry")
    values = entry["lenience"] if isinstance(entry["lenience"], list) else [entry["lenience"]]
    if not values:
        raise GridError(f"{where}: `lenience` is empty; list at least one value or remove the key")
    leniences = tuple(parse_lenience(v, f"{where}: lenience") for v in values)
    for value, label in leniences:  # the rule's own bounds, with its other parameters, as the cell will build it
        try:
            cls.Params(**params, lenience=value)
        except (TypeError, ValueError) as error:
            raise GridError(f"{where}: lenience {label}: {error}") from None
    return policy, leniences, params


def _args(args, where: str, runner: str) -> list[str]:
    """A mapping flag -> value (true: a bare flag, a list: several values) or a list of words."""
    if isinstance(args, list):
        words = [str(a) for a in args]
    elif isinstance(args, dict):
        words = []
        for flag, value in args.items():
            if value is False or value is None:
                continue
            words.append(str(flag))
            if value is not True:
                words += [_number(v) for v in value] if isinstance(value, list) else [_number(value)]
    else:
        raise GridError(f"{where}: give flags as a mapping such as {{--actor.model_name_or_path: MODEL}}")
    forbidden = cell_flag_names(runner)
    for word in words:
        flag = word.split("=", 1)[0]
        if flag in forbidden:
            raise GridError(f"{where}: {flag} is set per cell by the grid; remove it from `args`")
    if words and not words[0].startswith("--"):
        raise GridError(f"{where}: {words[0]!r} is not a flag; flags start with --")
    return words


def _number(value) -> str:
    return repr(value) if isinstance(value, float) else str(value)  # repr: a float's exact value


def _policy_label(policy: str) -> str:
    """A file-name-safe label: `path/rule.py:Class` becomes `Class`."""
    return re.sub(r"[^A-Za-z0-9_.]+", "_", short_name(policy))


# ---- running -----------------------------------------------------------------------------------------------------


def cell_state(cell_dir: Path) -> str:
    """'done', 'failed' or 'new'."""
    done = cell_dir / DONE_FILE
    if not done.is_file():
        return "new"
    try:
        return "done" if json.loads(done.read_text()).get("returncode") == 0 else "failed"
    except (OSError, ValueError):
        return "failed"


def run_cells(grid: Grid, out: Path, extra: list[str] = (), *, log=print) -> dict[str, list[str]]:
    """Train every cell that has not finished, one after another; returns the cell names by outcome."""
    outcome: dict[str, list[str]] = {"done": [], "skipped": [], "failed": []}
    cells = grid.cells()
    for number, cell in enumerate(cells, 1):
        cell_dir = out / cell.name
        if cell_state(cell_dir) == "done":
            outcome["skipped"].append(cell.name)
            log(f"[grid] {number}/{len(cells)} {cell.name}: finished before, skipped")
            continue
        cell_dir.mkdir(parents=True, exist_ok=True)
        (cell_dir / DONE_FILE).unlink(missing_ok=True)
        command = grid.command(cell, cell_dir, extra, python=sys.executable)
        (cell_dir / "cell.json").write_text(json.dumps({**cell.describe(), "command": command}, indent=1))
        log(f"[grid] {number}/{len(cells)} {cell.name}: running (log: {cell_dir / 'log.txt'})")
        start = time.perf_counter()
        with open(cell_dir / "log.txt", "w") as log_file:
            returncode = subprocess.call(command, stdout=log_file, stderr=subprocess.STDOUT)
        seconds = time.perf_counter() - start
        (cell_dir / DONE_FILE).write_text(json.dumps({"returncode": returncode, "seconds": seconds}))
        outcome["done" if returncode == 0 else "failed"].append(cell.name)
        verdict = "finished" if returncode == 0 else f"FAILED (exit code {returncode})"
        log(f"[grid] {number}/{len(cells)} {cell.name}: {verdict} in {seconds:.0f}s")
    return outcome


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specrl_openrlhf.grid",
        description=__doc__.split("\n\n")[0],
        epilog="Flags after `--` are added to every cell, e.g. -- --data.prompt_dataset DATA.",
    )
    parser.add_argument("grid", help="a grid file, e.g. configs/grids/lenience.yaml")
    parser.add_argument("--out", default=None, help="folder of the cells (default: runs/grids/<grid name>)")
    parser.add_argument("--seeds", default=None, help="seeds to run, replacing the grid's (e.g. 0,1,2)")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--dry-run", action="store_true", help="print one training command per cell, run nothing")
    what.add_argument("--emit", choices=["ray-job"], default=None, help="print one `ray job submit` per cell")
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    try:
        grid = load_grid(args.grid)
        if args.seeds:
            grid = grid.with_seeds([_seed(_int(s, "--seeds"), "--seeds") for s in args.seeds.split(",")])
        if extra:
            _args(extra, "flags after --", grid.runner)
    except GridError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    out = Path(args.out or Path("runs") / "grids" / grid.name).resolve()
    cells = grid.cells()
    if args.dry_run or args.emit:
        for cell in cells:
            command = shlex.join(grid.command(cell, out / cell.name, extra))
            if args.emit == "ray-job":
                command = f"ray job submit --no-wait --submission-id {grid.name}-{cell.name} -- {command}"
            print(command)
        return 0
    print(f"[grid] {grid.name}: {len(cells)} cells into {out}")
    outcome = run_cells(grid, out, extra)
    print(
        f"[grid] {len(outcome['done'])} finished, {len(outcome['skipped'])} skipped (finished before), "
        f"{len(outcome['failed'])} failed"
    )
    for name in outcome["failed"]:
        print(f"[grid] failed: {name} (see {out / name / 'log.txt'}); a rerun retries it")
    print(f"[grid] tables: python -m specrl_openrlhf.report {out}")
    return 1 if outcome["failed"] else 0
