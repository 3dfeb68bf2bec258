"""An engine without CUDA graphs (`pricing.eager`): a step's launches beside its kernels and what is exposed, each
constant from its source; the kernel model that carries it, the whole step it prices in a projection and the draft
budget's linear model."""

import numpy as np
import pytest

from specrl_openrlhf.pricing import linear
from specrl_openrlhf.pricing.eager import EagerLaunches
from specrl_openrlhf.pricing.kernels import MODELS, KernelStepModel
from specrl_openrlhf.pricing.projection import Pricing, step_costs


@pytest.fixture(scope="module")
def graphs():
    pytest.importorskip("aiconfigurator_core")
    return KernelStepModel.build("h100", "qwen3-8b")


def test_each_constant_is_its_sources_figure():
    eager = EagerLaunches(layers=32)  # Llama 3.1 8B, vLLM PR #10058's model
    # vLLM PR #10058: 1.26 s without CUDA graphs against 1.04 s with, 128 steps: 1.72 ms a step, all exposed there
    assert eager.exposed_s * 1e3 == pytest.approx((1.26 - 1.04) / 128 * 1e3)
    assert eager.launches == 12 * 32 + 2 and eager.launch_us == 5.0  # counted in qwen3.py; vllm-omni PR #6516
    # DeepSpeed PR #8271: 1,300 launches in a 5.22 ms step (OPT-1.3B, H100): 4.0 µs each, the same order as ours
    assert 5.22e-3 / 1300 == pytest.approx(eager.launch_us * 1e-6, rel=0.25)


def test_a_step_takes_the_longer_of_its_kernels_and_launches_plus_what_is_exposed():
    eager = EagerLaunches(layers=36)  # Qwen3-8B: 434 launches, 2.17 ms; 1.93 ms exposed
    assert eager.step(0.010) == pytest.approx(0.010 + eager.exposed_s)  # kernel-bound: the launches run ahead
    assert eager.step(0.001) == pytest.approx(eager.launch_s + eager.exposed_s)  # launch-bound
    steps = eager.step(np.array([0.001, 0.010]))
    assert steps.shape == (2,) and steps[0] == pytest.approx(eager.step(0.001))
    # a verification step carries more tokens but launches the same kernels: the same launches, the same exposure
    assert eager.step(0.012) - 0.012 == pytest.approx(eager.step(0.010) - 0.010)
    with pytest.raises(ValueError, match="layers must be a positive integer"):
        EagerLaunches(layers=0)
    with pytest.raises(ValueError, match="not an eager launch model"):
        EagerLaunches.from_data({"layers": 36, "launches": 3}, "the file")


def test_at_the_measured_points_the_model_reads_as_the_sources_did(graphs):
    """vLLM PR #10058's point (8B, batch 8) is kernel-bound on an H100, so its whole difference is exposed; at a
    rollout's batch the same 1.9 ms is a few percent (NeMo-RL PR #498: about 3% at a large rollout batch; PR #116:
    10-15% at 8B's generation), far more at one row (SGLang PR #1401: 8.23 ms eager against 7.35 ms at batch 1)."""
    eager = graphs.with_eager(True).eager
    assert eager.layers == MODELS["qwen3-8b"]["layers"] == 36
    assert graphs.time(8, 1, 96) > eager.launch_s  # kernel-bound at the calibration point
    share = {rows: eager.step(graphs.time(rows, 1, 2048)) / graphs.time(rows, 1, 2048) - 1 for rows in (1, 128, 512)}
    assert share[512] < 0.05 < share[128] < 0.15 < share[1]


def test_the_kernel_model_carries_it_to_a_whole_steps_price_and_the_budget(graphs):
    eager = graphs.with_eager(True)
    assert eager.with_eager(False).eager is None and graphs.eager is None
    assert KernelStepModel.from_data(eager.as_data()).eager == eager.eager  # it travels with the model's data
    assert eager.with_host(None).eager == eager.eager and eager.with_attention("per_token").eager == eager.eager
    assert eager.time(128, 1, 1024) == graphs.time(128, 1, 1024)  # the kernels alone: a step is priced whole
    rows, tokens, prefill = np.array([128, 0, 0]), np.array([128 * 5, 0, 0]), np.array([512, 512, 0])
    context = np.array([128 * 1024, 0, 0])
    graph_costs = step_costs(rows, tokens, prefill, Pricing(graphs), decode_context=context)
    eager_costs = step_costs(rows, tokens, prefill, Pricing(eager), decode_context=context)
    served = np.array([True, True, False])  # a decoding step with a prefill, a prefill alone, nothing
    assert np.allclose(eager_costs.gpu[served], eager.eager.step(graph_costs.gpu[served]))
    assert eager_costs.gpu[2] == graph_costs.gpu[2] == 0.0
    # the draft budget's fixed cost a step grows by what is exposed, its token slope stays the kernels'
    graph_budget = linear.budget_cost(graphs, 128, 1, 1024.0, (1.0, 5.0))
    eager_budget = linear.budget_cost(eager, 128, 1, 1024.0, (1.0, 5.0))
    assert eager_budget[0] - graph_budget[0] == pytest.approx(eager.eager.exposed_s)
    assert eager_budget[2] == pytest.approx(graph_budget[2])
    assert eager.budget_cost(128, 1, 1024.0)[0] == pytest.approx(eager_budget[0])


def test_doctests():
    import doctest

    from specrl_openrlhf.pricing import eager

    assert doctest.testmod(eager).failed == 0
