"""Our V2 speculator against vLLM 0.34's own classes, imported from its released package (`scripts/test_vllm034.sh`
puts its unzipped wheel on the path; no engine here runs vLLM's V2 runner): its registry takes our method, its
`SpeculativeConfig` resolves our config, its `init_speculator` builds our `BaseSpeculator`, which drafts as the drafter
does in the runner's call order, takes the rollout's histories through `histories.update_histories`, and never stops
an engine when the drafter fails."""

from types import SimpleNamespace

import pytest
import torch

from specrl_openrlhf.cache import prompt_key
from specrl_openrlhf.integration.vllm.histories import params_message, request_id, update_histories
from specrl_openrlhf.integration.vllm.v2 import registration
from specrl_openrlhf.miniature.v2_runner import MiniatureRunner
from specrl_openrlhf.policies.builtin import HISTORY_SPECULATOR, LosslessParams

pytestmark = pytest.mark.vllm034
if registration.registry() is None:
    pytest.skip("vLLM >= 0.34 (its speculator registry) is not importable here", allow_module_level=True)

K, MAX_LEN, PROMPT = 4, 128, [1, 2, 3]
RESPONSE = list(range(10, 40))


@pytest.fixture(scope="module")
def model_config(tmp_path_factory):
    from vllm.config import ModelConfig

    from specrl_openrlhf.miniature.tiny_model import build_tiny_model

    return ModelConfig(model=str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")), max_model_len=MAX_LEN)


def speculative_config(model_config, **given):
    from vllm.config import ParallelConfig, SpeculativeConfig

    registration.register()
    fields = {"method": HISTORY_SPECULATOR, "num_speculative_tokens": K, "speculator_options": {"history_mb": 2}}
    fields |= given
    return SpeculativeConfig(target_model_config=model_config, target_parallel_config=ParallelConfig(), **fields)


def built(model_config, **given):
    """A runner in miniature around the speculator vLLM's own `init_speculator` builds from our config."""
    from vllm.v1.worker.gpu.spec_decode import init_speculator

    config = SimpleNamespace(
        speculative_config=speculative_config(model_config, **given),
        model_config=model_config,
        scheduler_config=SimpleNamespace(max_num_seqs=4, max_num_batched_tokens=2048),
    )
    return MiniatureRunner(lambda state: init_speculator(config, torch.device("cpu"), state), 4, MAX_LEN)


def test_vllms_registry_and_config_take_our_method(model_config):
    from vllm.v1.worker.gpu.spec_decode.speculator_config import registered_speculative_methods

    spec = speculative_config(model_config)
    assert HISTORY_SPECULATOR in registered_speculative_methods()
    assert spec.custom_method == HISTORY_SPECULATOR and spec.method is None  # no built-in base: model-free
    config = spec.speculator_config
    assert config.speculator_class.endswith("v2.speculator.HistorySpeculator") and config.prefer_dense_token_history
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        speculative_config(model_config, num_speculative_tokens=None)


def test_init_speculator_builds_ours_and_it_drafts_from_the_rollouts_histories(model_config):
    from vllm.v1.worker.gpu.spec_decode.speculator import BaseSpeculator

    run = built(model_config, enable_adaptive_verification=True)
    speculator = run.speculator
    assert isinstance(speculator, BaseSpeculator) and speculator.enable_adaptive_verification
    worker = SimpleNamespace(model_runner=SimpleNamespace(speculator=speculator))
    key = prompt_key(PROMPT)
    answer = update_histories(worker, [(key, len(PROMPT), True, params_message(LosslessParams()), [RESPONSE], None)])
    assert answer["proposers"] == 1
    row = request_id(key)
    run.schedule(added=[(row, PROMPT, [])])
    assert run.step({row: RESPONSE[:2]})[row] == RESPONSE[2 : 2 + K]
    assert bool((speculator.draft_token_confidence_probs[0] > 0).all())


def test_a_failing_drafter_never_stops_the_engine(model_config, monkeypatch, caplog):
    run = built(model_config)
    speculator = run.speculator

    def broken(*args):
        raise RuntimeError("a bug of ours")

    monkeypatch.setattr(speculator.drafter, "propose", broken)
    row = request_id(prompt_key(PROMPT))
    run.schedule(added=[(row, PROMPT, [])])
    assert run.step({row: [10, 11]})[row] == [11] * K  # the row's last token in every slot
    assert float(speculator.draft_token_confidence_probs.sum()) == 0 and "specrl_history disabled" in caplog.text
    assert speculator.report()["proposers"] == 0  # the rollout then says so and generates normally
    run.step({row: [12]})  # and the engine steps on
