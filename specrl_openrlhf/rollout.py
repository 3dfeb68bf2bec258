"""Engine-independent steps of a speculative rollout (SPEC-RL Algorithm 1).

For each sample: take a draft, truncate it to what the engine can take, let the policy cut it (one vectorised
call per batch, scored logprobs from the current weights when the policy needs them), continue generation from
prompt + verified prefix, and assemble verified prefix + continuation. The engine adapters in
`specrl_openrlhf.integration` drive these steps over vLLM's batched `LLM` and its async engine.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch

from .adaptive import FeedbackBuffer
from .cache import Draft
from .metrics import ReuseStats
from .policies import DraftBatch, ReusePolicy
from .residual import draw, residual, top_k_of
from .staleness import reused_token_sums, scored_token_sums
from .trace import HISTORY_SLOT, TraceWriter, uniforms_for, visit_group
from .tree import ROOT, DraftTree, walk

logger = logging.getLogger(__name__)

REUSED_LOGPROBS = ("auto", "scored", "draft")
SCORING_MODES = ("chunked", "full")
MAX_NEXT_TOKEN_IDS = 128  # vLLM's cap on `logprob_token_ids`
MAX_POINT_PROBES = 4  # more positions missing than this: rescore them without reading the prefix cache
RESIDUAL_STREAM = 1  # entropy suffix of the uniform that draws a rejected position from the residual
NO_OWN_DRAFT = 1 << 32  # the length field of a tree sample's entropy when it has no previous response of its own


PENALTIES = {"repetition_penalty": (1.0, None), "presence_penalty": (0.0, None), "frequency_penalty": (0.0, None)}


class UnsupportedSamplingError(ValueError):
    """Sampling settings under which p_prev and p_curr would describe different distributions."""


def check_sampling(
    policy: ReusePolicy, *, min_tokens: int = 0, processed_logprobs: bool = False, **settings
) -> list[str]:
    """Fail unless the scored (always raw) logprobs describe the distribution samples are drawn from; return
    warnings for what is close but not exact.

    vLLM's prompt logprobs, which scoring uses, are raw: temperature 1, no top-p/top-k/min-p, no penalties. A
    lenient ratio between a raw p_curr and a tempered or truncated p_prev is meaningless, so policies that score
    drafts need plain sampling. Policies that do not score (random, full, off) accept any settings. With
    `min_tokens` > 0 the engine masks EOS at the first positions; when the engine reports processed logprobs (as
    OpenRLHF sets it for the IS correction), a draft's p_prev there is renormalised without EOS while the scored
    p_curr is not: their ratio is off by 1 - p(EOS) at those positions, which the warning says.
    Keyword arguments are SamplingParams fields (temperature, top_p, top_k, min_p and the penalties).
    """
    if policy.verifies_in_engine:  # vLLM verifies under the request's own temperature, top-p and top-k
        # under speculative decoding vLLM ignores min-p and logit bias; penalties are refused as untested with drafts
        unapplied = {"min_p": (0.0, None), "logit_bias": (None, {}), **PENALTIES}
        bad = {k: v for k, v in settings.items() if k in unapplied and v not in unapplied[k]}
        if bad:
            names = ", ".join(f"{k}={v}" for k, v in bad.items())
            raise UnsupportedSamplingError(
                f"reuse policy {policy.name!r} verifies drafts inside vLLM, which samples with temperature, top-p and "
                f"top-k as asked but ignores min-p and logit bias under speculative decoding (and penalties are not "
                f"tested there); sampling uses {names}. Drop them, or set verify='requests' (--reuse.params "
                '\'{"verify": "requests"}\'), which needs plain sampling.'
            )
        return []
    if not policy.needs_scores:
        return []
    plain = {
        "temperature": (1.0,),
        "top_p": (1.0, None),
        "top_k": (0, -1, None),
        "min_p": (0.0, None),
        **PENALTIES,
    }
    bad = {k: v for k, v in settings.items() if k in plain and v not in plain[k]}
    if bad:
        names = ", ".join(f"{k}={v}" for k, v in bad.items())
        raise UnsupportedSamplingError(
            f"reuse policy {policy.name!r} scores drafts with vLLM prompt logprobs, which are always raw "
            f"(temperature 1, no top-p/top-k/min-p/penalties), but sampling uses {names}. Sample with "
            f"temperature 1.0, top_p 1.0 and top_k -1 (the paper's setting, --rollout.temperature 1.0 "
            f"--rollout.top_p 1.0), or pick a policy that does not score drafts (random, full, off)."
        )
    if min_tokens and processed_logprobs:
        return [
            f"the engine masks EOS at the first {min_tokens} position(s) (min_tokens) and reports processed logprobs: "
            "there a draft's p_prev is renormalised without EOS and p_curr is not, so their ratio is off by "
            "1 - p(EOS), which is negligible unless responses often end at once"
        ]
    return []


@dataclass
class SampleOutput:
    """One generated sample: verified prefix + continuation."""

    token_ids: list[int]
    logprobs: list[float] | None  # per response token; None if the caller did not ask for logprobs
    finish_reason: str
    verified_prefix_len: int = 0
    stats: ReuseStats = field(default_factory=ReuseStats)
    draft_id: tuple[int, int] | None = None  # (visit, index) of the draft it started from, None without one


@dataclass
class Sample:
    """State of one sample through the speculative rollout."""

    prompt_ids: list[int]
    max_tokens: int
    draft: Draft | None = None  # already truncated to what this visit can use
    draft_ended: bool = False  # the (untruncated) draft ended by a stop condition (EOS or stop string)
    scored: np.ndarray | None = None  # [L] float32 log p_curr of the draft tokens, NaN where not scored (yet)
    uniforms: np.ndarray | None = None  # [L] float64
    entropy: tuple[int, ...] = ()  # what the uniforms were drawn from (traces store it)
    ages_now: np.ndarray | None = None  # [L] int64, visits since each draft token was decoded, counting this one
    scored_top: tuple[np.ndarray, np.ndarray] | None = None  # ([L, k] ids, [L, k] logprobs) of p_curr (lossless)
    cut: int = 0
    decided: bool = False  # the cut is final
    continued: bool = False  # its continuation was asked for (`next_request`)
    resampled: tuple[int, float] | None = None  # the rejected position, redrawn from the residual: (token, log p_curr)
    excluded: tuple[int, ...] = ()  # tokens the continuation's first step must not sample (`lossless`)
    excluded_mass: float = 0.0  # their summed p_curr
    tree: DraftTree | None = None  # the visit's tree of previous responses, shared by its samples (`draft="tree"`)
    own: int | None = None  # the sample's own previous response among the tree's, None without one
    forecast: tuple[int, int] | None = None  # (forecast cut, first draft position) at its first scoring request
    unserved: np.ndarray | None = None  # [k] draft positions a visit's request read from the prefix cache: rescored
    stats: ReuseStats = field(default_factory=ReuseStats)

    @property
    def prefix_len(self) -> int:
        """Tokens the continuation starts after: the verified prefix, and the redrawn token if there is one."""
        return self.cut + (self.resampled is not None)

    @property
    def draft_len(self) -> int:
        return 0 if self.draft is None else len(self.draft)

    @property
    def walks(self) -> bool:
        """It proposes from a tree it has not walked yet: its draft is the path the walk takes (`decide`)."""
        return self.tree is not None and not self.decided

    @property
    def scored_upto(self) -> int:
        """How many leading draft tokens have p_curr."""
        if self.scored is None:
            return 0
        unknown = np.flatnonzero(np.isnan(self.scored))
        return int(unknown[0]) if len(unknown) else len(self.scored)


@dataclass(frozen=True)
class ScoringRequest:
    """Score draft[start:end]: send prompt + draft[:end] with `max_tokens=1, prompt_logprobs=0`. With `read_cache`,
    the request may read vLLM's prefix cache: positions served from it come back without logprobs.
    `next_token_ids` are scored as the token that follows (vLLM's `logprob_token_ids` on the one generated token):
    draft[end], so that the next chunk can start after it, or every sample's first token in a visit's prompt probe."""

    token_ids: list[int]
    start: int
    end: int
    read_cache: bool
    next_token_ids: tuple[int, ...] = ()
    branch: int | None = None  # a tree's request: the draft is that response of the visit's `DraftTree`
    sample: int | None = None  # a visit's request for one of its samples: the draft is that sample's (its index)


@dataclass(frozen=True)
class ContinuationRequest:
    """Generate up to `max_tokens` after `token_ids` (prompt + verified prefix [+ a redrawn token]); `verified`: the
    response tokens before it; `excluded`: tokens the first step must not sample (`lossless`)."""

    token_ids: list[int]
    max_tokens: int
    verified: int
    excluded: tuple[int, ...] = ()


class ChunkSchedule:
    """How many draft tokens one scoring request covers, for rules whose first rejection decides the cut.

    Such a rule needs p_curr only up to the first rejection. Drafts are scored in chunks; a chunk that is all
    accepted is followed by the next, and the prefix cache serves each later chunk its prompt and earlier chunks.
    A chunk too long scores tokens past the rejection; one too short pays many round trips, each costing about
    `round_trip_tokens` scored tokens (the partial cache block it computes again, and its wait for a sequence slot).
    With rejections at this engine's recent rate q per examined token, a chunk of c tokens costs
    (c + round_trip_tokens) / (1 - (1 - q)^c) per draft; the chunk is the c that costs least. With little drift the
    best chunk outgrows any draft, and a draft is scored in one request, as without chunks.
    """

    LONGEST = 1 << 16  # a best chunk this long means: the whole draft in one request
    CANDIDATES = np.unique(np.minimum(np.round(1.08 ** np.arange(146)), LONGEST).astype(np.int64))  # 1 .. LONGEST

    def __init__(self, round_trip_tokens: float = 64.0, half_life_tokens: float = 16384.0):
        if not (round_trip_tokens >= 0 and half_life_tokens > 0):
            raise ValueError(
                f"bad chunk schedule: round_trip_tokens={round_trip_tokens}, half_life_tokens={half_life_tokens}"
            )
        self.round_trip_tokens, self.half_life_tokens = float(round_trip_tokens), float(half_life_tokens)
        self.rejections = 0.0  # decayed counts over recently examined tokens
        self.tokens = 0.0
        self._best: int | None = None  # cached until the next observation

    def chunk(self) -> int | None:
        """Draft tokens for the next request, or None for the whole rest of the draft."""
        if self.rejections <= 0.0:
            return None
        if self._best is None:
            q = min(1.0, self.rejections / self.tokens)
            candidates = self.CANDIDATES
            with np.errstate(divide="ignore"):
                reached = -np.expm1(candidates * np.log1p(-q))  # P(a rejection within c tokens)
            self._best = int(candidates[np.argmin((candidates + self.round_trip_tokens) / reached)])
        return None if self._best >= self.LONGEST else self._best

    def observe(self, examined: int, rejected: bool) -> None:
        """One cut draft: the tokens the rule examined (up to and including its first rejection)."""
        decay = 0.5 ** (examined / self.half_life_tokens)
        self.tokens = self.tokens * decay + examined
        self.rejections = self.rejections * decay + float(rejected)
        self._best = None


class CutForecast:
    """Where a rule will cut a draft, asked of the rule itself with p_prev standing in for p_curr where the draft is
    not scored yet, and how far past that forecast a scoring chunk should reach.

    The uniforms are drawn before scoring, so a rule such as `lossless` (keep y_i iff u_i <= p_curr(y_i)) tells where
    it would cut if the policy had not moved: a chunk that ends a margin past that forecast scores few tokens past
    the real cut and rarely needs a second request. The margin is the one that would have cost least on the drafts
    cut most recently: the tokens it scores plus `round_trip_tokens` for each draft it leaves short (see
    `ChunkSchedule`). Among the margins is "the whole draft", so a rule whose forecast says nothing (`spec`, which
    keeps every draft whose policy did not move) costs no more than without one.
    """

    MARGINS = np.array([0, 1, 2, 4, 8, 16, 32, 64, ChunkSchedule.LONGEST], np.int64)
    MIN_RECORDS = 32  # before this many cut drafts, the chunk schedule alone decides
    SAMPLE_EVERY = 8  # while the whole draft is the best margin, one request in this many still forecasts

    def __init__(self, round_trip_tokens: float = 64.0, window: int = 512):
        if not (round_trip_tokens >= 0 and window >= self.MIN_RECORDS):
            raise ValueError(f"bad cut forecast: round_trip_tokens={round_trip_tokens}, window={window}")
        self.round_trip_tokens = float(round_trip_tokens)
        self.records = np.zeros((int(window), 4), np.int64)  # rows: forecast cut, start, tokens needed, draft length
        self.count = 0
        self._margin: int | None = None  # cached until the next observation
        self._asked = 0

    def wanted(self) -> bool:
        """Whether to forecast for the next scoring request. Not while the whole draft is the best margin (a rule whose
        forecast says nothing, such as `spec`), but for one request in `SAMPLE_EVERY`, so that the margin can move."""
        if self.margin() != ChunkSchedule.LONGEST:
            return True
        self._asked += 1
        return self._asked % self.SAMPLE_EVERY == 0

    def margin(self) -> int | None:
        """Tokens past the forecast cut (after the forecast rejection) that a chunk should score, or None while too
        few drafts were cut to tell."""
        if self.count < self.MIN_RECORDS:
            return None
        if self._margin is None:
            forecast, start, needed, length = self.records[: min(self.count, len(self.records))].T  # [N] each
            covered = np.minimum(length, forecast + 1 + self.MARGINS[:, None])  # [M, N]
            short = needed > covered
            cost = covered - start + short * (self.round_trip_tokens + needed - covered)
            self._margin = int(self.MARGINS[np.argmin(cost.mean(axis=1))])
        return self._margin

    def observe(self, forecast: int, start: int, needed: int, draft_len: int) -> None:
        """One cut draft: the cut forecast at its first scoring request, that request's first draft position, the
        tokens the rule examined (up to and including its first rejection) and the draft's length."""
        self.records[self.count % len(self.records)] = (forecast, start, needed, draft_len)
        self.count += 1
        self._margin = None


class SpeculativePlanner:
    """The decisions of a speculative rollout, free of any engine.

    Args:
        policy: the reuse policy.
        seed: seeds the per-sample uniforms, together with the prompt and the draft's visit, so that runs are
            reproducible while every visit draws fresh randomness.
        reused_logprobs: which logprobs reused tokens report: "scored" (current policy), "draft" (the draft's
            own) or "auto" (scored when the policy scores drafts, else the draft's).
        max_token_id: largest token id the engine accepts in a prompt; drafts are cut before the first id
            outside [0, max_token_id].
        max_model_len: the engine's context length; a scoring request (prompt + draft + 1) must fit in it.
        trace: where to record every cut draft (`--reuse.trace_dir`), or None. Traces need p_curr of whole drafts, so
            tracing scores drafts in one piece.
        scoring: "chunked" (score drafts in chunks for rules whose first rejection decides the cut, reading the
            prefix cache) or "full" (every draft in one request that never reads the prefix cache). A rule that redraws
            rejected positions (`resample_top_k`) is scored in full: it needs p_curr's top-k at every scored position.
        stop_token_ids: tokens that end a response (EOS): a redrawn token among them completes the sample.
        processed_logprobs: the engine reports processed log-probs (`logprobs_mode="processed_logprobs"`, as OpenRLHF
            sets it for its IS correction): a continuation whose first step banned a token then reports
            log p(x) / (1 - p(y)) for it, which assembly turns back into log p_curr(x).
    """

    def __init__(
        self,
        policy: ReusePolicy,
        *,
        seed: int = 0,
        reused_logprobs: str = "auto",
        max_token_id: int | None = None,
        max_model_len: int | None = None,
        trace: TraceWriter | None = None,
        scoring: str = "chunked",
        stop_token_ids=(),
        processed_logprobs: bool = False,
    ):
        if reused_logprobs not in REUSED_LOGPROBS:
            raise ValueError(f"reused_logprobs must be one of {REUSED_LOGPROBS}, got {reused_logprobs!r}")
        if scoring not in SCORING_MODES:
            raise ValueError(f"scoring must be one of {SCORING_MODES}, got {scoring!r}")
        self.policy = policy
        self.seed = int(seed)
        self.max_token_id = max_token_id
        self.max_model_len = max_model_len
        if reused_logprobs == "auto":
            reused_logprobs = "scored" if policy.needs_scores else "draft"
        self.reused_logprobs = reused_logprobs
        self.scores_drafts = policy.needs_scores or reused_logprobs == "scored"
        self.top_k = int(policy.resample_top_k)
        if self.top_k:
            scoring = "full"
        self.read_cache = scoring == "chunked"
        self.chunks = (
            ChunkSchedule()
            if scoring == "chunked" and policy.needs_scores and policy.prefix_decidable and trace is None
            else None
        )
        self.forecast = CutForecast() if self.chunks is not None else None
        self.stop_token_ids = frozenset(int(t) for t in stop_token_ids)
        self.processed_logprobs = bool(processed_logprobs)
        self.trace = trace
        self.feedback = FeedbackBuffer()  # a stateful rule's reports, until the rollout sends them on

    # ---- step 1: drafts -----------------------------------------------------------------------------------------

    def visit_samples(
        self, prompt_ids, max_tokens: int, claimed: list, key: bytes = b"", count: int = 1
    ) -> list[Sample]:
        """The `count` samples of one visit (one prompt, one budget), from what the cache gave the visit: a draft per
        slot (None where there is none), then, with `history` 2, the responses of the visit before. Each sample
        proposes its own draft, or, by the rule's `draft_choice`, the majority path through all of the responses
        (numbered per sample, so that each draws its own uniforms), or their tree (one `DraftTree`, shared)."""
        claimed = list(claimed)
        own = (claimed[:count] + [None] * count)[:count]
        older = claimed[count:]
        choice = self.policy.draft_choice if self.policy.draft_age else "own"
        if choice == "majority":
            path = majority_path(own + older)
            if path is not None:
                own = [path.numbered(path.visit, index) for index in range(count)]
        if choice != "tree":
            return [self.new_sample(prompt_ids, max_tokens, draft, key) for draft in own]
        return self._tree_samples(prompt_ids, max_tokens, own, older, key)

    def new_sample(self, prompt_ids, max_tokens: int, draft: Draft | None, key: bytes = b"") -> Sample:
        """Wrap a request and its draft, truncating the draft to the budget, the context and the vocabulary."""
        sample = Sample(prompt_ids=list(prompt_ids), max_tokens=int(max_tokens))
        sample.stats.samples = 1
        draft, sample.stats.invalid_drafts = self._usable(draft, len(sample.prompt_ids), sample.max_tokens)
        if draft is None:
            return sample
        sample.draft_ended = draft.finish_reason == "stop"
        sample.draft = draft
        sample.ages_now = sample.draft.ages.astype(np.int64) + self.policy.draft_age
        sample.stats.drafts_found = 1
        sample.stats.draft_tokens = len(draft)
        sample.entropy = self._entropy(key, draft.visit, draft.index, len(draft))
        sample.uniforms = uniforms_for(sample.entropy, len(draft))
        if self.scores_drafts:
            sample.scored = np.full(len(draft), np.nan, np.float32)
        if self.top_k:
            sample.scored_top = (
                np.full((len(draft), self.top_k), -1, np.int32),
                np.full((len(draft), self.top_k), -np.inf, np.float32),
            )
        return sample

    def _entropy(self, key: bytes, visit: int, index: int, length: int) -> tuple[int, ...]:
        """What a sample's uniforms are drawn from: the seed, the prompt, and the draft's visit, index and length."""
        return (self.seed, int.from_bytes(key[:8] or b"\0", "little"), int(visit), int(index), int(length))

    def _usable(self, draft: Draft | None, prompt_len: int, max_tokens: int) -> tuple[Draft | None, int]:
        """The part of a draft this visit can use: within the budget and the context (prompt + draft + 1 <=
        max_model_len), and before the first token id the engine would refuse as a prompt token or the first
        non-finite logprob (a corrupt draft is used up to its first bad token). A draft cut short no longer ends by a
        stop condition. Returns (that part or None, 1 if the draft was corrupt)."""
        if draft is None or len(draft) == 0 or self.policy.draft_age == 0:
            return None, 0
        limit = min(len(draft), max_tokens)
        if self.max_model_len is not None:
            limit = min(limit, self.max_model_len - prompt_len - 1)
        tokens = draft.token_ids[: max(limit, 0)]
        invalid = ~np.isfinite(draft.logprobs[: len(tokens)]) | ~np.isfinite(draft.gen_logprobs[: len(tokens)])
        if self.max_token_id is not None:  # ids the engine would refuse as prompt tokens
            invalid |= (tokens < 0) | (tokens > self.max_token_id)
        corrupt = int(invalid.any())
        if corrupt:
            tokens = tokens[: np.flatnonzero(invalid)[0]]
        if len(tokens) == 0:
            return None, corrupt
        if len(tokens) == len(draft):
            return draft, corrupt
        return dataclasses.replace(draft.head(len(tokens)), finish_reason="length"), corrupt

    def _tree_samples(self, prompt_ids, max_tokens: int, own: list, older: list, key: bytes) -> list[Sample]:
        """Samples that share one `DraftTree` of the visit's usable responses (their own ones first, in slot order).
        Each draws its uniforms as its own draft would, so that, for the same p_curr, its walk keeps at least what
        that draft alone would keep."""
        samples = [Sample(prompt_ids=list(prompt_ids), max_tokens=int(max_tokens)) for _ in own]
        usable, slots, corrupt = [], [], 0
        for draft in own + older:
            head, bad = self._usable(draft, len(prompt_ids), max_tokens)
            corrupt += bad
            slots.append(None if head is None else len(usable))
            if head is not None:
                usable.append(head)
        for sample in samples:
            sample.stats.samples = 1
        if samples:
            samples[0].stats.invalid_drafts = corrupt
        if not usable:
            return samples
        tree = DraftTree(usable)
        tree.own_count = sum(slot is not None for slot in slots[: len(own)])
        for slot, sample in enumerate(samples):
            sample.tree, sample.own = tree, slots[slot]
            mine = None if sample.own is None else usable[sample.own]
            sample.entropy = (
                self._entropy(key, mine.visit, mine.index, len(mine))
                if mine is not None
                else self._entropy(key, usable[0].visit, slot, NO_OWN_DRAFT)
            )
            sample.uniforms = uniforms_for(sample.entropy, tree.max_depth + 1)
            sample.stats.drafts_found = 1
            sample.stats.tree_branches, sample.stats.tree_nodes = len(tree.branches), tree.num_nodes - 1
        return samples

    # ---- step 2: scoring ----------------------------------------------------------------------------------------

    def prompt_probe(self, samples: list[Sample]) -> ScoringRequest | None:
        """One request for a visit's samples (same prompt) before their own: it computes the prompt once, so that
        theirs read it from the prefix cache, and scores every sample's first draft token, which a request that reads
        the prompt from the cache can't give (vLLM has no logits for the last cached position). None unless two or
        more samples will score."""
        if not self.read_cache:
            return None
        needy = [s for s in samples if self.wants_scoring(s)]
        if len(needy) < 2:
            return None
        first_tokens = tuple(sorted({int(s.draft.token_ids[0]) for s in needy}))
        return ScoringRequest(list(needy[0].prompt_ids), 0, 0, True, first_tokens[:MAX_NEXT_TOKEN_IDS])

    @staticmethod
    def take_probe(samples: list[Sample], request: ScoringRequest, next_logprobs, num_cached_tokens) -> None:
        """Store each sample's first-token logprob from a prompt probe (`next_logprobs`: {token_id: Logprob}); the
        probe's cost is counted on the first sample that scores."""
        scoring = [s for s in samples if s.scored is not None]
        if not scoring:
            return
        scoring[0].stats.scoring_requests += 1
        scoring[0].stats.scoring_prefill_tokens += len(request.token_ids) - int(num_cached_tokens or 0)
        for s in scoring:
            token = int(s.draft.token_ids[0])
            if token in request.next_token_ids and np.isnan(s.scored[0]):
                s.scored[0] = next_logprobs[token].logprob

    def visit_rounds(self, samples: list[Sample]):
        """The requests a visit sends for all of its samples before their own, round by round: a generator of lists of
        `ScoringRequest`s, each round's answers handed to `take_visit_scores` before the next is asked for. Drafts of
        their own (or the majority path), in one round: the prompt probe (every sample's first draft token, as the
        tokens that follow the prompt) and each sample's first scoring request, which may read the prompt from the
        prefix cache; a sample then goes on with its own requests. A tree, in one round: the prompt probe (p_curr of
        the root's children, as the tokens that follow the prompt) and one request per branch (each branch scored once
        for every sample), which may read the prompt, and one another's shared prefixes, from the prefix cache; then
        point probes for the nodes the cache left out, if any. The tree then counts as scored, and its samples walk
        it."""
        tree = samples[0].tree if samples else None
        if tree is None:
            probe = self.prompt_probe(samples)
            if probe is not None:
                firsts = [
                    dataclasses.replace(request, sample=index)
                    for index, sample in enumerate(samples)
                    if (request := self.next_scoring(sample)) is not None
                ]
                yield [probe, *firsts]
            return
        prompt = samples[0].prompt_ids
        shared = self.read_cache and len(tree.branches) >= 2  # the branches share the prompt: it is computed once
        requests = []
        if shared:  # positions the cache serves come without log-probs: the root's children come from the probe
            first_tokens = tuple(int(t) for t in tree.token[tree.children(ROOT)][:MAX_NEXT_TOKEN_IDS])
            requests.append(ScoringRequest(list(prompt), 0, 0, True, first_tokens, branch=tree.branches[0]))
        for response in tree.branches:
            tokens = tree.path_tokens(response)
            end = len(tokens) - 1 if shared else len(tokens)  # the last token as the one that follows the request
            follows = (int(tokens[end]),) if end < len(tokens) else ()
            requests.append(ScoringRequest(prompt + tokens[:end].tolist(), 0, end, shared, follows, branch=response))
        yield requests
        missing = tree.unknown()
        if len(missing):
            yield self._tree_rescoring(prompt, tree, missing)
        tree.scored = True

    @staticmethod
    def _tree_rescoring(prompt: list[int], tree: DraftTree, missing: np.ndarray) -> list[ScoringRequest]:
        """Requests for tree nodes that no request gave (the prefix cache served them): a point probe per parent
        (its path, scoring the missing children as the tokens that follow), or, when many parents are missing, the
        branches through them without reading the cache."""
        parents = sorted(set(tree.parent[missing].tolist()))
        if len(parents) <= MAX_POINT_PROBES:
            requests = []
            for parent in parents:
                children = tree.children(parent)
                wanted = children[np.isnan(tree.logprobs[children])]
                response, depth = int(tree.source[wanted[0]]), int(tree.depth[parent])
                tokens = tuple(int(t) for t in tree.token[wanted][:MAX_NEXT_TOKEN_IDS])
                prefix = prompt + tree.path_tokens(response)[:depth].tolist()
                requests.append(ScoringRequest(prefix, depth, depth, True, tokens, branch=response))
            return requests
        unknown = np.zeros(tree.num_nodes, bool)
        unknown[missing] = True
        return [
            ScoringRequest(prompt + tree.path_tokens(r).tolist(), 0, len(tree.paths[r]), False, (), branch=r)
            for r in tree.branches
            if unknown[tree.paths[r]].any()
        ]

    def take_visit_scores(
        self, samples: list[Sample], request: ScoringRequest, prompt_logprobs, num_cached_tokens, next_logprobs
    ) -> None:
        """The answer to one of `visit_rounds`' requests. The prompt probe's and a sample's first request's, as
        `take_probe` and `take_scores` take them (positions still unknown are left to the sample's own requests). A
        tree's: log p_curr of the nodes along its branch (entries the prefix cache served, or that hold no usable
        value, stay unknown), and of the children asked for as the tokens that follow; its cost is counted on the
        visit's first sample."""
        if request.sample is not None:  # a sample's first request: what the cache left out, from a sibling if it can
            sample = samples[request.sample]
            missing = self.take_scores(sample, request, prompt_logprobs, num_cached_tokens, next_logprobs)
            if len(missing):  # still unknown: the sample's next requests score them without reading the cache
                missing = self.recover_scores(sample, missing, samples)
                sample.unserved = missing if len(missing) else None
            return
        if request.branch is None:
            self.take_probe(samples, request, next_logprobs, num_cached_tokens)
            return
        tree, stats = samples[0].tree, samples[0].stats
        known_before = int(np.isfinite(tree.logprobs).sum())
        cached = int(num_cached_tokens or 0) if request.read_cache else 0
        stats.scoring_requests += 1
        stats.scoring_prefill_tokens += len(request.token_ids) - cached
        path, tokens, offset = tree.paths[request.branch], tree.path_tokens(request.branch), len(samples[0].prompt_ids)
        for position in range(max(request.start, cached + 1 - offset), request.end):
            node = path[position]
            if np.isnan(tree.logprobs[node]):
                tree.logprobs[node] = _logprob(prompt_logprobs[offset + position], int(tokens[position]))
        if request.next_token_ids and next_logprobs:
            parent = path[request.end - 1] if request.end else ROOT
            for child in tree.children(parent).tolist():
                token = int(tree.token[child])
                if token in request.next_token_ids and np.isnan(tree.logprobs[child]):
                    tree.logprobs[child] = _logprob(next_logprobs, token)
        stats.scored_tokens += int(np.isfinite(tree.logprobs).sum()) - known_before

    def wants_scoring(self, sample: Sample) -> bool:
        """Whether the sample needs a scoring request (see `next_scoring`)."""
        if sample.draft is None or sample.scored is None:
            return False
        if self.policy.needs_scores:
            return not sample.decided
        return sample.decided and sample.scored_upto < sample.cut

    def next_scoring(self, sample: Sample) -> ScoringRequest | None:
        """The next scoring request the sample needs, or None. A rule that reads p_curr gets the draft chunk by chunk
        until it decides; a rule that does not gets, once it has cut, the kept prefix scored when reused tokens
        report p_curr (`reused_logprobs="scored"`)."""
        if not self.wants_scoring(sample):
            return None
        if sample.unserved is not None:  # what the prefix cache served in the visit's round, no sibling had
            left = sample.unserved[np.isnan(sample.scored[sample.unserved])]
            sample.unserved = left if len(left) else None
            if len(left):
                return self.rescoring(sample, left)[0]
        start = sample.scored_upto
        if self.policy.needs_scores:
            chunk = self.chunks.chunk() if self.chunks is not None else None
            forecasting = self.forecast is not None and self.forecast.wanted()
            if forecasting and (forecast := self.forecast_cut(sample)) is not None:
                if sample.forecast is None:
                    sample.forecast = (forecast, start)
                if (margin := self.forecast.margin()) is not None:
                    # up to the forecast rejection and the margin past it; at least one token, whatever a rule says
                    span = max(forecast + 1 + margin - start, 1)
                    chunk = span if chunk is None else min(chunk, span)
            # a chunk's last token comes as the token that follows the request (see below): chunk 1 = a point probe
            end = sample.draft_len if chunk is None else min(sample.draft_len, start + chunk - 1)
        else:
            end = sample.cut
        tokens = sample.prompt_ids + sample.draft.token_ids[:end].tolist()
        follows = (int(sample.draft.token_ids[end]),) if self.read_cache and end < sample.draft_len else ()
        return ScoringRequest(tokens, start, end, self.read_cache, follows)

    def forecast_cut(self, sample: Sample) -> int | None:
        """Where the rule would cut the draft if the tokens not scored yet had p_curr = p_prev (the draft's own
        log-probs), or None if the rule fails on that (the chunk schedule then decides alone)."""
        guess = np.where(np.isnan(sample.scored), sample.draft.logprobs[: sample.draft_len], sample.scored)
        batch = batch_of([sample], np.array([sample.draft_len], np.int64), True, scored=[guess])
        try:
            return int(checked_cuts(self.policy, batch, self.policy.cut(batch))[0])
        except Exception:
            return None

    def take_scores(
        self, sample: Sample, request: ScoringRequest, prompt_logprobs, num_cached_tokens, next_logprobs=None
    ) -> np.ndarray:
        """Store p_curr of draft[request.start:request.end] from vLLM's `prompt_logprobs` (index i: {token_id:
        Logprob} of prompt token i), and of draft[request.end] from `next_logprobs` when the request asked for it.
        Returns the draft positions the request could not give, [k] int64: those served from the prefix cache,
        whose entries vLLM leaves uninitialised (only positions after the cached tokens hold logprobs)."""
        sample.stats.scoring_requests += 1
        cached = int(num_cached_tokens or 0) if request.read_cache else 0
        sample.stats.scoring_prefill_tokens += len(request.token_ids) - cached
        offset = len(sample.prompt_ids)
        first = max(request.start, cached + 1 - offset)  # the first draft position the request computed
        tokens = sample.draft.token_ids
        for position in range(first, request.end):
            if np.isnan(sample.scored[position]):
                entries = prompt_logprobs[offset + position]
                sample.scored[position] = entries[int(tokens[position])].logprob
                if sample.scored_top is not None:
                    top = top_k_of(entries, self.top_k)
                    sample.scored_top[0][position], sample.scored_top[1][position] = top
        if request.next_token_ids and request.end < sample.draft_len:
            sample.scored[request.end] = next_logprobs[int(tokens[request.end])].logprob
        if first < request.end and np.isnan(sample.scored[first : request.end]).any():
            raise ValueError("the engine returned NaN logprobs for draft tokens")  # NaN marks "not scored yet"
        missing = np.arange(request.start, min(first, request.end), dtype=np.int64)
        return missing[np.isnan(sample.scored[missing])]

    @staticmethod
    def recover_scores(sample: Sample, missing: np.ndarray, siblings) -> np.ndarray:
        """Fill positions that a request read from the prefix cache with a sibling's p_curr of the same tokens (a
        draft that shares the sample's prompt and draft up to the position, scored under the same weights: its
        logprob there is the same). Returns the positions still missing."""
        for sibling in siblings:
            if not len(missing):
                break
            if sibling is sample or sibling.scored is None or sibling.prompt_ids != sample.prompt_ids:
                continue
            width = min(sibling.draft_len, sample.draft_len)
            differs = np.flatnonzero(sibling.draft.token_ids[:width] != sample.draft.token_ids[:width])
            shared = int(differs[0]) if len(differs) else width
            usable = missing[missing < shared]
            known = usable[~np.isnan(sibling.scored[usable])]
            sample.scored[known] = sibling.scored[known]
            missing = np.setdiff1d(missing, known)
        return missing

    def rescoring(self, sample: Sample, missing: np.ndarray) -> list[ScoringRequest]:
        """Requests for positions that neither a request nor a sibling gave: a point probe each (prompt + draft up to
        the position, scoring the position as the next token: it reads all before it from the cache), or, when
        many are missing, one request that does not read the prefix cache."""
        tokens = sample.draft.token_ids
        if len(missing) <= MAX_POINT_PROBES:
            return [
                ScoringRequest(sample.prompt_ids + tokens[:p].tolist(), p, p, True, (int(tokens[p]),))
                for p in missing.tolist()
            ]
        start, end = int(missing.min()), int(missing.max()) + 1
        return [ScoringRequest(sample.prompt_ids + tokens[:end].tolist(), start, end, False)]

    # ---- step 3: the policy cuts --------------------------------------------------------------------------------

    def decide(self, samples: list[Sample]) -> None:
        """One vectorised policy call for every sample whose draft can be cut now; sets `cut`, `decided` and the
        scoring stats. A rule that reads p_curr sees each draft's scored prefix: if it keeps all of it and more of
        the draft is unscored, the sample stays undecided and needs its next chunk (`next_scoring`)."""
        needs_scores = self.policy.needs_scores
        walked = [s for s in samples if s.walks and s.tree.scored]
        for s in walked:
            self._walk(s)
        if walked:
            self._record(walked)

        def scored_enough(s: Sample) -> bool:  # a rule not judged chunk by chunk sees whole drafts only
            return s.scored_upto > 0 if self.chunks is not None else s.scored_upto == s.draft_len

        ready = [
            s
            for s in samples
            if s.draft is not None and not s.decided and (not needs_scores or scored_enough(s)) and s.tree is None
        ]
        if not ready:
            return
        lengths = np.array([s.scored_upto if needs_scores else s.draft_len for s in ready], np.int64)  # [B]
        batch = batch_of(ready, lengths, needs_scores)
        cuts = checked_cuts(self.policy, batch, self.policy.cut(batch)).tolist()
        decided = []
        for s, cut, seen in zip(ready, cuts, lengths.tolist()):
            if needs_scores and cut == seen < s.draft_len:
                continue  # all of the scored prefix kept: score the next chunk
            s.cut, s.decided = cut, True
            decided.append(s)
        if decided:
            self._record(decided)

    def _walk(self, sample: Sample) -> None:
        """Walk the sample's scored tree (`tree.walk`): its draft becomes the path it kept, its cut that path's length,
        and the children of the node it left the tree at are what the continuation's first step excludes."""
        tree = sample.tree
        route = walk(tree, sample.uniforms, sample.own, sample.max_tokens)
        sample.draft = tree.draft_along(route.nodes)
        sample.scored = tree.logprobs[route.nodes].copy()
        sample.ages_now = sample.draft.ages.astype(np.int64) + self.policy.draft_age
        sample.cut, sample.decided, sample.draft_ended = len(route.nodes), True, route.complete
        sample.excluded, sample.excluded_mass = route.excluded, route.excluded_mass
        stats = sample.stats
        stats.draft_tokens = min(len(tree.paths[route.branch]), sample.max_tokens)  # the branch it ended on
        stats.branch_switches = route.switches
        stats.rejected_drafts = int(route.rejected)
        stats.resampled_tokens = int(len(route.excluded) > 0)

    def _record(self, decided: list[Sample]) -> None:
        """The decision's stats, the chunk schedule's estimate, a stateful rule's feedback and the trace of finally
        cut drafts. (Stats of scored tokens, the staleness meter's among them, are taken at assembly, once every
        token that will be scored is.)"""
        lenience = self.policy.lenience
        for s in decided:
            s.stats.reused_tokens = s.cut
            if s.tree is None:
                s.stats.rejected_drafts = int(s.cut < s.draft_len)
            s.stats.examined_tokens = s.cut + s.stats.rejected_drafts
            if lenience is not None and math.isfinite(lenience):
                s.stats.lenience_sum = lenience
            if self.chunks is not None and s.tree is None:  # past the first rejection tells nothing about the rate
                rejected = s.cut < s.draft_len
                self.chunks.observe(min(s.scored_upto, s.cut + rejected), rejected)
                if s.forecast is not None:
                    self.forecast.observe(*s.forecast, s.cut + rejected, s.draft_len)
            if self.top_k and s.cut < s.draft_len:
                self._resample(s)
            if self.policy.excludes_rejected_token and s.cut < s.draft_len:
                s.excluded = (int(s.draft.token_ids[s.cut]),)
                s.excluded_mass = min(math.exp(float(s.scored[s.cut])), 1.0)
                s.stats.resampled_tokens += 1
            if self.trace is not None:
                self._trace(s, lenience)
        if self.policy.keeps_state:  # the whole drafts, p_curr NaN where it was not needed
            lengths = np.array([s.draft_len for s in decided], np.int64)
            batch = batch_of(decided, lengths, self.policy.needs_scores)
            self.feedback.add(self.policy.feedback(batch, torch.tensor([s.cut for s in decided])), len(decided))

    def _trace(self, sample: Sample, lenience: float | None) -> None:
        """Record a cut draft. A tree sample records its own previous response (empty without one), p_curr from the
        tree, and the tokens its walk kept as its cut; the first of a visit's samples also records the responses of
        the visit before (slot -1): `replay` can then rebuild the visit's tree, or propose from any part of it."""
        seed, key = sample.entropy[:2]
        if sample.tree is None:
            group = visit_group(key, sample.draft.visit)
            draft = sample.draft
            ended, slot = sample.draft_ended, draft.index
            self.trace.record(
                draft,
                sample.scored,
                sample.ages_now,
                sample.max_tokens,
                ended,
                sample.entropy,
                sample.cut,
                lenience,
                group,
                slot,
            )
            return
        tree = sample.tree
        newest = max(r.visit for r in tree.responses)
        group = visit_group(key, newest)

        def record(response: int | None, entropy, cut: int, slot: int) -> None:
            if response is None:
                nothing = np.zeros(0, np.float32)
                draft, scored = Draft(np.zeros(0, np.int32), nothing, "length", newest, slot), nothing
            else:
                draft, scored = tree.responses[response], tree.logprobs[tree.paths[response]]
            ages = draft.ages.astype(np.int64) + self.policy.draft_age + (newest - draft.visit)
            ended = draft.finish_reason == "stop"
            self.trace.record(draft, scored, ages, sample.max_tokens, ended, entropy, cut, lenience, group, slot)

        record(sample.own, sample.entropy, sample.cut, int(sample.entropy[3]))
        if not tree.traced:
            tree.traced = True
            for response in range(tree.own_count, len(tree.responses)):
                older = tree.responses[response]
                record(response, (seed, key, older.visit, older.index, len(older)), 0, HISTORY_SLOT)

    def _resample(self, sample: Sample) -> None:
        """Redraw the rejected position from the residual norm(max(0, p_curr - p_prev)) (see `residual`). A draft
        without p_prev's top-k (written by another rule, or restored from an older cache) leaves the position to the
        engine, as in SPEC-RL, and is counted."""
        position = sample.cut
        if sample.draft.top_ids is None or sample.scored_top is None or (sample.scored_top[0][position] < 0).all():
            sample.stats.resample_unavailable += 1
            return
        tokens, probs, tail, empty = residual(
            sample.scored_top[0][position],
            sample.scored_top[1][position],
            sample.draft.top_ids[position],
            sample.draft.top_logprobs[position],
        )
        u = float(uniforms_for((*sample.entropy, RESIDUAL_STREAM), 1)[0])
        token = draw(tokens, probs, u)
        row = sample.scored_top
        logprob = float(row[1][position][list(row[0][position]).index(token)])
        sample.resampled = (token, logprob)
        sample.stats.resampled_tokens += 1
        sample.stats.residual_tail_sum += tail
        sample.stats.residual_fallbacks += int(empty)

    def _next_top(self, sample: Sample, length: int, new_top) -> tuple[np.ndarray, np.ndarray]:
        """The next draft's top-k per token: p_curr's from scoring for the kept prefix and the redrawn position, the
        continuation's own from decoding after them (empty rows where the engine gave none)."""
        k, cut = self.top_k, sample.cut
        parts = (
            [_top_rows(sample.scored_top, 0, cut + (sample.resampled is not None), cut, k)]
            if cut or sample.resampled
            else []
        )
        decoded = length - sample.prefix_len
        parts.append(
            _top_rows(new_top, 0, decoded, decoded, k) if new_top is not None else _top_rows(None, 0, 0, decoded, k)
        )
        ids = np.concatenate([p[0] for p in parts]) if parts else np.zeros((0, k), np.int32)
        logprobs = np.concatenate([p[1] for p in parts]) if parts else np.zeros((0, k), np.float32)
        return ids, logprobs

    def _meter(self, sample: Sample) -> None:
        """The scored tokens' stats and the staleness meter (see `staleness`), into the sample's stats."""
        stats = sample.stats
        if sample.draft is None:
            return
        if sample.cut:
            stats.reused_age_sum, stats.reused_old_tokens = reused_token_sums(sample.ages_now[: sample.cut]).values()
        seen = sample.scored_upto
        if not seen:
            return
        if sample.tree is None:  # a tree's nodes are counted where they are scored, once per visit
            stats.scored_tokens = seen
        stats.metered_tokens = seen
        sums = scored_token_sums(
            sample.draft.logprobs[:seen], sample.scored[:seen], sample.draft.gen_logprobs[:seen], self.policy.lenience
        )
        for name, value in sums.items():
            setattr(stats, name, value)

    # ---- the sample's requests, one after another ----------------------------------------------------------------

    def next_request(self, sample: Sample) -> ScoringRequest | ContinuationRequest | None:
        """What the sample needs from the engine next: its scoring requests until the rule has cut it, then its
        continuation, then None (assemble it). The same sequence for every rule; a driver sends each request and
        hands the answer back (`take_scores` for scoring) before asking again."""
        self.decide([sample])
        if (request := self.next_scoring(sample)) is not None:
            return request
        if sample.continued:
            return None
        sample.continued = True
        if (continuation := self.continuation(sample)) is None:
            return None
        return ContinuationRequest(*continuation, sample.prefix_len, sample.excluded)

    # ---- step 4: continuation -----------------------------------------------------------------------------------

    def continuation(self, sample: Sample) -> tuple[list[int], int] | None:
        """(prompt + verified prefix [+ redrawn token], remaining token budget), or None when that is complete."""
        if sample.draft is not None and sample.cut == sample.draft_len and sample.draft_ended:
            return None
        if sample.resampled is not None and sample.resampled[0] in self.stop_token_ids:
            return None
        remaining = sample.max_tokens - sample.prefix_len
        if remaining <= 0:
            return None
        prefix = sample.draft.token_ids[: sample.cut].tolist() if sample.cut else []
        if sample.resampled is not None:
            prefix.append(sample.resampled[0])
        return sample.prompt_ids + prefix, remaining

    # ---- step 5: assembly ---------------------------------------------------------------------------------------

    def assemble(
        self,
        sample: Sample,
        new_token_ids=(),
        new_logprobs=None,
        finish_reason: str | None = None,
        *,
        want_logprobs: bool = True,
        new_top: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> tuple[SampleOutput, Draft]:
        """Verified prefix [+ redrawn token] + continuation, and the draft to store for the next visit.

        `finish_reason` is the continuation's; it is derived from the draft when nothing was generated. `new_top`:
        the continuation's top-k per token ([n, k] ids and logprobs), which rules that redraw rejected positions keep.
        """
        cut = sample.cut
        new_token_ids = list(new_token_ids)
        if new_logprobs is None:
            new_logprobs = [math.nan] * len(new_token_ids)
        if len(new_logprobs) != len(new_token_ids):
            raise ValueError(f"continuation has {len(new_token_ids)} tokens but {len(new_logprobs)} logprobs")
        if sample.excluded and new_token_ids:
            if new_token_ids[0] in sample.excluded:
                raise ValueError("the continuation sampled a token its first step had to exclude")
            if self.processed_logprobs:  # the engine reported log p(x) / (1 - p(C)); the sample's law is p_curr's
                new_logprobs = [
                    new_logprobs[0] + math.log1p(-min(sample.excluded_mass, 1.0 - 1e-7)),
                    *new_logprobs[1:],
                ]
        redrawn = [] if sample.resampled is None else [sample.resampled[0]]
        if redrawn:  # the redrawn token leads the generated part: it was sampled now, from the current policy
            new_token_ids = redrawn + new_token_ids
            new_logprobs = [sample.resampled[1], *new_logprobs]
        if sample.draft is not None and cut:
            prefix_ids = sample.draft.token_ids[:cut].tolist()
            stored_prefix_lp = sample.scored[:cut] if sample.scored is not None else sample.draft.logprobs[:cut]
            if np.isnan(stored_prefix_lp).any():
                raise RuntimeError("a kept draft token has no p_curr: its scoring request did not complete")
            reported_prefix_lp = sample.draft.logprobs[:cut] if self.reused_logprobs == "draft" else stored_prefix_lp
            prefix_gen, prefix_ages = sample.draft.gen_logprobs[:cut], sample.ages_now[:cut]
        else:
            prefix_ids, stored_prefix_lp = [], np.zeros(0, np.float32)
            reported_prefix_lp = stored_prefix_lp
            prefix_gen, prefix_ages = stored_prefix_lp, np.zeros(0, np.int64)
        if finish_reason is None:  # nothing generated by the engine
            complete = (sample.draft_ended and cut == sample.draft_len) or (
                redrawn and redrawn[0] in self.stop_token_ids
            )
            finish_reason = "stop" if complete else "length"
        token_ids = prefix_ids + new_token_ids
        new_lp = np.asarray(new_logprobs, dtype=np.float32)
        top_ids = top_logprobs = None
        if self.top_k:
            top_ids, top_logprobs = self._next_top(sample, len(token_ids), new_top)
        next_draft = Draft(
            np.asarray(token_ids, np.int32),
            np.concatenate([stored_prefix_lp, new_lp]),
            finish_reason,
            gen_logprobs=np.concatenate([prefix_gen, new_lp]),
            ages=np.concatenate([prefix_ages, np.zeros(len(new_lp), np.int64)]),
            top_ids=top_ids,
            top_logprobs=top_logprobs,
        )
        self._meter(sample)
        sample.stats.decoded_tokens = len(new_token_ids) - len(redrawn)
        sample.stats.fully_reused = int(sample.draft is not None and not new_token_ids)
        reported = np.concatenate([reported_prefix_lp, new_lp]).tolist() if want_logprobs else None
        draft_id = None if sample.draft is None else (sample.draft.visit, sample.draft.index)
        output = SampleOutput(token_ids, reported, finish_reason, cut, sample.stats, draft_id)
        return output, next_draft


def majority_path(drafts) -> Draft | None:
    """The majority path through a prompt's responses: from the start, the next token that most of the responses
    agreeing with the path so far continue with (ties: the earliest response's), until most of them end. Per-token
    arrays come from a response that follows the path at that token; None without responses.

    >>> d = lambda *t: Draft(np.array(t), np.zeros(len(t)), "stop")
    >>> majority_path([d(1, 2, 3), d(1, 2, 4), d(1, 5), d(1, 2, 4, 6)]).token_ids.tolist()
    [1, 2, 4]
    """
    agreeing = [d for d in drafts if d is not None and len(d)]
    if not agreeing:
        return None
    sources, finish = [], "length"
    while True:
        depth = len(sources)
        going = [d for d in agreeing if len(d) > depth]
        if 2 * len(going) <= len(agreeing):  # most responses end here
            ended = [d for d in agreeing if len(d) == depth]
            finish = "stop" if any(d.finish_reason == "stop" for d in ended) else "length"
            break
        tokens = [int(d.token_ids[depth]) for d in going]
        best = Counter(tokens).most_common(1)[0][0]  # ties: the first seen
        agreeing = [d for d, t in zip(going, tokens) if t == best]
        sources.append(agreeing[0])
    depth = np.arange(len(sources))

    def column(name):
        return np.array([getattr(d, name)[i] for i, d in zip(depth.tolist(), sources)])

    first = sources[0]
    return Draft(
        column("token_ids").astype(np.int32),
        column("logprobs").astype(np.float32),
        finish,
        first.visit,
        first.index,
        gen_logprobs=column("gen_logprobs").astype(np.float32),
        ages=column("ages").astype(np.uint16),
    )


def _logprob(entries, token: int) -> float:
    """A token's log-prob from vLLM's {token_id: Logprob} (NaN where the entry holds none)."""
    entry = entries.get(token) if entries else None
    return math.nan if entry is None else float(entry.logprob)


def _top_rows(top, start: int, end: int, rows: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows [start, end) of a ([L, k] ids, [L, k] logprobs) pair, or `rows` empty rows when there is none."""
    if top is None:
        return np.full((rows, k), -1, np.int32), np.full((rows, k), -np.inf, np.float32)
    return top[0][start:end], top[1][start:end]


def checked_cuts(policy: ReusePolicy, batch: DraftBatch, cuts) -> torch.Tensor:
    """A rule's cuts, [B] int64, once they are known to keep its contract: one integer per draft, 0 <= cut <= length.
    Anything else is the rule's bug, raised with its name: the rollout then generates the batch normally."""
    name = policy.describe()
    if not isinstance(cuts, torch.Tensor) or cuts.shape != batch.lengths.shape:
        shape = tuple(cuts.shape) if isinstance(cuts, torch.Tensor) else type(cuts).__name__
        raise ValueError(f"rule {name} returned cuts of shape {shape}, want [B] = {tuple(batch.lengths.shape)}")
    if cuts.is_floating_point():
        if not torch.isfinite(cuts).all() or (cuts != torch.round(cuts)).any():
            raise ValueError(f"rule {name} returned cuts that are not whole numbers (NaN, inf or fractions)")
    cuts = cuts.long()
    if (cuts < 0).any() or (cuts > batch.lengths).any():
        raise ValueError(f"rule {name} returned cuts outside [0, draft length]")
    return cuts


def batch_of(samples: list[Sample], lengths: np.ndarray, with_scores: bool, scored=None) -> DraftBatch:
    """The `DraftBatch` of `samples`' first `lengths` draft tokens; `scored`: p_curr rows to use instead of theirs."""
    return draft_batch(
        lengths,
        draft_logprobs=[s.draft.logprobs for s in samples],
        gen_logprobs=[s.draft.gen_logprobs for s in samples],
        ages=[s.ages_now for s in samples],
        uniforms=[s.uniforms for s in samples],
        scored_logprobs=(scored or [s.scored for s in samples]) if with_scores else None,
    )


def draft_batch(lengths, *, draft_logprobs, gen_logprobs, ages, uniforms, scored_logprobs=None) -> DraftBatch:
    """Right-padded tensors of rows given as 1-D arrays (each at least as long as its row's length): the one way the
    rollout and replay build what a rule sees. Padding is 0; p_curr stays NaN where a row was not scored (only a
    stateful rule's `feedback` sees such rows: whole drafts, scored up to where the rule decided)."""
    lengths = np.asarray(lengths, np.int64)  # [B]
    rows, width = len(lengths), int(lengths.max()) if len(lengths) else 0

    def padded(arrays, dtype):  # [B, T]
        out = np.zeros((rows, width), dtype=dtype)
        for row, (array, length) in enumerate(zip(arrays, lengths.tolist())):
            out[row, :length] = array[:length]
        return torch.from_numpy(out)

    return DraftBatch(
        draft_logprobs=padded(draft_logprobs, np.float32),
        scored_logprobs=None if scored_logprobs is None else padded(scored_logprobs, np.float32),
        lengths=torch.from_numpy(lengths),
        uniforms=padded(uniforms, np.float64),
        gen_logprobs=padded(gen_logprobs, np.float32),
        ages=padded(ages, np.int64),
    )
