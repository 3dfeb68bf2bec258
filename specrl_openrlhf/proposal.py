"""What a sample proposes from its prompt's history: the one component both verification paths draw drafts from.

Terminology:
- *history*: a prompt's previous responses (its last visit's n samples, and with `history=2` the visit's before), and,
  when verified in the engine, the responses of the current visit that have finished.
- *proposal*: the draft tokens put forward for verification. A *fixed* proposal depends on the history and on the
  sample's own tokens so far, never on its randomness to come; keeping a draft token y with probability p(y) and
  otherwise sampling p without y is then exact, whatever produced the history (docs/design.md).
- *anchored*: the sample's response so far is a prefix of a history response: it is inside the prefix tree of the
  history (`tree.DraftTree`), and the proposal is the path below its node.
- *re-entry*: proposing again after a rejection, from the longest suffix of the response so far (at least
  `min_match` tokens) that occurs in the history.

The request path proposes once per sample and visit: the sample's own previous response (`own`), the majority path
through the history (`majority_path`) or the history's tree (`tree.DraftTree`, walked by the planner). The engine path
proposes at every decoding step (`HistoryIndex`): inside vLLM (`integration.vllm_proposer`) and in replay.

Core module: numpy only.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from .cache import Draft

SEPARATOR = -1  # ends each response in `HistoryIndex.tokens`: nothing is proposed past it
DEFAULT_MIN_MATCH = 4  # shortest suffix a re-entry may match on (../shared/FACTS.md, sixth look: 4)
MAX_MATCH = 256  # a re-entry's match is measured back this far at most (longer ones tie)


class HistoryIndex:
    """A prompt's history, indexed for proposals at every step.

    Responses are kept end to end in one list (`tokens`, each followed by `SEPARATOR`), with each token's log-prob
    under the policy that produced it (`logprobs`, its p_prev). `grams` maps every run of `min_match` tokens to the
    positions right after its occurrences. A sample's place in the history is a list of *candidates*: the positions
    whose preceding tokens match the end of its response so far (for an anchored sample, all of its response).

    >>> index = HistoryIndex(min_match=2)
    >>> index.add([5, 6, 7, 2], [-0.1, -0.2, -0.3, -0.1]); index.add([5, 6, 8, 9, 2], [-0.1, -0.2, -1.0, -0.5, -0.1])
    >>> here = index.anchored([5, 6]); index.propose(here, 4)  # inside the tree: the likelier child (7), then on
    [7, 2]
    >>> index.advance(here, [8])  # the engine took 8: still inside the tree, on the second response's branch
    [8]
    >>> index.propose(index.advance(here, [8]), 4)
    [9, 2]
    >>> index.advance(here, [3]), index.reentry([1, 8, 9])  # off the tree; a re-entry on the suffix [8, 9]
    ([], [9])
    """

    def __init__(self, min_match: int = DEFAULT_MIN_MATCH, min_accept_prob: float = 0.0):
        if isinstance(min_match, bool) or not isinstance(min_match, int) or min_match < 1:
            raise ValueError(f"min_match must be a positive integer, got {min_match!r}")
        if not 0.0 <= min_accept_prob < 1.0:
            raise ValueError(f"min_accept_prob must be in [0, 1), got {min_accept_prob!r}")
        self.min_match = min_match
        self.min_accept_logprob = math.log(min_accept_prob) if min_accept_prob > 0 else -math.inf
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.starts: list[int] = []  # position of each response's first token
        self.grams: dict[tuple[int, ...], list[int]] = {}

    def __len__(self) -> int:
        """Responses held."""
        return len(self.starts)

    def add(self, tokens, logprobs=None) -> None:
        """Append a response (token ids, and each token's log-prob under the policy that produced it, if known)."""
        tokens = [int(t) for t in tokens]
        logprobs = [0.0] * len(tokens) if logprobs is None else [float(lp) for lp in logprobs]
        if len(logprobs) != len(tokens):
            raise ValueError(f"a response of {len(tokens)} tokens came with {len(logprobs)} log-probs")
        start, m = len(self.tokens), self.min_match
        self.starts.append(start)
        self.tokens += [*tokens, SEPARATOR]
        self.logprobs += [*logprobs, -math.inf]
        for end in range(start + m, start + len(tokens) + 1):
            self.grams.setdefault(tuple(self.tokens[end - m : end]), []).append(end)

    def anchored(self, response) -> list[int]:
        """Candidates of a sample whose response so far is `response`, if it is a prefix of history responses."""
        return self.advance(self.starts, response)

    def advance(self, candidates: list[int], new_tokens) -> list[int]:
        """The candidates once the sample has produced `new_tokens` ([] when it left the history there)."""
        tokens = self.tokens
        for token in new_tokens:
            candidates = [p + 1 for p in candidates if tokens[p] == token]
            if not candidates:
                break
        return candidates

    def reentry(self, response) -> list[int]:
        """Candidates after the longest suffix of `response` (at least `min_match` tokens) found in the history."""
        m = self.min_match
        hits = self.grams.get(tuple(response[-m:])) if len(response) >= m else None
        if not hits:
            return []
        tokens, best, longest = self.tokens, [], 0
        reach = min(len(response), MAX_MATCH)
        for p in hits:
            length = m
            while length < reach and p - 1 - length >= 0 and tokens[p - 1 - length] == response[-1 - length]:
                length += 1
            if length > longest:
                best, longest = [p], length
            elif length == longest:
                best.append(p)
        return best

    def propose(self, candidates: list[int], k: int) -> list[int]:
        """Up to `k` tokens from the candidates: at each step the next token likeliest under the history's p_prev
        (ties: the first response's), then the candidates that continue with it, until none continues or the chance
        that the draft is accepted up to the token, by the history's p_prev, falls below `min_accept_prob` (a token
        the engine would likely reject costs a verification and saves nothing)."""
        tokens, logprobs, out, reach = self.tokens, self.logprobs, [], 0.0
        while candidates and len(out) < k:
            best, best_lp = SEPARATOR, -math.inf
            for p in candidates:
                token = tokens[p]
                if token != SEPARATOR and (best == SEPARATOR or logprobs[p] > best_lp):
                    best, best_lp = token, logprobs[p]
            reach += best_lp
            if best == SEPARATOR or reach < self.min_accept_logprob:
                break
            out.append(best)
            candidates = [p + 1 for p in candidates if tokens[p] == best]
        return out


def verify_steps(index: HistoryIndex, response, k: int) -> tuple[int, int, int]:
    """(accepted, drafted, re-entries) of `response`, a sample of p_curr, verified against proposals from `index` at
    every step, as the engine does: one-hot verification keeps a draft token y with probability p(y) and otherwise
    samples p without y, so the sample has y there exactly when y was accepted; after the accepted tokens the engine
    samples one token of its own, and the next step proposes again. Replay uses it on recorded responses: whatever
    proposal produced them, they follow p_curr, so this is what another proposal would have kept of them.

    >>> index = HistoryIndex(min_match=2)
    >>> index.add([5, 6, 7, 8]); index.add([5, 6, 9, 2])
    >>> verify_steps(index, [5, 6, 9, 2], k=8)  # proposes 6 7 8 after the first 5; keeps 6, re-anchors on 9: keeps 2
    (2, 4, 1)
    """
    response = [int(t) for t in response]
    position, accepted, drafted, reentries, rejected = 0, 0, 0, 0, False
    candidates = index.starts
    while position < len(response):
        if not candidates and position:
            candidates = index.reentry(response[:position])
        draft = index.propose(candidates, k) if position else []  # the first token is sampled after the prompt
        kept = 0
        while kept < len(draft) and position + kept < len(response) and draft[kept] == response[position + kept]:
            kept += 1
        if draft:
            drafted, accepted, reentries = drafted + len(draft), accepted + kept, reentries + rejected
            rejected = kept < len(draft)
        step = response[position : position + kept + 1]
        candidates = index.advance(candidates, step)
        position += len(step)
    return accepted, drafted, reentries


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
