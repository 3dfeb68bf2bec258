"""What a request-path rule keeps of each sample's draft on a recorded corpus: a visit's plan (`Plan`), the tokens its
scoring requests score and each sample's cut (`Decision`), decided by the rule itself (`request_workload` sends them).

Terminology:
- *rule*: any policy the request path runs; what it proposes (`draft_choice`), from how far back (`draft_age`,
  `draft_history`) and whether it scores its drafts (`needs_scores`) are its own. A corpus's epoch e - a stands for
  a run's visit a back (`draft_age` a).
- *coupling* (`CoupledPlans`, a rule that draws its first rejected position from p_curr without the draft token:
  `lossless`): it keeps draft token y with probability p_curr(y) and draws a rejected position from p_curr without
  y, the law of "sample x from p_curr; keep y if and only if x = y". A recorded epoch-e response was sampled from the
  current policy, so the kept prefix is its longest prefix the proposal agrees with (the tree's: the longest path of
  the tree of the prompt's previous responses that it follows) and the whole response is the recorded one: the rule's
  law exactly. Its proposal (own, majority, tree) is the policy's `draft_choice`, over `draft_history` epochs.
- *cut* (`CutPlans`, every other rule): the rule's own `cut` on a `DraftBatch` (`policies.base.draft_batch`, checked
  by `checked_cuts`), one call per RL step. A sample's draft is its own response `draft_age` epochs back, with p_prev
  its sampled log-probs (p_gen too: a corpus's responses are freshly decoded, each token `draft_age` visits old),
  p_curr the corpus's scoring pass, and the uniforms a run draws for it (`seeds.entropy_of`: the seed, the prompt's
  key, the draft's epoch and sample, its length). What follows a rejection is not the recorded response, and its
  length is borrowed from it (`BORROWED_LENGTH`). A rule that keeps state gets each RL step's feedback as a run's
  coordinator sums it (`FeedbackCoordinator`), one update per `update_every` samples (default: an RL step's).
- *refused* (`request_plans`): what a corpus cannot answer for, named: a rule that scores drafts on a corpus without
  a scoring pass, or drafts two or more epochs back (the scoring pass scores the epoch before only); a majority path
  or tree proposed by a rule the coupling does not hold for.

Engine-free: numpy, the core and the simulator only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cache import prompt_key
from ..history import ROOT, History
from ..policies import ReusePolicy
from ..policies.base import checked_cuts, draft_batch
from ..policies.stateful import FeedbackCoordinator
from ..proposal import majority_path
from ..seeds import entropy_of, uniforms_for
from .corpus import Corpus

FILLER_TOKEN = 0  # a borrowed length's tokens past the recorded response (never read)
BORROWED_LENGTH = (
    "approximation: a cut rule's continuation after a rejection is given the recorded epoch-e response's length past "
    "the cut (at least one token), not that of the policy's sample conditioned on the kept prefix"
)


@dataclass(frozen=True)
class Decision:
    """One sample's cut: `kept` draft tokens; `prefix`, the tokens after the prompt its continuation starts from;
    `rest`, what the continuation generates ([]: none runs)."""

    kept: int
    prefix: list[int]
    rest: list[int]


@dataclass(frozen=True)
class Plan:
    """A visit's round: the token lists after the prompt its scoring requests score (before the probe; none: the rule
    scores nothing), and each sample's decision (None: it has no draft and is a plain sample)."""

    scored: list[list[int]]
    decisions: list[Decision | None]


def request_plans(
    policy: ReusePolicy, corpus: Corpus, seed: int = 0, update_every: int | None = None
) -> CoupledPlans | CutPlans:
    """The plans of `policy` on `corpus`; a ValueError names the rule and what the corpus lacks for it."""
    name = policy.describe()
    if policy.verifies_in_engine or policy.draft_age == 0:
        raise ValueError(f"rule {name} sends no drafts on the request path (stock, or verified in the engine)")
    if policy.excludes_rejected_token:
        return CoupledPlans(policy, corpus)
    if policy.draft_choice != "own":
        raise ValueError(
            f"rule {name} proposes the {policy.draft_choice} of a visit's responses, which the simulator replays for "
            "rules that draw a rejected position without the draft token (lossless) only"
        )
    if policy.needs_scores and not corpus.scored:
        raise ValueError(
            f"rule {name}: corpus {describe(corpus)} has no scoring pass (the log-probs a rule that scores drafts "
            "reads): record one with it (python -m specrl_openrlhf.miniature.corpus short|drift|long records the "
            "shipped ones)"
        )
    if policy.needs_scores and policy.draft_age > 1:
        raise ValueError(
            f"rule {name} scores drafts from {policy.draft_age} visits back, but a corpus's scoring pass scores each "
            "epoch's responses under the next epoch's policy only"
        )
    return CutPlans(policy, corpus, seed, update_every)


class CoupledPlans:
    """A coupled rule's plans (the module docstring): its cut is what its proposal shares with the recorded
    response."""

    def __init__(self, policy: ReusePolicy, corpus: Corpus):
        self.draft, self.visits, self.age = policy.draft_choice, policy.draft_history, policy.draft_age
        self.max_tokens = max_tokens(corpus)

    def plans(self, epoch: int, prompts: list[int], corpus: Corpus) -> list[Plan]:
        return [self._plan(epoch, p, corpus) for p in prompts]

    def _plan(self, epoch: int, prompt: int, corpus: Corpus) -> Plan:
        """The visit's round and cuts (none before `draft_age` epochs: every sample is plain)."""
        recorded, source = corpus.responses[epoch][prompt], epoch - self.age
        if source < 0:
            return Plan([], [None] * len(recorded))
        drafts = [list(r[: self.max_tokens]) for r in corpus.responses[source][prompt]]
        if self.draft != "own":
            older = [] if self.visits < 2 or source < 1 else corpus.responses[source - 1][prompt]
            history = History()  # the planner's: the usable responses in slot order (`History.of_drafts`)
            for d in drafts + [list(r[: self.max_tokens]) for r in older]:
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


class CutPlans:
    """A rule's plans by its own `cut` (the module docstring), one call per RL step."""

    def __init__(self, policy: ReusePolicy, corpus: Corpus, seed: int = 0, update_every: int | None = None):
        self.policy, self.seed, self.update_every = policy, int(seed), update_every
        self.max_tokens = max_tokens(corpus)
        self.keys = [prompt_key(p) for p in corpus.prompts]  # what a run's uniforms name a prompt by
        self.coordinator: FeedbackCoordinator | None = None

    def plans(self, epoch: int, prompts: list[int], corpus: Corpus) -> list[Plan]:
        age, n = self.policy.draft_age, corpus.samples
        source = epoch - age
        rows = [] if source < 0 else [(p, s) for p in prompts for s in range(n) if corpus.responses[source][p][s]]
        cuts = self._cuts(epoch, rows, corpus, len(prompts) * n) if rows else []
        decisions = {(p, s): self._decision(epoch, p, s, cut, corpus) for (p, s), cut in zip(rows, cuts)}
        out = []
        for p in prompts:
            mine = [decisions.get((p, s)) for s in range(n)]
            drafts = [corpus.responses[source][p][s][: self.max_tokens] for s in range(n) if mine[s] is not None]
            out.append(Plan([list(d) for d in drafts] if self.policy.needs_scores else [], mine))
        return out

    def _cuts(self, epoch: int, rows: list[tuple[int, int]], corpus: Corpus, step_samples: int) -> list[int]:
        """The rule's cut of every row's draft, [B]: one batch, checked; a stateful rule's feedback reported as a
        run's planner reports it (its cut samples), to a coordinator that updates it every `update_every` samples
        (default: the RL step's, `step_samples`)."""
        policy, age = self.policy, self.policy.draft_age
        source = epoch - age
        lengths = [min(len(corpus.responses[source][p][s]), self.max_tokens) for p, s in rows]
        if corpus.logprobs:
            sampled = [corpus.logprobs[source][p][s] for p, s in rows]
        else:  # a rule that needs no scores may still read p_prev: unknown here
            sampled = [np.full(n, np.nan, np.float32) for n in lengths]
        batch = draft_batch(
            lengths,
            draft_logprobs=sampled,
            gen_logprobs=sampled,
            ages=[np.full(n, age, np.int64) for n in lengths],
            uniforms=[
                uniforms_for(entropy_of(self.seed, self.keys[p], source, s, n), n) for (p, s), n in zip(rows, lengths)
            ],
            scored_logprobs=[corpus.scores[epoch][p][s] for p, s in rows] if policy.needs_scores else None,
        )
        try:
            cuts = checked_cuts(policy, batch, policy.cut(batch))
        except Exception as error:  # a rule may fail in any way: a run would generate the batch normally
            raise ValueError(
                f"rule {policy.describe()} failed on the corpus's drafts of epoch {epoch} ({type(error).__name__}: "
                f"{error}); replay it on traces to debug it (python -m specrl_openrlhf replay)"
            ) from error
        if policy.keeps_state:
            if self.coordinator is None:
                self.coordinator = FeedbackCoordinator(policy, self.update_every or step_samples)
            self.coordinator.report(policy.feedback(batch, cuts), len(rows))
        return cuts.tolist()

    def _decision(self, epoch: int, prompt: int, sample: int, cut: int, corpus: Corpus) -> Decision:
        draft = list(corpus.responses[epoch - self.policy.draft_age][prompt][sample][: self.max_tokens])
        recorded, n = corpus.responses[epoch][prompt][sample], len(draft)
        if cut < n:  # BORROWED_LENGTH
            length = max(len(recorded) - cut, 1)
        else:  # kept whole: nothing after a stop, else what the recorded response holds past the draft
            length = 0 if n < self.max_tokens else max(len(recorded) - n, 0)
        rest = (list(recorded[cut:]) + [FILLER_TOKEN] * length)[:length]
        return Decision(cut, draft[:cut], rest)


def max_tokens(corpus: Corpus) -> int:
    """A response's budget: the corpus's `max_tokens`, else its longest response (shorter ones ended by a stop)."""
    longest = max(len(r) for epoch in corpus.responses for samples in epoch for r in samples)
    return int(corpus.meta.get("max_tokens") or longest)


def common_prefix(a, b) -> int:
    """How many leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if len(differ) else n


def describe(corpus: Corpus) -> str:
    name = corpus.meta.get("path") or corpus.meta.get("model") or "unnamed"
    return f"{name} ({len(corpus.prompts)} prompts x {corpus.samples} samples x {corpus.epochs} epochs)"


def _decision(kept: int, draft: list[int], recorded: list[int]) -> Decision:
    return Decision(kept, list(draft[:kept]), list(recorded[kept:]))
