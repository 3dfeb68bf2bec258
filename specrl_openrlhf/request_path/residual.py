"""Residual resampling, the step that makes speculative sampling exact.

A draft token y drawn from p_prev is kept with probability min(1, p_curr(y) / p_prev(y)); if it is rejected, the
position is drawn from the residual norm(max(0, p_curr - p_prev)). Kept or redrawn, the token then follows p_curr
exactly (Leviathan et al. 2023; Chen et al. 2023). SPEC-RL instead lets the current policy decode the rejected
position from p_curr, which over-weights the tokens p_prev favoured; and lenience > 1 keeps more of them still.

The rule `lossless` needs both distributions at the rejected position. Drafts keep the top-k of p_prev at every
token (from decoding, or from scoring when the token was kept), and scoring returns the top-k of p_curr. Mass beyond
the top-k is not seen: the residual is taken on the tokens p_curr's top-k names, with p_prev(x) = 0 where p_prev's
top-k does not name x. The mass left out of either top-k bounds the bias this leaves (`reuse/residual_tail_mass`);
with k at least the vocabulary it is exact.

>>> import numpy as np
>>> ids, probs, tail, empty = residual([1, 2], np.log([0.75, 0.25]), [1, 2], np.log([0.25, 0.75]))
>>> ids.tolist(), probs.round(3).tolist(), round(tail, 6), empty
([1, 2], [1.0, 0.0], 0.0, False)
"""

from __future__ import annotations

import numpy as np

from ..seeds import uniforms_for

RESIDUAL_STREAM = 1  # entropy suffix of the uniform that draws a rejected position from the residual


def residual(curr_ids, curr_logprobs, prev_ids, prev_logprobs) -> tuple[np.ndarray, np.ndarray, float, bool]:
    """(tokens, normalised residual probabilities over them, mass the two top-k lists left out, whether the residual
    was empty). Tokens are p_curr's top-k; an empty residual (p_curr nowhere above p_prev where both are seen, which
    only truncation allows) falls back to p_curr's top-k, normalised."""
    curr_ids = np.asarray(curr_ids, np.int64)
    curr_p = np.exp(np.asarray(curr_logprobs, np.float64))  # [k]
    prev = dict(zip(np.asarray(prev_ids, np.int64).tolist(), np.exp(np.asarray(prev_logprobs, np.float64)).tolist()))
    valid = curr_ids >= 0
    curr_ids, curr_p = curr_ids[valid], curr_p[valid]
    prev_p = np.array([prev.get(int(t), 0.0) for t in curr_ids])
    tail = max(0.0, 1.0 - float(curr_p.sum())) + max(0.0, 1.0 - sum(p for t, p in prev.items() if t >= 0))
    weights = np.maximum(curr_p - prev_p, 0.0)
    empty = not weights.sum() > 0.0
    if empty:
        weights = curr_p
    return curr_ids, weights / weights.sum(), tail, empty


def draw(tokens: np.ndarray, probs: np.ndarray, u: float) -> int:
    """The token at which the cumulative probability passes u (inverse-CDF sampling with one uniform)."""
    index = int(np.searchsorted(np.cumsum(probs), u, side="right"))
    return int(tokens[min(index, len(tokens) - 1)])


def redraw(sample) -> None:
    """Redraw a cut sample's (`sample.Sample`) rejected position from the residual norm(max(0, p_curr - p_prev)). A
    draft without p_prev's top-k (written by another rule, or restored from an older cache) leaves the position to
    the engine, as in SPEC-RL, and is counted."""
    position = sample.cut
    if sample.draft.top_ids is None or sample.scored_top is None or (sample.scored_top[0][position] < 0).all():
        sample.stats.resample_unavailable += 1
        return
    tokens, probs, tail, empty = residual(
        sample.scored_top[0][position],
        sample.scored_top[1][position],
        sample.draft.top_ids[position],
        sample.draft.top_logprobs[position],
    )
    u = float(uniforms_for((*sample.entropy, RESIDUAL_STREAM), 1)[0])
    token = draw(tokens, probs, u)
    row = sample.scored_top
    logprob = float(row[1][position][list(row[0][position]).index(token)])
    sample.resampled = (token, logprob)
    sample.stats.resampled_tokens += 1
    sample.stats.residual_tail_sum += tail
    sample.stats.residual_fallbacks += int(empty)
