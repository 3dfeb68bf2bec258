"""The driver interface, and what every driver shares: the engine call, visits, the draft store and its failures.

A driver runs one sample per call over an async `generate(prompt_token_ids, params[, priority=])` that returns the
final `RequestOutput` (OpenRLHF's `RolloutRayActor.generate`, or `vllm.edge.engine_generate` over a `vllm.AsyncLLM`).
`request_path.RequestPathDriver` verifies drafts with scoring requests; `engine_path.EnginePathDriver` lets vLLM verify
them at every step; `StockDriver` reuses nothing (`off`). The generator (`generator.AsyncSpeculativeGenerator`) sees
only `Driver`'s methods. The draft store may fail at any time (a cache actor dies): a failed claim means no draft and a
failed commit means no draft for the next visit; the sample itself is always returned.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass

from ...cache import DraftCache
from ...draft import Draft
from ...metrics import ReuseStats, verified_in_engine
from ...policies import ReusePolicy
from ...policies.stateful import FeedbackCoordinator
from ...request_path.assembly import SampleOutput
from ...request_path.planner import SpeculativePlanner
from ...trace import TraceWriter
from ..vllm.edge import completion_of

logger = logging.getLogger(__name__)

DRAFTED_PROMPTS_KEPT = 1 << 16  # prompts a driver remembers having committed drafts for (`Driver.drafted`)


@dataclass(frozen=True, kw_only=True)
class DriverOptions:
    """What a driver is built with besides its engine call, rule and draft store: the one list of them (the generator
    takes them as keywords and hands them to the driver it picks; each driver reads those it knows of)."""

    samples_per_visit: int
    """Samples per prompt in a batch (OpenRLHF's `n_samples_per_prompt`)."""

    prioritize: bool = False
    """The engine call takes `priority=` (an engine scheduling by priority); lower values are served first."""

    planner: SpeculativePlanner | None = None
    """The request path's planner (default: one for the rule, with `seed` and `trace`)."""

    trace: TraceWriter | None = None
    """Where visits are recorded (`--reuse.trace_dir`; the request path's planner has its own)."""

    seed: int = 0
    """The run's seed: the request path's default planner draws with it; the engine path's trace records name it."""

    update_every: int | None = None
    """Samples per update of a rule that adapts (request path; default: a visit's samples)."""

    rpc: object = None
    """The engine's `collective_rpc`, which carries histories to its proposer (engine path)."""


@dataclass
class Visit:
    """One visit of a prompt: its n samples share the id; `drafts` is the one claim made for all of them."""

    visit_id: str
    joined: int = 0
    drafts: object = None  # an asyncio.Future of the claim, set by the visit's first sample


class VisitTracker:
    """Groups per-request calls into visits: the n concurrent samples of one prompt share a visit.

    In OpenRLHF the n samples of a prompt arrive as n concurrent calls on one engine; the visit closes after
    its n-th sample joins, so the next call for the prompt opens a new visit whatever order earlier ones finish in.
    Prompts that never reach n calls (an agent's later turns, whose prompts hold one sample's history) would stay
    open forever: at most `max_open` visits are kept, the least recently joined closing first. `new_visit` builds a
    driver's own kind of visit from an id.
    """

    def __init__(self, samples_per_visit: int, new_visit=Visit, max_open: int = 1 << 16):
        self.samples_per_visit = samples_per_visit
        self.new_visit = new_visit
        self.max_open = max_open
        self._open: OrderedDict[bytes, Visit] = OrderedDict()

    def __len__(self) -> int:
        return len(self._open)

    def join(self, key: bytes, follow_up: bool = False) -> tuple[Visit, int]:
        """The visit a new sample of prompt `key` belongs to, and the sample's slot in it (0 for the first). A
        `follow_up` (an agent's later turn, whose prompt holds one sample's history) is a visit of its own."""
        if follow_up:
            return self.new_visit(uuid.uuid4().hex), 0
        visit = self._open.get(key)
        if visit is None:
            visit = self._open[key] = self.new_visit(uuid.uuid4().hex)
            while len(self._open) > self.max_open:
                self._open.popitem(last=False)
        else:
            self._open.move_to_end(key)
        slot = visit.joined
        visit.joined += 1
        if visit.joined >= self.samples_per_visit:
            del self._open[key]
        return visit, slot

    def size(self, follow_up: bool) -> int:
        """Samples in a visit."""
        return 1 if follow_up else self.samples_per_visit


class LocalDraftStore:
    """Async front of in-process `DraftCache`s; `draft_store.RayDraftStore` has the same methods for Ray actors.

    `follow_up` drafts (an agent's later turns) live in a cache of their own, so they can't evict first-turn ones.
    """

    restarts = 0

    def __init__(
        self, cache: DraftCache | None = None, follow_up_cache: DraftCache | None = None, *, keep_visits: int = 1
    ):
        self.caches = {
            False: cache if cache is not None else DraftCache(keep_visits=keep_visits),
            True: follow_up_cache if follow_up_cache is not None else DraftCache(keep_visits=keep_visits),
        }
        self.coordinator: FeedbackCoordinator | None = None

    @property
    def cache(self) -> DraftCache:
        return self.caches[False]

    async def claim(
        self, key: bytes, visit_id: str, age: int, count: int, follow_up: bool = False, history: int = 1
    ) -> list:
        """Drafts for `count` samples of a visit (None where there is none), then with `history` > 1 the responses of
        earlier visits (`DraftCache.claim`)."""
        return self.caches[follow_up].claim(key, visit_id, age, count, history)

    async def commit(self, key: bytes, visit_id: str, draft: Draft, follow_up: bool = False) -> None:
        self.caches[follow_up].commit(key, visit_id, draft)

    async def report(self, feedback: dict[str, float], samples: int) -> dict[str, float]:
        """A stateful rule's feedback; the answer is the rule's state to load. Here the generator's own rule is the
        coordinator's copy (one process), set by the request-path driver."""
        return self.coordinator.report(feedback, samples)


class Driver:
    """A rollout driver: one sample per `generate` call, with the parts every driver shares: the engine call (with
    priorities when the engine schedules by them), the visits, the draft store and the count of what failed.

    With `prioritize` (an engine started with `scheduling_policy="priority"`, and a `generate` that takes `priority=`)
    lower values are served first. Subclasses implement `generate`, and override what they know of: `available`,
    `verifies_in_engine`, `engine_report`, `trace`, `planner`, `bind`.
    """

    trace: TraceWriter | None = None  # where the driver records visits (`--reuse.trace_dir`)
    planner = None  # the request path's planner
    new_visit = Visit  # the driver's kind of visit, built from an id

    def __init__(self, generate, policy: ReusePolicy, store, **options):
        """`options`: `DriverOptions`' fields, as keywords."""
        self.options = DriverOptions(**options)
        self.generate_fn = generate
        self.prioritize = self.options.prioritize
        self.policy = policy
        self.store = store
        self.visits = VisitTracker(self.options.samples_per_visit, self.new_visit)
        self.failures = 0
        self.lost_commits = 0  # the store's failed commits, as counted on samples so far
        # The prompts this driver last committed drafts for, most recent last: their next visit here will likely find
        # one. Bounded: a run's prompts are many, and one that has not come back for this long is no better a guess.
        self.drafted: OrderedDict[bytes, None] = OrderedDict()

    async def generate(self, prompt_ids: list[int], params, follow_up: bool) -> SampleOutput:
        """One sample (`follow_up`: a later turn of an agent's sample)."""
        raise NotImplementedError

    async def generate_stock(self, prompt_ids: list[int], params, *, fallback: bool) -> SampleOutput:
        """One sample generated as stock OpenRLHF would, counted as a fallback if `fallback`; what vLLM drafted and
        accepted, where the engine speculates by itself (`vllm`), is counted as on the engine path."""
        start = time.perf_counter()
        output = completion_of(await self.generate_fn(prompt_ids, params))
        stats = verified_in_engine(output.accepted_per_step, output.drafted_per_step, len(output.token_ids))
        stats.fallbacks = int(fallback)
        stats.time_generation_s = time.perf_counter() - start
        logprobs = output.logprobs if params.logprobs is not None else None
        return SampleOutput(output.token_ids, logprobs, output.finish_reason, 0, stats)

    @property
    def available(self) -> bool:
        """False once the reuse path is known not to work here (samples are then generated normally)."""
        return True

    @property
    def verifies_in_engine(self) -> bool | None:
        """On the engine path: None until the engine answers, then whether it runs our proposer; None elsewhere."""
        return None

    @property
    def engine_report(self) -> dict[str, float]:
        """On the engine path, what the engine's proposers last reported of their draft budget; {} elsewhere."""
        return {}

    def bind(self, generate, *, rpc=None, prioritize: bool | None = None) -> None:
        """Point the driver at an engine: its `generate`, its `collective_rpc` (engine path) and whether it
        schedules by priority."""
        self.generate_fn = generate
        if prioritize is not None:
            self.prioritize = prioritize

    def send(self, prompt_ids, params, priority: int = 0):
        """The engine's final `RequestOutput` for one request (an awaitable)."""
        if self.prioritize:
            return self.generate_fn(prompt_ids, params, priority=priority)
        return self.generate_fn(prompt_ids, params)

    def warn(self, what: str, error: Exception) -> None:
        self.failures += 1
        if self.failures & (self.failures - 1) == 0:  # 1st, 2nd, 4th, 8th...: loud but not flooding
            logger.warning("%s (%s: %s; %d failures so far)", what, type(error).__name__, error, self.failures)

    async def commit(self, key: bytes, visit_id: str, draft: Draft, follow_up: bool, stats: ReuseStats) -> None:
        """Store a sample's response as a draft for its prompt's next visit; a failure costs that draft only, and is
        counted on `stats` (the sample's)."""
        try:  # a Ray store queues it and returns: a commit that fails later is counted on a later sample
            await self.store.commit(key, visit_id, draft, follow_up)
            if not follow_up:
                self.drafted[key] = None
                self.drafted.move_to_end(key)
                if len(self.drafted) > DRAFTED_PROMPTS_KEPT:
                    self.drafted.popitem(last=False)
        except Exception as error:  # the sample is fine; only its next visit loses a draft
            self.warn("draft cache commit failed; the sample is kept", error)
            stats.cache_errors = 1
        lost = getattr(self.store, "lost_commits", 0)
        if lost > self.lost_commits:
            stats.cache_errors += lost - self.lost_commits
            self.warn("draft cache commits failed; their prompts' next visits have no drafts", RuntimeError(lost))
            self.lost_commits = lost
        stats.cache_restarts = getattr(self.store, "restarts", 0)


class StockDriver(Driver):
    """No reuse (`off`, `vllm`): every sample is generated as stock OpenRLHF generates it."""

    async def generate(self, prompt_ids: list[int], params, follow_up: bool) -> SampleOutput:
        return await self.generate_stock(prompt_ids, params, fallback=False)
