"""`python -m specrl_openrlhf.grid GRID.yaml`: an ablation grid, one training run per cell (`grid`, read by
`grid_file`).

`--seeds 0,1,2` replaces the file's seeds. `--dry-run` prints one command per cell, `--emit ray-job` one `ray job
submit` per cell; otherwise the cells run here one after another, each in its own folder with its log, `cell.json`
and metrics, and a rerun skips the cells that finished. `python -m specrl_openrlhf.report OUT` then prints the
paper's tables.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

from .grid import Grid, GridError
from .grid_file import flag_words, load_grid, parse_seeds

DONE_FILE = "done.json"


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
            grid = grid.with_seeds(parse_seeds(args.seeds))
        if extra:
            flag_words(extra, "flags after --", grid.runner)
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
