"""The request-path driver: drafts verified with our own requests to the engine (SPEC-RL's way).

It runs `request_path.planner.SpeculativePlanner`'s engine-free steps over the engine: the visit's first sample claims
drafts for all of its samples and sends the visit's requests (the prompt probe, a tree's branches); each sample then
sends its scoring requests until its rule has cut it, its continuation, and assembles. Positions that vLLM's prefix
cache served without log-probs come from a sibling that scored the same tokens, or from more requests. A rejected token
is excluded from the continuation's first step by our logits-processor plugin (`vllm.exclude`), or, on an engine
without it, redrawn with a logit bias first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from ...cache import prompt_key
from ...policies.stateful import FeedbackCoordinator
from ...request_path.assembly import SampleOutput
from ...request_path.planner import ContinuationRequest, SpeculativePlanner
from ...request_path.scoring_messages import ScoringRequest
from ..vllm.edge import (
    Completion,
    completion_of,
    continuation_params,
    excluding_params,
    exclusion_probe_params,
    next_logprobs,
    scoring_answer,
    scoring_params,
)
from ..vllm.exclude import EXCLUDE_FIRST_TOKEN
from .driver import Driver, LocalDraftStore, Visit

logger = logging.getLogger(__name__)

SCORING_PRIORITY = -(1 << 30)  # vLLM serves lower values first
LEADER_WAIT_S = 60.0  # a sample never waits longer than this for a sibling's request
REUSABLE_DECAY = 0.1  # weight of the latest visit in `reusable`: about the last 10 visits


@dataclass
class PlannedVisit(Visit):
    """A visit whose samples are still arriving. Its first sample builds every sample's `Sample` and sends the
    visit's requests, then sets `ready`. `samples` and `scoring` (their scoring requests in flight) let a sample take
    p_curr of tokens it shares with a sibling."""

    samples: list = field(default_factory=list)
    unclaimed: dict = field(default_factory=dict)  # slot -> its built sample, until the slot's call takes it
    scoring: set = field(default_factory=set)
    ready: asyncio.Event = field(default_factory=asyncio.Event)


class RequestPathDriver(Driver):
    """Speculative samples on the request path. With `prioritize`, scoring requests go first, since they are cheap
    and each unblocks a continuation, and continuations expected to be longest next, since the slowest sample
    decides when a step ends."""

    new_visit = PlannedVisit

    def __init__(self, generate, policy, store, **options):
        super().__init__(generate, policy, store, **options)
        seed, trace, update_every = self.options.seed, self.options.trace, self.options.update_every
        self.planner = self.options.planner or SpeculativePlanner(policy, seed=seed, trace=trace)
        self.reusable = 0.0  # decayed share of recent visits that had something to reuse
        self.exclusion_applies: bool | None = None  # whether the engine runs the `vllm.exclude` plugin; None: unknown
        if policy.keeps_state and isinstance(store, LocalDraftStore):  # one process: this rule is the coordinator's
            store.coordinator = FeedbackCoordinator(policy, update_every or self.visits.samples_per_visit)

    @property
    def trace(self):
        return self.planner.trace

    async def generate(self, prompt_ids: list[int], params, follow_up: bool) -> SampleOutput:
        key = prompt_key(prompt_ids)
        visit, slot = self.visits.join(key, follow_up)
        try:
            return await self._sample(key, prompt_ids, params, follow_up, visit, slot)
        finally:
            if slot == 0:  # whatever happened to the leader, its siblings must not wait for it
                visit.ready.set()

    async def _sample(self, key, prompt_ids, params, follow_up: bool, visit: PlannedVisit, slot: int):
        age, history, n = self.policy.draft_age, self.policy.draft_history, self.visits.size(follow_up)
        if visit.drafts is None:  # the visit's first sample claims for all of them: one cache call per visit
            visit.drafts = asyncio.ensure_future(self.store.claim(key, visit.visit_id, age, n, follow_up, history))
        early = None
        if self.reusable < 0.5 and key not in self.drafted:  # likely nothing to reuse: generate while claiming
            early = continuation_params(params, params.max_tokens, 0, 0, self.planner.top_k)
            early = asyncio.ensure_future(self.send(prompt_ids, early, -params.max_tokens))
        try:
            return await self._claimed(key, prompt_ids, params, follow_up, visit, slot, early)
        finally:
            if early is not None and not early.done():
                early.cancel()

    async def _claimed(self, key, prompt_ids, params, follow_up: bool, visit: PlannedVisit, slot: int, early):
        """The sample once its visit's claim is out; `early`: its generation from the prompt alone, already started,
        which it keeps if it has nothing to reuse (as stock generation would give it), and drops otherwise."""
        cache_errors = 0
        try:
            drafts = list(await asyncio.shield(visit.drafts))
        except Exception as error:  # the cache is unreachable: this sample has no draft
            self.warn("draft cache claim failed; this sample is generated normally", error)
            drafts, cache_errors = [], 1
        if early is not None and any(draft is not None for draft in drafts):  # it would hold the engine's slots
            early.cancel()  # while the visit's scoring waits
            early = None
        start = time.perf_counter()
        if slot == 0:  # the visit's samples, built once, so that its requests (probe, tree) serve them all
            visit.samples = self.planner.open_visit(
                prompt_ids, params.max_tokens, drafts, key, self.visits.size(follow_up)
            )
            visit.unclaimed = dict(enumerate(visit.samples))
            found = any(s.draft is not None or s.tree is not None for s in visit.samples)
            self.reusable += REUSABLE_DECAY * (found - self.reusable)
            await self._visit_requests(visit.samples)
            visit.ready.set()
        else:
            await _wait(visit.ready, LEADER_WAIT_S)
        sample = visit.unclaimed.pop(slot, None)  # each built sample goes to one call only
        if sample is None or sample.max_tokens != params.max_tokens:  # not in the visit's requests: it scores alone
            own = drafts[slot] if slot < len(drafts) else None
            sample = self.planner.new_sample(prompt_ids, params.max_tokens, own, key)
        sample.stats.cache_errors = sample.stats.fallbacks = cache_errors
        output, scoring = None, True
        if early is not None and sample.draft is None and sample.tree is None:  # nothing to reuse: it is the sample
            sample.continued, scoring = True, False
            start = await self._scoring_done(sample, start)
            output = completion_of(await early, self.planner.top_k)
            sample.stats.time_generation_s = time.perf_counter() - start
        while (request := self.planner.next_request(sample)) is not None:
            if isinstance(request, ScoringRequest):
                await self._score(sample, request, visit)
                continue
            start, scoring = await self._scoring_done(sample, start), False
            output = await self._continue(sample, request, params)
            sample.stats.time_generation_s = time.perf_counter() - start
        if scoring:  # nothing left to generate
            await self._scoring_done(sample, start)
        start = time.perf_counter()
        new = () if output is None else (output.token_ids, output.logprobs, output.finish_reason)
        if output is not None:
            sample.stats.cached_prompt_tokens = output.cached_tokens
        result, next_draft = self.planner.assemble(
            sample, *new, want_logprobs=params.logprobs is not None, new_top=None if output is None else output.top
        )
        await self.commit(key, visit.visit_id, next_draft, follow_up, result.stats)
        result.stats.time_assembly_s = time.perf_counter() - start
        return result

    async def _visit_requests(self, samples) -> None:
        """The requests the planner sends for all of a visit's samples, a round at a time. A request that fails leaves
        what it would have scored unknown: a tree's walks then stop before it, which stays exact; a sample scores what
        is left with its own requests."""
        for requests in self.planner.visit_rounds(samples):
            outputs = await asyncio.gather(
                *[self.send(r.token_ids, scoring_params(r), SCORING_PRIORITY) for r in requests],
                return_exceptions=True,
            )
            for request, output in zip(requests, outputs):
                try:
                    if isinstance(output, Exception):
                        raise output
                    self.planner.take_visit_answer(samples, request, scoring_answer(request, output))
                except Exception as error:  # a sample's request: it asks again on its own, and falls back if it must
                    self.warn("a visit's scoring request failed; its tokens stay unscored", error)

    async def _score(self, sample, request: ScoringRequest, visit: PlannedVisit) -> None:
        """One scoring request; positions the prefix cache served come from a sibling that scored the same tokens
        (waiting for siblings' requests in flight), or from more requests (`SpeculativePlanner.rescoring`)."""
        task = asyncio.ensure_future(self.send(request.token_ids, scoring_params(request), SCORING_PRIORITY))
        visit.scoring.add(task)
        try:
            output = await task
        finally:
            visit.scoring.discard(task)
        missing = self.planner.take_answer(sample, request, scoring_answer(request, output), visit.samples)
        if len(missing) and visit.scoring:  # a sibling whose blocks we read may not have returned yet
            await asyncio.wait(set(visit.scoring), timeout=LEADER_WAIT_S)
            missing = self.planner.recover(sample, missing, visit.samples)
        if len(missing):
            await asyncio.gather(*[self._score(sample, r, visit) for r in self.planner.rescoring(sample, missing)])

    async def _scoring_done(self, sample, start: float) -> float:
        """The sample's scoring stage ends (the rule has cut it): its time, and, once a visit's worth of samples is
        in, a stateful rule's report. Returns when the next stage starts."""
        sample.stats.time_scoring_s = time.perf_counter() - start
        feedback, samples = self.planner.take_feedback(self.visits.samples_per_visit)
        if samples:
            try:
                self.policy.load_state_dict(await self.store.report(feedback, samples))
            except Exception as error:  # the rule keeps its current state; the sample goes on
                self.warn("reuse rule feedback could not be reported; the rule keeps its state", error)
        return time.perf_counter()

    async def _continue(self, sample, request: ContinuationRequest, params) -> Completion:
        """The continuation after the verified prefix. A sample whose rejected tokens C must be excluded asks the
        engine's plugin (`vllm.exclude`) to ban them at the first step; the first token then follows p_curr without C.
        Without the plugin, the first token is drawn with their logits biased away (a one-token request) and the
        continuation follows that token (see `_exclusion_applies`)."""
        prefix, budget, excluded, top_k = request.token_ids, request.max_tokens, request.excluded, request.top_k
        priority = -request.expected_tokens
        if not excluded or await self._exclusion_applies(prefix, excluded):
            own = continuation_params(params, budget, request.verified, 0, top_k, excluded)
            result = completion_of(await self.send(prefix, own, priority), top_k)
            if not excluded or not result.token_ids or result.token_ids[0] not in excluded:
                return result
            # the engine ignored the ban (raw log-probs can't tell beforehand): the token came with probability p(y)
            self.exclusion_applies = False
            self._warn_without_plugin()
            sample.stats.resample_requests += 1
        first = completion_of(
            await self.send(prefix, excluding_params(params, request.verified, excluded), SCORING_PRIORITY)
        )
        sample.stats.resample_requests += 1
        if first.token_ids and first.token_ids[0] in excluded:
            raise ValueError(f"the engine sampled token {first.token_ids[0]} through a logit bias")
        if first.finish_reason == "stop" or budget <= 1:
            return first
        rest_params = continuation_params(params, budget - 1, request.verified + 1)
        rest = completion_of(await self.send(prefix + first.token_ids, rest_params, priority))
        logprobs = None if first.logprobs is None or rest.logprobs is None else first.logprobs + rest.logprobs
        return Completion(first.token_ids + rest.token_ids, logprobs, rest.finish_reason, rest.cached_tokens)

    async def _exclusion_applies(self, prefix: list[int], tokens: tuple[int, ...]) -> bool:
        """Whether the engine runs the exclusion plugin. Processed log-probs must know it before the first sample,
        since a banned first step reports log p(x) / (1 - p(C)) and an unbanned one log p(x): one probe per engine
        asks for a banned token's log-prob, -inf under the ban. Raw log-probs are log p(x) either way, so the
        plugin is assumed until a continuation returns a banned token."""
        if self.exclusion_applies is None and self.planner.processed_logprobs:
            token = int(tokens[0])
            logprobs = next_logprobs(await self.send(prefix, exclusion_probe_params(token), SCORING_PRIORITY))
            self.exclusion_applies = bool(logprobs) and logprobs[token].logprob == -float("inf")
            if not self.exclusion_applies:
                self._warn_without_plugin()
        return self.exclusion_applies is not False

    @staticmethod
    def _warn_without_plugin() -> None:
        logger.warning(
            "the engine does not run the logits-processor plugin %r (is specrl-openrlhf installed where vLLM runs, "
            "and speculative decoding off?): lossless redraws each rejected position with an extra request, which "
            "stays exact but costs time",
            EXCLUDE_FIRST_TOKEN,
        )


async def _wait(event: asyncio.Event, timeout: float) -> None:
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except asyncio.TimeoutError:
        pass
