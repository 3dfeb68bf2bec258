"""The exclusion plugin (`vllm.exclude`) loads wherever vLLM loads logits-processor plugins: the V1 model runner's
loader, and on vLLM >= 0.32 the model runner V2's, which refuses to start any engine of the environment when a plugin
is not a V2 processor. Under V2 it acts on no request (the rollout draws the position again)."""

import pytest
import torch

from specrl_openrlhf.integration.vllm import exclude

vllm = pytest.importorskip("vllm")


def test_the_v1_processor_bans_a_requests_tokens_until_its_first_token():
    from vllm.v1.sample.logits_processor import _load_logitsprocs_plugins

    assert exclude.ExcludeFirstToken in _load_logitsprocs_plugins()
    processor = exclude.ExcludeFirstToken(None, torch.device("cpu"), False)
    processor.rows = {1: ([2, 3], [])}
    logits = processor.apply(torch.zeros(2, 5))
    assert torch.isinf(logits[1, [2, 3]]).all() and torch.isfinite(logits[0]).all()


def test_model_runner_v2_loads_it_and_runs_no_request_through_it():
    loader = pytest.importorskip("vllm.v1.worker.gpu.sample.logits_processor.loader")  # vLLM >= 0.32
    assert exclude.ExcludeFirstToken in loader._load_v2_logitsprocs_plugins()  # V1-only plugins raise here
    processor = exclude.ExcludeFirstToken(None, object())  # V2's (vllm_config, req_states)
    params = vllm.SamplingParams(extra_args={exclude.EXCLUDE_FIRST_TOKEN: [2]})
    exclude.ExcludeFirstToken.validate_params(params)
    assert processor.add_request(0, params) is False
    logits = torch.zeros(1, 5)
    assert processor.apply(logits, ctx=None) is logits and torch.isfinite(logits).all()
