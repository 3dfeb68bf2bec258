"""OpenRLHF's own loggers for a quickstart run (`--tensorboard`, `--wandb offline`), as its trainer logs a cluster
run: what they write is what OpenRLHF's loggers write."""

from __future__ import annotations

import json
from pathlib import Path


def open_loggers(run, args, out: Path) -> None:
    """OpenRLHF's own TensorBoard and wandb loggers for a run, and the `cell.json` that tells the report its group."""
    import types

    described = run.describe()
    if args.tensorboard:
        from openrlhf.utils.logging_utils import TensorboardLogger

        folder = Path(args.tensorboard) / run.label
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "cell.json").write_text(json.dumps(described))
        logger_args = types.SimpleNamespace(tensorboard_dir=args.tensorboard, wandb=types.SimpleNamespace())
        logger_args.wandb.run_name = run.label
        run.loggers.append(TensorboardLogger(types.SimpleNamespace(logger=logger_args)))
    if args.wandb:
        run.loggers.append(DeferredWandbLogger(run.label, run.group, described))


class DeferredWandbLogger:
    """OpenRLHF's WandbLogger for one run, in wandb's offline mode (`--wandb offline`). That logger logs through
    wandb's one current run per process, and a group's runs train side by side, so each run's logs are kept and
    handed to a WandbLogger of its own when the run ends: what it writes is what OpenRLHF's logger writes."""

    def __init__(self, name: str, group: str, cell: dict):
        self.name, self.group, self.cell = name, group, cell
        self.calls: list[tuple[str, int, dict]] = []

    def log_train(self, step: int, logs: dict) -> None:
        self.calls.append(("log_train", step, dict(logs)))

    def log_eval(self, step: int, logs: dict) -> None:
        self.calls.append(("log_eval", step, dict(logs)))

    def close(self) -> None:
        import types

        from openrlhf.utils.logging_utils import WandbLogger

        wandb = types.SimpleNamespace(key=None, org=None, project="specrl-quickstart", group=self.group)
        wandb.run_name = self.name
        logger = WandbLogger(types.SimpleNamespace(logger=types.SimpleNamespace(wandb=wandb), **self.cell))
        for method, step, logs in self.calls:
            getattr(logger, method)(step, logs)
        logger.close()
