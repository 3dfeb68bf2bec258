"""`lossless` is exact, tested rather than argued: on a toy policy with a four-token vocabulary and responses of up to
three tokens whose weights drift at every visit, the whole responses that the planner assembles (draft, scoring,
cut, redraw from the residual, continuation, next draft) follow each visit's policy exactly, visit after visit. The
same test detects the bias of SPEC-RL's rule, at lenience 1 (`exact`) and at e^0.5 (`spec`)."""

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


def top_k(logprobs_row: np.ndarray):
    order = np.argsort(-logprobs_row)
    return order.astype(np.int32), logprobs_row[order].astype(np.float32)


def decode(table, prefix: list[int], rng) -> tuple[list[int], list[float], list, str]:
    """The engine: continue `prefix` under the table until EOS or LENGTH tokens."""
    tokens, logprobs, tops = [], [], []
    while len(prefix) + len(tokens) < LENGTH:
        row = table[tuple(prefix + tokens)]
        token = draw(np.arange(VOCAB), np.exp(row), rng.random())
        tokens.append(token)
        logprobs.append(float(row[token]))
        tops.append(top_k(row))
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
                    sample.scored_top[0][j], sample.scored_top[1][j] = top_k(row)
        samples.append(sample)
    planner.decide(samples)
    responses, next_drafts = [], []
    for sample in samples:
        new = ([], [], [], None)
        request = planner.continuation(sample)
        if request is not None:
            new = decode(table, request[0][len(PROMPT) :], rng)
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


def test_lossless_follows_each_visits_policy_exactly():
    statistics = chains(sr.make("lossless", top_k=VOCAB), samples=100_000, visits=3)
    assert all(chi2 < chi2_999(dof) for chi2, dof in statistics), statistics


@pytest.mark.parametrize("policy", [sr.make("exact"), sr.make("spec")], ids=["exact", "spec"])
def test_the_same_test_detects_spec_rls_bias(policy):
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
