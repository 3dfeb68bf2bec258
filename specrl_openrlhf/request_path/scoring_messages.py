"""What a scoring request asks of the engine and what its answer says, on the request path.

- *scoring request*: prompt + draft[:end] sent with `max_tokens=1, prompt_logprobs=0` (`ScoringRequest`); entry
  `P + i` of vLLM's prompt log-probs is log p_curr(draft[i]). The tokens asked to *follow* it are scored as the one
  token it generates (vLLM's `logprob_token_ids`).
- *answer*: what the engine returned, parsed at the integration edge into arrays (`ScoringAnswer`); positions the
  prefix cache served come back without log-probs (NaN here).

`scoring.DraftScorer` decides the requests and reads the answers. Core module: numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_NEXT_TOKEN_IDS = 128  # vLLM's cap on `logprob_token_ids`


@dataclass(frozen=True)
class ScoringRequest:
    """Score draft[start:end]: send prompt + draft[:end] with `max_tokens=1, prompt_logprobs=0`. With `read_cache`,
    the request may read vLLM's prefix cache: positions served from it come back without logprobs.
    `next_token_ids` are scored as the token that follows (vLLM's `logprob_token_ids` on the one generated token):
    draft[end], so that the next chunk can start after it, or every sample's first token in a visit's prompt probe."""

    token_ids: list[int]
    start: int
    end: int
    read_cache: bool
    next_token_ids: tuple[int, ...] = ()
    branch: int | None = None  # a tree's request: the draft is that response of the visit's `ScoredHistory`
    sample: int | None = None  # a visit's request for one of its samples: the draft is that sample's (its index)
    top_k: int = 0  # p_curr's top-k at each scored position, for rules that redraw rejected positions


@dataclass(frozen=True)
class ScoringAnswer:
    """The engine's answer to a `ScoringRequest`, as the integration edge parsed it."""

    logprobs: np.ndarray  # [end - start] float32, log p_curr of draft[start:end]; NaN where the cache served it
    follows: dict[int, float]  # log p_curr of the tokens asked to follow, by token id
    cached: int = 0  # prompt tokens the request read from the prefix cache (0 for one that may not)
    computed_from: int = 0  # the first draft position the engine computed (those before came from the cache)
    top: tuple[np.ndarray, np.ndarray] | None = None  # ([end - start, k] ids, logprobs) of p_curr's top-k, or None
