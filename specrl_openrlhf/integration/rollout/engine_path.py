"""The engine-path driver: `lossless` verified inside vLLM, at every decoding step, by our history proposer.

A sample is one plain generation request. Around it: the visit's first sample claims the prompt's history from the
draft store and sends it to the engine's proposer (`HistoryChannel`) while the samples generate; each finished sample
joins the history of its visit's later samples, and is committed as a draft for the next visit. What vLLM drafted and
accepted comes back with the output (`vllm.edge.Completion`). No planner: nothing is scored or cut here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict

import numpy as np

from ...cache import prompt_key
from ...draft import Draft
from ...history import UNKNOWN_LOGPROB
from ...metrics import budget_gauges, verified_in_engine
from ...request_path.assembly import SampleOutput
from ...seeds import entropy_of, prompt_number
from ...trace import HISTORY_SLOT, visit_group
from ..vllm.edge import completion_of, continuation_params
from ..vllm.histories import params_message, update_histories
from .driver import DRAFTED_PROMPTS_KEPT, Driver

logger = logging.getLogger(__name__)

SLOT_STRIDE = 1 << 16  # priorities of a visit's successive slots lie this far apart (engine steps a sample may take)


class HistoryChannel:
    """Histories to the engine's proposers, the updates of a few milliseconds in one `collective_rpc`. Never awaited
    by a sample: a history that arrives late only drafts later.

    `rpc(method, args=...)` is the engine's `collective_rpc` (vLLM's `AsyncLLM`, or `RolloutRayActor.llm`), which runs
    `vllm.histories.update_histories` in each worker with the worker first. A function reaches vLLM's engine core
    pickled (by reference), which vLLM allows with `VLLM_ALLOW_INSECURE_SERIALIZATION=1`: OpenRLHF's rollout actors set
    it, and so does `miniature.engine.CPU_ENGINE_ENV`. `available` is None until the engine answers, then
    whether every worker runs a proposer."""

    WINDOW_S = 0.002

    def __init__(self, rpc, params):
        self.rpc = rpc
        self.params = params_message(params)  # the rule's `LosslessParams`, sent with every update
        self.report: dict[str, float] = {}  # what the engine's proposers measured, summed over its workers
        self.pending: list[tuple] = []
        self.flushing = None
        self.available: bool | None = None

    def send(self, key: bytes, prompt_len: int, reset: bool, responses, logprobs) -> None:
        """Queue an update (`update_histories`); lists of token ids and of their log-probs, one per response."""
        if self.available is False:
            return
        self.pending.append((key, int(prompt_len), bool(reset), self.params, responses, logprobs))
        if self.flushing is None:
            self.flushing = asyncio.ensure_future(self._flush())

    async def _flush(self) -> None:
        await asyncio.sleep(self.WINDOW_S)
        updates, self.pending, self.flushing = self.pending, [], None
        try:
            answers = await self.rpc(update_histories, args=(updates,))
            running = bool(answers) and all(int(a.get("proposers", 0)) > 0 for a in answers)
            error = None if running else RuntimeError("no history proposer runs in this engine")
            if running:
                self.report = {k: sum(float(a.get(k, 0.0)) for a in answers) for k in answers[0]}
        except Exception as failure:
            running, error = False, failure
        if not running and self.available is not False:
            logger.warning(
                "lossless verifies in the engine, but the engine has no history proposer (%s: %s): samples are "
                "generated normally. Start the engine with "
                "specrl_openrlhf.integration.vllm.engine_args.engine_kwargs() (the quickstart and `--rollout_reuse "
                "lossless` do), or set verify='requests'",
                type(error).__name__,
                error,
            )
        self.available = running


class StepForecast:
    """What a prompt's last visit here says of its next: the engine steps a sample of it takes, about its response's
    tokens less the draft tokens the engine accepted (each step decodes one token of its own), averaged over the
    visit's samples. Bounded: the prompts seen last are kept."""

    def __init__(self, max_prompts: int = DRAFTED_PROMPTS_KEPT):
        self.max_prompts = max_prompts
        # key -> (the latest visit's id, its step sum, its samples, the mean of the visit before it or None)
        self.visits: OrderedDict[bytes, tuple[str, float, int, float | None]] = OrderedDict()

    def observe(self, key: bytes, visit_id: str, steps: int) -> None:
        """A finished sample of `key`'s visit `visit_id`, which took `steps` engine steps."""
        visit, total, samples, before = self.visits.pop(key, (visit_id, 0.0, 0, None))
        if visit != visit_id:  # a new visit: the one it follows becomes its forecast
            total, samples, before = 0.0, 0, (total / samples if samples else before)
        self.visits[key] = (visit_id, total + steps, samples + 1, before)
        if len(self.visits) > self.max_prompts:
            self.visits.popitem(last=False)

    def steps(self, key: bytes, visit_id: str) -> float | None:
        """The expected engine steps of a sample of `key`'s visit `visit_id`, from the visit before (None: unknown)."""
        visit, total, samples, before = self.visits.get(key, (None, 0.0, 0, None))
        if visit == visit_id:
            return before
        return total / samples if samples else before


class ReleaseOrder:
    """Requests released to the engine in priority order: the calls that arrive within `WINDOW_S` of one another (a
    step's samples come within milliseconds, in whatever order the caller sends them) wait and go together, lowest
    priority value first, so that the engine's priority queue sees them all before it fills its slots."""

    WINDOW_S = 0.002

    def __init__(self):
        self.waiting: list[tuple[int, int, asyncio.Future]] = []
        self.count = 0
        self.releasing = None

    async def turn(self, priority: int) -> None:
        future = asyncio.get_running_loop().create_future()
        self.count += 1
        self.waiting.append((priority, self.count, future))
        if self.releasing is None:
            self.releasing = asyncio.ensure_future(self._release())
        await future

    async def _release(self) -> None:
        await asyncio.sleep(self.WINDOW_S)
        waiting, self.waiting, self.releasing = sorted(self.waiting), [], None
        for _, _, future in waiting:
            if not future.done():
                future.set_result(None)
            await asyncio.sleep(0)  # each request reaches the engine before the next is let go


class EnginePathDriver(Driver):
    """Samples whose drafts vLLM verifies at every step (`vllm.proposer`); `rpc` is the engine's `collective_rpc`.

    `trace` records each visit's history and responses (`--reuse.trace_dir`), for `replay` to verify them against
    other proposals; `seed` names the run in the records."""

    def __init__(self, generate, policy, store, **options):
        super().__init__(generate, policy, store, **options)
        self.histories = HistoryChannel(self.options.rpc, policy.params)
        self.forecast = StepForecast()
        self.order = ReleaseOrder()
        self.trace = self.options.trace
        self.seed = int(self.options.seed)

    @property
    def available(self) -> bool:
        """False once the engine said it runs no proposer: samples are then generated normally."""
        return self.histories.available is not False

    @property
    def verifies_in_engine(self) -> bool | None:
        return self.histories.available

    @property
    def engine_report(self) -> dict[str, float]:
        """What the engine's proposers last reported of their draft budget (`vllm.histories`: decayed sums of steps,
        drafted slots, verdicts, predicted and observed acceptance, the step cost's parameters); {} before the engine
        answered."""
        return self.histories.report

    def bind(self, generate, *, rpc=None, prioritize: bool | None = None) -> None:
        super().bind(generate, prioritize=prioritize)
        if rpc is not None:
            self.histories.rpc = rpc

    async def generate(self, prompt_ids: list[int], params, follow_up: bool) -> SampleOutput:
        key = prompt_key(prompt_ids)
        visit, slot = self.visits.join(key, follow_up)
        if slot == 0:
            count = self.visits.size(follow_up)
            visit.drafts = asyncio.ensure_future(self._send_history(key, prompt_ids, visit.visit_id, count, follow_up))
        start = time.perf_counter()
        # log-probs only if the caller asked: the budget predicts acceptance without p_prev (`budget.features`), and
        # the history then chooses between branches by how many responses take them
        own = continuation_params(params, params.max_tokens, 0, logprobs=params.logprobs is not None)
        priority = self.priority(key, visit.visit_id, slot)
        if self.prioritize:
            await self.order.turn(priority)
        output = completion_of(await self.send(prompt_ids, own, priority))
        length = len(output.token_ids)
        stats = verified_in_engine(output.accepted_per_step, output.drafted_per_step, length)
        self.forecast.observe(key, visit.visit_id, stats.decoded_tokens)
        stats.time_generation_s, stats.cached_prompt_tokens = time.perf_counter() - start, output.cached_tokens
        stats.fallbacks = int(self.histories.available is False)
        for name, value in budget_gauges(self.histories.report).items():
            setattr(stats, name, value)
        self.histories.send(key, len(prompt_ids), False, [output.token_ids], [output.logprobs])
        logprobs = output.logprobs if output.logprobs is not None else [UNKNOWN_LOGPROB] * length
        try:
            stats.drafts_found = int(bool(await asyncio.shield(visit.drafts))) if visit.drafts else 0
        except Exception:
            stats.drafts_found = 0
        draft = Draft(np.asarray(output.token_ids, np.int32), np.asarray(logprobs, np.float32), output.finish_reason)
        if self.trace is not None:  # the response, a sample of p_curr: replay verifies it against proposals
            self._trace(key, visit.visit_id, draft, slot, params.max_tokens, stats.reused_tokens)
        reported = output.logprobs if params.logprobs is not None else None
        sample = SampleOutput(output.token_ids, reported, output.finish_reason, 0, stats)
        await self.commit(key, visit.visit_id, draft, follow_up, stats)
        return sample

    def priority(self, key: bytes, visit_id: str, slot: int) -> int:
        """vLLM's priority for a visit's sample in `slot` (lower first): a visit's samples in slot order, so that where
        the engine has more samples than slots, later ones start after earlier ones finished and draft from them too;
        within a slot, the samples expected to take the most engine steps first (longest processing time first: the
        slowest sample decides when a rollout ends)."""
        steps = self.forecast.steps(key, visit_id)
        return slot * SLOT_STRIDE - (0 if steps is None else min(int(steps), SLOT_STRIDE - 1))

    async def _send_history(self, key: bytes, prompt_ids, visit_id: str, count: int, follow_up: bool) -> int:
        """Claim the visit's history from the draft store and send it to the engine; returns its size."""
        try:
            claimed = await self.store.claim(key, visit_id, 1, count, follow_up, self.policy.draft_history)
            drafts = [d for d in claimed if d]
        except Exception as error:  # the cache is unreachable: the visit drafts from its own finished samples only
            self.warn("draft cache claim failed; the visit proposes from its own samples", error)
            drafts = []
        responses = [d.token_ids.tolist() for d in drafts]
        self.histories.send(key, len(prompt_ids), True, responses, [d.logprobs.tolist() for d in drafts])
        if self.trace is not None:
            for draft in drafts:
                self._trace(key, visit_id, draft, HISTORY_SLOT, len(draft), 0)
        return len(drafts)

    def _trace(self, key: bytes, visit_id: str, draft: Draft, slot: int, budget: int, kept: int) -> None:
        """A response verified in the engine (slot >= 0) or the history it drafted from (`HISTORY_SLOT`), recorded in
        the visit's group: `replay` rebuilds the history and verifies each response against a proposal."""
        entropy = entropy_of(self.seed, key, draft.visit, draft.index, len(draft))
        group = visit_group(prompt_number(key), int(visit_id[:15], 16))
        ended = draft.finish_reason == "stop"
        self.trace.record(draft, draft.logprobs, draft.ages, budget, ended, entropy, kept, None, group, slot)
