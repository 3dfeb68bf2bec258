"""`--resume`: the groups an earlier quickstart run into the same folder finished, read back from its `metrics.json`
(`summary.write_outputs`), so that only the others are trained again."""

from __future__ import annotations

import json
from pathlib import Path


def finished_groups(out: Path, groups) -> set[str]:
    """With --resume: the groups whose runs all finished in an earlier run into `out` (their rows are taken over).
    Runs are matched by group and rule, not by label: labels change when the seeds or regimes given change."""
    path = out / "metrics.json"
    if not path.is_file():
        return set()
    earlier = json.loads(path.read_text())
    rows = {}
    for row in earlier.get("rows", []):
        rows.setdefault(row["run"], []).append(row)
    before = {info["name"]: info.get("acc_before") for info in earlier.get("runs", [])}
    names = {(info.get("group"), info.get("method")): info["name"] for info in earlier.get("runs", [])}
    done = set()
    for group in groups:
        last = group.regime.epochs - 1
        found = [names.get((group.key, run.method.name)) for run in group.runs]
        if all(
            name is not None and any(r["kind"] == "epoch" and r["epoch"] == last for r in rows.get(name, []))
            for name in found
        ):
            for run, name in zip(group.runs, found):
                run.rows = [dict(row, run=run.label) for row in rows[name]]
                run.accuracy_before = before.get(name)
            done.add(group.key)
    return done
