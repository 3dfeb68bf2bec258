import asyncio
import threading

import pytest

from specrl_openrlhf.integration.miniature.engine import cpu_engine_kwargs

ENGINE_KWARGS = cpu_engine_kwargs(max_model_len=1024)


@pytest.fixture(scope="session")
def llm(tiny_model_dir):
    vllm = pytest.importorskip("vllm")
    from specrl_openrlhf.integration.miniature.weights import EXTENSION

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

    from specrl_openrlhf.integration.miniature.weights import EXTENSION

    async def start():
        args = vllm.AsyncEngineArgs(
            model=str(tiny_model_dir),
            logprobs_mode="processed_logprobs",
            worker_extension_cls=EXTENSION,
            **ENGINE_KWARGS,
        )
        return vllm.AsyncLLMEngine.from_engine_args(args)

    engine = runner.run(start())
    yield engine, runner
    engine.shutdown()


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray instance for the session, started as `train_with_reuse` starts OpenRLHF's (with the worker
    setup hook that marks evaluation requests)."""
    ray = pytest.importorskip("ray")
    from specrl_openrlhf.integration.openrlhf_eval import WORKER_SETUP_HOOK

    ray.init(
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=False,
        namespace="specrl-test",
        runtime_env={"worker_process_setup_hook": WORKER_SETUP_HOOK},
    )
    yield ray
    ray.shutdown()
