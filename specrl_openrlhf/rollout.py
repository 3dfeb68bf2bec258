"""Engine-independent steps of a speculative rollout on the request path (SPEC-RL Algorithm 1).

Terminology:
- *draft*: what a sample proposes (`proposal`): its own previous response, the majority path, or a walk through the
  tree of its prompt's previous responses; truncated to what the engine can take.
- *verified prefix*: draft[:cut], the tokens the rule keeps (the *cut*); a rule that reads p_curr gets it from
  scoring requests (`scoring.DraftScorer`).
- *continuation*: what the engine generates after the verified prefix (and a redrawn token, for rules that redraw).
- *assembly*: verified prefix + continuation, and the draft for the next visit (`assembly.Assembler`).

`SpeculativePlanner` sequences these for each sample: the driver (`integration.vllm_rollout`) sends the requests it
asks for and hands the answers back. `lossless` verified in the engine skips all of it (`integration.vllm_proposer`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field

import numpy as np
import torch

from .adaptive import FeedbackBuffer
from .assembly import Assembler
from .cache import Draft
from .metrics import ReuseStats
from .policies import ReusePolicy
from .policies.base import checked_cuts
from .proposal import majority_path
from .residual import redraw
from .scoring import DraftScorer, ScoringRequest, batch_of
from .trace import TraceWriter, record_cut, uniforms_for
from .tree import DraftTree, walk

logger = logging.getLogger(__name__)

REUSED_LOGPROBS = ("auto", "scored", "draft")
SCORING_MODES = ("chunked", "full")
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
        _refuse(
            settings,
            {"min_p": (0.0, None), "logit_bias": (None, {}), **PENALTIES},
            f"reuse policy {policy.name!r} verifies drafts inside vLLM, which samples with temperature, top-p and "
            "top-k as asked but ignores min-p and logit bias under speculative decoding (and penalties are not "
            "tested there); sampling uses {names}. Drop them, or set verify='requests' (--reuse.params "
            '\'{"verify": "requests"}\'), which needs plain sampling.',
        )
        return []
    if not policy.needs_scores:
        return []
    _refuse(
        settings,
        {"temperature": (1.0,), "top_p": (1.0, None), "top_k": (0, -1, None), "min_p": (0.0, None), **PENALTIES},
        f"reuse policy {policy.name!r} scores drafts with vLLM prompt logprobs, which are always raw "
        "(temperature 1, no top-p/top-k/min-p/penalties), but sampling uses {names}. Sample with "
        "temperature 1.0, top_p 1.0 and top_k -1 (the paper's setting, --rollout.temperature 1.0 "
        "--rollout.top_p 1.0), or pick a policy that does not score drafts (random, full, off).",
    )
    if min_tokens and processed_logprobs:
        return [
            f"the engine masks EOS at the first {min_tokens} position(s) (min_tokens) and reports processed logprobs: "
            "there a draft's p_prev is renormalised without EOS and p_curr is not, so their ratio is off by "
            "1 - p(EOS), which is negligible unless responses often end at once"
        ]
    return []


def _refuse(settings: dict, allowed: dict, message: str) -> None:
    """Raise `message`, its "{names}" replaced by the offending settings, when one is outside its allowed values."""
    bad = {k: v for k, v in settings.items() if k in allowed and v not in allowed[k]}
    if bad:
        raise UnsupportedSamplingError(message.replace("{names}", ", ".join(f"{k}={v}" for k, v in bad.items())))


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
class ContinuationRequest:
    """Generate up to `max_tokens` after `token_ids` (prompt + verified prefix [+ a redrawn token]); `verified`: the
    response tokens before it; `excluded`: tokens the first step must not sample (`lossless`)."""

    token_ids: list[int]
    max_tokens: int
    verified: int
    excluded: tuple[int, ...] = ()


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
        self.scores_drafts = policy.needs_scores or reused_logprobs == "scored"
        self.top_k = int(policy.resample_top_k)
        if self.top_k:
            scoring = "full"
        chunked = scoring == "chunked" and policy.needs_scores and policy.prefix_decidable and trace is None
        self.scorer = DraftScorer(policy, read_cache=scoring == "chunked", chunked=chunked, top_k=self.top_k)
        self.assembler = Assembler(
            reused_logprobs=reused_logprobs,
            processed_logprobs=bool(processed_logprobs),
            stop_token_ids=stop_token_ids,
            top_k=self.top_k,
            lenience=policy.lenience,
        )
        self.trace = trace
        self.feedback = FeedbackBuffer()  # a stateful rule's reports, until the rollout sends them on

    # ---- drafts ----------------------------------------------------------------------------------------------------

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

    # ---- the policy cuts -----------------------------------------------------------------------------------------

    def decide(self, samples: list[Sample]) -> None:
        """One vectorised policy call for every sample whose draft can be cut now; sets `cut`, `decided` and the
        scoring stats. A rule that reads p_curr sees each draft's scored prefix: if it keeps all of it and more of
        the draft is unscored, the sample stays undecided and needs its next chunk (`scorer.next_scoring`)."""
        needs_scores = self.policy.needs_scores
        walked = [s for s in samples if s.walks and s.tree.scored]
        for s in walked:
            self._walk(s)
        if walked:
            self._record(walked)

        def scored_enough(s: Sample) -> bool:  # a rule not judged chunk by chunk sees whole drafts only
            return s.scored_upto > 0 if self.scorer.chunks is not None else s.scored_upto == s.draft_len

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
            self.scorer.observe(s)
            if self.top_k and s.cut < s.draft_len:
                redraw(s)
            if self.policy.excludes_rejected_token and s.cut < s.draft_len:
                s.excluded = (int(s.draft.token_ids[s.cut]),)
                s.excluded_mass = min(math.exp(float(s.scored[s.cut])), 1.0)
                s.stats.resampled_tokens += 1
            if self.trace is not None:
                record_cut(self.trace, s, self.policy.draft_age, lenience)
        if self.policy.keeps_state:  # the whole drafts, p_curr NaN where it was not needed
            lengths = np.array([s.draft_len for s in decided], np.int64)
            batch = batch_of(decided, lengths, self.policy.needs_scores)
            self.feedback.add(self.policy.feedback(batch, torch.tensor([s.cut for s in decided])), len(decided))

    # ---- the sample's requests, one after another ----------------------------------------------------------------

    def next_request(self, sample: Sample) -> ScoringRequest | ContinuationRequest | None:
        """What the sample needs from the engine next: its scoring requests until the rule has cut it, then its
        continuation, then None (assemble it). The same sequence for every rule; a driver sends each request and
        hands the answer back (`scorer.take_scores` for scoring) before asking again."""
        self.decide([sample])
        if (request := self.scorer.next_scoring(sample)) is not None:
            return request
        if sample.continued:
            return None
        sample.continued = True
        if (continuation := self.continuation(sample)) is None:
            return None
        return ContinuationRequest(*continuation, sample.prefix_len, sample.excluded)

    # ---- continuation and assembly -------------------------------------------------------------------------------

    def continuation(self, sample: Sample) -> tuple[list[int], int] | None:
        """(prompt + verified prefix [+ redrawn token], remaining token budget), or None when that is complete."""
        if sample.draft is not None and sample.cut == sample.draft_len and sample.draft_ended:
            return None
        if sample.resampled is not None and sample.resampled[0] in self.assembler.stop_token_ids:
            return None
        remaining = sample.max_tokens - sample.prefix_len
        if remaining <= 0:
            return None
        prefix = sample.draft.token_ids[: sample.cut].tolist() if sample.cut else []
        if sample.resampled is not None:
            prefix.append(sample.resampled[0])
        return sample.prompt_ids + prefix, remaining

    def assemble(self, sample: Sample, new_token_ids=(), new_logprobs=None, finish_reason=None, **kwargs):
        """The sample's response and the draft for its prompt's next visit (`assembly.Assembler.assemble`)."""
        return self.assembler.assemble(sample, new_token_ids, new_logprobs, finish_reason, **kwargs)
