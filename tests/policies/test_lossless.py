"""Which rules return samples of the current policy, tested rather than argued, on a toy policy with a four-token
vocabulary and responses of up to three tokens, through the planner's own steps (draft, scoring, cut, redraw,
continuation, next draft).

- RL-dependent drafts: the learner takes a policy-gradient step on the very sample that becomes the draft, so its new
  weights depend on the draft. Grouped by the weights the learner ends with, `lossless` (the draft as a fixed
  proposal) returns samples of them; `residual` (speculative sampling against p_prev), `exact` and `spec` do not.
- Independent drift: every visit moves the weights by a drift drawn independently of the samples. There `residual`
  is exact too, and the test still detects SPEC-RL's rule.
"""

import itertools
import math

import numpy as np
import pytest

import specrl_openrlhf as sr
from specrl_openrlhf.residual import draw, residual

EOS, VOCAB, LENGTH = 0, 4, 3
PROMPT = [9]
Z_999 = 3.0902  # the standard normal's 99.9% quantile


def chi2_999(dof: int) -> float:
    """The 99.9% quantile of chi-square with `dof` degrees of freedom (Wilson-Hilferty, within 1% for dof >= 5)."""
    return dof * (1 - 2 / (9 * dof) + Z_999 * math.sqrt(2 / (9 * dof))) ** 3


class ToyPolicy:
    """p(x | prefix) = softmax(logits[prefix]) over 4 tokens, for every prefix of up to two non-EOS tokens; each visit
    moves every logit by a fixed random drift."""

    def __init__(self, seed: int = 0, drift: float = 0.8):
        rng = np.random.default_rng(seed)
        self.prefixes = [p for n in range(LENGTH) for p in itertools.product(range(1, VOCAB), repeat=n)]
        self.base = {p: rng.normal(0.0, 1.0, VOCAB) for p in self.prefixes}
        self.drift = {p: rng.normal(0.0, drift, VOCAB) for p in self.prefixes}

    def logprobs(self, visit: int) -> dict[tuple, np.ndarray]:
        out = {}
        for p in self.prefixes:
            logits = self.base[p] + visit * self.drift[p]
            out[p] = logits - np.logaddexp.reduce(logits)
        return out

    @staticmethod
    def responses() -> list[tuple]:
        """Every possible response: up to EOS, or cut at LENGTH tokens."""
        out = []
        for n in range(1, LENGTH + 1):
            for body in itertools.product(range(1, VOCAB), repeat=n - 1):
                out.append((*body, EOS))
        out += list(itertools.product(range(1, VOCAB), repeat=LENGTH))
        return out

    @staticmethod
    def probability(logprobs, response) -> float:
        return math.exp(sum(logprobs[tuple(response[:i])][t] for i, t in enumerate(response)))


def top_k(logprobs_row: np.ndarray, k: int = VOCAB):
    order = np.argsort(-logprobs_row)[:k]
    return order.astype(np.int32), logprobs_row[order].astype(np.float32)


def decode(table, prefix: list[int], rng, excluded=None, k: int = VOCAB) -> tuple[list[int], list[float], list, str]:
    """The engine: continue `prefix` under the table until EOS or LENGTH tokens; `excluded` is banned at the first
    step (as the vLLM plugin does), and the reported logprob is the token's under the table (raw)."""
    tokens, logprobs, tops = [], [], []
    while len(prefix) + len(tokens) < LENGTH:
        row = table[tuple(prefix + tokens)]
        probs = np.exp(row)
        if excluded is not None and not tokens:
            probs[excluded] = 0.0
            probs /= probs.sum()
        token = draw(np.arange(VOCAB), probs, rng.random())
        tokens.append(token)
        logprobs.append(float(row[token]))
        tops.append(top_k(row, k))
        if token == EOS:
            return tokens, logprobs, tops, "stop"
    return tokens, logprobs, tops, "length"


def visit(planner, table, drafts, rng, visit_number):
    """One visit of every chain: the planner's steps, with `table` as the engine (exact scores, full top-k)."""
    samples = []
    for i, draft in enumerate(drafts):
        draft = None if draft is None else draft.numbered(visit_number - 1, 0)  # as the cache numbers them
        sample = planner.new_sample(PROMPT, LENGTH, draft, key=i.to_bytes(16, "little"))
        if sample.draft is not None:
            tokens = sample.draft.token_ids.tolist()
            rows = [table[tuple(tokens[:j])] for j in range(len(tokens))]
            if sample.scored is not None:
                sample.scored[:] = [row[t] for row, t in zip(rows, tokens)]
            if sample.scored_top is not None:
                for j, row in enumerate(rows):
                    sample.scored_top[0][j], sample.scored_top[1][j] = top_k(row, planner.top_k)
        samples.append(sample)
    planner.decide(samples)
    responses, next_drafts = [], []
    for sample in samples:
        new = ([], [], [], None)
        request = planner.continuation(sample)
        if request is not None:
            new = decode(table, request[0][len(PROMPT) :], rng, sample.excluded, planner.top_k or VOCAB)
        tops = (np.array([t[0] for t in new[2]]), np.array([t[1] for t in new[2]])) if new[2] else None
        output, stored = planner.assemble(sample, new[0], new[1], new[3], new_top=tops)
        responses.append(tuple(output.token_ids))
        next_drafts.append(stored)
    return responses, next_drafts


def chi_square(responses, table) -> tuple[float, int]:
    """Pearson's statistic over every possible response, responses expected fewer than 5 times pooled into one bin
    (so the chi-square law holds); returns it with its degrees of freedom."""
    counts = {}
    for r in responses:
        counts[r] = counts.get(r, 0) + 1
    assert set(counts) <= set(ToyPolicy.responses())
    n = len(responses)
    bins, pooled_expected, pooled_count = [], 0.0, 0
    for r in ToyPolicy.responses():
        expected = n * ToyPolicy.probability(table, r)
        if expected >= 5:
            bins.append((counts.get(r, 0), expected))
        else:
            pooled_expected, pooled_count = pooled_expected + expected, pooled_count + counts.get(r, 0)
    if pooled_expected > 0:
        bins.append((pooled_count, pooled_expected))
    return sum((c - e) ** 2 / e for c, e in bins), len(bins) - 1


def chains(policy, samples: int, visits: int, seed: int = 0):
    """The chi-square of every visit after the first, each against that visit's own policy."""
    toy = ToyPolicy()
    planner = sr.SpeculativePlanner(policy, seed=seed, stop_token_ids=[EOS])
    rng = np.random.default_rng(seed + 1)
    drafts, statistics = [None] * samples, []
    for v in range(visits):
        table = toy.logprobs(v)
        responses, drafts = visit(planner, table, drafts, rng, v)
        if v:
            statistics.append(chi_square(responses, table))
    return statistics


def policy_gradient_step(table, response, step: float = 1.5) -> dict[tuple, np.ndarray]:
    """The learner's update on one sample (REINFORCE with reward 1, tabular softmax): at each prefix of the response,
    logits += step * (onehot(token) - p). The new weights depend on the sample, as in RL."""
    new = {prefix: row.copy() for prefix, row in table.items()}
    for i, token in enumerate(response):
        prefix = tuple(response[:i])
        gradient = -np.exp(table[prefix])
        gradient[token] += 1.0
        logits = table[prefix] + step * gradient
        new[prefix] = logits - np.logaddexp.reduce(logits)
    return new


def rl_dependent(policy, samples: int, seed: int = 0, flat: bool = False) -> tuple[float, int]:
    """Visit 0 samples afresh; the learner steps on each chain's sample, which is also that chain's draft at visit 1.
    Returns the chi-square of visit 1's responses summed over the groups of chains that share the learner's final
    weights (that is, the same visit-0 sample), each group against its own weights, with the summed degrees of
    freedom. `flat`: weights so even that the top-2 tokens leave much of the mass out."""
    toy = ToyPolicy(seed=seed, drift=0.0)
    table = {p: row * (0.2 if flat else 1.0) for p, row in toy.logprobs(0).items()}
    table = {p: row - np.logaddexp.reduce(row) for p, row in table.items()}
    planner = sr.SpeculativePlanner(policy, seed=seed, stop_token_ids=[EOS])
    rng = np.random.default_rng(seed + 1)
    firsts, drafts = visit(planner, table, [None] * samples, rng, 0)
    learned = {r: policy_gradient_step(table, r) for r in set(firsts)}
    # visit 1, chain by chain under its own learner's weights: batch the chains that share them
    chi2, dof = 0.0, 0
    for first, weights in learned.items():
        chains_here = [d for d, r in zip(drafts, firsts) if r == first]
        responses, _ = visit(planner, weights, chains_here, rng, 1)
        if len(responses) >= 200:  # too few to bin; the other groups carry the test
            group_chi2, group_dof = chi_square(responses, weights)
            chi2, dof = chi2 + group_chi2, dof + group_dof
    return chi2, dof


def test_lossless_is_exact_when_the_learner_trains_on_the_draft():
    chi2, dof = rl_dependent(sr.make("lossless"), samples=100_000)
    assert dof >= 20 and chi2 < chi2_999(dof), (chi2, dof)


def test_lossless_is_exact_where_much_mass_lies_beyond_any_top_k():
    chi2, dof = rl_dependent(sr.make("lossless"), samples=50_000, flat=True)
    assert chi2 < chi2_999(dof), (chi2, dof)


@pytest.mark.parametrize(
    "policy",
    [sr.make("residual", top_k=VOCAB), sr.make("exact"), sr.make("spec")],
    ids=["residual", "exact", "spec"],
)
def test_ratio_rules_are_detected_when_the_learner_trains_on_the_draft(policy):
    chi2, dof = rl_dependent(policy, samples=20_000)
    assert chi2 > 3 * chi2_999(dof), (chi2, dof)


def test_residual_with_a_short_top_k_is_detected_where_the_tail_is_heavy():
    chi2, dof = rl_dependent(sr.make("residual", top_k=2), samples=20_000, flat=True)
    assert chi2 > chi2_999(dof), (chi2, dof)


@pytest.mark.parametrize(
    "policy", [sr.make("lossless"), sr.make("residual", top_k=VOCAB)], ids=["lossless", "residual"]
)
def test_exact_rules_follow_each_visits_policy_under_independent_drift(policy):
    statistics = chains(policy, samples=25_000, visits=3)
    assert all(chi2 < chi2_999(dof) for chi2, dof in statistics), statistics


@pytest.mark.parametrize("policy", [sr.make("exact"), sr.make("spec")], ids=["exact", "spec"])
def test_independent_drift_still_detects_spec_rls_bias(policy):
    statistics = chains(policy, samples=20_000, visits=3)
    assert any(chi2 > 3 * chi2_999(dof) for chi2, dof in statistics), statistics


def test_the_residual_is_norm_max_0_pcurr_minus_pprev():
    curr, prev = np.log([0.5, 0.3, 0.2]), np.log([0.2, 0.5, 0.3])
    tokens, probs, tail, empty = residual([0, 1, 2], curr, [0, 1, 2], prev)
    assert tokens.tolist() == [0, 1, 2] and probs == pytest.approx([1.0, 0.0, 0.0]) and tail == pytest.approx(0.0)
    # truncated lists: p_prev unseen counts as 0, and the unseen mass is reported
    tokens, probs, tail, empty = residual([0, 1], np.log([0.5, 0.3]), [1], np.log([0.6]))
    assert tokens.tolist() == [0, 1] and probs == pytest.approx([1.0, 0.0]) and tail == pytest.approx(0.2 + 0.4)
    _, probs, _, empty = residual([0], np.log([0.5]), [0], np.log([0.9]))  # nothing left: p_curr's top-k
    assert empty and probs == pytest.approx([1.0])
