"""at_scale/host_steps.py: the host's time per step, measured once per machine (the device's work timed out of each
step), cached with when and how it was taken, and named wherever it is used."""

import json
import time
from types import SimpleNamespace

import pytest

from specrl_openrlhf.at_scale import host_steps
from specrl_openrlhf.miniature import engine
from specrl_openrlhf.pricing import measured
from specrl_openrlhf.pricing.curves import HostCurve

POINTS = [{"rows": 16, "seconds": 0.001}, {"rows": 64, "seconds": 0.002}]


def test_the_device_work_a_host_step_leaves_out_is_timed_where_the_worker_runs_it(monkeypatch):
    """The host curve takes each step's forward, logits and sampling out (a GPU's part): every call is timed, answers
    as before, and is timed even when it raises."""

    def slow(answer):
        def call(*args, **kwargs):
            time.sleep(0.01)
            if answer is None:
                raise RuntimeError("sampler failed")
            return answer, args, kwargs

        return call

    model = SimpleNamespace(forward=slow("hidden"), compute_logits=slow("logits"))
    worker = SimpleNamespace(model_runner=SimpleNamespace(model=model, sampler=SimpleNamespace(forward=slow(None))))
    monkeypatch.setattr(host_steps, "DEVICE_WORK", [])
    wrapped = host_steps.time_device_work(worker)
    assert wrapped == ["SimpleNamespace.forward", "SimpleNamespace.compute_logits", "SimpleNamespace.forward"]
    assert model.forward(1, x=2) == ("hidden", (1,), {"x": 2}) and model.compute_logits(3)[0] == "logits"
    with pytest.raises(RuntimeError):
        worker.model_runner.sampler.forward()
    assert len(host_steps.DEVICE_WORK) == 3 and all(t >= 0.009 for t in host_steps.DEVICE_WORK)


def test_the_host_curve_is_measured_once_cached_with_when_and_named(tmp_path, monkeypatch):
    monkeypatch.setenv(measured.CACHE_ENV, str(tmp_path))
    measurements = []

    def measure(progress=print):
        measurements.append(1)
        return HostCurve(POINTS, engine.machine(), "measured here", measured.taken_now(engine.machine(), 0.5))

    monkeypatch.setattr(host_steps, "measure_host_steps", measure)
    said = []
    first = host_steps.host_curve(None, said.append)
    assert len(measurements) == 1 and first.source == str(measured.host_cache_path(engine.machine()))
    assert "measuring on the tiny model (no host curve cached" in said[0] and "measured 20" in said[-1]
    again = host_steps.host_curve(None, said.append)
    assert len(measurements) == 1 and again.taken == first.taken and said[-1].startswith(f"[host steps] {tmp_path}")
    # another format is measured again; `cache=False` measures and writes nothing
    path = measured.host_cache_path(engine.machine())
    path.write_text(json.dumps({"machine": "x", "points": POINTS}))
    host_steps.host_curve(None, said.append, cache=False)
    assert len(measurements) == 2 and "taken" not in json.loads(path.read_text())
    host_steps.host_curve(None, said.append)
    assert len(measurements) == 3 and json.loads(path.read_text())["taken"]["format"] == measured.HOST_FORMAT
    given = tmp_path / "given.json"
    given.write_text(json.dumps({"machine": "elsewhere", "points": POINTS}))
    assert host_steps.host_curve(str(given), said.append).machine == "elsewhere" and len(measurements) == 3
    assert said[-1] == f"[host steps] {given}, when unknown on elsewhere"
