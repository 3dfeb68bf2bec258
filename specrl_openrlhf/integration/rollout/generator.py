"""Speculative rollouts over vLLM's async engine, one sample per call, as OpenRLHF's rollout actors run them.

`AsyncSpeculativeGenerator` picks its driver once, by where the rule verifies drafts, and then sees only the driver
interface (`driver.Driver`):
- `engine_path.EnginePathDriver`: `lossless` verified inside vLLM, at every decoding step, by our proposer;
- `request_path.RequestPathDriver`: every other rule, with scoring requests and a continuation
  (`request_path.planner.SpeculativePlanner`'s steps);
- `driver.StockDriver` for `off`, and for `vllm`, whose engine drafts and verifies by itself.
A sample whose reuse path fails is generated normally. `gather_samples` runs n concurrent calls per prompt and
collects them, as OpenRLHF does.

A sample on the engine path goes through: this module, `engine_path`, `driver` (the engine call, the commit),
`vllm.edge` (params and the parsed answer), and in the engine `vllm.proposer` with `proposal` over `history`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ...metrics import ReuseStats
from ...policies import ReusePolicy
from ...request_path.assembly import SampleOutput
from ...request_path.planner import SpeculativePlanner
from ...trace import TraceWriter
from ..vllm.edge import check_sampling_params
from .driver import Driver, LocalDraftStore, StockDriver
from .engine_path import EnginePathDriver
from .request_path import RequestPathDriver

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
    the final `RequestOutput` (OpenRLHF's `RolloutRayActor.generate`, or `vllm.edge.engine_generate(AsyncLLM)`).

    Args:
        generate: the engine call (`bind` replaces it).
        policy: the reuse rule.
        store: the draft store (`LocalDraftStore`, or `openrlhf.draft_store.RayDraftStore`).
        options: the driver's, as keywords (`driver.DriverOptions`: `samples_per_visit`, and optionally `prioritize`,
            `planner`, `trace`, `seed`, `update_every`, `rpc`).
    """

    def __init__(self, generate, policy: ReusePolicy, store, **options):
        self.policy = policy
        self.store = store
        if not policy.draft_age:  # nothing to reuse: stock generation (vLLM may speculate inside, `vllm`)
            kind: type[Driver] = StockDriver
        elif policy.verifies_in_engine:
            kind = EnginePathDriver
        else:
            kind = RequestPathDriver
        self.driver = kind(generate, policy, store, **options)

    @property
    def planner(self) -> SpeculativePlanner | None:
        """The request path's planner (None on the engine path and for `off`)."""
        return self.driver.planner

    @property
    def trace(self) -> TraceWriter | None:
        return self.driver.trace

    @property
    def verifies_in_engine(self) -> bool | None:
        """On the engine path: None until the engine answers, then whether it runs our proposer."""
        return self.driver.verifies_in_engine

    @property
    def engine_report(self) -> dict[str, float]:
        """On the engine path, what the engine's proposers last reported of their draft budget; {} elsewhere."""
        return self.driver.engine_report

    def bind(self, generate, *, rpc=None, prioritize: bool | None = None) -> None:
        """Point the generator at an engine: its `generate`, its `collective_rpc` (engine path) and whether it
        schedules by priority."""
        self.driver.bind(generate, rpc=rpc, prioritize=prioritize)

    async def generate(self, prompt_ids: list[int], params, *, follow_up: bool = False) -> SampleOutput:
        """One sample; errors in the reuse path fall back to normal generation. `follow_up`: a later turn of an
        agent's sample (its drafts are kept apart, see `LocalDraftStore`)."""
        check_sampling_params(self.policy, params)
        driver = self.driver
        if driver.available:
            try:
                return await driver.generate(prompt_ids, params, follow_up)
            except Exception as error:
                driver.warn("speculative sample failed; generating normally", error)
        return await driver.generate_stock(prompt_ids, params, fallback=True)


async def gather_samples(generator: AsyncSpeculativeGenerator, prompts, params) -> RolloutBatch:
    """Run `params.n` concurrent single-sample calls per prompt, as OpenRLHF does, and collect them."""
    single = params.clone()
    n, single.n = params.n, 1
    outputs = await asyncio.gather(*[generator.generate(list(p), single) for p in prompts for _ in range(n)])
    stats = ReuseStats()
    for output in outputs:
        stats = stats + output.stats
    return RolloutBatch([list(outputs[i * n : (i + 1) * n]) for i in range(len(prompts))], stats)
