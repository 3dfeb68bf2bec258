"""The engine's host time per step, measured on this machine on the tiny model: the step's time less the model's
forward, logits and sampling, which a GPU runs (what async scheduling hides and a model-free proposer, which turns it
off, pays on top). Measured once per machine and cached with when and how it was taken (`pricing.measured`); every
benchmark prints which measurement it used (`HostCurve.describe`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ..pricing import measured
from ..pricing.curves import HostCurve

HOST_ROWS = (16, 64, 128, 256, 512)  # rows the host step curve is measured at
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

    from ..miniature.engine import cpu_engine_kwargs, machine, use_cpu_engine_env
    from ..miniature.tiny_model import build_tiny_model

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
    load = os.getloadavg()[0]  # the last minute's: the measurement's
    del llm
    if multiprocessing is not None:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = multiprocessing
    return HostCurve(points, machine(), "measured here", measured.taken_now(machine(), load))


def host_curve(path: str | None, progress=print, cache: bool = True) -> HostCurve:
    """The host step curve of `path`; else this machine's cached one (`pricing.measured`), or measured here and
    cached (`cache=False`: measured, and not written to the cache). `progress` gets which one it is."""
    if path:
        curve = HostCurve.load(path)
        progress(f"[host steps] {curve.describe()}")
        return curve
    from ..miniature.engine import machine

    here = machine()
    curve, why = measured.cached_host_curve(here) if cache else (None, "not read: cache=False")
    if curve is None:
        progress(f"[host steps] measuring on the tiny model ({why})")
        curve = measure_host_steps(progress=progress)
        if cache:
            curve = measured.save_host_curve(curve, here)
    progress(f"[host steps] {curve.describe()}")
    return curve
