"""What an engine step pays besides its forward on a GPU, measured on this machine: the engine's host time per step
(on the tiny model: the step's time less the model's forward, logits and sampling, which a GPU runs; what async
scheduling hides and a model-free proposer, which turns it off, pays on top), and the proposers' own time a step
(`bench_at_scale.py` measures each, ours and vLLM's, driven as vLLM drives it). Cached per machine; how a rule's steps
are priced from them (`rule_cost`).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from ..step_curve import HostCurve

HOST_ROWS = (16, 64, 128, 256, 512)  # rows the host step curve is measured at
HOST_FORMAT = 2  # 2: the device's work (forward, logits, sampling) taken out of each step; 1: whole steps
DEVICE_WORK: list[float] = []  # seconds of each call `time_device_work` wrapped, in this process


def time_device_work(worker) -> list[str]:
    """In the engine's worker (`collective_rpc`, the engine core in this process): time every call of what a GPU
    would run, the model's forward and logits and the sampler, into `DEVICE_WORK`. Answers what it wrapped."""
    runner, wrapped = worker.model_runner, []
    for owner, name in ((runner.model, "forward"), (runner.model, "compute_logits"), (runner.sampler, "forward")):
        call = getattr(owner, name)

        def timed(*args, _call=call, **kwargs):
            start = time.perf_counter()
            try:
                return _call(*args, **kwargs)
            finally:
                DEVICE_WORK.append(time.perf_counter() - start)

        setattr(owner, name, timed)
        wrapped.append(f"{type(owner).__name__}.{name}")
    return wrapped


def measure_host_steps(rows=HOST_ROWS, progress=print) -> HostCurve:
    """The engine's host time per decoding step at each of `rows`, on the tiny model: the median of `LLMEngine.step`'s
    time less its forward, logits and sampling (a GPU's work), once every row decodes."""
    import tempfile

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from .engine import cpu_engine_kwargs, machine, use_cpu_engine_env
    from .tiny_model import build_tiny_model

    use_cpu_engine_env()
    multiprocessing = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process, as OpenRLHF's actors run it
    model = build_tiny_model(Path(tempfile.gettempdir()) / "specrl_host_steps", hidden_size=128, eos_logit=-5.0)
    llm = LLM(model=str(model), **cpu_engine_kwargs(max_model_len=256, max_num_seqs=max(rows), kv_cache_bytes=1 << 29))
    llm.collective_rpc(time_device_work)
    engine, points = llm.llm_engine, []
    for count in rows:
        params = SamplingParams(max_tokens=48, ignore_eos=True, temperature=1.0)
        for i in range(count):
            engine.add_request(f"host-{count}-{i}", TokensPrompt(prompt_token_ids=[5 + i % 50, 7, 9, 11] * 4), params)
        times = []
        while engine.has_unfinished_requests():
            DEVICE_WORK.clear()
            start = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - start - sum(DEVICE_WORK))
        steady = sorted(times[4:-4]) or sorted(times)
        points.append({"rows": count, "seconds": steady[len(steady) // 2]})
        progress(f"[host steps] {count} rows: {points[-1]['seconds'] * 1e3:.2f} ms a step")
    del llm
    if multiprocessing is not None:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = multiprocessing
    return HostCurve(points, machine())


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specrl_openrlhf" / "at_scale"


def machine_key() -> str:
    from .engine import machine

    return hashlib.sha256(machine().encode()).hexdigest()[:12]


def proposer_costs() -> dict[str, dict]:
    """Each model-free proposer's own time a step, `base_us` + `row_us` x rows, fitted on its steps when this bench
    last ran on this machine (empty where it has not): what the engine benchmarks price the proposers' steps at."""
    try:
        costs = json.loads((cache_root() / f"proposer_us-{machine_key()}.json").read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(costs, dict):
        return {}
    # an older file held a number a rule: not read (re-measured where bench_at_scale next runs)
    return {rule: fit for rule, fit in costs.items() if isinstance(fit, dict) and {"base_us", "row_us"} <= set(fit)}


def save_proposer_costs(costs: dict[str, dict]) -> None:
    path = cache_root() / f"proposer_us-{machine_key()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**proposer_costs(), **costs}, indent=1))


def rule_cost(policy):
    """How a rule's engine steps are priced besides their forward (`projection.RuleCost`): stock and the request path
    keep async scheduling; a proposer in the engine turns it off and runs at what `bench_at_scale.py` measured of the
    same proposer, driven as vLLM drives it, on this machine (`proposer_costs`; unknown where it has not run)."""
    from ..analysis.projection import RuleCost

    if not policy.verifies_in_engine:
        return RuleCost()
    method = getattr(policy.params, "speculative_config", {}).get("method", policy.name)
    fit = proposer_costs().get(method)
    return RuleCost(False, fit["row_us"], fit["base_us"]) if fit else RuleCost(False, None)


def host_curve(path: str | None, progress=print) -> HostCurve:
    """The host step curve of `path`, or measured here (once: cached per machine)."""
    if path:
        return HostCurve.load(path)
    cached = cache_root() / f"host_steps-v{HOST_FORMAT}-{machine_key()}.json"
    if cached.exists():
        return HostCurve.load(cached)
    curve = measure_host_steps(progress=progress)
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps(curve.as_data(), indent=1))
    return curve
