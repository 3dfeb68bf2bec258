"""The generator (`integration.rollout.generator`): one driver per rule, stock generation for `off`, and sampling
settings checked before anything is sent."""

import pytest

import specrl_openrlhf as sr
from tests.helpers import PROMPTS, generator, params, rollout

pytestmark = pytest.mark.engine
vllm = pytest.importorskip("vllm")


def test_off_is_stock_generation(async_engine):
    gen = generator(async_engine[0], sr.make("off"))
    for _ in range(2):
        batch = rollout(async_engine, gen, PROMPTS[:2], params(n=3))
        assert batch.stats.drafts_found == 0 and batch.stats.samples == 6 and batch.stats.fallbacks == 0
    assert len(gen.store.cache) == 0


def test_unsupported_sampling_fails_at_start(async_engine):
    with pytest.raises(sr.UnsupportedSamplingError, match="temperature"):
        rollout(async_engine, generator(async_engine[0], sr.make("spec")), PROMPTS[:1], params(temperature=0.7))
