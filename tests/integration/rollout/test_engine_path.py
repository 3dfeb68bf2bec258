"""The engine-path driver's side of the engine: histories sent to the engine's proposers (`HistoryChannel`), and what
the rollout does when an engine has none. The samples' law on a real engine: tests/integration/vllm/test_proposer.py;
OpenRLHF's engines: tests/integration/openrlhf/test_engines.py."""

import pytest

from specrl_openrlhf.integration.rollout.engine_path import HistoryChannel
from specrl_openrlhf.policies.builtin import LosslessParams


@pytest.mark.parametrize(
    "answer", [[{"proposers": 0}], RuntimeError("Worker failed")], ids=["no-proposer", "rpc-fails"]
)
def test_the_rollout_learns_that_an_engine_has_no_proposer_and_says_so(answer, caplog):
    import asyncio

    calls = []

    async def rpc(method, args):
        calls.append(args)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def send_twice():
        channel = HistoryChannel(rpc, LosslessParams())
        channel.send(b"k" * 16, 3, True, [[5, 6]], [[0.0, 0.0]])
        await channel.flushing
        channel.send(b"k" * 16, 3, False, [[7]], [[0.0]])  # dropped: there is nobody to send it to
        return channel

    channel = asyncio.run(send_twice())
    assert channel.available is False and channel.flushing is None and len(calls) == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "no history proposer" in warnings[0] and "verify='requests'" in warnings[0]


def test_the_samples_expected_to_take_longest_are_released_first():
    """A visit's samples are served in slot order; within a slot, the prompt whose last visit took the most engine
    steps first (a long response, little of it accepted), whatever order the caller sends them in."""
    import asyncio
    from types import SimpleNamespace

    vllm = pytest.importorskip("vllm")

    import specrl_openrlhf as sr
    from specrl_openrlhf.integration.rollout.generator import AsyncSpeculativeGenerator, LocalDraftStore

    length = {5: 40, 6: 4}  # the prompt's last token -> its responses' length
    calls = []

    async def generate(prompt, params, priority=0):
        calls.append((prompt[-1], priority))
        completion = SimpleNamespace(token_ids=[7] * length[prompt[-1]], logprobs=None, finish_reason="length")
        return SimpleNamespace(outputs=[completion], num_cached_tokens=0)

    async def rpc(method, args):
        return [{"proposers": 1}]

    generator = AsyncSpeculativeGenerator(
        generate, sr.make("lossless"), LocalDraftStore(), samples_per_visit=2, prioritize=True, rpc=rpc
    )
    params = vllm.SamplingParams(max_tokens=64)

    async def visit():
        calls.clear()
        short, long = [1, 2, 6], [1, 2, 5]  # the caller sends the short prompt's samples first
        await asyncio.gather(*[generator.generate(p, params) for p in (short, short, long, long)])
        return list(calls)

    first = asyncio.run(visit())
    assert [p for p, _ in first] == [6, 5, 6, 5]  # nothing known yet: slot order, then arrival
    second = asyncio.run(visit())
    assert [p for p, _ in second] == [5, 6, 5, 6]  # the long prompt first in each slot
    assert [priority for _, priority in second] == sorted(priority for _, priority in second)
