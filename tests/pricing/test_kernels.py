"""The kernel step model (`pricing.kernels`): aiconfigurator's own step sums reproduced from our tables, the attention
bounds of a verification step ordered, the data that travels, and the errors of a bad name or a missing library."""

import json
import sys

import numpy as np
import pytest

from specrl_openrlhf.pricing import kernels, linear
from specrl_openrlhf.pricing.kernels import KernelStepModel


@pytest.fixture(scope="module")
def engine():
    """aiconfigurator's own engine for Qwen3-1.7B on H200 (its bundled config, not ours)."""
    pytest.importorskip("aiconfigurator_core")
    from aiconfigurator_core.sdk.engine import EngineHandle

    return EngineHandle.compile("Qwen/Qwen3-1.7B", "h200_sxm", "vllm", backend_version="0.24.0", tp_size=1)


@pytest.fixture(scope="module")
def once():
    pytest.importorskip("aiconfigurator_core")
    return KernelStepModel.build("h200", "qwen3-1.7b")


@pytest.fixture(scope="module")
def per_token():
    pytest.importorskip("aiconfigurator_core")
    return KernelStepModel.build("h200", "qwen3-1.7b", "per_token")


@pytest.mark.parametrize("rows,isl", [(32, 512), (128, 512), (512, 512), (128, 4096)])
def test_one_token_steps_reproduce_aiconfigurators_decode_step(engine, once, rows, isl):
    osl = 2  # its decode step reads isl + osl // 2 + 1 keys a row: the cache (isl + osl // 2) and the new token
    assert once.time(rows, 1, isl + osl // 2) * 1e3 == pytest.approx(
        engine.decode_step_latency(rows, isl, osl), rel=0.05
    )


def test_a_four_token_step_is_the_dense_ops_at_rows_x_4_and_one_cache_read(engine, once):
    names = [op[0] for op in engine.decode_step_per_op(1, 1, 2)]
    dense = [i for i, name in enumerate(names) if name != "generation_attention"]
    gemms = sum(op[1] for op in engine.evaluate_generation_ops(dense, batch_size=512, s=1))
    attention = engine.evaluate_generation_ops([names.index("generation_attention")], batch_size=128, s=4100)[0][1]
    assert once.time(128, 4, 4096) * 1e3 == pytest.approx(gemms + attention, rel=0.03)


def test_the_logits_gemm_past_the_measured_widths_is_near_aiconfigurators_own(engine, once):
    index = [op[0] for op in engine.decode_step_per_op(1, 1, 2)].index("generation_logits_gemm")
    for m in (1, 128, 512, 4096):
        own = engine.evaluate_generation_ops([index], batch_size=m, s=1)[0][1] / 1e3
        assert np.interp(m, once.tokens, once.logits) == pytest.approx(own, rel=0.06)


def test_a_prefill_only_step_is_the_fixed_cost_and_the_prefill(engine, once):
    for tokens in (64, 512, 3000):
        step = once.time(0, 1, 0) + once.prefill_cost(tokens)
        assert step * 1e3 == pytest.approx(engine.predict_prefill_latency(1, tokens), rel=0.05)
    assert once.prefill_cost(0, 128, 512) == 0.0
    assert 0 < once.prefill_cost(256, 128) < once.prefill_cost(2048, 128)


def test_prefills_of_several_sequences_share_one_launch_and_prompt_logprobs_pay_the_logits(once):
    one = once.prefill_cost(400, 0, 0)
    # 20 prompts of 400 tokens: twenty times one's attention less 19 launches' fixed cost, and its dense ops at 8,000
    fixed = np.interp(1, once.prefill_tokens, once.prefill[:, 0])
    dense = np.interp(8000, once.tokens, once.layers) - np.interp(0, once.tokens, once.layers)
    attention = 20 * (one - (np.interp(400, once.tokens, once.layers) - once.layers[0])) - 19 * fixed
    assert once.prefill_cost(8000, 0, 0, sequences=20) == pytest.approx(dense + attention, rel=1e-6)
    assert once.prefill_cost(8000, 0, 0, sequences=20) < once.prefill_cost(8000, 0, 0)  # no 8,000-token square
    assert once.logits_cost(0) == 0.0 and 0 < once.logits_cost(256) < once.logits_cost(4096)
    assert once.logits_cost(4096) == pytest.approx(
        np.interp(4096, once.tokens, once.logits) - once.logits[0], rel=1e-9
    )


def test_time_grows_with_context_and_rows(once, per_token):
    for model in (once, per_token):
        for tokens in (1, 4):
            assert np.all(np.diff(model.time(128, tokens, [0, 512, 2048, 8192, 32768])) > 0)
            assert np.all(np.diff(model.time([1, 8, 32, 128, 512, 2048], tokens, 1024)) > 0)


def test_the_once_bound_lies_between_one_token_and_per_token(once, per_token):
    rows, context = np.meshgrid([8, 32, 128, 512], [256, 1024, 4096, 16384])
    for tokens in (2, 4, 9):
        low, high = once.time(rows, tokens, context), per_token.time(rows, tokens, context)
        assert np.all(once.time(rows, 1, context) < low) and np.all(low <= high)
    assert once.time(rows, 1, context) == pytest.approx(per_token.time(rows, 1, context))  # one token: one read


def test_scalars_give_floats_and_arrays_broadcast(once):
    assert isinstance(once.time(128, 1, 512), float) and isinstance(once.prefill_cost(512, 128), float)
    assert once.time([32, 64], [[1], [4]], 512).shape == (2, 2)
    assert once.prefill_cost([0, 512], 64, [0, 1024]).shape == (2,)
    with pytest.raises(ValueError, match="context"):
        once.time(128, 1)


def test_the_data_round_trip_gives_the_same_times(once, per_token):
    for model in (once, per_token):
        back = KernelStepModel.from_data(json.loads(json.dumps(model.as_data())), "model.json")
        rows, tokens, context = np.meshgrid([0, 3, 100, 700, 5000], [1, 2.5, 9], [0, 700, 50000])
        assert np.array_equal(back.time(rows, tokens, context), model.time(rows, tokens, context))
        assert np.array_equal(
            back.prefill_cost(tokens * 100, rows, context), model.prefill_cost(tokens * 100, rows, context)
        )
        assert (back.device, back.model, back.attention, back.source) == (
            "NVIDIA H200",
            "qwen3-1.7b",
            model.attention,
            model.source,
        )
        assert back.kv_capacity_tokens == model.kv_capacity_tokens > 0
    assert once.source == "aiconfigurator-core 0.12.0, vLLM 0.24.0 kernels"


def test_bad_data_is_one_error_naming_its_source(once):
    with pytest.raises(ValueError, match="model.json: not a kernel step model"):
        KernelStepModel.from_data({"device": "x"}, "model.json")
    with pytest.raises(ValueError, match="model.json"):
        KernelStepModel.from_data([], "model.json")
    bad = once.as_data()
    bad["decode_attention"]["seconds"][0][0] = float("nan")
    with pytest.raises(ValueError, match="model.json: .*finite"):
        KernelStepModel.from_data(bad, "model.json")


def test_kv_capacity_is_the_memory_left_over_the_cache_per_token():
    params = 8_190_735_360  # Qwen3-8B's published parameter count
    memory = 80 * 2**30
    expected = (0.9 * memory - 2 * params - kernels.RESERVE_BYTES) // (2 * 36 * 8 * 128 * 2)
    assert kernels.kv_capacity_tokens("qwen3-8b", memory) == expected
    assert kernels.kv_capacity_tokens("qwen3-14b", 16 * 2**30) == 0  # its weights do not fit


@pytest.mark.parametrize(
    "kwargs,flag", [({"gpu": "a100"}, "gpu 'a100'"), ({"model": "llama"}, "model 'llama'"), ({"attention": "x"}, "x")]
)
def test_bad_names_are_one_error_with_the_choices(kwargs, flag):
    with pytest.raises(ValueError, match=flag) as error:
        KernelStepModel.build(**{"gpu": "h200", "model": "qwen3-8b", **kwargs})
    assert any(
        choice in str(error.value) for choice in ("h100, h200, b200", "qwen3-1.7b, qwen3-8b", "once, per_token")
    )


def test_without_aiconfigurator_build_says_how_to_install(monkeypatch):
    for name in [name for name in sys.modules if name.startswith("aiconfigurator_core")] + ["aiconfigurator_core"]:
        monkeypatch.setitem(sys.modules, name, None)  # makes its imports fail, where earlier tests loaded it too
    monkeypatch.setattr(kernels, "_tables", kernels._tables.__wrapped__)  # past the in-process cache
    with pytest.raises(ModuleNotFoundError) as error:
        KernelStepModel.build("h200", "qwen3-1.7b")
    message = str(error.value)
    assert "\n" not in message and "pip install 'specrl-openrlhf[pricing]'" in message


@pytest.fixture(scope="module")
def h100_8b():
    pytest.importorskip("aiconfigurator_core")
    return KernelStepModel.build("h100", "qwen3-8b")


def test_short_prefills_after_a_long_context_pay_at_least_reading_it(h100_8b):
    """32 sequences x 16 tokens after 8,192 cached each read 32 x 8,192 tokens' keys and values (Qwen3-8B: 36 layers x
    8 KV heads x 128 x 2 x 2 bytes a token) from an H100's 3.35 TB/s at least; at context 0 they read none."""
    read = 32 * 8192 * (36 * 8 * 128 * 2 * 2) / 3.35e12
    after = h100_8b.prefill_cost(512, 0, 8192, sequences=32)
    assert after >= read > h100_8b.prefill_cost(512, 0, 0, sequences=32)
    assert h100_8b.prefill_cost(16, 0, 32768) > h100_8b.prefill_cost(16, 0, 0)  # one chunk after a long prompt too


def test_a_prefill_beside_a_verification_step_adds_its_dense_ops_past_the_decode_tokens(once):
    """256 rows x 4 tokens carry 1,024 tokens through the dense ops: 512 prefill tokens beside them cost the dense ops
    from 1,024 to 1,536 tokens, not from 256 to 768."""

    def dense(m):
        return np.interp(m, once.tokens, once.layers)

    verification = once.prefill_cost(512, 256, 0, carried=1024)
    one_token = once.prefill_cost(512, 256, 0)  # one token a row: the rows' tokens
    assert one_token == once.prefill_cost(512, 256, 0, carried=256)
    assert verification - one_token == pytest.approx((dense(1536) - dense(1024)) - (dense(768) - dense(256)), rel=1e-9)


def test_a_budget_needs_the_context_as_time_does(once):
    with pytest.raises(ValueError, match="context"):
        once.budget_cost(16, 8)
    base, per_row, per_token = once.budget_cost(16, 8, 1024.0)
    assert base + per_token * 16 == pytest.approx(once.time(128, 1, 1024))  # a one-token step at rows x scale


def test_a_budget_read_off_each_stretchs_line_is_the_price_itself(once, per_token):
    """`budget_cost` prices each stretch of contexts at its ends once: everywhere (below the KV grid, on its points,
    past its end, at both attention bounds, with a host's time) it is `linear.budget_cost` itself."""
    rng = np.random.default_rng(0)
    hosted = once.with_host(kernels.HostCurve([{"rows": 1, "seconds": 0.002}, {"rows": 512, "seconds": 0.006}]))
    for model in (once, per_token, hosted):
        points = model._budget_points
        for context in [*rng.uniform(-10, 70000, 300), *points, 0.0, 1e6]:
            rows, scale = int(rng.integers(1, 600)), int(rng.choice([1, 8]))
            direct = linear.budget_cost(model, rows, scale, context, kernels.BUDGET_TOKENS)
            np.testing.assert_allclose(model.budget_cost(rows, scale, context), direct, rtol=1e-8, atol=1e-15)


def test_the_other_attention_bound_is_the_same_tables_priced_per_token(once, per_token):
    upper = once.with_attention("per_token")
    rows, tokens, context = np.meshgrid([8, 128, 512], [1, 4, 9], [256, 4096])
    np.testing.assert_array_equal(upper.time(rows, tokens, context), per_token.time(rows, tokens, context))
    assert upper.attention == "per_token" and once.attention == "once" and upper.source == once.source
    with pytest.raises(ValueError, match="once, per_token"):
        once.with_attention("twice")
