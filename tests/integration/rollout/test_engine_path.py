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
