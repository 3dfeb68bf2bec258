"""Speculative rollouts over vLLM's async engine, one sample per call, as OpenRLHF's rollout actors run them.

`AsyncSpeculativeGenerator` picks its driver once, by where the rule verifies drafts:
- `engine_path.EnginePathDriver`: `lossless` verified inside vLLM, at every decoding step, by our proposer;
- `request_path.RequestPathDriver`: every other rule, with scoring requests and a continuation
  (`rollout.SpeculativePlanner`'s steps);
- none for `off`.
A sample whose reuse path fails is generated normally. `gather_samples` runs n concurrent calls per prompt and
collects them, as OpenRLHF does.

A sample on the engine path goes through: this module, `engine_path`, `driver` (the engine call, the commit),
`vllm_edge` (params and the parsed answer), and in the engine `vllm_proposer` with `proposal` over `history`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from ..assembly import SampleOutput
from ..metrics import ReuseStats
from ..policies import ReusePolicy
from ..rollout import SpeculativePlanner
from ..trace import TraceWriter
from .driver import LocalDraftStore, VisitTracker
from .engine_path import EnginePathDriver
from .request_path import RequestPathDriver
from .vllm_edge import check_sampling_params, completion_of

__all__ = ["AsyncSpeculativeGenerator", "LocalDraftStore", "RolloutBatch", "gather_samples"]


@dataclass
class RolloutBatch:
    """Outputs of `gather_samples`: `outputs[p][j]` is sample j of prompt p; `stats` sums every sample's."""

    outputs: list[list[SampleOutput]]
    stats: ReuseStats = field(default_factory=ReuseStats)

    @property
    def metrics(self) -> dict[str, float]:
        return self.stats.as_dict()


class AsyncSpeculativeGenerator:
    """Speculative rollout of one sample per call over an async `generate(prompt_token_ids, params)` that returns
    the final `RequestOutput` (OpenRLHF's `RolloutRayActor.generate`, or `vllm_edge.engine_generate(AsyncLLM)`).

    Args:
        generate: the engine call (`bind` replaces it).
        policy: the reuse rule.
        store: the draft store (`LocalDraftStore`, or `draft_store.RayDraftStore`).
        samples_per_visit: samples per prompt in a batch (OpenRLHF's `n_samples_per_prompt`).
        planner: the request path's planner (default: one for `policy` with `seed` and `trace`).
        trace: where the engine path records visits (the request path's planner has its own).
        seed: the run's seed, named in the engine path's trace records.
        update_every: samples per update of a rule that adapts (request path).
        prioritize: `generate` takes `priority=` (an engine scheduling by priority).
        rpc: the engine's `collective_rpc`, which carries histories to its proposer (engine path).
    """

    def __init__(
        self,
        generate,
        policy: ReusePolicy,
        store,
        *,
        samples_per_visit: int,
        planner: SpeculativePlanner | None = None,
        trace: TraceWriter | None = None,
        seed: int = 0,
        update_every: int | None = None,
        prioritize: bool = False,
        rpc=None,
    ):
        self.policy = policy
        args = dict(samples_per_visit=samples_per_visit, prioritize=prioritize)
        if policy.verifies_in_engine:
            self.driver = EnginePathDriver(generate, policy, store, rpc=rpc, trace=trace, seed=seed, **args)
        elif policy.draft_age:
            planner = planner or SpeculativePlanner(policy, seed=seed, trace=trace)
            self.driver = RequestPathDriver(
                generate, policy, store, planner=planner, update_every=update_every, **args
            )
        else:
            self.driver = None
        self.generate_fn = generate
        self.store = store
        self.failures = 0

    @property
    def planner(self) -> SpeculativePlanner | None:
        """The request path's planner (None on the engine path and for `off`)."""
        return getattr(self.driver, "planner", None)

    @property
    def trace(self) -> TraceWriter | None:
        if isinstance(self.driver, EnginePathDriver):
            return self.driver.trace
        return None if self.planner is None else self.planner.trace

    @property
    def visits(self) -> VisitTracker | None:
        return None if self.driver is None else self.driver.visits

    @property
    def verifies_in_engine(self) -> bool | None:
        """On the engine path: None until the engine answers, then whether it runs our proposer."""
        if not isinstance(self.driver, EnginePathDriver):
            return None
        return self.driver.histories.available

    @property
    def engine_report(self) -> dict[str, float]:
        """On the engine path, what the engine's proposers last reported of their draft budget (`vllm_proposer`:
        decayed sums of steps, drafted slots, verdicts, predicted and observed acceptance, the step cost's
        parameters); {} elsewhere, or before the engine answered."""
        return self.driver.histories.report if isinstance(self.driver, EnginePathDriver) else {}

    def bind(self, generate, *, rpc=None, prioritize: bool | None = None) -> None:
        """Point the generator at an engine: its `generate`, its `collective_rpc` (engine path) and whether it
        schedules by priority."""
        self.generate_fn = generate
        if self.driver is not None:
            self.driver.generate_fn = generate
            if prioritize is not None:
                self.driver.prioritize = prioritize
        if rpc is not None and isinstance(self.driver, EnginePathDriver):
            self.driver.histories.rpc = rpc

    async def generate(self, prompt_ids: list[int], params, *, follow_up: bool = False) -> SampleOutput:
        """One sample; errors in the reuse path fall back to normal generation. `follow_up`: a later turn of an
        agent's sample (its drafts are kept apart, see `LocalDraftStore`)."""
        check_sampling_params(self.policy, params)
        driver = self.driver
        if driver is not None and (not isinstance(driver, EnginePathDriver) or driver.available):
            try:
                return await driver.generate(prompt_ids, params, follow_up)
            except Exception as error:
                driver.warn("speculative sample failed; generating normally", error)
        start = time.perf_counter()
        output = completion_of(await self.generate_fn(prompt_ids, params))
        stats = ReuseStats(samples=1, decoded_tokens=len(output.token_ids), fallbacks=int(driver is not None))
        stats.time_generation_s = time.perf_counter() - start
        logprobs = output.logprobs if params.logprobs is not None else None
        return SampleOutput(output.token_ids, logprobs, output.finish_reason, 0, stats)


async def gather_samples(generator: AsyncSpeculativeGenerator, prompts, params) -> RolloutBatch:
    """Run `params.n` concurrent single-sample calls per prompt, as OpenRLHF does, and collect them."""
    single = params.clone()
    n, single.n = params.n, 1
    outputs = await asyncio.gather(*[generator.generate(list(p), single) for p in prompts for _ in range(n)])
    stats = ReuseStats()
    for output in outputs:
        stats = stats + output.stats
    return RolloutBatch([list(outputs[i * n : (i + 1) * n]) for i in range(len(prompts))], stats)
