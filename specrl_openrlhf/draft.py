"""A draft: one stored response of a prompt, with what each of its tokens needs on its next visit.

Core module: numpy only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

FINISH_REASONS = ("stop", "length", "abort")
AGE_LIMIT = np.iinfo(np.uint16).max  # ages saturate here
DRAFT_OVERHEAD_BYTES = 192  # the Draft object and its array headers


@dataclass(frozen=True, eq=False)
class Draft:
    """One cached response. `visit` is the per-prompt number of the visit that produced it, `index` its position
    among that visit's responses.

    Besides each token's logprob under the policy that last produced or verified it (p_prev for the next visit), a
    draft keeps what the staleness meter and the anchored rules need: the token's logprob when it was decoded
    (p_gen) and its age, and, for rules that resample rejected positions (`lossless`), the top-k distribution at
    each position.
    """

    token_ids: np.ndarray  # [L] int32
    logprobs: np.ndarray  # [L] float32, log p_prev: under the policy that sampled or last verified the token
    finish_reason: str
    visit: int = 0
    index: int = 0
    gen_logprobs: np.ndarray | None = None  # [L] float32, log p_gen: when the token was decoded (default: logprobs)
    ages: np.ndarray | None = None  # [L] uint16, visits since decoded, as of the visit that stored it (default: 0)
    top_ids: np.ndarray | None = None  # [L, k] int32, the k likeliest tokens at each position under p_prev
    top_logprobs: np.ndarray | None = None  # [L, k] float32, their logprobs (-inf pads rows with fewer than k)

    def __post_init__(self):
        tokens = np.ascontiguousarray(self.token_ids, dtype=np.int32)
        object.__setattr__(self, "token_ids", tokens)
        object.__setattr__(self, "logprobs", np.ascontiguousarray(self.logprobs, dtype=np.float32))
        gen = self.logprobs if self.gen_logprobs is None else self.gen_logprobs
        object.__setattr__(self, "gen_logprobs", np.ascontiguousarray(gen, dtype=np.float32))
        ages = np.zeros(len(tokens), np.uint16) if self.ages is None else np.minimum(self.ages, AGE_LIMIT)
        object.__setattr__(self, "ages", np.ascontiguousarray(ages, dtype=np.uint16))
        if tokens.ndim != 1 or not (tokens.shape == self.logprobs.shape == self.gen_logprobs.shape == self.ages.shape):
            raise ValueError(
                f"draft arrays differ in shape: token_ids {tokens.shape}, logprobs {self.logprobs.shape}, "
                f"gen_logprobs {self.gen_logprobs.shape}, ages {self.ages.shape}"
            )
        if (self.top_ids is None) != (self.top_logprobs is None):
            raise ValueError("a draft's top_ids and top_logprobs come together")
        if self.top_ids is not None:
            object.__setattr__(self, "top_ids", np.ascontiguousarray(self.top_ids, dtype=np.int32))
            object.__setattr__(self, "top_logprobs", np.ascontiguousarray(self.top_logprobs, dtype=np.float32))
            if (
                self.top_ids.ndim != 2
                or self.top_ids.shape != self.top_logprobs.shape
                or len(self.top_ids) != len(tokens)
            ):
                raise ValueError(
                    f"draft top-k arrays {self.top_ids.shape} and {self.top_logprobs.shape} must be [L, k]"
                )
        if self.finish_reason not in FINISH_REASONS:
            object.__setattr__(self, "finish_reason", "abort")

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def top_k(self) -> int:
        return 0 if self.top_ids is None else self.top_ids.shape[1]

    @property
    def nbytes(self) -> int:
        per_token = self.token_ids.nbytes + self.logprobs.nbytes + self.gen_logprobs.nbytes + self.ages.nbytes
        top = 0 if self.top_ids is None else self.top_ids.nbytes + self.top_logprobs.nbytes
        return per_token + top + DRAFT_OVERHEAD_BYTES

    def head(self, length: int) -> Draft:
        """The first `length` tokens, every per-token array cut alike."""
        top = (None, None) if self.top_ids is None else (self.top_ids[:length], self.top_logprobs[:length])
        return Draft(
            self.token_ids[:length],
            self.logprobs[:length],
            self.finish_reason,
            self.visit,
            self.index,
            gen_logprobs=self.gen_logprobs[:length],
            ages=self.ages[:length],
            top_ids=top[0],
            top_logprobs=top[1],
        )

    def copy(self) -> Draft:
        """A copy that owns its arrays (a draft received from Ray may view a read-only shared buffer)."""
        copies = {f: None if getattr(self, f) is None else getattr(self, f).copy() for f in _ARRAY_FIELDS}
        return dataclasses.replace(self, **copies)

    def numbered(self, visit: int, index: int) -> Draft:
        return dataclasses.replace(self, visit=visit, index=index)


_ARRAY_FIELDS = ("token_ids", "logprobs", "gen_logprobs", "ages", "top_ids", "top_logprobs")
