"""The staleness meter: how far the drafts a run reuses have drifted from the policy it trains.

Every scored draft token y gives r = p_curr(y) / p_prev(y), and, with the token's probability when it was decoded,
the drift since decoding p_curr(y) / p_gen(y). The meter sums, over a sample's scored tokens:

- an estimate of KL(p_prev || p_curr): (r - 1) - log r, the non-negative "k3" estimator, unbiased for tokens drawn
  from p_prev (a token reused at the previous visit was drawn earlier, so for it the estimate is a proxy);
- the exact acceptance min(1, r), whose complement is the rejection rate of lossless speculative decoding;
- the rule's acceptance min(1, l * r); the difference to the exact one is the *excess acceptance*, the share of
  draft tokens kept only because of lenience;
- log(p_curr / p_gen), the cumulative drift since the token was decoded, which lenience lets compound;

and, over the tokens the sample kept, their age: the visits since each was decoded (1 for a token decoded at the
previous visit). The planner stores the sums in `ReuseStats`; `metrics.ReuseStats.as_dict` turns them into
`reuse/` metrics.

>>> import numpy as np
>>> sums = scored_token_sums(np.log([0.5, 0.5]), np.log([0.25, 0.5]), np.log([0.5, 1.0]), lenience=1.5)
>>> round(sums["exact_acceptance_sum"], 3), round(sums["acceptance_sum"], 3)
(1.5, 1.75)
"""

from __future__ import annotations

import math

import numpy as np

OLD_AGE = 2  # `reuse/reused_older_than_2`: tokens decoded more than two visits ago


def scored_token_sums(draft_logprobs, scored_logprobs, gen_logprobs, lenience: float | None) -> dict[str, float]:
    """Sums over scored draft tokens, [n] arrays each: log p_prev, log p_curr, log p_gen. `lenience` None or 1
    means exact acceptance, inf full reuse."""
    log_ratio = np.asarray(scored_logprobs, np.float64) - np.asarray(draft_logprobs, np.float64)  # [n]
    ratio = np.exp(np.minimum(log_ratio, 700.0))
    lenience = 1.0 if lenience is None else float(lenience)
    lenient = np.ones_like(ratio) if math.isinf(lenience) else np.minimum(1.0, lenience * ratio)
    return {
        "log_ratio_sum": float(log_ratio.sum()),
        "kl_sum": float(np.sum(np.expm1(log_ratio) - log_ratio)),
        "exact_acceptance_sum": float(np.minimum(1.0, ratio).sum()),
        "acceptance_sum": float(lenient.sum()),
        "drift_sum": float(np.sum(np.asarray(scored_logprobs, np.float64) - np.asarray(gen_logprobs, np.float64))),
    }


def reused_token_sums(ages_now) -> dict[str, float]:
    """Sums over the tokens a sample kept: `ages_now` [k], visits since each was decoded (>= 1)."""
    ages = np.asarray(ages_now, np.int64)
    return {"reused_age_sum": float(ages.sum()), "reused_old_tokens": float((ages > OLD_AGE).sum())}
