"""Engine-independent steps of a speculative rollout on the request path (SPEC-RL Algorithm 1).

Terminology:
- *draft*: what a sample proposes (`proposal`): its own previous response, the majority path, or a walk through the
  tree of its prompt's previous responses (`history.History`); truncated to what the engine can take.
- *verified prefix*: draft[:cut], the tokens the rule keeps (the *cut*); a rule that reads p_curr gets it from
  scoring requests (`scoring.DraftScorer`).
- *continuation*: what the engine generates after the verified prefix (and a redrawn token, for rules that redraw).
- *assembly*: verified prefix + continuation, and the draft for the next visit (`assembly.Assembler`).

`SpeculativePlanner` sequences these for each sample. The driver (`integration.request_path`) talks to it through its
methods only: `open_visit`, the requests of a visit and of each sample (`visit_rounds`, `next_request`), their answers
(`take_visit_answer`, `take_answer`, `recover`, `rescoring`), `assemble` and `take_feedback`. `lossless` verified in
the engine needs none of it (`integration.engine_path`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from ..config import REUSED_LOGPROBS, SCORING_MODES
from ..draft import Draft
from ..history import History
from ..params import check_value
from ..policies import ReusePolicy
from ..policies.base import checked_cuts
from ..policies.stateful import FeedbackBuffer
from ..proposal import majority_path, walk
from ..seeds import NO_OWN_DRAFT, entropy_of, uniforms_for
from ..trace import TraceWriter, record_cut
from .assembly import Assembler
from .residual import redraw
from .sample import Sample, ScoredHistory
from .scoring import DraftScorer, batch_of
from .scoring_messages import ScoringAnswer, ScoringRequest

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ContinuationRequest:
    """Generate up to `max_tokens` after `token_ids` (prompt + verified prefix [+ a redrawn token]); `verified`: the
    response tokens before it; `excluded`: tokens the first step must not sample (`lossless`); `top_k`: each
    generated token's top-k to return (rules that redraw); `expected_tokens`: how long it likely runs (the rest of
    the draft), which orders continuations under priority scheduling."""

    token_ids: list[int]
    max_tokens: int
    verified: int
    excluded: tuple[int, ...] = ()
    top_k: int = 0
    expected_tokens: int = 1


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
        check_value("reused_logprobs", reused_logprobs, Literal[REUSED_LOGPROBS])
        check_value("scoring", scoring, Literal[SCORING_MODES])
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
        self.processed_logprobs = bool(processed_logprobs)
        self.trace = trace
        self.feedback = FeedbackBuffer()  # a stateful rule's reports, until the driver sends them on

    # ---- drafts ----------------------------------------------------------------------------------------------------

    def visit_samples(
        self, prompt_ids, max_tokens: int, claimed: list, key: bytes = b"", count: int = 1
    ) -> list[Sample]:
        """The `count` samples of one visit (one prompt, one budget), from what the cache gave the visit: a draft per
        slot (None where there is none), then, with `history` 2, the responses of the visit before. Each sample
        proposes its own draft, or, by the rule's `draft_choice`, the majority path through all of the responses
        (numbered per sample, so that each draws its own uniforms), or their tree (one `ScoredHistory`, shared)."""
        claimed = list(claimed)
        own = (claimed[:count] + [None] * count)[:count]
        older = claimed[count:]
        choice = self.policy.draft_choice if self.policy.draft_age else "own"
        if choice == "majority":
            responses = [d for d in own + older if d is not None and len(d)]
            history = History.of_drafts(responses)
            nodes = majority_path(history)
            if len(nodes):
                path = history.draft_along(nodes)
                own = [path.numbered(path.visit, index) for index in range(count)]
        if choice != "tree":
            return [self.new_sample(prompt_ids, max_tokens, draft, key) for draft in own]
        return self._tree_samples(prompt_ids, max_tokens, own, older, key)

    def open_visit(self, prompt_ids, max_tokens: int, claimed: list, key: bytes = b"", count: int = 1) -> list[Sample]:
        """A visit's samples (`visit_samples`), with the cuts of rules that read no p_curr already made."""
        samples = self.visit_samples(prompt_ids, max_tokens, claimed, key, count)
        self.decide(samples)
        return samples

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
        sample.entropy = entropy_of(self.seed, key, draft.visit, draft.index, len(draft))
        sample.uniforms = uniforms_for(sample.entropy, len(draft))
        if self.scores_drafts:
            sample.scored = np.full(len(draft), np.nan, np.float32)
        if self.top_k:
            sample.scored_top = (
                np.full((len(draft), self.top_k), -1, np.int32),
                np.full((len(draft), self.top_k), -np.inf, np.float32),
            )
        return sample

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
        """Samples that share one `ScoredHistory` of the visit's usable responses (their own ones first, in slot
        order). Each draws its uniforms as its own draft would, so that, for the same p_curr, its walk keeps at least
        what that draft alone would keep."""
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
        tree = ScoredHistory.of(History.of_drafts(usable), sum(slot is not None for slot in slots[: len(own)]))
        for slot, sample in enumerate(samples):
            sample.tree, sample.own = tree, slots[slot]
            mine = None if sample.own is None else usable[sample.own]
            sample.entropy = (
                entropy_of(self.seed, key, mine.visit, mine.index, len(mine))
                if mine is not None
                else entropy_of(self.seed, key, usable[0].visit, slot, NO_OWN_DRAFT)
            )
            sample.uniforms = uniforms_for(sample.entropy, tree.history.max_depth + 1)
            sample.stats.drafts_found = 1
            sample.stats.tree_branches = len(tree.history.branches)
            sample.stats.tree_nodes = tree.history.num_nodes - 1
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
        """Walk the sample's scored tree (`proposal.walk`): its draft becomes the path it kept, its cut that path's
        length, and the children of the node it left the tree at are what the continuation's first step excludes."""
        tree = sample.tree
        route = walk(tree.history, tree.logprobs, sample.uniforms, sample.own, sample.max_tokens)
        sample.draft = tree.history.draft_along(route.nodes)
        sample.scored = tree.logprobs[route.nodes].copy()
        sample.ages_now = sample.draft.ages.astype(np.int64) + self.policy.draft_age
        sample.cut, sample.decided, sample.draft_ended = len(route.nodes), True, route.complete
        sample.excluded, sample.excluded_mass = route.excluded, route.excluded_mass
        stats = sample.stats
        stats.draft_tokens = min(len(tree.history.paths[route.branch]), sample.max_tokens)  # the branch it ended on
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
        expected = max(sample.draft_len - sample.cut, 1) if sample.draft is not None else continuation[1]
        return ContinuationRequest(*continuation, sample.prefix_len, sample.excluded, self.top_k, expected)

    def visit_rounds(self, samples: list[Sample]):
        """The requests a visit sends for all of its samples, round by round (`DraftScorer.visit_rounds`): each
        round's answers go to `take_visit_answer` before the next round is asked for."""
        return self.scorer.visit_rounds(samples)

    def take_visit_answer(self, samples: list[Sample], request: ScoringRequest, answer: ScoringAnswer) -> None:
        self.scorer.take_visit_scores(samples, request, answer)

    def take_answer(self, sample: Sample, request: ScoringRequest, answer: ScoringAnswer, siblings=()) -> np.ndarray:
        """The answer to one of the sample's own scoring requests. Returns the draft positions still unknown, [k]
        int64: those the prefix cache served that no sibling (a sample of the same visit) has scored yet. The driver
        may wait for siblings' requests in flight and `recover` them, then score the rest (`rescoring`)."""
        missing = self.scorer.take_scores(sample, request, answer)
        return self.recover(sample, missing, siblings) if len(missing) else missing

    def recover(self, sample: Sample, missing: np.ndarray, siblings) -> np.ndarray:
        """Positions `missing` filled from siblings that scored the same tokens; returns those still missing."""
        return self.scorer.recover_scores(sample, missing, siblings)

    def rescoring(self, sample: Sample, missing: np.ndarray) -> list[ScoringRequest]:
        """Requests for positions that neither a request nor a sibling gave."""
        return self.scorer.rescoring(sample, missing)

    def take_feedback(self, at_least: int) -> tuple[dict[str, float], int]:
        """A stateful rule's feedback once `at_least` samples reported (its sums and their count), else ({}, 0)."""
        if self.feedback.samples < at_least:
            return {}, 0
        return self.feedback.take()

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
