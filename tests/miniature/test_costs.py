"""miniature/costs.py: the proposers' measured costs, cached per machine."""

import json
import time
from types import SimpleNamespace

import pytest

import specrl_openrlhf as sr
from specrl_openrlhf.miniature import costs


def test_an_older_or_corrupt_cost_file_is_not_read_and_prices_the_rule_as_unknown(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = costs.cache_root() / f"proposer_us-{costs.machine_key()}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"suffix": 54.5, "lossless": {"base_us": 613.0, "row_us": 3.1}}))  # suffix: old format
    assert costs.proposer_costs() == {"lossless": {"base_us": 613.0, "row_us": 3.1}}
    assert costs.rule_cost(sr.make("suffix")).proposer_us is None  # unknown: the figure is labelled optimistic
    lossless = costs.rule_cost(sr.make("lossless"))
    assert (lossless.proposer_base_us, lossless.proposer_us) == (613.0, 3.1)
    path.write_text("[1, 2")
    assert costs.proposer_costs() == {}


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
    monkeypatch.setattr(costs, "DEVICE_WORK", [])
    wrapped = costs.time_device_work(worker)
    assert wrapped == ["SimpleNamespace.forward", "SimpleNamespace.compute_logits", "SimpleNamespace.forward"]
    assert model.forward(1, x=2) == ("hidden", (1,), {"x": 2}) and model.compute_logits(3)[0] == "logits"
    with pytest.raises(RuntimeError):
        worker.model_runner.sampler.forward()
    assert len(costs.DEVICE_WORK) == 3 and all(t >= 0.009 for t in costs.DEVICE_WORK)
