"""What the quickstart's `lossless` budget prices a draft slot on (`--draft-price`), so that a seed's tokens are the
seed's.

Terminology:
- *modelled step* (`STEP_MODEL`, the default `model`): the quickstart's CPU engine step as a line, t = base + per_row x
  rows + per_token x tokens carried, shipped as a step curve (`pricing.curves.StepCurve` data, read as `cost_curve`):
  the line the budget fitted to its own engine's steps in a quickstart run (`fit_step_model`), on the machine the file
  names. Every run prices alike, so which slots a step drafts depends on the seed's tokens alone.
- *measured* (`measured`): the engine's own steps, timed as they run (`pricing.online.OnlineStepCost` and the drafting
  check), as on a real engine. The budget then reads this machine's wall clock, whose noise (the other runs' engines
  and the trainer on the same cores) moves what it drafts, and the decoded tokens with it, from run to run.
- A GPU's step curve (`--cost-curve FILE`) prices slots as that GPU would, whichever of the two is chosen.

Time stays this machine's in every case: the rollout times and their ratio move from run to run.

`python -m specrl_openrlhf.miniature.draft_price runs/quickstart` writes the file from a run's metrics
(`fit_step_model`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

STEP_MODEL = Path(__file__).with_name("quickstart_step.json")
DRAFT_PRICES = ("model", "measured")
GRID_ROWS, GRID_TOKENS = (1, 64), (1, 17)  # the curve's grid: linear in rows and tokens, exact between its points
FITTED = ("step_base_ms", "step_row_ms", "step_token_ms")  # the budget's step cost, as its runs report it


def step_curve(base_ms: float, row_ms: float, token_ms: float, device: str) -> dict:
    """A step curve's data (`StepCurve.from_data`) that prices every step on the line base + row x rows + token x
    rows x tokens per row (ms): bilinear, as the curve interpolates, so the curve is the line itself."""
    if not (base_ms > 0 and row_ms >= 0 and token_ms >= 0):
        raise ValueError(f"a step model needs base > 0 and costs >= 0 (ms), got {base_ms}, {row_ms}, {token_ms}")
    points = [
        {"rows": rows, "tokens": tokens, "seconds": 1e-3 * (base_ms + row_ms * rows + token_ms * rows * tokens)}
        for rows in GRID_ROWS
        for tokens in GRID_TOKENS
    ]
    return {"device": device, "curve": points, "fit": {"base_ms": base_ms, "row_ms": row_ms, "token_ms": token_ms}}


def fit_step_model(metrics: Path, run: str = "lossless") -> dict:
    """The modelled step from a quickstart run's `metrics.json`: the budget's own fit of its engine's steps
    (`reuse/step_*_ms`, each step's mean over its samples) averaged over the run's last epoch, with where and when it
    was taken."""
    recorded = json.loads(Path(metrics).read_text())
    rows = [r for r in recorded["rows"] if r.get("kind") == "step" and r.get("run") == run]
    if not rows or not all(key in rows[-1] for key in FITTED):
        raise ValueError(f"{metrics}: no steps of {run!r} with the budget's step cost ({', '.join(FITTED)})")
    last = [r for r in rows if r["epoch"] == rows[-1]["epoch"]]
    base, row, token = (sum(r[key] for r in last) / len(last) for key in FITTED)
    from .engine import machine

    where = machine()
    data = step_curve(base, row, token, f"the quickstart's CPU engine (tiny Qwen3), modelled on {where}")
    taken = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    seeds = sorted({info.get("seed") for info in recorded["runs"] if info.get("name") == run})
    data["taken"] = {"time": taken, "machine": where, "run": run, "seeds": seeds, "last_epoch_steps": len(last)}
    return data


def describe(choice: str, cost_curve: str | None) -> str:
    """One line on what `lossless` prices draft slots on, and so whether a rerun drafts the same."""
    if cost_curve:
        return f"lossless prices draft slots on {cost_curve}: a seed drafts the same on every run"
    if choice == "measured":
        return (
            "lossless prices draft slots on this engine's own steps as they run (--draft-price measured): what it "
            "drafts, and so its decoded tokens, move with this machine's noise from run to run"
        )
    fit = json.loads(STEP_MODEL.read_text())["fit"]
    line = f"{fit['base_ms']:.2f} ms + {fit['row_ms']:.3f} ms a row + {fit['token_ms']:.3f} ms a carried token"
    return (
        f"lossless prices draft slots on a modelled step of this CPU engine ({line}, {STEP_MODEL.name}): a seed "
        "drafts the same on every run (--draft-price measured: on the engine's own steps, as on a real engine)"
    )


def budgeted(config) -> bool:
    """Whether a rule's config (`ReuseConfig`) drafts under our budget: `lossless` verified in the engine."""
    return config.policy == "lossless" and config.params.get("verify", "engine") == "engine"


def reproduces(choice: str, cost_curve: str | None, runs) -> str:
    """The summary's line on what a rerun of the same seed gives again (decoded tokens) and what it does not (time),
    for `runs` (`plan.Run`s) under `--draft-price choice` and `--cost-curve`."""
    time = "rollout times are this machine's wall clock and move from run to run (the ± above)"
    if choice == "measured" and not cost_curve and any(budgeted(run.method.config) for run in runs):
        return (
            "what reproduces: not lossless's decoded tokens, priced on this engine's own steps (--draft-price "
            f"measured): what it drafts moves with this machine's noise; {time}"
        )
    return f"what reproduces: decoded tokens, the seed's (a rerun gives its token ratios within a few %); {time}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Write the quickstart's modelled step from a run's metrics.")
    parser.add_argument("out", help="a quickstart output folder (its metrics.json) with a lossless run")
    parser.add_argument("--run", default="lossless", help="the run whose budget's fit is taken (default: lossless)")
    parser.add_argument("--to", default=str(STEP_MODEL), help=f"where to write it (default: {STEP_MODEL})")
    args = parser.parse_args(argv)
    data = fit_step_model(Path(args.out) / "metrics.json", args.run)
    Path(args.to).write_text(json.dumps(data, indent=1) + "\n")
    print(f"{args.to}: {data['fit']} ({data['device']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
