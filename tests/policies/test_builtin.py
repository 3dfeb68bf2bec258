import math

import numpy as np
import pytest
import torch

from specrl_openrlhf.policies import DEFAULT_LENIENCE, DraftBatch, make


def batch(draft, scored, lengths, uniforms):
    return DraftBatch(
        draft_logprobs=torch.tensor(draft, dtype=torch.float32),
        scored_logprobs=None if scored is None else torch.tensor(scored, dtype=torch.float32),
        lengths=torch.tensor(lengths, dtype=torch.int64),
        uniforms=torch.tensor(uniforms, dtype=torch.float64),
    )


# Hand-made token tables: log p_prev, log p_curr, uniforms -> expected cut.
LOG_HALF = math.log(0.5)


@pytest.mark.parametrize(
    "name, params, draft, scored, lengths, uniforms, expected",
    [
        # ratio 1 everywhere: exact keeps the whole draft whatever the uniforms
        ("exact", {}, [[-1.0, -2.0, -3.0]], [[-1.0, -2.0, -3.0]], [3], [[0.99, 0.99, 0.99]], [3]),
        # ratio 1/2 at token 1: u=0.6 > 0.5 rejects there
        ("exact", {}, [[-1.0, -1.0, -1.0]], [[-1.0, -1.0 + LOG_HALF, -1.0]], [3], [[0.9, 0.6, 0.1]], [1]),
        # the same table with lenience 1.5: acceptance 0.75 >= 0.6 keeps everything
        (
            "spec",
            {"lenience": 1.5},
            [[-1.0, -1.0, -1.0]],
            [[-1.0, -1.0 + LOG_HALF, -1.0]],
            [3],
            [[0.9, 0.6, 0.1]],
            [3],
        ),
        # first token rejected: cut 0
        ("spec", {"lenience": 1.0}, [[0.0, 0.0]], [[LOG_HALF, 0.0]], [2], [[0.7, 0.0]], [0]),
        # padding past a row's length is ignored even where it would reject
        (
            "exact",
            {},
            [[-1.0, -1.0, 0.0], [-1.0, -1.0, -1.0]],
            [[-1.0, -1.0, -50.0], [-1.0, -5.0, -1.0]],
            [2, 3],
            [[0.5, 0.5, 0.99], [0.5, 0.5, 0.5]],
            [2, 1],
        ),
        # a higher current probability is always accepted
        ("exact", {}, [[-3.0, -3.0]], [[-1.0, -0.5]], [2], [[0.999, 0.999]], [2]),
        ("full", {}, [[-1.0, -1.0, 0.0]], None, [2], [[0.9, 0.9, 0.9]], [2]),
        ("off", {}, [[-1.0, -1.0]], None, [2], [[0.1, 0.1]], [0]),
        # random: floor(u0 * (len + 1))
        ("random", {}, [[0.0] * 4, [0.0] * 4], None, [4, 2], [[0.0, 0, 0, 0], [0.99, 0, 0, 0]], [0, 2]),
        ("delayed", {"lenience": 1.0}, [[0.0, 0.0]], [[0.0, LOG_HALF]], [2], [[0.4, 0.6]], [1]),
    ],
)
def test_hand_made_tables(name, params, draft, scored, lengths, uniforms, expected):
    assert make(name, **params).cut(batch(draft, scored, lengths, uniforms)).tolist() == expected


def test_declared_needs():
    assert make("spec").needs_scores and make("exact").needs_scores and make("delayed").needs_scores
    assert not make("random").needs_scores and not make("full").needs_scores and not make("off").needs_scores
    assert make("delayed").draft_age == 2 and make("spec").draft_age == 1 and make("off").draft_age == 0
    assert make("spec").params.lenience == pytest.approx(math.exp(0.5)) == DEFAULT_LENIENCE


@pytest.mark.parametrize("lenience, ratio", [(1.0, 0.3), (1.0, 0.8), (1.65, 0.3), (1.65, 0.5), (2.0, 0.7), (1.0, 1.4)])
def test_acceptance_frequency_matches_min_one_lenience_ratio(lenience, ratio):
    """One-token drafts: the accepted fraction must match min(1, lenience * ratio) within 5 standard errors."""
    rows = 40_000
    rng = np.random.default_rng(1234)
    draft = torch.full((rows, 1), -2.0)
    scored = draft + math.log(ratio)
    uniforms = torch.from_numpy(rng.random((rows, 1)))
    cuts = make("spec", lenience=lenience).cut(
        DraftBatch(draft, scored, torch.ones(rows, dtype=torch.int64), uniforms)
    )
    target = min(1.0, lenience * ratio)
    observed = cuts.double().mean().item()
    stderr = math.sqrt(max(target * (1 - target), 1e-12) / rows)
    assert abs(observed - target) <= 5 * stderr + 1e-12


def test_cut_distribution_is_geometric():
    """With per-token acceptance a, P(cut = k) = a^k (1 - a) for k < T and a^T for k = T (chi-square test)."""
    rows, length, accept = 50_000, 6, 0.7
    rng = np.random.default_rng(7)
    draft = torch.zeros(rows, length)
    scored = torch.full((rows, length), math.log(accept))  # exact: acceptance = ratio = 0.7
    uniforms = torch.from_numpy(rng.random((rows, length)))
    cuts = make("exact").cut(DraftBatch(draft, scored, torch.full((rows,), length), uniforms)).numpy()
    observed = np.bincount(cuts, minlength=length + 1)
    expected = np.array([accept**k * (1 - accept) for k in range(length)] + [accept**length]) * rows
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < 22.46  # 99.9% quantile of chi-square with 6 degrees of freedom


def test_random_cut_is_uniform():
    rows, length = 70_000, 6
    rng = np.random.default_rng(3)
    uniforms = torch.from_numpy(rng.random((rows, length)))
    zeros = torch.zeros(rows, length)
    cuts = make("random").cut(DraftBatch(zeros, None, torch.full((rows,), length), uniforms)).numpy()
    observed = np.bincount(cuts, minlength=length + 1)
    expected = rows / (length + 1)
    assert observed.shape == (length + 1,)
    assert float(((observed - expected) ** 2 / expected).sum()) < 22.46


def test_spec_without_scores_is_an_error():
    with pytest.raises(ValueError, match="scored logprobs"):
        make("spec").cut(batch([[0.0]], None, [1], [[0.5]]))


def test_anchored_judges_each_token_on_its_drift_since_decoding():
    """A token that fell 0.30 -> 0.20 -> 0.13 over two visits: spec at ℓ = e^0.5 sees 0.13/0.20 = 0.65 per visit and
    keeps it whatever the uniform; anchored sees the whole drift, 0.13/0.30, and accepts with ℓ x 0.433 = 0.71."""
    log = math.log
    drafts = DraftBatch(
        draft_logprobs=torch.tensor([[log(0.2), log(0.5)]] * 2, dtype=torch.float32),  # p_prev: refreshed last visit
        scored_logprobs=torch.tensor([[log(0.13), log(0.5)]] * 2, dtype=torch.float32),  # p_curr
        gen_logprobs=torch.tensor([[log(0.3), log(0.5)]] * 2, dtype=torch.float32),  # p_gen: two visits ago
        ages=torch.tensor([[2, 1]] * 2),
        lengths=torch.tensor([2, 2]),
        uniforms=torch.tensor([[0.70, 0.99], [0.72, 0.99]], dtype=torch.float64),
    )
    assert make("spec").cut(drafts).tolist() == [2, 2]
    assert make("anchored").cut(drafts).tolist() == [2, 0]  # accepted with 1.6487 x 0.13 / 0.3 = 0.714
    assert make("anchored", lenience=1.0).cut(drafts).tolist() == [0, 0]
    without_p_gen = DraftBatch(**{**drafts.__dict__, "gen_logprobs": None, "ages": None})
    assert make("anchored").cut(without_p_gen).tolist() == make("spec").cut(without_p_gen).tolist()


def test_lossless_params_are_validated():
    with pytest.raises(ValueError, match="draft must be one of"):
        make("lossless", draft="forest")
    with pytest.raises(ValueError, match="history must be one of 1, 2, got 3"):
        make("lossless", history=3)
    with pytest.raises(ValueError, match="history applies"):
        make("lossless", draft="own", history=2, verify="requests")
    with pytest.raises(ValueError, match="add verify='requests'"):
        make("lossless", draft="own")
    with pytest.raises(ValueError, match="verify must be one of"):
        make("lossless", verify="gpu")
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        make("lossless", num_speculative_tokens=0)
    with pytest.raises(ValueError, match="min_accept_prob"):
        make("lossless", min_accept_prob=1.0)
    assert (
        make("lossless").draft_choice == "tree" and make("lossless", draft="own", verify="requests").visits_kept == 1
    )
