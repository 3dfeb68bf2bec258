"""The runs under a folder, read into `RunSeries` for the report (`analysis.report`), whatever wrote them:

- our CPU runs (`metrics.json`, written by the quickstart and by `python -m specrl_openrlhf.grid` cells);
- OpenRLHF runs' TensorBoard logs (`--logger.tensorboard_dir`), with TensorBoard's own event reader. Their cell
  (policy, lenience, seed, group) comes from the `cell.json` the grid runner writes beside the log, or from
  `args.json`;
- wandb run folders (`wandb/offline-run-*`, `wandb/run-*`), read from disk (`wandb_logs`): the run's name, group
  and config say its cell.

A run found twice (a quickstart's metrics.json and its own TensorBoard or wandb logs) is read once, from
metrics.json. `step_row` turns one step of OpenRLHF-shaped logs into the same rows as our runs'.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from ..references import short_name
from .run_series import RunSeries, step_row

logger = logging.getLogger(__name__)


def load_cpu_metrics(path: Path) -> list[RunSeries]:
    """The runs of one `metrics.json` (quickstart or grid cell). A grid cell's `cell.json` beside it names the cell
    and its group: how the grid runner tells the report which cells share a baseline."""
    data = json.loads(Path(path).read_text())
    cell_file = path.parent / "cell.json"  # a grid cell: one run, named by its cell
    cell = json.loads(cell_file.read_text()) if cell_file.is_file() and len(data.get("runs", [])) == 1 else {}
    runs = []
    for info in data.get("runs", []):
        rows = [r for r in data["rows"] if r.get("run") == info["name"]]
        if not rows:  # planned but not trained yet: a grid still running, or stopped
            continue
        group = info.get("group", 0)
        runs.append(
            RunSeries(
                name=cell.get("name") or info["name"],
                policy=info["policy"],
                lenience=info.get("lenience"),
                group=cell.get("group") or (group if isinstance(group, str) else f"{path.parent}#{group}"),
                source=str(path),
                method=cell.get("method") or info.get("method", ""),
                regime=cell.get("regime") or info.get("regime", ""),
                seed=cell.get("seed", info.get("seed", data.get("settings", {}).get("seed"))),
                steps=[r for r in rows if r.get("kind") == "step"],
                evals=[
                    {"step": r["step"], "epoch": r["epoch"], "held_out": r["held_out_accuracy"]}
                    for r in rows
                    if r.get("kind") == "epoch" and r.get("held_out_accuracy") is not None
                ],
                accuracy_before=info.get("acc_before", data.get("summary", {}).get("acc_before")),
            )
        )
    return runs


def load_tensorboard_run(directory: Path) -> RunSeries | None:
    """An OpenRLHF run from its event files, with TensorBoard's reader. Resumed runs log some steps twice: the
    latest value of each step wins."""
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError as error:
        raise SystemExit("reading TensorBoard logs needs the tensorboard package: pip install tensorboard") from error
    accumulator = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    accumulator.Reload()
    tags = set(accumulator.Tags().get("scalars", []))
    if not tags:
        return None
    scalars = {}
    for tag in tags:
        latest: dict[int, tuple[float, float]] = {}
        for event in accumulator.Scalars(tag):
            if event.step not in latest or event.wall_time >= latest[event.step][0]:
                latest[event.step] = (event.wall_time, event.value)
        scalars[tag] = {step: value for step, (_, value) in latest.items()}
    return series_from_scalars(scalars, directory)


def series_from_scalars(scalars: dict[str, dict[int, float]], directory: Path, cell: dict | None = None) -> RunSeries:
    """A run from OpenRLHF's logged scalars ({'train/...' or 'eval/...': {step: value}}), whatever stored them;
    `cell` says which run it is (default: the `cell.json` or `args.json` near `directory`)."""
    train = {tag.removeprefix("train/"): values for tag, values in scalars.items() if tag.startswith("train/")}
    steps = sorted({s for key in ("rollout/num_samples", "timing/generation") for s in train.get(key, {})})
    rows = [step_row(step, {k: v[step] for k, v in train.items() if step in v}) for step in steps]
    evals: dict[int, dict] = {}
    for tag in sorted(t for t in scalars if t.startswith("eval/") and t.endswith("_pass1")):
        dataset = tag.removeprefix("eval/").removeprefix("eval_").removesuffix("_pass1")
        for step, value in scalars[tag].items():
            evals.setdefault(step, {"step": step})[dataset] = value
    cell = read_cell(directory) if cell is None else cell
    lenience = cell.get("lenience")
    applied = [row["lenience"] for row in rows if row.get("lenience")]
    if lenience is None and applied:  # the preset's lenience: the run logged what it applied
        lenience = sum(applied) / len(applied)
    policy = cell.get("policy", "off")
    return RunSeries(
        name=cell.get("name") or directory.name,
        policy=policy,
        lenience=lenience,
        group=cell.get("group") or str(directory.parent),
        source=str(directory),
        method=cell.get("method") or short_name(policy) + ("" if cell.get("lenience") is None else f"@{lenience:.3g}"),
        regime=cell.get("regime", ""),
        seed=cell.get("seed"),
        steps=rows,
        evals=[evals[s] for s in sorted(evals)],
    )


def read_cell(directory: Path) -> dict:
    """The grid cell a run belongs to: `cell.json` in its folder or a parent (written by the grid runner), else the
    reuse flags of an `args.json` there."""
    for folder in [directory, *directory.parents][:4]:
        if (folder / "cell.json").is_file():
            return json.loads((folder / "cell.json").read_text())
        if (folder / "args.json").is_file():
            args = json.loads((folder / "args.json").read_text())
            return {"policy": args.get("rollout_reuse", "off"), "lenience": args.get("lenience")}
    return {}


def load_wandb_run(folder: Path) -> RunSeries | None:
    """A run from a wandb run folder: OpenRLHF's WandbLogger logs what its TensorboardLogger does."""
    from . import wandb_logs

    scalars = wandb_logs.scalars(folder)
    if not scalars:
        return None
    info = wandb_logs.run_info(folder)
    config = info["config"]
    cell = read_cell(folder) or {
        "name": info.get("name") or config.get("name"),
        "group": info.get("group") or config.get("group"),
        **{k: config[k] for k in ("policy", "lenience", "method", "regime", "seed") if k in config},
    }
    if "policy" not in cell and "rollout_reuse" in config:  # an OpenRLHF run: its own arguments
        cell.update(policy=config["rollout_reuse"], lenience=config.get("lenience"))
    return series_from_scalars(scalars, folder, {k: v for k, v in cell.items() if v is not None})


def discover(root: Path) -> list[RunSeries]:
    """Every run under `root`: metrics.json files, folders holding TensorBoard event files, wandb run folders."""
    from . import wandb_logs

    runs: list[RunSeries] = []
    for path in sorted(root.rglob("metrics.json")):
        try:
            runs.extend(load_cpu_metrics(path))
        except (OSError, ValueError, KeyError) as error:
            logger.warning("skipping %s: %s", path, error)
    seen = {(run.name, run.group) for run in runs}
    logged = [
        (folder, load_tensorboard_run) for folder in sorted({p.parent for p in root.rglob("events.out.tfevents.*")})
    ]
    logged += [(folder, load_wandb_run) for folder in wandb_logs.run_folders(root)]
    for folder, load in logged:
        try:
            run = load(folder)
        except (OSError, ValueError) as error:
            logger.warning("skipping %s: %s", folder, error)
            continue
        if run is not None and (run.name, run.group) not in seen:
            runs.append(run)
    return runs
