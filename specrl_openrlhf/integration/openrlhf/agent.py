"""OpenRLHF's agent seam: an `AgentExecutorBase` that gives any executor speculative rollouts.

OpenRLHF builds the class named `AgentExecutor` in the file `--train.agent_func_path` points to, with no
arguments, inside each `RolloutRayActor`, and calls `execute(..., llm_engine=<the actor>)` once per sample. Ours
wraps the executor the user would have had (OpenRLHF's `SingleTurnAgentExecutor` with their reward settings, or
their own `--train.agent_func_path` agent) and hands it an engine proxy whose `generate` runs the speculative
rollout. Rewards, multi-turn logic and output format stay theirs.
"""

from __future__ import annotations

import asyncio
import logging
import math

from openrlhf.utils.agent import AgentExecutorBase, SingleTurnAgentExecutor
from vllm.logprobs import Logprob
from vllm.outputs import CompletionOutput, RequestOutput

from ...config import ReuseConfig
from ...metrics import ReuseStats, sample_metric_names
from ...policies.sampling import UnsupportedSamplingError
from ...request_path.assembly import SampleOutput
from ...request_path.planner import SpeculativePlanner
from ...trace import TraceWriter
from ..rollout.generator import AsyncSpeculativeGenerator
from ..vllm.edge import engine_generate, engine_limits, processed_logprobs, stop_token_ids
from .eval import is_evaluation

logger = logging.getLogger(__name__)


def load_agent_executor(path: str) -> AgentExecutorBase:
    """Build the user's `AgentExecutor` from their file, as OpenRLHF would."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("specrl_user_agent", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.AgentExecutor()


def request_output(prompt_ids: list[int], sample: SampleOutput, text: str) -> RequestOutput:
    """A vLLM `RequestOutput` for an assembled sample, so executors read it exactly like a plain generation."""
    logprobs = None
    if sample.logprobs is not None:
        logprobs = [{t: Logprob(logprob=lp)} for t, lp in zip(sample.token_ids, sample.logprobs)]
    completion = CompletionOutput(
        index=0,
        text=text,
        token_ids=list(sample.token_ids),
        cumulative_logprob=None if sample.logprobs is None else float(math.fsum(sample.logprobs)),
        logprobs=logprobs,
        finish_reason=sample.finish_reason,
        stop_reason=None,
    )
    return RequestOutput(
        request_id="specrl",
        prompt=None,
        prompt_token_ids=list(prompt_ids),
        prompt_logprobs=None,
        outputs=[completion],
        finished=True,
    )


class SpeculativeEngineProxy:
    """Stands in for the `RolloutRayActor` an executor receives: `generate` runs the speculative rollout; every
    other attribute is the real actor's. One proxy serves one `execute` call (one sample), so its second and later
    `generate` calls are an agent's follow-up turns."""

    def __init__(self, engine, generator: AsyncSpeculativeGenerator, tokenizer, training_signature: tuple, names=None):
        self._engine = engine
        self._metric_names = names  # the rule's `sample_metric_names`
        self._generator = generator
        self._tokenizer = tokenizer
        self._training_signature = training_signature
        self._turns = 0
        self.stats: ReuseStats | None = None  # summed over this sample's speculative turns

    def __getattr__(self, name):
        return getattr(self._engine, name)

    @property
    def sample_metrics(self) -> dict[str, float]:
        if self.stats is None:
            return {}
        return {k: v for k, v in self.stats.as_dict().items() if k in self._metric_names}

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        top_k = sampling_params.top_k if sampling_params.top_k and sampling_params.top_k > 0 else -1
        signature = (sampling_params.temperature, sampling_params.top_p, top_k)
        if is_evaluation(sampling_params) or multi_modal_data or signature != self._training_signature:
            # Evaluation, images, or settings the drafts were not sampled with: generate as stock OpenRLHF does.
            return await self._engine.generate(prompt_token_ids, sampling_params, multi_modal_data=multi_modal_data)
        follow_up, self._turns = self._turns > 0, self._turns + 1
        sample = await self._generator.generate(list(prompt_token_ids), sampling_params, follow_up=follow_up)
        self.stats = sample.stats if self.stats is None else self.stats + sample.stats
        text = self._tokenizer.decode(sample.token_ids, skip_special_tokens=sampling_params.skip_special_tokens)
        return request_output(prompt_token_ids, sample, text)


class SpeculativeAgentExecutor(AgentExecutorBase):
    """Wraps the run's real executor. OpenRLHF builds it with no arguments inside each rollout actor; it then reads
    the run's settings (published by `specrl_openrlhf.cli.train_ppo_ray`) on first use. The CPU quickstart and
    tests may hand it its parts instead."""

    def __init__(self, inner=None, generator: AsyncSpeculativeGenerator | None = None, training_signature=None):
        self._inner = inner
        self._generator = generator
        self._training_signature = None if training_signature is None else tuple(training_signature)
        self._unavailable = False
        self._metric_names: frozenset[str] | None = None
        self._setting_up: asyncio.Lock | None = None  # the first calls of an engine wait for one setup

    async def _setup(self, llm_engine) -> None:
        """Build the user's executor first (rewards must work whatever happens), then the reuse path."""
        from .draft_store import RayDraftStore, current_run, run_actor

        settings = await run_actor().settings.remote()
        inner_path = settings.get("inner_agent_func_path")
        self._inner = (
            load_agent_executor(inner_path) if inner_path else SingleTurnAgentExecutor(settings["remote_url"])
        )
        self._training_signature = tuple(settings["training_signature"])
        config = ReuseConfig.from_json(settings["reuse_config"])
        policy = config.build_policy()
        model_config, tokenizer = llm_engine.llm.model_config, llm_engine.llm.tokenizer
        max_token_id, max_model_len = engine_limits(model_config, tokenizer)
        trace = None
        if config.trace_dir:
            proposal = "engine" if policy.verifies_in_engine else policy.draft_choice
            trace = TraceWriter(config.trace_dir, policy.describe(), proposal=proposal)
        planner = None
        if not policy.verifies_in_engine:
            planner = SpeculativePlanner(
                policy,
                seed=config.seed,
                reused_logprobs=config.reused_logprobs,
                max_token_id=max_token_id,
                max_model_len=max_model_len,
                trace=trace,
                scoring=config.scoring,
                stop_token_ids=stop_token_ids(model_config, tokenizer),
                processed_logprobs=processed_logprobs(model_config),
            )
        store = RayDraftStore(settings["num_shards"], current_run())
        self._generator = AsyncSpeculativeGenerator(
            None,
            policy,
            store,
            samples_per_visit=settings["samples_per_visit"],
            planner=planner,
            trace=trace,
            seed=config.seed,
        )
        logger.info("speculative rollouts on: %s", policy.describe())

    @property
    def generator(self) -> AsyncSpeculativeGenerator | None:
        """The speculative rollout this executor runs (None until its first call set it up)."""
        return self._generator

    def flush_traces(self) -> None:
        """Write out the draft traces recorded so far (also done every few seconds and at exit)."""
        if self._generator is not None and self._generator.trace is not None:
            self._generator.trace.flush()

    async def execute(self, prompt, label, sampling_params, max_length: int, hf_tokenizer, llm_engine, images=None):
        if self._generator is None and not self._unavailable:
            self._setting_up = self._setting_up or asyncio.Lock()
            async with self._setting_up:  # concurrent first calls: one sets up, the others find it done
                if self._generator is None and not self._unavailable:
                    try:
                        await self._setup(llm_engine)
                    except Exception as error:  # a plugin that fails here, say: keep training with stock generation
                        if self._inner is None:
                            raise  # without the run's settings, rewards would silently be missing: fail loudly
                        self._unavailable = True
                        logger.warning("reuse unavailable (%s: %s); generating normally", type(error).__name__, error)
        if self._unavailable:
            return await self._inner.execute(
                prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine, images
            )
        if self._generator.policy.verifies_in_engine:  # the engine's proposer gets the histories (`vllm.proposer`)
            llm = llm_engine.llm
            if llm.vllm_config.scheduler_config.policy == "priority":  # a visit's samples in slot order
                self._generator.bind(engine_generate(llm), rpc=llm.collective_rpc, prioritize=True)
            else:
                self._generator.bind(llm_engine.generate, rpc=llm.collective_rpc)
        else:
            self._generator.bind(llm_engine.generate)
        names = self._metric_names = self._metric_names or sample_metric_names(self._generator.policy)
        proxy = SpeculativeEngineProxy(llm_engine, self._generator, hf_tokenizer, self._training_signature, names)
        result = await self._inner.execute(prompt, label, sampling_params, max_length, hf_tokenizer, proxy, images)
        if proxy.sample_metrics:
            result["extra_logs"] = {**(result.get("extra_logs") or {}), **proxy.sample_metrics}
        return result


__all__ = ["SpeculativeAgentExecutor", "UnsupportedSamplingError", "request_output"]
