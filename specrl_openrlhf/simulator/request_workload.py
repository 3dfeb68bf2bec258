"""The request path replayed on a recorded corpus: a `Workload` for the simulator (`simulator.engine`) that sends,
each RL step, the scoring requests and continuations the request path's driver (`integration.request_path`) sends,
cut by the rule itself (`request_plans`: any rule the request path runs, through its own `cut` or, for `lossless`,
the coupling).

Terminology:
- *round*: a visit's scoring requests (`prompt_logprobs`, one generated token), sent together as the planner's
  `visit_rounds` sends them: a prompt probe (the prompt alone) when two or more drafts score, then one request per
  draft (own, majority, a rule's own draft) or one per branch of the tree (`tree`, its last token scored as the one
  that follows). A draft is scored whole: the planner's first chunk until its chunk schedule has seen a rejection;
  later chunks, and rescoring of positions the prefix cache served without log-probs, are not replayed. Every sample
  of a visit with a round waits for all of it (the driver's samples wait for their visit's leader), then sends its
  continuation (prompt + kept prefix) or, with no draft, its sample; a sample kept whole sends none. A rule that
  scores nothing (`random`, `full`) has no round: its samples send their continuations at once.
- *prefix cache* (on unless the schedule turns it off): a request reads the whole `BLOCK_TOKENS` blocks it shares
  with an earlier request of its visit (the probe's prompt, a sibling's draft; a continuation after a round: its
  prompt + kept prefix, which the round wrote), never its last token, which vLLM computes again; taken as cached when
  it is admitted, whatever the earlier request's progress. Samples of visits without drafts are the simulator's
  `Samples`.

Engine-free: numpy, the core and the simulator only.
"""

from __future__ import annotations

import numpy as np

from ..policies import ReusePolicy
from .corpus import Corpus
from .request_plans import Decision, Plan, common_prefix, request_plans
from .requests import Request, cached_tokens, samples_of

SCORED_TOKEN = 0  # what a scoring request generates (its one token; never read)


class NoDrafts:
    """The engine's proposer on the request path: none (drafts are verified by requests), so async scheduling stays."""

    name, async_scheduling = "requests", True

    def between_visits(self, others) -> None:
        pass

    def visit(self, epoch: int, prompts: list[int], corpus: Corpus) -> float:
        return 0.0

    def propose(self, batch, sampled: list[list[int]]) -> list[list[int]]:
        return [[] for _ in sampled]

    def finished(self, request: Request) -> None:
        pass

    def memory_bytes(self) -> int:
        return 0


class RequestReplay:
    """The request path's `Workload` for one rule (see the module docstring): per visit, its round, then, once every
    request of the round has finished (`followups`), its samples' continuations and plain samples. `kept` adds each
    sample's kept draft tokens; `plans` decides them (`request_plans`)."""

    def __init__(self, policy: ReusePolicy, corpus: Corpus, seed: int = 0, update_every: int | None = None):
        self.policy = policy
        self.plans = request_plans(policy, corpus, seed, update_every)
        self.kept = 0
        self._visit_of: dict[str, str] = {}  # a round's request in flight -> its visit
        self._left: dict[str, int] = {}  # per visit: its round's requests in flight
        self._after: dict[str, list[Request]] = {}  # per visit: what its samples send once its round is done

    def plan(self, epoch: int, prompt: int, corpus: Corpus) -> Plan:
        """One visit's round and cuts (a stateful rule counts it as an RL step's)."""
        return self.plans.plans(epoch, [prompt], corpus)[0]

    def requests(self, epoch: int, prompts: list[int], corpus: Corpus) -> list[Request]:
        out = []
        for p, plan in zip(prompts, self.plans.plans(epoch, prompts, corpus)):
            prompt, recorded, tag = corpus.prompts[p], corpus.responses[epoch][p], f"e{epoch}-p{p}"
            self.kept += sum(d.kept for d in plan.decisions if d is not None)
            if all(d is None for d in plan.decisions):
                out += samples_of(tag, p, prompt, recorded)
                continue
            after = [self._next(f"{tag}-s{s}", p, prompt, recorded[s], d) for s, d in enumerate(plan.decisions)]
            after = [r for r in after if r is not None]
            if not plan.scored:  # no round: they go now, each reading what an earlier one of the visit shares
                out += _sharing(after)
                continue
            sequences = ([list(prompt)] if len(plan.scored) >= 2 else []) + [prompt + d for d in plan.scored]
            for i, (tokens, cached) in enumerate(zip(sequences, _shared_blocks(sequences))):
                out.append(Request(f"{tag}-r{i}", p, tokens, [SCORED_TOKEN], cached=cached, prompt_logprobs=True))
                self._visit_of[out[-1].id] = tag
            self._left[tag] = len(sequences)
            self._after[tag] = after
        return out

    @staticmethod
    def _next(name: str, p: int, prompt, recorded, decision: Decision | None) -> Request | None:
        """What a sample sends once its visit's round is done: its continuation, or its plain sample (both read what
        the round wrote)."""
        if decision is None:
            tokens, response = list(prompt), recorded
        elif decision.rest:
            tokens, response, name = prompt + decision.prefix, decision.rest, f"{name}-continuation"
        else:
            return None  # kept whole: nothing left to generate
        return Request(name, p, tokens, response, cached=cached_tokens(len(tokens), len(tokens)))

    def followups(self, request: Request) -> list[Request]:
        tag = self._visit_of.pop(request.id, None)
        if tag is None:
            return []
        self._left[tag] -= 1
        if self._left[tag]:
            return []
        del self._left[tag]
        return self._after.pop(tag)


def _shared_blocks(sequences: list[list[int]]) -> list[int]:
    """Each request's cached tokens when it shares with the visit's earlier ones (`cached_tokens`)."""
    arrays = [np.asarray(tokens) for tokens in sequences]  # converted once: a visit compares every pair
    shared = [max((common_prefix(a, before) for before in arrays[:i]), default=0) for i, a in enumerate(arrays)]
    return [cached_tokens(n, len(tokens)) for n, tokens in zip(shared, sequences)]


def _sharing(requests: list[Request]) -> list[Request]:
    """A visit's requests sent together with no round before them: each reads what an earlier one shares."""
    for request, cached in zip(requests, _shared_blocks([r.prompt for r in requests])):
        request.cached = request.prefilled = cached
    return requests


def request_workload(
    policy: ReusePolicy, corpus: Corpus, seed: int = 0, update_every: int | None = None
) -> RequestReplay:
    """The request path's workload for `policy` on `corpus` (`seed`: a run's `--reuse.seed`; `update_every`: a
    stateful rule's samples per update, default an RL step's); a ValueError names the rule and what the corpus lacks
    for it (`request_plans`)."""
    return RequestReplay(policy, corpus, seed, update_every)
