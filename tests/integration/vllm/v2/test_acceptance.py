"""The acceptance model on the device (`vllm.v2.acceptance`) is the core's (`budget.AcceptanceModel`): the same
verdicts give the same table, and its sums do not depend on the order of a step's verdicts (every tensor-parallel rank
keeps the same model)."""

import numpy as np
import torch

from specrl_openrlhf.budget import SHAPE, AcceptanceModel
from specrl_openrlhf.integration.vllm.v2.acceptance import DeviceAcceptance


def test_one_verdict_a_step_gives_the_cores_table():
    rng = np.random.default_rng(0)
    core, device = AcceptanceModel(half_life=50.0), DeviceAcceptance("cpu", half_life=50.0)
    buckets = rng.integers(0, int(np.prod(SHAPE)), 400)
    hits = rng.random(400) < 0.7
    for b, hit in zip(buckets, hits):
        core.observe(np.array([b]), np.array([hit]))
        device.observe(torch.tensor([int(b)]), torch.tensor([True]), torch.tensor([bool(hit)]))
    assert np.allclose(device.table.numpy(), core.table, atol=1e-6)


def test_a_steps_verdicts_sum_alike_in_any_order_and_unjudged_slots_count_for_nothing():
    rng = np.random.default_rng(1)
    buckets = torch.as_tensor(rng.integers(0, 50, 200))
    judged, hit = torch.as_tensor(rng.random(200) < 0.8), torch.as_tensor(rng.random(200) < 0.5)
    order = torch.as_tensor(rng.permutation(200))
    first, second = DeviceAcceptance("cpu"), DeviceAcceptance("cpu")
    first.observe(buckets, judged, hit)
    second.observe(buckets[order], judged[order], hit[order])
    assert torch.equal(first.table, second.table) and torch.equal(first.fine, second.fine)
    assert float(first.fine[:, 1].sum() / first.weight) == float(judged.sum())
