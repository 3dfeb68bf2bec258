"""A grid file (`configs/grids/*.yaml`) read and checked into a `Grid`: every error names the file, the key and the
fix, before anything runs. A grid file names the runner, the algorithm presets, the policies and lenience values to
sweep, the seeds and the flags every cell shares::

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

A rule given by path (`rules/my_rule.py:Class`) is found relative to the grid file. Validating a grid loads the rules
it names; PyYAML is imported only when a file is read.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from pathlib import Path

from ..params import is_integer
from ..references import absolute_reference
from .grid import Grid, GridError, flag_word

RUNNERS = ("openrlhf", "cpu")
GRID_KEYS = ("description", "runner", "presets", "layout", "seeds", "traces", "sweep", "args")
SWEEP_KEYS = ("policy", "lenience", "params")  # ReuseConfig fields a sweep entry sets (see `reuse_flags`)

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


def cell_flag_names(runner: str) -> tuple[str, ...]:
    """Flags the grid sets per cell; a grid's `args` must not set them."""
    import dataclasses

    from ..config import ReuseConfig, cell_fields

    ours = [f.metadata["flag"] for f in dataclasses.fields(ReuseConfig) if f.name in cell_fields()]
    return (*ours, *RUNNER_CELL_FLAGS[runner])


def parse_lenience(value, where: str) -> tuple[float, str]:
    """A lenience written as a number, `e^0.5`, `exp(0.5)` or `inf`: (value, label for cell names)."""
    if isinstance(value, bool):
        raise GridError(f"{where}: lenience {value!r} is not a number; write 1.65 or e^0.5")
    if isinstance(value, (int, float)):
        number, label = float(value), flag_word(value)
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
        args=tuple(flag_words(data.get("args") or {}, f"{where}: args", runner)),
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


def parse_seeds(text: str, where: str = "--seeds") -> list[int]:
    """Seeds written as on the command line, `0,1,2`."""
    return [_seed(_int(s, where), where) for s in text.split(",")]


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


def flag_words(args, where: str, runner: str) -> list[str]:
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
                words += [flag_word(v) for v in value] if isinstance(value, list) else [flag_word(value)]
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
