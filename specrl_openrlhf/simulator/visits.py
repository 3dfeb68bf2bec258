"""How RL comes back to a prompt, in the simulator: the other requests an engine serves between two visits of a
prompt (`Gaps`, `OtherRequests`), and whether the draft store still holds a returning prompt's last visit
(`StoreHeld`).

Terminology:
- *returning prompts* and *others* (`passes`): a corpus's epochs are its prompts' visits, every prompt in every RL
  step, so none of its prompts is free to stand for the other prompts an engine serves between two visits. The
  simulator serves half of the corpus's prompts as the returning ones (`subset`: the even ones) and draws the
  requests between their visits from the other half; every spacing runs so, so spacings differ only in what the
  caches hold. Passes over other splits would merge (`engine.Simulation.merged`); one is served, as a second, every
  prompt returning, would double a run's time (most of it suffix decoding's FIFO, refilled at every return).
- *gap* (`Gaps.before`): what an engine serves before an epoch's RL steps of the returning prompts, `spacing` RL
  steps after their last visit: the other prompts' visits of `spacing` less the RL steps an epoch of the returning
  prompts takes, each an RL step's simulated requests. Not priced (every rule serves the same ones); what counts is
  what each cache holds when the prompt returns. A first visit's gap is served too: an engine served other prompts
  before it.
- *other visit* (`OtherVisit`): one visit of another prompt in a gap, under an identity of its own (`key`), so that
  it never counts as the returning prompt: its `samples` responses of the returning prompts' epoch (the policy the
  engine serves just before they return) and its previous visit's (the epoch before; none in the first epoch). The
  others take turns in a seeded shuffle, a new one each round, so a small corpus's responses repeat in a long gap.
- *tail* (`OtherRequests.tail`): a cache that keeps the last N responses (FIFO) holds only the gap's last N, so only
  those need serving; `newest_first` gives a cache of another measure (tokens, bytes) the gap from its end.
- *store* (`StoreHeld`): the draft store (`cache.DraftCache`) under its memory cap keeps the prompts it touched last;
  a returning prompt whose last visit it dropped has no previous visit to draft from.

Engine-free: numpy and the core only.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from ..cache import DraftCache, prompt_key
from ..draft import Draft
from .corpus import Corpus
from .requests import Request, Workload, samples_of


@dataclass(frozen=True)
class OtherVisit:
    """A visit of another prompt between two visits of the returning ones (see the module's terminology)."""

    key: str  # its identity: no returning prompt's
    source: tuple[int, int]  # the corpus's (prompt, epoch) its responses are
    prompt: list[int]
    responses: list[list[int]]  # [samples] the visit's
    previous: list[list[int]]  # [samples] its previous visit's, which a rollout registers with it (none: first)


@dataclass(frozen=True)
class OtherRequests:
    """The other prompts' visits of one gap, oldest first: `visits` of them, each of `corpus.samples` responses."""

    corpus: Corpus
    others: tuple[int, ...]  # the other prompts, by their index in `corpus`
    epoch: int
    visits: int
    seed: int = 0

    @property
    def responses(self) -> int:
        return self.visits * self.corpus.samples

    def visit(self, i: int) -> OtherVisit:
        """The gap's `i`-th visit (0: the oldest)."""
        turn, place = divmod(i, len(self.others))
        order = list(self.others)
        random.Random(f"{self.seed}-{self.epoch}-{turn}").shuffle(order)
        q, e = order[place], self.epoch
        previous = self.corpus.responses[e - 1][q] if e > 0 else []
        responses = self.corpus.responses[e][q]
        return OtherVisit(f"other-e{e}-v{i}", (q, e), self.corpus.prompts[q], responses, previous)

    def newest_first(self) -> Iterator[OtherVisit]:
        for i in range(self.visits - 1, -1, -1):
            yield self.visit(i)

    def tail(self, responses: int) -> list[OtherVisit]:
        """Oldest first, the gap's last visits that hold `responses` responses (every visit where it holds fewer)."""
        count = min(self.visits, math.ceil(max(responses, 0) / self.corpus.samples))
        return [self.visit(i) for i in range(self.visits - count, self.visits)]


@dataclass(frozen=True)
class Gaps:
    """The gaps of a run of the returning prompts: before each epoch, `visits` visits of `others` of `corpus`."""

    corpus: Corpus
    others: tuple[int, ...]
    visits: int
    seed: int = 0

    def before(self, epoch: int) -> OtherRequests:
        return OtherRequests(self.corpus, self.others, epoch, self.visits, self.seed)


def gap_visits(spacing: int, steps_per_epoch: int, prompts_per_step: int) -> int:
    """Other visits a gap serves: `spacing` RL steps from a prompt's visit to its next, less the RL steps of the
    returning prompts' epoch (they serve the rest), each of `prompts_per_step` prompts' visits."""
    return max(spacing - steps_per_epoch, 0) * prompts_per_step


def passes(prompts: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The simulator's passes over a corpus of `prompts`, each (returning prompts, the others): one, the even indices
    returning, the odd ones between their visits. A ValueError where the corpus has one prompt (no other to serve
    between its visits)."""
    if prompts < 2:
        raise ValueError(
            f"the corpus has {prompts} prompt: the simulator needs two or more (half of them return, the others' "
            "requests come between their visits)"
        )
    return [(tuple(range(0, prompts, 2)), tuple(range(1, prompts, 2)))]


def subset(corpus: Corpus, prompts: tuple[int, ...]) -> Corpus:
    """`corpus` with `prompts` alone, in that order (their responses, log-probs and scoring pass with them)."""

    def pick(nested):
        return [[epoch[p] for p in prompts] for epoch in nested]

    meta = {**corpus.meta, "prompts_of": list(prompts)}
    chosen = [corpus.prompts[p] for p in prompts]
    return Corpus(chosen, pick(corpus.responses), meta, pick(corpus.logprobs), pick(corpus.scores))


def store_bytes(corpus: Corpus) -> tuple[int, int]:
    """The draft store's bytes a prompt between its visits, by its own accounting (`DraftCache`, `Draft.nbytes`: the
    drafts the engine path commits, token ids and log-probs), averaged over the corpus's prompts: (after a first
    visit, after a later one). It keeps the visit a returning prompt claims and the one after it until the next
    opens, so a later visit holds two."""
    cache = DraftCache(max_bytes=1 << 62)
    held = []
    for epoch, responses in enumerate(corpus.responses):
        for p, samples in enumerate(responses):
            key, visit = prompt_key(corpus.prompts[p]), f"e{epoch}"
            cache.claim(key, visit, count=len(samples))
            for response in samples:
                tokens = np.asarray(response, np.int32)
                cache.commit(key, visit, Draft(tokens, np.zeros(len(tokens), np.float32), "stop"))
        held.append(cache.nbytes / len(corpus.prompts))
    return round(held[0]), round(held[-1])


def lru_held_share(capacity: float, prompts: int) -> float:
    """The share of returning prompts an LRU store of `capacity` prompts still holds, `prompts` prompts visited in a
    fresh shuffle each epoch: a prompt at place x of one epoch and y of the next returns after the other prompts of
    both spans, N (1 - x (1 - y)) of them, and is held where they are fewer than the capacity, so the share is
    P(x (1 - y) > 1 - c) = 1 - t + t ln t, t = 1 - c, c the capacity's share of the prompts."""
    share = capacity / max(prompts, 1)
    if share >= 1:
        return 1.0
    if share <= 0:
        return 0.0
    t = 1.0 - share
    return 1.0 - t + t * math.log(t)


@dataclass(frozen=True)
class StoreHeld:
    """Which returning prompts still have their last visit in the draft store: a seeded `share` of them, drawn per
    visit (all where `share` is 1)."""

    share: float = 1.0
    seed: int = 0

    def held(self, epoch: int, prompt: int) -> bool:
        if epoch == 0 or self.share >= 1:
            return True
        return random.Random(f"{self.seed}-{epoch}-{prompt}").random() < self.share

    def previous(self, corpus: Corpus, epoch: int, prompt: int) -> list[list[int]]:
        """The prompt's last visit as the store answers its claim ([] on a first visit, or where it dropped it)."""
        return corpus.responses[epoch - 1][prompt] if epoch > 0 and self.held(epoch, prompt) else []


class Stored:
    """A request-path workload whose drafts come from the draft store: a returning prompt it dropped is sent as
    plain samples (`StoreHeld`), the others as the workload sends them."""

    def __init__(self, workload: Workload, store: StoreHeld):
        self.workload, self.store = workload, store

    @property
    def kept(self) -> int:
        return self.workload.kept

    def requests(self, epoch: int, prompts: list[int], corpus: Corpus) -> list[Request]:
        held = [p for p in prompts if self.store.held(epoch, p)]
        out = self.workload.requests(epoch, held, corpus) if held else []
        for p in prompts:
            if p not in held:
                out += samples_of(f"e{epoch}-p{p}", p, corpus.prompts[p], corpus.responses[epoch][p])
        return out

    def followups(self, request: Request) -> list[Request]:
        return self.workload.followups(request)
