"""The speculative rollout driver: one sample per call over vLLM's async engine, as OpenRLHF's rollout actors run it.

`AsyncSpeculativeGenerator` drives `SpeculativePlanner`'s engine-free steps (draft, score, cut, continue, assemble)
over any async `generate(prompt_token_ids, params)`: OpenRLHF's `RolloutRayActor.generate`, or `engine_generate` over
a `vllm.AsyncLLM`. `gather_samples` runs n concurrent calls per prompt and collects them, as OpenRLHF does.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import math
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
from vllm import SamplingParams
from vllm.inputs import TokensPrompt
from vllm.sampling_params import RequestOutputKind

from ..adaptive import FeedbackCoordinator
from ..assembly import SampleOutput
from ..cache import Draft, DraftCache, prompt_key
from ..metrics import ReuseStats, verified_in_engine
from ..policies import ReusePolicy
from ..rollout import ContinuationRequest, SpeculativePlanner, check_sampling
from ..scoring import ScoringAnswer, ScoringRequest
from ..trace import HISTORY_SLOT, visit_group
from .vllm_exclude import EXCLUDE_FIRST_TOKEN
from .vllm_proposer import HistoryChannel

logger = logging.getLogger(__name__)

SUPPORTED_LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")
SCORING_PRIORITY = -(1 << 30)  # vLLM serves lower values first
LEADER_WAIT_S = 60.0  # a sample never waits longer than this for a sibling's request
REUSABLE_DECAY = 0.1  # weight of the latest visit in `reusable`: about the last 10 visits
EXCLUDING_BIAS = -100.0  # vLLM clamps logit_bias to [-100, 100]: e^-100 leaves the token a relative weight of 4e-44
# Our requests are read when they finish: vLLM then builds no output per step (the default, CUMULATIVE, copies every
# token so far into a new output at each step; docs/benchmarks.md section 7)
FINAL = RequestOutputKind.FINAL_ONLY


def engine_limits(model_config, tokenizer) -> tuple[int, int]:
    """(largest prompt token id the engine accepts, context length), by vLLM's own validation rule: an id is
    valid up to max(tokenizer.max_token_id, model vocab size - 1)."""
    mode = str(getattr(model_config, "logprobs_mode", "raw_logprobs"))
    if mode.split(".")[-1].lower() not in SUPPORTED_LOGPROBS_MODES:
        raise ValueError(
            f"vLLM logprobs_mode={mode} returns logits, not logprobs; drafts need raw_logprobs or processed_logprobs"
        )
    tokenizer_max = getattr(tokenizer, "max_token_id", None)
    if tokenizer_max is None:
        tokenizer_max = max(tokenizer.get_vocab().values())
    return max(int(tokenizer_max), model_config.get_vocab_size() - 1), int(model_config.max_model_len)


def check_sampling_params(policy: ReusePolicy, params: SamplingParams) -> None:
    check_sampling(  # its warnings were given at start-up (the command knows the engine's logprobs mode)
        policy,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        min_p=params.min_p,
        repetition_penalty=params.repetition_penalty,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        logit_bias=params.logit_bias,
    )


def scoring_params(request, top_k: int = 0) -> SamplingParams:
    """The SamplingParams of a `ScoringRequest`: the prompt logprobs of prompt + draft (with each position's top-k
    for rules that redraw rejected positions), and of the tokens asked to follow it. Reading the prefix cache saves
    recomputing what an earlier request computed (the prompt, earlier chunks); vLLM then leaves those positions
    without logprobs."""
    return SamplingParams(
        max_tokens=1,
        prompt_logprobs=top_k,
        detokenize=False,
        output_kind=FINAL,
        skip_reading_prefix_cache=not request.read_cache,
        logprob_token_ids=list(request.next_token_ids) or None,
    )


def next_logprobs(request_output) -> dict | None:
    """{token_id: Logprob} of the generated position: the tokens a request asked to score after its prompt."""
    logprobs = request_output.outputs[0].logprobs
    return logprobs[0] if logprobs else None


def scoring_answer(request: ScoringRequest, request_output, top_k: int = 0) -> ScoringAnswer:
    """vLLM's answer to a scoring request, parsed into the core's `ScoringAnswer`. Entry `P + i` of
    `prompt_logprobs` ({token_id: Logprob}, entry 0 None) holds log p_curr(draft[i]); a request that read the prefix
    cache gets uninitialised entries for the positions the cache served (`num_cached_tokens`), which are never read:
    they stay NaN, and `computed_from` says where computed ones start."""
    cached = int(request_output.num_cached_tokens or 0) if request.read_cache else 0
    offset = len(request.token_ids) - request.end  # the prompt's length: token_ids = prompt + draft[:end]
    first = max(request.start, cached + 1 - offset)
    count = request.end - request.start
    values = np.full(count, np.nan, np.float32)
    top = (np.full((count, top_k), -1, np.int32), np.full((count, top_k), -np.inf, np.float32)) if top_k else None
    for position in range(first, request.end):
        entries = request_output.prompt_logprobs[offset + position]
        entry = entries.get(int(request.token_ids[offset + position])) if entries else None
        values[position - request.start] = math.nan if entry is None else entry.logprob
        if top is not None:
            top[0][position - request.start], top[1][position - request.start] = top_k_of(entries, top_k)
    follows = {}
    if request.next_token_ids and (following := next_logprobs(request_output)):
        follows = {t: float(following[t].logprob) for t in request.next_token_ids if t in following}
    return ScoringAnswer(values, follows, cached, first, top)


def top_k_of(entries, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k likeliest tokens of one position from vLLM's {token_id: Logprob} (rank 1 first); -1 and -inf pad a
    position that lists fewer. vLLM adds the position's own token when it is not among them: it is left out."""
    ranked = sorted(
        ((getattr(lp, "rank", None) or math.inf, token, lp.logprob) for token, lp in entries.items()),
        key=lambda item: (item[0], -item[2]),
    )[:k]
    ids = np.full(k, -1, np.int32)
    logprobs = np.full(k, -np.inf, np.float32)
    for i, (_, token, logprob) in enumerate(ranked):
        ids[i], logprobs[i] = token, logprob
    return ids, logprobs


def continuation_params(
    params: SamplingParams,
    max_tokens: int,
    verified: int,
    sample_index: int = 0,
    top_k: int = 0,
    excluded: tuple[int, ...] = (),
) -> SamplingParams:
    """The user's params for one continuation after `verified` reused tokens: n=1, the remaining budget, the
    remaining minimum length, the output once it finishes (FINAL_ONLY), and logprobs on (the cache needs them;
    `top_k` per token for rules that redraw). `excluded`: tokens the first step must not sample (the `vllm_exclude`
    plugin reads them). Without stop strings vLLM does not detokenize: the caller decodes the whole response once.
    A shallow copy: every field we change is assigned, never mutated, and vLLM copies the params it is given before
    it changes them (`SamplingParams.clone`'s deep copy cost more per sample than the rest of our path)."""
    out = copy.copy(params)
    if excluded:
        out.extra_args = {**(params.extra_args or {}), EXCLUDE_FIRST_TOKEN: [int(t) for t in excluded]}
    out.n = 1
    out.output_kind = FINAL
    out.max_tokens = max_tokens
    out.min_tokens = max(0, (params.min_tokens or 0) - verified)
    out.logprobs = max(params.logprobs or 0, top_k)
    if not out.stop:  # the text is decoded once from the assembled ids; vLLM would also decode every top-k token
        out.detokenize = False
    if params.seed is not None:  # n separate requests with one seed would all sample the same tokens
        out.seed = params.seed + sample_index
    return out


def completion_of(request_output, top_k: int = 0):
    """(token ids, logprob of each sampled token, finish reason, prompt tokens served from prefix cache, and with
    `top_k` each token's top-k as ([n, k] ids, [n, k] logprobs), else None)."""
    completion = request_output.outputs[0]
    token_ids = list(completion.token_ids)
    entries = completion.logprobs or []
    logprobs = [entry[token].logprob for token, entry in zip(token_ids, entries)]
    if len(logprobs) != len(token_ids):
        logprobs = None
    top = None
    if top_k and logprobs is not None:
        rows = [top_k_of(entry, top_k) for entry in entries]
        shape = (len(rows), top_k)
        top = (
            np.stack([r[0] for r in rows]) if rows else np.zeros(shape, np.int32),
            np.stack([r[1] for r in rows]) if rows else np.zeros(shape, np.float32),
        )
    finish = completion.finish_reason or "length"
    return token_ids, logprobs, finish, int(request_output.num_cached_tokens or 0), top


def stop_token_ids(model_config, tokenizer) -> set[int]:
    """The tokens that end a response on this engine: the tokenizer's EOS and the model's generation config's."""
    ids = {tokenizer.eos_token_id} if getattr(tokenizer, "eos_token_id", None) is not None else set()
    eos = getattr(getattr(model_config, "hf_config", None), "eos_token_id", None)
    ids |= set(eos) if isinstance(eos, (list, tuple)) else ({eos} if eos is not None else set())
    return {int(i) for i in ids}


@dataclass
class RolloutBatch:
    """Outputs of `gather_samples`: `outputs[p][j]` is sample j of prompt p; `stats` sums every sample's."""

    outputs: list[list[SampleOutput]]
    stats: ReuseStats = field(default_factory=ReuseStats)

    @property
    def metrics(self) -> dict[str, float]:
        return self.stats.as_dict()


@dataclass
class OpenVisit:
    """A visit whose samples are still arriving. `drafts` is the one claim made for all of its samples; its first
    sample builds every sample's `Sample` and sends the prompt probe, then sets `ready`. `samples` and `scoring`
    (their scoring requests in flight) let a sample take p_curr of tokens it shares with a sibling."""

    visit_id: str
    joined: int = 0
    drafts: asyncio.Future | None = None
    samples: list = field(default_factory=list)
    unclaimed: dict = field(default_factory=dict)  # slot -> its built sample, until the slot's call takes it
    scoring: set = field(default_factory=set)
    ready: asyncio.Event = field(default_factory=asyncio.Event)


class VisitTracker:
    """Groups per-request calls into visits: the n concurrent samples of one prompt share a visit id.

    In OpenRLHF the n samples of a prompt arrive as n concurrent calls on one engine; the visit closes after
    its n-th sample joins, so the next call for the prompt opens a new visit whatever order earlier ones finish in.
    Prompts that never reach n calls (an agent's later turns, whose prompts hold one sample's history) would stay
    open forever: at most `max_open` visits are kept, the least recently joined closing first.
    """

    def __init__(self, samples_per_visit: int, max_open: int = 1 << 16):
        self.samples_per_visit = samples_per_visit
        self.max_open = max_open
        self._open: OrderedDict[bytes, OpenVisit] = OrderedDict()

    def __len__(self) -> int:
        return len(self._open)

    def join(self, key: bytes) -> tuple[OpenVisit, int]:
        """The visit a new sample of prompt `key` belongs to, and the sample's slot in it (0 for the first)."""
        visit = self._open.get(key)
        if visit is None:
            visit = self._open[key] = OpenVisit(uuid.uuid4().hex)
            while len(self._open) > self.max_open:
                self._open.popitem(last=False)
        else:
            self._open.move_to_end(key)
        slot = visit.joined
        visit.joined += 1
        if visit.joined >= self.samples_per_visit:
            del self._open[key]
        return visit, slot


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
        earlier visits (`DraftCache.claim_many`)."""
        return self.caches[follow_up].claim_many(key, visit_id, age, count, history)

    async def commit(self, key: bytes, visit_id: str, draft: Draft, follow_up: bool = False) -> None:
        self.caches[follow_up].commit(key, visit_id, draft)

    async def report(self, feedback: dict[str, float], samples: int) -> dict[str, float]:
        """A stateful rule's feedback; the answer is the rule's state to load. Here the generator's own rule is the
        coordinator's copy (one process), set by `AsyncSpeculativeGenerator`."""
        return self.coordinator.report(feedback, samples)


class AsyncSpeculativeGenerator:
    """Speculative rollout of one sample per call over an async `generate(prompt_token_ids, params)` that returns
    the final `RequestOutput` (OpenRLHF's `RolloutRayActor.generate`, or `engine_generate(AsyncLLM)`).

    With `prioritize` (an engine started with `scheduling_policy="priority"`, and a `generate` that takes
    `priority=`), scoring requests go first, since they are cheap and each unblocks a continuation, and
    continuations expected to be longest next, since the slowest sample decides when a step ends.

    The draft store may fail at any time (a cache actor dies): a failed claim means no draft and a failed commit
    means no draft for the next visit; the sample itself is always returned.
    """

    def __init__(
        self,
        generate,
        policy: ReusePolicy,
        store,
        *,
        samples_per_visit: int,
        planner: SpeculativePlanner,
        update_every: int | None = None,
        prioritize: bool = False,
        rpc=None,
    ):
        self.generate_fn = generate
        # `lossless` verified in the engine: histories go to the engine's proposer over `rpc` (its collective_rpc)
        self.histories = (
            HistoryChannel(rpc, policy.params.min_match, policy.params.min_accept_prob)
            if policy.verifies_in_engine
            else None
        )
        self.prioritize = prioritize
        self.policy = policy
        self.store = store
        self.visits = VisitTracker(samples_per_visit)
        self.planner = planner
        self.failures = 0
        self.lost_commits = 0  # the store's failed commits, as counted on samples so far
        self.reusable = 0.0  # decayed share of recent visits that had something to reuse
        # Prompts this generator committed drafts for (16-byte keys, one per prompt served): their next visit here
        # will likely find one, so their samples wait for the claim, whatever `reusable` says.
        self.drafted: set[bytes] = set()
        self.exclusion_applies: bool | None = None  # whether the engine runs the `vllm_exclude` plugin; None: unknown
        if policy.keeps_state and isinstance(store, LocalDraftStore):  # one process: this rule is the coordinator's
            store.coordinator = FeedbackCoordinator(policy, update_every or samples_per_visit)

    async def _report_feedback(self) -> None:
        feedback, samples = self.planner.feedback.take()
        try:
            self.policy.load_state_dict(await self.store.report(feedback, samples))
        except Exception as error:  # the rule keeps its current state; the sample goes on
            self._warn("reuse rule feedback could not be reported; the rule keeps its state", error)

    async def _score(self, sample, request, visit: OpenVisit) -> None:
        """One scoring request; positions the prefix cache served come from a sibling that scored the same tokens
        (waiting for siblings' requests in flight), or from more requests (`SpeculativePlanner.rescoring`)."""
        params = scoring_params(request, self.planner.top_k)
        task = asyncio.ensure_future(self._generate(request.token_ids, params, SCORING_PRIORITY))
        visit.scoring.add(task)
        try:
            output = await task
        finally:
            visit.scoring.discard(task)
        scorer = self.planner.scorer
        missing = scorer.take_scores(sample, request, scoring_answer(request, output, self.planner.top_k))
        if len(missing):
            missing = scorer.recover_scores(sample, missing, visit.samples)
        if len(missing) and visit.scoring:  # a sibling whose blocks we read may not have returned yet
            await asyncio.wait(set(visit.scoring), timeout=LEADER_WAIT_S)
            missing = scorer.recover_scores(sample, missing, visit.samples)
        if len(missing):
            await asyncio.gather(*[self._score(sample, r, visit) for r in scorer.rescoring(sample, missing)])

    async def _scoring_done(self, sample, start: float) -> float:
        """The sample's scoring stage ends (the rule has cut it): its time, and, once a visit's worth of samples is
        in, a stateful rule's report. Returns when the next stage starts."""
        sample.stats.time_scoring_s = time.perf_counter() - start
        if self.planner.feedback.samples >= self.visits.samples_per_visit:
            await self._report_feedback()
        return time.perf_counter()

    async def _continue(self, sample, request: ContinuationRequest, params: SamplingParams):
        """The continuation after the verified prefix: `completion_of` its output. A sample whose rejected tokens C
        must be excluded asks the engine's plugin (`vllm_exclude`) to ban them at the first step; the first token then
        follows p_curr without C. Without the plugin, the first token is drawn with their logits biased away (a
        one-token request) and the continuation follows that token (see `_exclusion_applies`)."""
        prefix, budget, excluded = request.token_ids, request.max_tokens, request.excluded
        expected = max(sample.draft_len - sample.cut, 1) if sample.draft is not None else budget
        top_k = self.planner.top_k
        if not excluded or await self._exclusion_applies(prefix, excluded):
            own = continuation_params(params, budget, request.verified, 0, top_k, excluded)
            result = completion_of(await self._generate(prefix, own, -expected), top_k)
            if not excluded or not result[0] or result[0][0] not in excluded:
                return result
            # the engine ignored the ban (raw log-probs can't tell beforehand): the token came with probability p(y)
            self.exclusion_applies = False
            self._warn_without_plugin()
            sample.stats.resample_requests += 1
        first_params = continuation_params(params, 1, request.verified)
        first_params.logit_bias = {token: EXCLUDING_BIAS for token in excluded}
        first_ids, first_lp, first_finish, cached, _ = completion_of(
            await self._generate(prefix, first_params, SCORING_PRIORITY)
        )
        sample.stats.resample_requests += 1
        if first_ids and first_ids[0] in excluded:
            raise ValueError(f"the engine sampled token {first_ids[0]} through a logit bias of {EXCLUDING_BIAS}")
        if first_finish == "stop" or budget <= 1:
            return first_ids, first_lp, first_finish, cached, None
        rest = continuation_params(params, budget - 1, request.verified + 1)
        rest_ids, rest_lp, finish, cached, _ = completion_of(await self._generate(prefix + first_ids, rest, -expected))
        logprobs = None if first_lp is None or rest_lp is None else first_lp + rest_lp
        return first_ids + rest_ids, logprobs, finish, cached, None

    async def _exclusion_applies(self, prefix: list[int], tokens: tuple[int, ...]) -> bool:
        """Whether the engine runs the exclusion plugin. Processed log-probs must know it before the first sample,
        since a banned first step reports log p(x) / (1 - p(C)) and an unbanned one log p(x): one probe per engine
        asks for a banned token's log-prob, -inf under the ban. Raw log-probs are log p(x) either way, so the
        plugin is assumed until a continuation returns a banned token."""
        if self.exclusion_applies is None and self.planner.assembler.processed_logprobs:
            token = int(tokens[0])
            probe = SamplingParams(
                max_tokens=1,
                detokenize=False,
                output_kind=FINAL,
                extra_args={EXCLUDE_FIRST_TOKEN: [token]},
                logprob_token_ids=[token],
            )
            logprobs = next_logprobs(await self._generate(prefix, probe, SCORING_PRIORITY))
            self.exclusion_applies = bool(logprobs) and logprobs[token].logprob == -float("inf")
            if not self.exclusion_applies:
                self._warn_without_plugin()
        return self.exclusion_applies is not False

    async def _visit_requests(self, samples) -> None:
        """The requests the planner sends for all of a visit's samples (`visit_rounds`), a round at a time. A request
        that fails leaves what it would have scored unknown: a tree's walks then stop before it, which stays exact; a
        sample scores what is left with its own requests."""
        top_k = self.planner.top_k
        scorer = self.planner.scorer
        for requests in scorer.visit_rounds(samples):
            outputs = await asyncio.gather(
                *[self._generate(r.token_ids, scoring_params(r, top_k), SCORING_PRIORITY) for r in requests],
                return_exceptions=True,
            )
            for request, output in zip(requests, outputs):
                try:
                    if isinstance(output, Exception):
                        raise output
                    scorer.take_visit_scores(samples, request, scoring_answer(request, output, top_k))
                except Exception as error:  # a sample's request: it asks again on its own, and falls back if it must
                    self._warn("a visit's scoring request failed; its tokens stay unscored", error)

    def _warn_without_plugin(self) -> None:
        logger.warning(
            "the engine does not run the logits-processor plugin %r (is specrl-openrlhf installed where vLLM runs, "
            "and speculative decoding off?): lossless redraws each rejected position with an extra request, which "
            "stays exact but costs time",
            EXCLUDE_FIRST_TOKEN,
        )

    def _generate(self, prompt_ids, params, priority: int):
        if self.prioritize:
            return self.generate_fn(prompt_ids, params, priority=priority)
        return self.generate_fn(prompt_ids, params)

    def _warn(self, what: str, error: Exception) -> None:
        self.failures += 1
        if self.failures & (self.failures - 1) == 0:  # 1st, 2nd, 4th, 8th...: loud but not flooding
            logger.warning("%s (%s: %s; %d failures so far)", what, type(error).__name__, error, self.failures)

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, *, follow_up: bool = False
    ) -> SampleOutput:
        """One sample; errors in the reuse path fall back to normal generation. `follow_up`: a later turn of an
        agent's sample (its drafts are kept apart, see `LocalDraftStore`)."""
        check_sampling_params(self.policy, params)
        if self.histories is not None and self.histories.available is not False:
            try:
                return await self._verified_in_engine(prompt_ids, params, follow_up)
            except Exception as error:
                self._warn("sample verified in the engine failed; generating normally", error)
        elif self.policy.draft_age and self.histories is None:
            try:
                return await self._speculative(prompt_ids, params, follow_up)
            except Exception as error:
                self._warn("speculative sample failed; generating normally", error)
        start = time.perf_counter()
        new_ids, new_lp, finish, _, _ = completion_of(await self.generate_fn(prompt_ids, params))
        stats = ReuseStats(samples=1, decoded_tokens=len(new_ids), fallbacks=int(self.policy.draft_age > 0))
        stats.time_generation_s = time.perf_counter() - start
        return SampleOutput(new_ids, new_lp if params.logprobs is not None else None, finish, 0, stats)

    async def _verified_in_engine(self, prompt_ids: list[int], params: SamplingParams, follow_up: bool):
        """One sample whose drafts vLLM verifies at every step (`vllm_proposer`). The visit's first sample claims the
        prompt's history and sends it to the engine while the samples generate; each finished sample joins the
        history of its visit's later samples, and is committed as a draft for the next visit."""
        key = prompt_key(prompt_ids)
        visit, slot = (OpenVisit(uuid.uuid4().hex), 0) if follow_up else self.visits.join(key)
        if slot == 0:
            count = 1 if follow_up else self.visits.samples_per_visit
            visit.drafts = asyncio.ensure_future(self._send_history(key, prompt_ids, visit.visit_id, count, follow_up))
        start = time.perf_counter()
        own = continuation_params(params, params.max_tokens, 0)  # logprobs on: the history keeps them
        output = await self._generate(prompt_ids, own, slot)  # with priorities, a visit's samples go in slot order
        new_ids, new_lp, finish, cached, _ = completion_of(output)
        metrics = getattr(output.outputs[0], "spec_decode_metrics", None)  # None: an engine without our arguments
        stats = verified_in_engine(
            getattr(metrics, "per_step_accepted", None) or [],
            getattr(metrics, "per_step_drafted", None) or [],
            len(new_ids),
        )
        stats.time_generation_s, stats.cached_prompt_tokens = time.perf_counter() - start, cached
        stats.fallbacks = int(self.histories.available is False)
        logprobs = new_lp if new_lp is not None else [0.0] * len(new_ids)
        self.histories.send(key, len(prompt_ids), False, [list(new_ids)], [list(logprobs)])
        try:
            stats.drafts_found = int(bool(await asyncio.shield(visit.drafts))) if visit.drafts else 0
        except Exception:
            stats.drafts_found = 0
        draft = Draft(np.asarray(new_ids, np.int32), np.asarray(logprobs, np.float32), finish)
        if self.planner.trace is not None:  # the response, a sample of p_curr: replay verifies it against proposals
            self._trace(key, visit.visit_id, draft, slot, params.max_tokens, stats.reused_tokens)
        output = SampleOutput(list(new_ids), new_lp if params.logprobs is not None else None, finish, 0, stats)
        await self._commit(key, visit.visit_id, draft, follow_up, output)
        return output

    async def _send_history(self, key: bytes, prompt_ids, visit_id: str, count: int, follow_up: bool) -> int:
        """Claim the visit's history from the draft store and send it to the engine; returns its size."""
        try:
            drafts = [
                d for d in await self.store.claim(key, visit_id, 1, count, follow_up, self.policy.draft_history) if d
            ]
        except Exception as error:  # the cache is unreachable: the visit drafts from its own finished samples only
            self._warn("draft cache claim failed; the visit proposes from its own samples", error)
            drafts = []
        responses = [d.token_ids.tolist() for d in drafts]
        self.histories.send(key, len(prompt_ids), True, responses, [d.logprobs.tolist() for d in drafts])
        if self.planner.trace is not None:
            for draft in drafts:
                self._trace(key, visit_id, draft, HISTORY_SLOT, len(draft), 0)
        return len(drafts)

    def _trace(self, key: bytes, visit_id: str, draft: Draft, slot: int, budget: int, kept: int) -> None:
        """A response verified in the engine (slot >= 0) or the history it drafted from (`HISTORY_SLOT`), recorded in
        the visit's group: `replay` rebuilds the history and verifies each response against a proposal."""
        prompt = int.from_bytes(key[:8], "little")
        entropy = (self.planner.seed, prompt, draft.visit, draft.index, len(draft))
        group = visit_group(prompt, int(visit_id[:15], 16))
        ended = draft.finish_reason == "stop"
        self.planner.trace.record(draft, draft.logprobs, draft.ages, budget, ended, entropy, kept, None, group, slot)

    async def _commit(self, key: bytes, visit_id: str, draft: Draft, follow_up: bool, output: SampleOutput) -> None:
        """Store the sample's response as a draft for the prompt's next visit; a failure costs that draft only."""
        try:  # a Ray store queues it and returns: a commit that fails later is counted on a later sample
            await self.store.commit(key, visit_id, draft, follow_up)
            if not follow_up:
                self.drafted.add(key)
        except Exception as error:  # the sample is fine; only its next visit loses a draft
            self._warn("draft cache commit failed; the sample is kept", error)
            output.stats.cache_errors = 1
        lost = getattr(self.store, "lost_commits", 0)
        if lost > self.lost_commits:
            output.stats.cache_errors += lost - self.lost_commits
            self._warn("draft cache commits failed; their prompts' next visits have no drafts", RuntimeError(lost))
            self.lost_commits = lost
        output.stats.cache_restarts = getattr(self.store, "restarts", 0)

    async def _speculative(self, prompt_ids: list[int], params: SamplingParams, follow_up: bool) -> SampleOutput:
        key = prompt_key(prompt_ids)
        # A later turn's prompt holds one sample's history: it is a visit of its own, which closes with the call.
        visit, slot = (OpenVisit(uuid.uuid4().hex), 0) if follow_up else self.visits.join(key)
        leader = slot == 0
        try:
            return await self._sample(key, prompt_ids, params, follow_up, visit, slot, leader)
        finally:
            if leader:  # whatever happened to the leader, its siblings must not wait for it
                visit.ready.set()

    async def _sample(self, key, prompt_ids, params, follow_up: bool, visit: OpenVisit, slot: int, leader: bool):
        age, history = self.policy.draft_age, self.policy.draft_history
        n = 1 if follow_up else self.visits.samples_per_visit
        if follow_up:  # a later turn's prompt holds one sample's history: its samples claim one by one
            claim = self.store.claim(key, visit.visit_id, age, 1, follow_up, history)
        else:  # the visit's first sample claims for all of them: one cache call per visit
            if visit.drafts is None:
                visit.drafts = asyncio.ensure_future(self.store.claim(key, visit.visit_id, age, n, False, history))
            claim = asyncio.shield(visit.drafts)
        early = None
        if self.reusable < 0.5 and key not in self.drafted:  # likely nothing to reuse: generate while claiming
            early = continuation_params(params, params.max_tokens, 0, 0, self.planner.top_k)
            early = asyncio.ensure_future(self._generate(prompt_ids, early, -params.max_tokens))
        try:
            return await self._claimed(key, prompt_ids, params, follow_up, visit, slot, leader, claim, early)
        finally:
            if early is not None and not early.done():
                early.cancel()

    async def _claimed(self, key, prompt_ids, params, follow_up, visit, slot, leader, claim, early):
        """The sample once its visit's claim is out; `early`: its generation from the prompt alone, already started,
        which it keeps if it has nothing to reuse (as stock generation would give it), and drops otherwise."""
        n = 1 if follow_up else self.visits.samples_per_visit
        cache_errors = 0
        try:
            drafts = list(await claim)
        except Exception as error:  # the cache is unreachable: this sample has no draft
            self._warn("draft cache claim failed; this sample is generated normally", error)
            drafts, cache_errors = [], 1
        if early is not None and any(draft is not None for draft in drafts):  # it would hold the engine's slots
            early.cancel()  # while the visit's scoring waits
            early = None
        start = time.perf_counter()
        if leader:  # the visit's samples, built once, so that its requests (probe, tree) serve them all
            visit.samples = self.planner.visit_samples(prompt_ids, params.max_tokens, drafts, key, n)
            visit.unclaimed = dict(enumerate(visit.samples))
            found = any(s.draft is not None or s.tree is not None for s in visit.samples)
            self.reusable += REUSABLE_DECAY * (found - self.reusable)
            self.planner.decide(visit.samples)  # rules that do not read p_curr cut now
            await self._visit_requests(visit.samples)
            visit.ready.set()
        elif not follow_up:
            await _wait(visit.ready, LEADER_WAIT_S)
        sample = visit.unclaimed.pop(slot, None)  # each built sample goes to one call only
        if sample is None or sample.max_tokens != params.max_tokens:  # not in the probe: it scores on its own
            sample = self.planner.new_sample(
                prompt_ids, params.max_tokens, drafts[slot] if slot < len(drafts) else None, key
            )
        sample.stats.cache_errors = sample.stats.fallbacks = cache_errors
        new_ids, new_lp, finish, new_top, scoring = (), None, None, None, True
        if early is not None and sample.draft is None and sample.tree is None:  # nothing to reuse: it is the sample
            sample.continued, scoring = True, False
            start = await self._scoring_done(sample, start)
            new_ids, new_lp, finish, sample.stats.cached_prompt_tokens, new_top = completion_of(
                await early, self.planner.top_k
            )
            sample.stats.time_generation_s = time.perf_counter() - start
        while (request := self.planner.next_request(sample)) is not None:
            if isinstance(request, ScoringRequest):
                await self._score(sample, request, visit)
                continue
            start, scoring = await self._scoring_done(sample, start), False
            new_ids, new_lp, finish, sample.stats.cached_prompt_tokens, new_top = await self._continue(
                sample, request, params
            )
            sample.stats.time_generation_s = time.perf_counter() - start
        if scoring:  # nothing left to generate
            await self._scoring_done(sample, start)
        start = time.perf_counter()
        output, next_draft = self.planner.assemble(
            sample, new_ids, new_lp, finish, want_logprobs=params.logprobs is not None, new_top=new_top
        )
        await self._commit(key, visit.visit_id, next_draft, follow_up, output)
        output.stats.time_assembly_s = time.perf_counter() - start
        return output


async def _wait(event: asyncio.Event, timeout: float) -> None:
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except asyncio.TimeoutError:
        pass


def engine_generate(engine):
    """Adapt a vLLM `AsyncLLM` to `async generate(prompt_token_ids, params, priority=0) -> final RequestOutput`."""

    async def generate(prompt_token_ids, params, priority: int = 0):
        final = None
        async for output in engine.generate(
            TokensPrompt(prompt_token_ids=prompt_token_ids), params, request_id=uuid.uuid4().hex, priority=priority
        ):
            final = output
        return final

    return generate


async def gather_samples(generator: AsyncSpeculativeGenerator, prompts, params: SamplingParams) -> RolloutBatch:
    """Run `params.n` concurrent single-sample calls per prompt, as OpenRLHF does, and collect them."""
    single = params.clone()
    n, single.n = params.n, 1
    outputs = await asyncio.gather(*[generator.generate(list(p), single) for p in prompts for _ in range(n)])
    stats = ReuseStats()
    for output in outputs:
        stats = stats + output.stats
    return RolloutBatch([list(outputs[i * n : (i + 1) * n]) for i in range(len(prompts))], stats)
