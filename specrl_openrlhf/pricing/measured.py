"""What an engine step pays besides its forward on a GPU, as measured on this machine and cached per machine: the
proposers' own time a step (`bench_at_scale.py` measures each, ours and vLLM's, driven as vLLM drives it), and the
engine's host time per step (`at_scale.host_steps` measures it on the tiny model). How a rule's steps are priced
from them (`rule_cost`). The package ships one host curve (`shipped_host_curve`): the one every published verdict
uses, measured on the machine it names, so that a verdict rerun anywhere prices the host alike.

The cache is `$SPECRL_MEASURE_CACHE` where set (the test suite points it at a folder of its own), else the user's
cache (`$XDG_CACHE_HOME/specrl_openrlhf/at_scale`). A cached host curve carries when and how it was taken (`taken`:
the time, the machine, the machine's load during it, the format); one older than `HOST_MAX_AGE_DAYS` or of another
format is not read, and is measured again. The machine is passed in (`miniature.engine.machine()` describes it): a
measurement is this machine's.

Core module: the standard library, numpy through its curves.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
from pathlib import Path

from .curves import HostCurve
from .projection import RuleCost

CACHE_ENV = "SPECRL_MEASURE_CACHE"
SHIPPED_HOST = Path(__file__).with_name("host_steps.json")
HOST_FORMAT = 3  # 3: `taken` recorded; 2: the device's work (forward, logits, sampling) taken out; 1: whole steps
HOST_MAX_AGE_DAYS = 30


def cache_root() -> Path:
    """Where measurements are cached: `$SPECRL_MEASURE_CACHE`, else the user's cache."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specrl_openrlhf" / "at_scale"


def machine_key(machine: str) -> str:
    return hashlib.sha256(machine.encode()).hexdigest()[:12]


def proposer_costs(machine: str) -> dict[str, dict]:
    """Each model-free proposer's own time a step, `base_us` + `row_us` x rows, fitted on its steps when
    bench_at_scale last ran on `machine` (empty where it has not): what the engine benchmarks price the proposers'
    steps at."""
    try:
        costs = json.loads((cache_root() / f"proposer_us-{machine_key(machine)}.json").read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(costs, dict):
        return {}
    # an older file held a number a rule: not read (re-measured where bench_at_scale next runs)
    return {rule: fit for rule, fit in costs.items() if isinstance(fit, dict) and {"base_us", "row_us"} <= set(fit)}


def save_proposer_costs(costs: dict[str, dict], machine: str) -> Path:
    path = cache_root() / f"proposer_us-{machine_key(machine)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**proposer_costs(machine), **costs}, indent=1))
    return path


def rule_cost(policy, machine: str) -> RuleCost:
    """How a rule's engine steps are priced besides their forward: stock and the request path keep async scheduling;
    a proposer in the engine turns it off and runs at what bench_at_scale measured of the same proposer, driven as
    vLLM drives it, on `machine` (`proposer_costs`; `proposer_us=None` where it has not: named missing)."""
    if not policy.verifies_in_engine:
        return RuleCost()
    method = getattr(policy.params, "speculative_config", {}).get("method", policy.name)
    fit = proposer_costs(machine).get(method)
    return RuleCost(False, fit["row_us"], fit["base_us"]) if fit else RuleCost(False, None)


def shipped_host_curve() -> HostCurve:
    """The host step curve shipped with the package (`SHIPPED_HOST`), measured on the machine it names."""
    return HostCurve.load(SHIPPED_HOST)


def host_cache_path(machine: str) -> Path:
    return cache_root() / f"host_steps-{machine_key(machine)}.json"


def taken_now(machine: str, load: float | None) -> dict:
    """`taken` for a host curve measured just now on `machine`, the 1-minute load average `load` during it."""
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return {"time": now, "machine": machine, "load": load, "format": HOST_FORMAT}


def cached_host_curve(machine: str, now: datetime.datetime | None = None) -> tuple[HostCurve | None, str]:
    """`machine`'s cached host curve, or None and why not (none, unreadable, another format, too old)."""
    path = host_cache_path(machine)
    if not path.is_file():
        return None, f"no host curve cached at {path}"
    try:
        curve = HostCurve.load(path)
    except ValueError as error:
        return None, f"{error}"
    taken = curve.taken
    if taken.get("format") != HOST_FORMAT:
        return None, f"{path} is of format {taken.get('format')}, not {HOST_FORMAT}"
    try:
        when = datetime.datetime.fromisoformat(str(taken.get("time")))
    except ValueError:
        return None, f"{path} does not say when it was measured"
    age = (now or datetime.datetime.now(datetime.timezone.utc)) - when
    if age > datetime.timedelta(days=HOST_MAX_AGE_DAYS):
        return None, f"{path} was measured {age.days} days ago (more than {HOST_MAX_AGE_DAYS})"
    return curve, f"cached at {path}"


def save_host_curve(curve: HostCurve, machine: str) -> HostCurve:
    """Cache `curve` (with its `taken`) as `machine`'s; the curve as read back from its file."""
    path = host_cache_path(machine)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(curve.as_data(), indent=1))
    return HostCurve.load(path)
