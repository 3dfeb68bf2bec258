"""The request path replayed on a recorded corpus: a `Workload` for the simulator (`simulator.engine`) that sends,
each RL step, the scoring requests and continuations the request path's driver (`integration.request_path`) sends,
cut as its rule would cut them.

Terminology:
- *rule* (`request_workload`): `lossless:own`, `lossless:majority`, `lossless:tree` (`lossless:requests` is the
  tree, `LosslessParams`' default draft), with `verify="requests"` and `history=1`; `spec@<lenience>` (`spec`: the
  default lenience) and `exact` (lenience 1).
- *coupling*: `lossless` keeps draft token y with probability p_curr(y) and draws a rejected position from p_curr
  without y: the law of "sample x from p_curr; keep y if and only if x = y". A recorded epoch-e response was sampled
  from the current policy, so the kept prefix is its longest prefix the proposal agrees with (the tree's: the longest
  path of the tree of the prompt's previous responses that it follows) and the whole response is the recorded one:
  the rule's law exactly.
- *ratio rules*: keep draft token i while u_i <= min(1, lenience * p_curr / p_prev), p_prev the previous response's
  sampled log-probs, p_curr the corpus's scoring pass, u seeded per sample (`uniforms`). What follows a rejection is
  not the recorded response, and its length is borrowed from it (`BORROWED_LENGTH`).
- *round*: a visit's scoring requests (`prompt_logprobs`, one generated token), sent together as the planner's
  `visit_rounds` sends them: a prompt probe (the prompt alone) when two or more drafts score, then one request per
  draft (`own`, `majority`, ratio rules) or one per branch of the tree (`tree`, its last token scored as the one
  that follows). A draft is scored whole: the planner's first chunk until its chunk schedule has seen a rejection;
  later chunks, and rescoring of positions the prefix cache served without log-probs, are not replayed. Every sample
  of a visit with a round waits for all of it (the driver's samples wait for their visit's leader), then sends its
  continuation (prompt + kept prefix) or, with no draft, its sample; a sample kept whole sends none.
- *prefix cache* (on unless the schedule turns it off): a request reads the whole `BLOCK_TOKENS` blocks it shares
  with an earlier request of its visit (the probe's prompt, a sibling's draft; a continuation: its prompt + kept
  prefix, which the round wrote), never its last token, which vLLM computes again; taken as cached when it is
  admitted, whatever the earlier request's progress. Samples of visits without a round are the simulator's `Samples`.

Engine-free: numpy, the core and the simulator only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..history import ROOT, History
from ..params import DEFAULT_LENIENCE, check_lenience
from ..proposal import majority_path
from .corpus import Corpus
from .requests import Request, cached_tokens, samples_of

SCORED_TOKEN = 0  # what a scoring request generates (its one token; never read)
BORROWED_LENGTH = (
    "approximation: a ratio rule's continuation after a rejection is given the recorded epoch-e response's length "
    "past the cut (at least one token), not that of the policy's sample conditioned on the kept prefix"
)
DRAFTS = ("own", "majority", "tree")
RULES = ("lossless:own", "lossless:majority", "lossless:tree", "lossless:requests", "spec@<lenience>", "spec", "exact")


class NoDrafts:
    """The engine's proposer on the request path: none (drafts are verified by requests), so async scheduling stays."""

    name, async_scheduling = "requests", True

    def visit(self, epoch: int, prompts: list[int], corpus: Corpus) -> float:
        return 0.0

    def propose(self, batch, sampled: list[list[int]]) -> list[list[int]]:
        return [[] for _ in sampled]

    def finished(self, request: Request) -> None:
        pass

    def memory_bytes(self) -> int:
        return 0


@dataclass(frozen=True)
class Decision:
    """One sample's cut: `kept` draft tokens; `prefix`, the tokens after the prompt its continuation starts from;
    `rest`, what the continuation generates ([]: none runs)."""

    kept: int
    prefix: list[int]
    rest: list[int]


@dataclass(frozen=True)
class Plan:
    """A visit's round: the token lists after the prompt its requests score (before the probe), and each sample's
    decision (None: it has no draft and is a plain sample)."""

    scored: list[list[int]]
    decisions: list[Decision | None]


def uniforms(seed: int, epoch: int, prompt: int, sample: int, length: int) -> np.ndarray:
    """[length] float64, a ratio rule's acceptance uniforms for one sample, the same for every rule."""
    return np.random.default_rng([seed, epoch, prompt, sample]).random(length)


def ratio_cut(p_curr: np.ndarray, p_prev: np.ndarray, u: np.ndarray, lenience: float) -> int:
    """SPEC-RL's cut: the first i with u_i > min(1, lenience * exp(p_curr_i - p_prev_i)), the whole draft if none (in
    log space, as `policies.base.lenient_cut`)."""
    accept = np.minimum(math.log(lenience) + p_curr.astype(np.float64) - p_prev.astype(np.float64), 0.0)
    rejected = np.flatnonzero(~(np.log(u) <= accept))
    return int(rejected[0]) if len(rejected) else len(u)


def common_prefix(a, b) -> int:
    """How many leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if len(differ) else n


class RequestReplay:
    """The request path's `Workload` for one rule (see the module docstring): per visit, its round, then, once every
    request of the round has finished (`followups`), its samples' continuations and plain samples. `kept` adds each
    sample's kept draft tokens."""

    def __init__(self, rule: str, corpus: Corpus, seed: int = 0):
        self.rule, self.seed = rule, int(seed)
        self.draft, self.lenience = _parse(rule)
        if self.lenience is not None and not corpus.scored:
            raise ValueError(
                f"rule {rule!r}: corpus {_describe(corpus)} has no scoring pass (the log-probs a ratio rule reads): "
                "record one with it (python -m specrl_openrlhf.miniature.corpus short|drift|long records the shipped "
                "ones)"
            )
        longest = max(len(r) for epoch in corpus.responses for samples in epoch for r in samples)
        self.max_tokens = int(corpus.meta.get("max_tokens") or longest)  # shorter responses ended by a stop
        self.kept = 0
        self._visit_of: dict[str, str] = {}  # a round's request in flight -> its visit
        self._left: dict[str, int] = {}  # per visit: its round's requests in flight
        self._after: dict[str, list[Request]] = {}  # per visit: what its samples send once its round is done

    def plan(self, epoch: int, prompt: int, corpus: Corpus) -> Plan:
        """The visit's round and cuts (none at epoch 0: every sample is plain)."""
        recorded = corpus.responses[epoch][prompt]
        if epoch == 0:
            return Plan([], [None] * len(recorded))
        drafts = [list(r[: self.max_tokens]) for r in corpus.responses[epoch - 1][prompt]]
        if self.lenience is not None:
            decisions = [self._ratio(epoch, prompt, s, d, recorded[s], corpus) for s, d in enumerate(drafts)]
            return Plan([d for d in drafts if d], decisions)
        if self.draft != "own":
            history = History()  # the planner's: the usable responses in slot order (`History.of_drafts`)
            for d in drafts:
                if d:
                    history.add(d, stop=len(d) < self.max_tokens)
            if self.draft == "tree":
                if not len(history):
                    return Plan([], [None] * len(recorded))
                shared = len(history.branches) >= 2  # the probe scores the root's children, each branch its last token
                scored = [history.path_tokens(r).tolist()[: -1 if shared else None] for r in history.branches]
                return Plan(scored, [self._follow(history, x) for x in recorded])
            if len(nodes := majority_path(history)):  # else each its own, as the planner's
                drafts = [history.token_of(nodes).tolist()] * len(drafts)
        decisions = [None if not d else _decision(common_prefix(d, x), d, x) for d, x in zip(drafts, recorded)]
        return Plan([d for d in drafts if d], decisions)

    def _follow(self, history: History, response: list[int]) -> Decision:
        """The tree walk under the coupling: the recorded response as far as the tree holds it, to a stop at most."""
        node, kept = ROOT, 0
        for token in response[: self.max_tokens]:
            node = history.kids[node].get(int(token))
            if node is None:
                break
            kept += 1
            if history.stop[node]:  # a response ended here: nothing follows (`proposal.walk`)
                break
        return _decision(kept, response, response)

    def _ratio(self, epoch, prompt, sample, draft, recorded, corpus) -> Decision | None:
        if not draft:
            return None
        n = len(draft)
        p_prev, p_curr = corpus.logprobs[epoch - 1][prompt][sample][:n], corpus.scores[epoch][prompt][sample][:n]
        cut = ratio_cut(p_curr, p_prev, uniforms(self.seed, epoch, prompt, sample, n), self.lenience)
        if cut < n:  # BORROWED_LENGTH
            length = max(len(recorded) - cut, 1)
        else:  # kept whole: nothing after a stop, else what the recorded response holds past the draft
            length = 0 if n < self.max_tokens else max(len(recorded) - n, 0)
        rest = (list(recorded[cut:]) + [SCORED_TOKEN] * length)[:length]
        return Decision(cut, draft[:cut], rest)

    def requests(self, epoch: int, prompts: list[int], corpus: Corpus) -> list[Request]:
        out = []
        for p in prompts:
            prompt, recorded = corpus.prompts[p], corpus.responses[epoch][p]
            plan, tag = self.plan(epoch, p, corpus), f"e{epoch}-p{p}"
            if not plan.scored:
                out += samples_of(tag, p, prompt, recorded)
                continue
            sequences = ([list(prompt)] if len(plan.scored) >= 2 else []) + [prompt + d for d in plan.scored]
            arrays = [np.asarray(tokens) for tokens in sequences]  # converted once: a visit compares every pair
            for i, tokens in enumerate(sequences):
                shared = max((common_prefix(arrays[i], before) for before in arrays[:i]), default=0)
                cached = cached_tokens(shared, len(tokens))
                out.append(Request(f"{tag}-r{i}", p, tokens, [SCORED_TOKEN], cached=cached, prompt_logprobs=True))
                self._visit_of[out[-1].id] = tag
            self._left[tag] = len(sequences)
            after = [self._next(f"{tag}-s{s}", p, prompt, recorded[s], d) for s, d in enumerate(plan.decisions)]
            self._after[tag] = [r for r in after if r is not None]
            self.kept += sum(d.kept for d in plan.decisions if d is not None)
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


def request_workload(rule: str, corpus: Corpus, seed: int = 0) -> RequestReplay:
    """The request path's workload for `rule` on `corpus`; a ValueError names an unknown rule and the choices, or a
    ratio rule's corpus that has no scoring pass."""
    return RequestReplay(rule, corpus, seed)


def _parse(rule: str) -> tuple[str | None, float | None]:
    """(lossless's draft, None) or (None, a ratio rule's lenience)."""
    name, _, arg = str(rule).partition(":") if str(rule).startswith("lossless") else str(rule).partition("@")
    if name == "lossless" and arg in (*DRAFTS, "requests"):
        return ("tree" if arg == "requests" else arg), None
    if rule == "exact":
        return None, 1.0
    if name == "spec":
        try:
            lenience = float(arg) if arg else DEFAULT_LENIENCE
        except ValueError:
            raise ValueError(f"rule {rule!r}: lenience {arg!r} is not a number; rules: {', '.join(RULES)}") from None
        check_lenience(f"rule {rule!r}", lenience)
        return None, lenience
    raise ValueError(f"unknown request-path rule {rule!r}; rules: {', '.join(RULES)}")


def _decision(kept: int, draft: list[int], recorded: list[int]) -> Decision:
    return Decision(kept, list(draft[:kept]), list(recorded[kept:]))


def _describe(corpus: Corpus) -> str:
    name = corpus.meta.get("path") or corpus.meta.get("model") or "unnamed"
    return f"{name} ({len(corpus.prompts)} prompts x {corpus.samples} samples x {corpus.epochs} epochs)"
