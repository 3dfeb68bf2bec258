"""The histories' seam (`vllm.histories`): request ids that carry a prompt's digest, and the receiver each worker
sends its updates to (our V2 speculator where the worker runs it, else the V1 board)."""

from types import SimpleNamespace

from specrl_openrlhf.cache import prompt_key
from specrl_openrlhf.integration.vllm import histories
from specrl_openrlhf.integration.vllm.v1 import board


def test_a_request_id_carries_its_prompts_digest_through_vllms_sample_prefix():
    key = prompt_key([1, 2, 3])
    first, second = histories.request_id(key), histories.request_id(key)
    assert first != second and first.startswith(histories.REQUEST_PREFIX)
    assert histories.key_of(first) == key and histories.key_of(f"3_{first}") == key  # vLLM's n samples: "{i}_{id}"
    for other in ("0123abcd", "specrl-zz-1", "specrl-", "7_plain"):
        assert histories.key_of(other) is None


def test_updates_go_to_the_v2_speculator_where_the_worker_runs_it_else_to_the_v1_board():
    received = []

    class Speculator:
        receives_histories = True

        def update(self, *update):
            received.append(update)

        def report(self, details=False):
            return {"proposers": 1}

    worker = SimpleNamespace(model_runner=SimpleNamespace(speculator=Speculator()))
    update = (prompt_key([1, 2]), 2, True, {}, [[5, 6]], None)
    assert histories.update_histories(worker, [update]) == {"proposers": 1}
    assert received == [update]
    v1_worker = SimpleNamespace(model_runner=SimpleNamespace(drafter=object()))
    assert histories.receiver(v1_worker) is board.BOARD
    assert histories.receiver(SimpleNamespace(model_runner=SimpleNamespace(speculator=object()))) is board.BOARD
