"""The exclusion plugin (`vllm.exclude`) loads wherever vLLM loads logits-processor plugins, on every vLLM: the V1
model runner's loader (vLLM <= 0.33) and the model runner V2's (vLLM >= 0.32; the only one from 0.34), which refuses
to start any engine of the environment when a plugin fails to import or is not a V2 processor. Each runner's side
bans a request's tokens at the step that samples its first token, and nowhere else.

Marked vllm_wheel: `scripts/test_vllm034.sh` runs them again under vLLM 0.33's and 0.34's own modules (no engine runs
there: the V2 side is checked with vLLM's own request-state and batch-layout classes, on CPU tensors)."""

import logging
import types

import numpy as np
import pytest
import torch

from specrl_openrlhf.integration.vllm import exclude

vllm = pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm_wheel

V2 = "vllm.v1.worker.gpu.sample.logits_processor"


def test_every_loader_of_the_installed_vllm_loads_it():
    loaders = 0
    if exclude.V1LogitsProcessor is not None:  # vLLM <= 0.33
        from vllm.v1.sample.logits_processor import _load_logitsprocs_plugins

        assert exclude.ExcludeFirstToken in _load_logitsprocs_plugins()
        loaders += 1
    if exclude.V2LogitsProcessor is not None:  # vLLM >= 0.32: V1-only or failing plugins raise here
        loader = pytest.importorskip(f"{V2}.loader")
        assert exclude.ExcludeFirstToken in loader._load_v2_logitsprocs_plugins()
        validate = loader.build_custom_logits_processors_params_validator(())  # the front end's
        validate(vllm.SamplingParams(extra_args={exclude.EXCLUDE_FIRST_TOKEN: [2, 3]}))
        with pytest.raises(Exception, match=exclude.EXCLUDE_FIRST_TOKEN):  # vLLM's VLLMValidationError
            validate(vllm.SamplingParams(extra_args={exclude.EXCLUDE_FIRST_TOKEN: [-1]}))
        loaders += 1
    assert loaders == len(exclude.RUNNER_BASES) >= 1  # a processor of every runner this vLLM has, each loaded


def test_the_v1_processor_bans_a_requests_tokens_until_its_first_token():
    if exclude.V1LogitsProcessor is None:
        pytest.skip(f"vLLM {vllm.__version__} has no V1 model runner")
    processor = exclude.ExcludeFirstToken(None, torch.device("cpu"), False)
    processor.v1.rows = {1: ([2, 3], [])}
    logits = processor.apply(torch.zeros(2, 5))
    assert torch.isinf(logits[1, [2, 3]]).all() and torch.isfinite(logits[0]).all()


def request_states(prompt_lens, vocab_size=6):
    """vLLM's `LogitsProcRequestState`, with host arrays where vLLM has its pinned buffers (CPU: none pinned)."""
    interface = pytest.importorskip(f"{V2}.interface")
    slots = len(prompt_lens)
    buffer = types.SimpleNamespace(np=np.array(prompt_lens, dtype=np.int32))
    return interface.LogitsProcRequestState(
        device=torch.device("cpu"),
        max_num_reqs=slots,
        vocab_size=vocab_size,
        all_token_ids=None,
        prompt_len=buffer,
        prefill_len=buffer,
        total_len=None,
    )


def batch(slots_of_rows, positions):
    """vLLM's `LogitsContext` for one step: each logits row's request slot and input position."""
    interface = pytest.importorskip(f"{V2}.interface")
    rows = torch.tensor(slots_of_rows, dtype=torch.int32)
    slots = np.unique(np.array(slots_of_rows, dtype=np.int32))
    return interface.LogitsContext(
        expanded_idx_mapping=rows,
        idx_mapping=torch.from_numpy(slots),
        idx_mapping_np=slots,
        expanded_local_pos=torch.zeros(len(slots_of_rows), dtype=torch.int32),
        input_ids=torch.zeros(len(slots_of_rows), dtype=torch.int32),
        pos=torch.tensor(positions, dtype=torch.int64),
        seq_lens_upper_bound_np=np.array(positions, dtype=np.int32) + 1,
    )


def test_the_v2_processor_bans_a_requests_tokens_on_the_row_of_its_first_token_only():
    """Slot 0 (prompt of 4 tokens) excludes tokens 1 and 5, slot 2 (prompt of 3) token 0, slot 1 nothing. At the
    step that samples slot 0's first token (row at position 3) and slot 2's second (position 3 > 2), only slot 0's
    row is banned; a later request in slot 0 that excludes nothing clears it; exclusions longer than any before widen
    every slot."""
    if exclude.V2LogitsProcessor is None:
        pytest.skip(f"vLLM {vllm.__version__} has no model runner V2")
    processor = exclude.ExcludeFirstToken(None, request_states([4, 5, 3]))
    assert isinstance(processor, exclude.V2LogitsProcessor)
    asks = {0: [1, 5], 1: None, 2: [0]}
    for slot, tokens in asks.items():
        params = vllm.SamplingParams(extra_args={exclude.EXCLUDE_FIRST_TOKEN: tokens} if tokens else None)
        assert processor.add_request(slot, params) is bool(tokens)
    logits = torch.zeros(3, 6)
    assert processor.apply(logits, batch([0, 1, 2], [3, 3, 3])) is logits  # nothing staged yet: untouched
    assert torch.isfinite(logits).all()
    processor.apply_staged_writes()
    # slot 0's row is its last prompt token (position 3): banned; slot 1 excludes nothing; slot 2 is past its first
    logits = processor.apply(torch.zeros(3, 6), batch([0, 1, 2], [3, 3, 3]))
    assert torch.isinf(logits[0, [1, 5]]).all() and torch.isfinite(logits[0, [0, 2, 3, 4]]).all()
    assert torch.isfinite(logits[1:]).all()
    logits = processor.apply(torch.zeros(2, 6), batch([2, 0], [2, 4]))  # slot 2's first token, slot 0's second
    assert torch.isinf(logits[0, 0]) and torch.isfinite(logits[0, 1:]).all() and torch.isfinite(logits[1]).all()
    processor.add_request(0, vllm.SamplingParams())
    processor.add_request(1, vllm.SamplingParams(extra_args={exclude.EXCLUDE_FIRST_TOKEN: [0, 1, 2, 3, 4]}))
    processor.apply_staged_writes()
    logits = processor.apply(torch.zeros(2, 6), batch([0, 1], [3, 4]))
    assert torch.isfinite(logits[0]).all() and torch.isinf(logits[1, :5]).all() and torch.isfinite(logits[1, 5])


def test_the_v2_processor_steps_aside_with_one_warning_where_it_cant_be_built(caplog):
    if exclude.V2LogitsProcessor is None:
        pytest.skip(f"vLLM {vllm.__version__} has no model runner V2")
    with caplog.at_level(logging.WARNING, logger=exclude.__name__):
        processor = exclude.ExcludeFirstToken(None, object())  # not a request state
    assert [r.levelname for r in caplog.records] == ["WARNING"] and "steps aside" in caplog.text
    params = vllm.SamplingParams(extra_args={exclude.EXCLUDE_FIRST_TOKEN: [2]})
    assert processor.add_request(0, params) is False
    processor.apply_staged_writes()
    logits = torch.zeros(1, 5)
    assert processor.apply(logits, batch([0], [0])) is logits and torch.isfinite(logits).all()
