"""A rollout simulator from recorded responses: a model-free proposer's engine steps, drafts and accepted tokens at RL
scale, with no model running.

Terminology:
- *corpus* (`Corpus`): responses recorded with stock generation, per epoch, prompt and sample, from a policy trained
  between epochs. An epoch's drafts come from the epoch before it.
- *coupling*: vLLM verifies a model-free draft one-hot (keep draft token y with probability p(y), else sample p
  without y), which has the law of "sample x from p; keep y if and only if x = y". So, given a response recorded from
  the policy, a proposer's accepted tokens at a step are its draft's longest prefix that agrees with the recorded
  continuation, and the row then takes the next recorded token (a rejection's resample, or the bonus token).
- *schedule* (`EngineSimulator`): vLLM's continuous batching, as its V1 scheduler and persistent batch run it. A
  step of the RL loop sends `prompts_per_step` prompts x n samples at once; the engine runs up to `max_num_seqs`
  rows, admits waiting requests first come first served as rows free up (their prompts prefilled within
  `max_num_batched_tokens`, after the decoding rows' tokens), and keeps rows in slots: a new request takes the lowest
  free slot and the last rows move down into the holes left (`batch.BatchView`), as a proposer that follows rows by
  slot sees them. After every step the proposer gets each row's sampled tokens, tokens so far and token ids, and
  returns each row's draft, verified at the next step.
- *proposer* (`SimProposer`): what the simulator drives; the integration's adapters wrap the real ones.
- *context*: the tokens a row holds in the KV cache before a step (its prompt and what it has taken), which a GPU's
  attention reads at every step: records carry their sum over the step's decoding rows (`decode_context`).
- *KV capacity* (`Schedule.kv_capacity_tokens`): the tokens the GPU's KV cache holds. A request is admitted only if
  its prompt fits beside the running rows' contexts; when the running rows outgrow it, the latest admitted are
  preempted and wait to be recomputed (prompt and what they had taken, prefilled again), as vLLM's scheduler does.
  With the prefix cache on, a prompt's whole blocks count once however many of its rows hold them, as vLLM holds a
  block once for every request that reads it.
- *workload* (`requests.Workload`): the requests an RL step sends, and the ones a finished request sends after it.
- *gap* (`visits.Gaps`): before each epoch, the other prompts' requests an engine served since the returning prompts'
  last visit; not priced, but every proposer that keeps responses takes what its cache holds of them
  (`SimProposer.between_visits`).
- *prefix cache* (`Schedule.prefix_caching`, vLLM's `enable_prefix_caching`): a request's cached prompt tokens
  (`requests.cached_tokens`) are not prefilled; with the cache off nothing is read from it.
- *record* (`StepRecord`): per engine step, its decoding rows, tokens carried and contexts, its prefill rows, tokens
  and contexts (a chunk after the chunks before it, a prompt after its cached blocks; and the tokens whose prompt
  log-probs it computes), the draft tokens it verified and accepted, and the wall time the proposer (and its
  history updates) took here.

Engine-free: numpy only. Pricing the records is the `pricing` package's.
"""

from __future__ import annotations

import gc
import random
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ..params import check_fields, limits
from .batch import BatchView
from .corpus import Corpus
from .requests import Request, Samples, Workload, cached_tokens

if TYPE_CHECKING:
    from .visits import Gaps, OtherRequests


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """The RL loop and the engine as the simulator runs them, in simulated rows (`regime.Regime.schedule` divides a
    GPU's engine by the scale at which a simulated row stands for several of its rows)."""

    max_num_seqs: int = field(default=512, metadata=limits(at_least=1))
    """Rows the engine decodes at once."""
    prompts_per_step: int = field(default=32, metadata=limits(at_least=1))
    """Prompts an RL step sends, each with the corpus's samples; every prompt comes once an epoch, in a seeded
    shuffle (`steps_of`)."""
    max_num_batched_tokens: int = field(default=8192, metadata=limits(at_least=1))
    """Tokens a step carries, every decoding row's sampled token and draft and every prefill chunk."""
    seed: int = 0
    """The shuffle of an epoch's prompts into RL steps."""
    kv_capacity_tokens: int | None = field(default=None, metadata=limits(at_least=1))
    """Tokens the KV cache holds (None: unbounded)."""
    prefix_caching: bool = True
    """vLLM's prefix cache: cached prompt blocks are read, not prefilled."""

    def __post_init__(self):
        check_fields(self)

    def steps_of(self, epoch: int, prompts: int) -> list[list[int]]:
        """The prompts of each RL step of an epoch."""
        order = list(range(prompts))
        random.Random(self.seed * 1000 + epoch).shuffle(order)
        return [order[i : i + self.prompts_per_step] for i in range(0, prompts, self.prompts_per_step)]


class SimProposer(Protocol):
    """What the simulator drives. `between_visits(others)`: the other prompts' requests an engine served since the
    returning prompts' last visit (`visits.OtherRequests`: a proposer that keeps responses takes the tail its cache
    holds); `visit(step, prompts)`: an RL step's prompts start (the moment a rollout sends their histories);
    `propose(batch, sampled)`: every row's draft after an engine step, as vLLM asks; `finished`: a sample is done (its
    response joins its visit's history). `visit` returns the share of its prompts whose previous epoch the proposer
    holds."""

    name: str
    async_scheduling: bool

    def between_visits(self, others: OtherRequests) -> None: ...

    def visit(self, epoch: int, prompts: list[int], corpus: Corpus) -> float: ...

    def propose(self, batch: BatchView, sampled: list[list[int]]) -> list[list[int]]: ...

    def finished(self, request: Request) -> None: ...

    # optional: `admit(rows, prefill_budget)`, the step's scheduled drafts trimmed before it runs (`_admit_drafts`)


@dataclass
class StepRecord:
    decode_rows: int
    decode_tokens: int  # 1 + drafts per decoding row
    prefill_rows: int
    prefill_tokens: int
    drafted: int
    accepted: int
    proposer_s: float  # this machine's wall time of the proposer's `propose` after this step
    rl_step: int
    epoch: int = 0  # the corpus's epoch the RL step belongs to
    register_s: float = 0.0  # and of the history updates before it (a visit's start, finished samples)
    decode_context: int = 0  # the decoding rows' tokens in the KV cache before the step, summed
    prefill_context: int = 0  # the prefilling rows' tokens in the KV cache before the step (cached, chunks before)
    logit_tokens: int = 0  # prefill tokens whose log-probs the step computes (scoring requests)
    preempted: int = 0  # rows preempted before the step (the KV cache was full)


@dataclass
class Simulation:
    """What a run of the simulator recorded: every engine step, per RL step the share of returning prompts whose
    previous epoch the proposer held, the response tokens its requests generated (a scoring request's one token
    aside; the request path's continuations, not the recorded responses), and those kept from drafts outside the
    engine: a rule's responses are its kept and generated tokens."""

    records: list[StepRecord] = field(default_factory=list)
    found_previous: list[float] = field(default_factory=list)
    response_tokens: int = 0
    kept_outside: int = 0
    peak_kv: int = 0  # the most KV tokens the running rows held at once (a capacity above it changes nothing)
    epoch_tokens: dict[int, tuple[int, int]] = field(default_factory=dict)  # epoch: (response tokens, kept outside)

    def column(self, name: str) -> np.ndarray:
        return np.array([getattr(r, name) for r in self.records])

    @property
    def accepted(self) -> int:
        return int(self.column("accepted").sum()) if self.records else 0

    @property
    def kept(self) -> float:
        """The share of the rule's response tokens kept from drafts, in the engine or outside it."""
        return (self.accepted + self.kept_outside) / max(self.response_tokens + self.kept_outside, 1)

    def kept_in(self, epoch: int) -> float:
        """`kept` of `epoch`'s responses alone."""
        kept, tokens = self.kept_tokens(epoch)
        return kept / max(tokens, 1)

    def kept_tokens(self, epoch: int) -> tuple[int, int]:
        """`epoch`'s response tokens kept from drafts, and all of them (kept or generated)."""
        tokens, outside = self.epoch_tokens.get(epoch, (0, 0))
        accepted = sum(r.accepted for r in self.records if r.epoch == epoch)
        return accepted + outside, tokens + outside

    @classmethod
    def merged(cls, parts: list[Simulation]) -> Simulation:
        """Simulations of disjoint prompts one after the other (`visits.passes`): their steps in turn, RL steps
        numbered on, their tokens summed."""
        out = cls()
        for part in parts:
            offset = out.records[-1].rl_step + 1 if out.records else 0
            out.records += [replace(r, rl_step=r.rl_step + offset) for r in part.records]
            out.found_previous += part.found_previous
            out.response_tokens += part.response_tokens
            out.kept_outside += part.kept_outside
            out.peak_kv = max(out.peak_kv, part.peak_kv)
            for epoch, (tokens, kept) in part.epoch_tokens.items():
                before = out.epoch_tokens.get(epoch, (0, 0))
                out.epoch_tokens[epoch] = (before[0] + tokens, before[1] + kept)
        return out


class EngineSimulator:
    """Runs the corpus's epochs `first_epoch`.. through one engine and a proposer (`run`), the RL steps' requests
    from `workload` (default: the samples), and before each epoch the other requests of its gap (`gaps`, None: a
    prompt returns at the next RL step, nothing between)."""

    def __init__(
        self,
        corpus: Corpus,
        schedule: Schedule,
        proposer: SimProposer,
        clock=time.perf_counter,
        workload: Workload | None = None,
        gaps: Gaps | None = None,
    ):
        self.corpus, self.schedule, self.proposer, self.clock = corpus, schedule, proposer, clock
        self.workload = workload if workload is not None else Samples()
        self.gaps = gaps
        self.admissions = 0
        longest = max(len(p) for p in corpus.prompts) + max(len(r) for e in corpus.responses for p in e for r in p)
        self.max_len = 2 * longest + 64  # a request path's continuation: prompt + verified prefix + the rest

    def run(self, first_epoch: int = 0, progress=None) -> Simulation:
        out = Simulation()
        rl_step = 0
        gc.collect(1)  # the young generations: what the last run left (nothing was promoted while gc was off)
        gc.disable()  # the simulator's own garbage is not the proposer's time: no collection lands in a timed call
        try:
            for epoch in range(first_epoch, self.corpus.epochs):
                if self.gaps is not None:  # not priced: every rule serves the same other requests
                    self.proposer.between_visits(self.gaps.before(epoch))
                tokens, kept = out.response_tokens, self.workload.kept
                for prompts in self.schedule.steps_of(epoch, len(self.corpus.prompts)):
                    self._rl_step(epoch, prompts, rl_step, out)
                    rl_step += 1
                    if progress is not None:
                        progress(rl_step)
                out.epoch_tokens[epoch] = (out.response_tokens - tokens, self.workload.kept - kept)
        finally:
            gc.enable()
        out.kept_outside = self.workload.kept
        return out

    def _rl_step(self, epoch: int, prompts: list[int], rl_step: int, out: Simulation) -> None:
        start = self.clock()
        found = self.proposer.visit(epoch, prompts, self.corpus)
        registering = self.clock() - start
        if epoch > 0:
            out.found_previous.append(found)
        waiting = self._arriving(self.workload.requests(epoch, prompts, self.corpus))
        batch = BatchView(self.schedule.max_num_seqs, self.max_len)
        done: set[str] = set()
        capacity = self.schedule.kv_capacity_tokens or float("inf")
        while True:
            running = [r for r in batch.rows if r.id not in done]
            in_use = self._kv_held(running)
            admitted = []
            while waiting and len(running) + len(admitted) < self.schedule.max_num_seqs:
                need = waiting[0].to_prefill - min(waiting[0].cached, len(waiting[0].prompt))
                if (running or admitted) and in_use + need > capacity:
                    break  # vLLM admits no request whose prompt the cache can't hold
                in_use += need
                admitted.append(waiting.pop(0))
                admitted[-1].admitted, self.admissions = self.admissions, self.admissions + 1
            preempted = []
            growth = sum(1 + len(r.draft) for r in running if r.prefilled >= r.to_prefill)
            running.sort(key=lambda r: r.admitted)
            while len(running) > 1 and in_use + growth > capacity:  # the latest admitted give their blocks back
                victim = running.pop()
                in_use = self._kv_held(running)
                growth -= 1 + len(victim.draft) if victim.prefilled >= victim.to_prefill else 0
                victim.preempt()
                preempted.append(victim)
            out.peak_kv = max(out.peak_kv, int(min(in_use + growth, capacity)))
            batch.update(done | {r.id for r in preempted}, admitted)
            waiting[:0] = preempted
            if not batch.rows:
                if waiting:
                    done = set()
                    continue
                return
            budget = self._fit_drafts(batch.rows)
            self._admit_drafts(batch.rows, budget)
            record = self._engine_step(batch, budget, rl_step)
            record.preempted, record.epoch = len(preempted), epoch
            out.records.append(record)
            done = {request.id for request in batch.rows if request.finished}
            start = self.clock()
            for request in batch.rows:
                if request.id in done:
                    self.proposer.finished(request)
                    out.response_tokens += 0 if request.prompt_logprobs else len(request.response)
            record.register_s, registering = registering + self.clock() - start, 0.0
            for request in batch.rows:
                if request.id in done:
                    waiting.extend(self._arriving(self.workload.followups(request)))

    def _fit_drafts(self, rows: list[Request]) -> int:
        """The token budget left for prefills once the decoding rows take theirs: each its sampled token, then its
        draft as far as the budget goes, in admission order (vLLM's running queue), as vLLM cuts a draft the step's
        `max_num_batched_tokens` can't carry."""
        decoding = sorted((r for r in rows if r.prefilled >= r.to_prefill), key=lambda r: r.admitted)
        budget = self.schedule.max_num_batched_tokens - len(decoding)
        for request in decoding:
            request.draft = request.draft[: max(budget, 0)]
            budget -= len(request.draft)
        return budget

    def _admit_drafts(self, rows: list[Request], prefill_budget: int) -> None:
        """The drafts the step scheduled, trimmed by the proposer's own admission where it has one (`admit`: vLLM's
        adaptive verification), before the step runs; the prefills keep the budget the scheduler gave them."""
        admit = getattr(self.proposer, "admit", None)
        if admit is not None:
            admit(rows, prefill_budget)

    def _kv_held(self, rows: list[Request]) -> int:
        """KV tokens the rows hold: their contexts, with the whole blocks of a prompt that several of them share (the
        prefix cache on) counted once."""
        held = sum(r.context for r in rows)
        if not self.schedule.prefix_caching:
            return held
        shared: dict[int, list[int]] = {}
        for r in rows:
            blocks = cached_tokens(len(self.corpus.prompts[r.prompt_index]), len(r.prompt))
            shared.setdefault(r.prompt_index, []).append(min(r.prefilled, blocks))
        return held - sum(sum(tokens) - max(tokens) for tokens in shared.values())

    def _arriving(self, requests: list[Request]) -> list[Request]:
        """Requests as the engine takes them: with no prefix cache, every one prefills its whole prompt."""
        if not self.schedule.prefix_caching:
            for request in requests:
                request.cached = request.prefilled = 0
        return requests

    def _engine_step(self, batch: BatchView, budget: int, rl_step: int) -> StepRecord:
        """One engine step: decoding rows verify their drafts against their recorded continuations, prefills go on
        within the token budget; then the proposer drafts for the next step."""
        sampled: list[list[int]] = []
        decode_rows = decode_tokens = prefill_rows = prefill_tokens = drafted = accepted = 0
        decode_context = prefill_context = logit_tokens = 0
        for slot, request in enumerate(batch.rows):
            if request.prefilled < request.to_prefill:  # in prefill: as much as the budget allows
                chunk = min(request.to_prefill - request.prefilled, max(budget, 0))
                prefill_context += request.prefilled if chunk else 0  # it reads what it holds: a cached prefix
                request.prefilled += chunk
                budget -= chunk
                prefill_rows += chunk > 0
                prefill_tokens += chunk
                logit_tokens += chunk if request.prompt_logprobs else 0
                if request.prefilled == request.to_prefill and not request.restored:  # it samples the first token
                    taken = request.response[:1]
                    request.taken = len(taken)
                    batch.extend(slot, taken)
                    sampled.append(taken)
                else:
                    sampled.append([])
                continue
            draft, request.draft = request.draft, []
            decode_context += request.context
            position = request.taken
            ahead = request.response[position : position + len(draft)]
            a = 0
            while a < len(ahead) and ahead[a] == draft[a]:
                a += 1
            taken = request.response[position : position + a + 1]
            request.taken += len(taken)
            request.drafted, request.accepted = request.drafted + len(draft), request.accepted + a
            batch.extend(slot, taken)
            sampled.append(taken)
            decode_rows += 1
            decode_tokens += 1 + len(draft)
            drafted += len(draft)
            accepted += a
        start = self.clock()
        drafts = self.proposer.propose(batch, sampled)
        proposer_s = self.clock() - start
        for request, draft in zip(batch.rows, drafts):
            request.draft = [] if request.finished else list(draft)
        return StepRecord(
            decode_rows,
            decode_tokens,
            prefill_rows,
            prefill_tokens,
            drafted,
            accepted,
            proposer_s,
            rl_step,
            decode_context=decode_context,
            prefill_context=prefill_context,
            logit_tokens=logit_tokens,
        )
