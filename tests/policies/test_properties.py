"""Properties of the built-in cut functions, over generated batches (hypothesis): a cut lies in [0, length], grows
with lenience, does not depend on how drafts are batched, padded or scored in chunks, and is defined for NaN and
infinite logprobs."""

import math

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import specrl_openrlhf as sr
from specrl_openrlhf.policies.base import checked_cuts

LOGPROB = st.one_of(
    st.floats(min_value=-30.0, max_value=0.0, allow_nan=False),
    st.sampled_from([math.nan, -math.inf, 0.0]),
)
RULES = ["spec", "exact", "full", "random", "delayed", "lossless", "residual", "anchored"]


@st.composite
def batches(draw, max_rows=6, max_width=12):
    """(draft logprobs, scored logprobs, lengths, uniforms) of a right-padded batch with garbage in the padding."""
    rows = draw(st.integers(1, max_rows))
    width = draw(st.integers(1, max_width))
    lengths = draw(st.lists(st.integers(0, width), min_size=rows, max_size=rows))
    cell = st.lists(LOGPROB, min_size=width, max_size=width)
    draft = np.array(draw(st.lists(cell, min_size=rows, max_size=rows)), np.float32)
    scored = np.array(draw(st.lists(cell, min_size=rows, max_size=rows)), np.float32)
    uniforms = np.array(
        draw(
            st.lists(st.lists(st.floats(0.0, 0.999999), min_size=width, max_size=width), min_size=rows, max_size=rows)
        )
    )
    return draft, scored, np.array(lengths, np.int64), uniforms


def cut(rule, draft, scored, lengths, uniforms, lenience=None):
    policy = sr.make(rule, **({} if lenience is None else {"lenience": lenience}))
    batch = sr.DraftBatch(
        draft_logprobs=torch.from_numpy(draft),
        scored_logprobs=torch.from_numpy(scored) if policy.needs_scores else None,
        lengths=torch.from_numpy(lengths),
        uniforms=torch.from_numpy(uniforms),
        gen_logprobs=torch.from_numpy(np.minimum(draft + 0.25, 0.0)),  # p_gen differs from p_prev (anchored reads it)
    )
    return checked_cuts(policy, batch, policy.cut(batch)).numpy()  # raises unless 0 <= cut <= length


@settings(max_examples=150, deadline=None)
@given(batches(), st.sampled_from(RULES))
def test_cuts_lie_within_the_draft_for_any_logprobs(batch, rule):
    cuts = cut(rule, *batch)
    assert cuts.shape == batch[2].shape and ((0 <= cuts) & (cuts <= batch[2])).all()


@settings(max_examples=150, deadline=None)
@given(batches(), st.floats(1.0, 8.0), st.floats(1.0, 8.0))
def test_cuts_grow_with_lenience(batch, a, b):
    low, high = sorted((a, b))
    assert (cut("spec", *batch, lenience=low) <= cut("spec", *batch, lenience=high)).all()
    assert (cut("exact", *batch) <= cut("spec", *batch, lenience=low)).all()
    assert (cut("anchored", *batch, lenience=low) <= cut("anchored", *batch, lenience=high)).all()


@settings(max_examples=100, deadline=None)
@given(batches(), st.sampled_from(RULES), st.integers(0, 5))
def test_cuts_do_not_depend_on_batching_or_padding(batch, rule, extra):
    draft, scored, lengths, uniforms = batch
    together = cut(rule, draft, scored, lengths, uniforms)
    for row in range(len(lengths)):  # each row alone, with more padding of garbage
        pad = ((0, 0), (0, extra))
        alone = cut(
            rule,
            np.pad(draft[row : row + 1], pad, constant_values=-7.0),
            np.pad(scored[row : row + 1], pad, constant_values=math.nan),
            lengths[row : row + 1],
            np.pad(uniforms[row : row + 1], pad, constant_values=0.99),
        )
        assert alone[0] == together[row]


@settings(max_examples=100, deadline=None)
@given(
    batches(), st.sampled_from(["spec", "exact", "delayed", "lossless", "residual", "anchored"]), st.integers(0, 12)
)
def test_rules_judged_at_the_first_rejection_cut_a_chunk_as_the_whole_draft(batch, rule, chunk):
    """What chunked scoring relies on: the cut of a draft's first k tokens is the draft's cut when that is below k,
    and k itself when the draft's cut reaches k."""
    draft, scored, lengths, uniforms = batch
    whole = cut(rule, draft, scored, lengths, uniforms)
    prefix = cut(rule, draft, scored, np.minimum(lengths, chunk), uniforms)
    assert (prefix == np.minimum(whole, chunk)).all()


def test_nan_and_infinite_logprobs_have_a_defined_cut():
    draft = np.log(np.full((4, 3), 0.5, np.float32))
    scored = draft.copy()
    scored[0, 1], scored[1, 0], scored[2, 2] = math.nan, -math.inf, math.inf
    draft[3, 0] = -math.inf  # a draft token its policy gave probability 0
    uniforms = np.full((4, 3), 0.5)
    lengths = np.full(4, 3)
    assert cut("exact", draft, scored, lengths, uniforms).tolist() == [1, 0, 3, 3]  # NaN or -inf p_curr: rejected
