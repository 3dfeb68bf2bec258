"""Scoring drafts on the request path: the requests that give a visit's and a sample's drafts their p_curr.

Terminology (the requests and answers themselves are in `scoring_messages`):
- *prompt probe*: the prompt alone, scoring the first draft token of every sample of a visit (or the children of a
  tree's root) as the tokens that follow it.
- *chunk*: the part of a draft one request scores, for rules whose first rejection decides the cut (`chunking`:
  `ChunkSchedule`, `CutForecast`).
- *point probe*: prompt + draft up to a position the prefix cache served, scoring that position as the token that
  follows.

`DraftScorer` holds these decisions; the planner (`planner.SpeculativePlanner`) asks it for requests, and the driver
hands it the answers through the planner. Core module: numpy and torch only.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..history import ROOT
from ..policies import DraftBatch, ReusePolicy
from ..policies.base import checked_cuts, draft_batch
from .chunking import ChunkSchedule, CutForecast
from .sample import Sample, ScoredHistory
from .scoring_messages import MAX_NEXT_TOKEN_IDS, ScoringAnswer, ScoringRequest

MAX_POINT_PROBES = 4  # more positions missing than this: rescore them without reading the prefix cache


class DraftScorer:
    """Which scoring requests the samples of a visit send, and what their answers tell (see the module docstring).

    Args:
        policy: the reuse rule (`needs_scores`, `prefix_decidable` and its `cut` for the forecast).
        read_cache: requests may read vLLM's prefix cache (`--reuse.scoring chunked`); else each draft is scored whole
            in one request that does not.
        chunked: score drafts in chunks up to the first rejection (a prefix-decidable rule, no trace).
        top_k: p_curr's top-k per scored position, for rules that redraw rejected positions (`residual`).
    """

    def __init__(self, policy: ReusePolicy, *, read_cache: bool, chunked: bool, top_k: int = 0):
        self.policy = policy
        self.read_cache = read_cache
        self.top_k = top_k
        self.chunks = ChunkSchedule() if chunked else None
        self.forecast = CutForecast() if chunked else None

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
        return ScoringRequest(
            list(needy[0].prompt_ids), 0, 0, True, first_tokens[:MAX_NEXT_TOKEN_IDS], top_k=self.top_k
        )

    @staticmethod
    def take_probe(samples: list[Sample], request: ScoringRequest, answer: ScoringAnswer) -> None:
        """Store each sample's first-token log-prob from a prompt probe; the probe's cost is counted on the first
        sample that scores. A NaN is never taken for p_curr: the token is scored again."""
        scoring = [s for s in samples if s.scored is not None]
        if not scoring:
            return
        scoring[0].stats.scoring_requests += 1
        scoring[0].stats.scoring_prefill_tokens += len(request.token_ids) - answer.cached
        for s in scoring:
            value = answer.follows.get(int(s.draft.token_ids[0]), np.nan)
            if np.isnan(s.scored[0]) and not np.isnan(value):
                s.scored[0] = value

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
        prompt, history = samples[0].prompt_ids, tree.history
        branches = history.branches
        shared = self.read_cache and len(branches) >= 2  # the branches share the prompt: it is computed once
        requests = []
        if shared:  # positions the cache serves come without log-probs: the root's children come from the probe
            first_tokens = tuple(int(t) for t in history.token_of(history.children(ROOT))[:MAX_NEXT_TOKEN_IDS])
            requests.append(ScoringRequest(list(prompt), 0, 0, True, first_tokens, branch=branches[0]))
        for response in branches:
            tokens = history.path_tokens(response)
            end = len(tokens) - 1 if shared else len(tokens)  # the last token as the one that follows the request
            follows = (int(tokens[end]),) if end < len(tokens) else ()
            requests.append(ScoringRequest(prompt + tokens[:end].tolist(), 0, end, shared, follows, branch=response))
        yield requests
        missing = tree.unknown()
        if len(missing):
            yield self._tree_rescoring(prompt, tree, missing)
        tree.scored = True

    @staticmethod
    def _tree_rescoring(prompt: list[int], tree: ScoredHistory, missing: np.ndarray) -> list[ScoringRequest]:
        """Requests for tree nodes that no request gave (the prefix cache served them): a point probe per parent
        (its path, scoring the missing children as the tokens that follow), or, when many parents are missing, the
        branches through them without reading the cache."""
        history = tree.history
        nodes = history.arrays
        parents = sorted(set(nodes.parent[missing].tolist()))
        if len(parents) <= MAX_POINT_PROBES:
            requests = []
            for parent in parents:
                children = history.children(parent)
                wanted = children[np.isnan(tree.logprobs[children])]
                response, depth = int(nodes.source[wanted[0]]), int(nodes.depth[parent])
                tokens = tuple(int(t) for t in nodes.token[wanted][:MAX_NEXT_TOKEN_IDS])
                prefix = prompt + history.path_tokens(response)[:depth].tolist()
                requests.append(ScoringRequest(prefix, depth, depth, True, tokens, branch=response))
            return requests
        unknown = np.zeros(history.num_nodes, bool)
        unknown[missing] = True
        return [
            ScoringRequest(prompt + history.path_tokens(r).tolist(), 0, len(history.paths[r]), False, (), branch=r)
            for r in history.branches
            if unknown[history.paths[r]].any()
        ]

    def take_visit_scores(self, samples: list[Sample], request: ScoringRequest, answer: ScoringAnswer) -> None:
        """The answer to one of `visit_rounds`' requests. The prompt probe's and a sample's first request's, as
        `take_probe` and `take_scores` take them (positions still unknown are left to the sample's own requests). A
        tree's: log p_curr of the nodes along its branch (entries the prefix cache served, or that hold no usable
        value, stay unknown), and of the children asked for as the tokens that follow; its cost is counted on the
        visit's first sample."""
        if request.sample is not None:  # a sample's first request: what the cache left out, from a sibling if it can
            sample = samples[request.sample]
            missing = self.take_scores(sample, request, answer)
            if len(missing):  # still unknown: the sample's next requests score them without reading the cache
                missing = self.recover_scores(sample, missing, samples)
                sample.unserved = missing if len(missing) else None
            return
        if request.branch is None:
            self.take_probe(samples, request, answer)
            return
        tree, stats = samples[0].tree, samples[0].stats
        known_before = int(np.isfinite(tree.logprobs).sum())
        stats.scoring_requests += 1
        stats.scoring_prefill_tokens += len(request.token_ids) - answer.cached
        path = tree.history.paths[request.branch]
        nodes = path[request.start : request.end]
        unknown = np.isnan(tree.logprobs[nodes])
        tree.logprobs[nodes[unknown]] = answer.logprobs[unknown]
        if answer.follows:
            parent = path[request.end - 1] if request.end else ROOT
            for child, token in zip(tree.history.children(parent).tolist(), tree.history.kids[parent]):
                value = answer.follows.get(int(token), np.nan)
                if np.isnan(tree.logprobs[child]):
                    tree.logprobs[child] = value
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
        return ScoringRequest(tokens, start, end, self.read_cache, follows, top_k=self.top_k)

    def forecast_cut(self, sample: Sample) -> int | None:
        """Where the rule would cut the draft if the tokens not scored yet had p_curr = p_prev (the draft's own
        log-probs), or None if the rule fails on that (the chunk schedule then decides alone)."""
        guess = np.where(np.isnan(sample.scored), sample.draft.logprobs[: sample.draft_len], sample.scored)
        batch = batch_of([sample], np.array([sample.draft_len], np.int64), True, scored=[guess])
        try:
            return int(checked_cuts(self.policy, batch, self.policy.cut(batch))[0])
        except Exception:
            return None

    def take_scores(self, sample: Sample, request: ScoringRequest, answer: ScoringAnswer) -> np.ndarray:
        """Store p_curr of draft[request.start:request.end], and of draft[request.end] when the request asked for it to
        follow. Returns the draft positions the request could not give, [k] int64: those the prefix cache served."""
        sample.stats.scoring_requests += 1
        sample.stats.scoring_prefill_tokens += len(request.token_ids) - answer.cached
        span = slice(request.start, request.end)
        unknown = np.isnan(sample.scored[span])
        sample.scored[span][unknown] = answer.logprobs[unknown]
        if sample.scored_top is not None and answer.top is not None:
            for rows, given in zip(sample.scored_top, answer.top):
                rows[span][unknown] = given[unknown]
        if request.next_token_ids and request.end < sample.draft_len:
            value = answer.follows.get(int(sample.draft.token_ids[request.end]), np.nan)
            if np.isnan(sample.scored[request.end]):
                sample.scored[request.end] = value
        first = max(request.start, answer.computed_from)
        if np.isnan(sample.scored[first : request.end]).any():
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
                ScoringRequest(
                    sample.prompt_ids + tokens[:p].tolist(), p, p, True, (int(tokens[p]),), top_k=self.top_k
                )
                for p in missing.tolist()
            ]
        start, end = int(missing.min()), int(missing.max()) + 1
        return [ScoringRequest(sample.prompt_ids + tokens[:end].tolist(), start, end, False, top_k=self.top_k)]

    def observe(self, sample: Sample) -> None:
        """A sample's own draft is cut: what it tells the chunk schedule and the forecast (past the first rejection
        tells nothing about the rate)."""
        if self.chunks is None or sample.tree is not None:
            return
        rejected = sample.cut < sample.draft_len
        self.chunks.observe(min(sample.scored_upto, sample.cut + rejected), rejected)
        if sample.forecast is not None:
            self.forecast.observe(*sample.forecast, sample.cut + rejected, sample.draft_len)


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
