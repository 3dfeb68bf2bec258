import asyncio
import threading

import pytest

from specrl_openrlhf.integration.cpu.engine import cpu_engine_kwargs

ENGINE_KWARGS = cpu_engine_kwargs(max_model_len=1024)


@pytest.fixture(scope="session")
def llm(tiny_model_dir):
    vllm = pytest.importorskip("vllm")
    from specrl_openrlhf.integration.cpu.weights import EXTENSION

    engine = vllm.LLM(model=str(tiny_model_dir), worker_extension_cls=EXTENSION, **ENGINE_KWARGS)
    yield engine
    engine.llm_engine.engine_core.shutdown()


class LoopThread:
    """An event loop on a thread, so sync tests can drive the async engine."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine, timeout=600):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)


@pytest.fixture(scope="session")
def async_engine(tiny_model_dir):
    """vLLM's async engine (the one OpenRLHF uses), in processed_logprobs mode, as OpenRLHF sets it for IS
    correction."""
    vllm = pytest.importorskip("vllm")
    runner = LoopThread()

    async def start():
        args = vllm.AsyncEngineArgs(model=str(tiny_model_dir), logprobs_mode="processed_logprobs", **ENGINE_KWARGS)
        return vllm.AsyncLLMEngine.from_engine_args(args)

    engine = runner.run(start())
    yield engine, runner
    engine.shutdown()
