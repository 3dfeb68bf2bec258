"""A step price of either kind from its data (`pricing.prices`), and a price at a verification step's attention
bound."""

import json
from pathlib import Path

import pytest

from specrl_openrlhf.pricing.curves import StepCurve
from specrl_openrlhf.pricing.kernels import KernelStepModel
from specrl_openrlhf.pricing.prices import at_attention, load_price

H200 = Path(__file__).resolve().parents[2] / "docs" / "gpu_step_h200.json"
# the smallest kernel step model: every table 2 x 2
KERNELS = {
    "device": "NVIDIA H100",
    "model": "qwen3-8b",
    "attention": "once",
    "kv_capacity_tokens": 1000,
    "dense": {"tokens": [1, 100], "layers": [0.001, 0.002], "logits": [0.0001, 0.0002]},
    "decode_attention": {"rows": [0, 100], "kv": [1, 1000], "seconds": [[0.0, 0.0], [0.001, 0.01]]},
    "prefill_attention": {"tokens": [1, 100], "context": [0, 1000], "seconds": [[0.001, 0.001], [0.002, 0.003]]},
}


def test_either_kind_loads_from_its_data_or_file(tmp_path):
    assert isinstance(load_price(H200), StepCurve) and load_price(H200).source == str(H200)
    (tmp_path / "model.json").write_text(json.dumps(KERNELS))
    model = load_price(tmp_path / "model.json")
    assert isinstance(model, KernelStepModel) and model.time(10, 1, 100) > 0
    with pytest.raises(ValueError, match="bad.json: not a step curve"):
        load_price({"points": []}, "bad.json")
    with pytest.raises(ValueError, match="no such step curve file"):
        load_price(tmp_path / "missing.json")


def test_a_price_at_an_attention_bound():
    model = KernelStepModel.from_data(KERNELS, "model.json")
    upper = at_attention(model, "per_token")
    assert upper.attention == "per_token" and upper.time(50, 4, 500) > model.time(50, 4, 500)
    curve = load_price(H200)
    assert at_attention(curve, "per_token") is curve  # a measured curve ran its GPU's one
    with pytest.raises(ValueError, match="unknown attention 'twice': choose one of once, per_token"):
        at_attention(curve, "twice")
