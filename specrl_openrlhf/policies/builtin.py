"""The built-in reuse policies of the SPEC-RL paper and its ablations."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .base import DraftBatch, ReusePolicy, check_lenience, first_rejection, lenient_acceptance_logprob, lenient_cut
from .registry import register

DEFAULT_LENIENCE = math.exp(0.5)  # the paper's GRPO default


@dataclass(frozen=True, kw_only=True)
class LenienceParams:
    """lenience: the factor on p_curr / p_prev; 1 is exact speculative acceptance, larger reuses more."""

    lenience: float = DEFAULT_LENIENCE

    def __post_init__(self):
        check_lenience("lenience", self.lenience)


@register("off")
class Off(ReusePolicy):
    """No reuse: every sample is generated from scratch (stock OpenRLHF)."""

    needs_scores = False
    draft_age = 0

    def cut(self, batch: DraftBatch) -> torch.Tensor:
        return torch.zeros_like(batch.lengths)


@register("spec")
class Spec(ReusePolicy):
    """Lenient speculative acceptance: keep token i while u_i <= min(1, lenience * p_curr / p_prev)."""

    Params = LenienceParams
    prefix_decidable = True

    def cut(self, batch: DraftBatch) -> torch.Tensor:
        return lenient_cut(batch, self.params.lenience)


@register("exact")
class Exact(ReusePolicy):
    """Vanilla speculative acceptance (lenience 1): keep token i while u_i <= min(1, p_curr / p_prev)."""

    prefix_decidable = True

    @property
    def lenience(self) -> float:
        return 1.0

    def cut(self, batch: DraftBatch) -> torch.Tensor:
        return lenient_cut(batch, 1.0)


@register("random")
class RandomCut(ReusePolicy):
    """Random reuse: cut uniformly at random in [0, len], without scoring (the paper's ablation)."""

    needs_scores = False

    def cut(self, batch: DraftBatch) -> torch.Tensor:
        # floor(u * (len + 1)) is uniform on {0, ..., len}
        return torch.floor(batch.uniforms[:, 0] * (batch.lengths + 1).double()).long().clamp(max=batch.lengths)


@register("delayed")
class Delayed(Spec):
    """Delayed reuse: the spec rule on drafts from two visits back (the paper's ablation)."""

    draft_age = 2


@register("full")
class Full(ReusePolicy):
    """Full reuse (lenience = infinity): keep every draft token, without scoring."""

    needs_scores = False

    @property
    def lenience(self) -> float:
        return math.inf

    def cut(self, batch: DraftBatch) -> torch.Tensor:
        return batch.lengths.clone()


@dataclass(frozen=True, kw_only=True)
class LosslessParams:
    """top_k: how many of p_prev's and p_curr's likeliest tokens are kept per draft position to draw a rejected one
    from the residual; what lies beyond them bounds the bias left (`reuse/residual_tail_mass`)."""

    top_k: int = 20  # vLLM's default max_logprobs

    def __post_init__(self):
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or not 1 <= self.top_k <= 1024:
            raise ValueError(f"top_k must be an integer in [1, 1024], got {self.top_k!r}")


@register("lossless")
class Lossless(ReusePolicy):
    """Speculative sampling done exactly: keep token i while u_i <= min(1, p_curr / p_prev), redraw the first
    rejected position from norm(max(0, p_curr - p_prev)); every sample then follows the current policy."""

    Params = LosslessParams
    prefix_decidable = True

    @property
    def lenience(self) -> float:
        return 1.0

    @property
    def resample_top_k(self) -> int:
        return self.params.top_k

    def cut(self, batch: DraftBatch) -> torch.Tensor:
        return lenient_cut(batch, 1.0)  # the cuts of exact, from the same uniforms


@register("anchored")
class Anchored(ReusePolicy):
    """Lenience anchored at decoding time: keep token i while u_i <= min(1, lenience * p_curr / p_gen), with p_gen the
    token's probability when it was decoded, not p_prev, which every visit refreshes. A token decoded at the previous
    visit is judged as by `spec`; an older one on its whole drift since decoding, so lenience cannot compound over
    visits (docs/benchmarks.md: replay and training against the other candidates)."""

    Params = LenienceParams
    prefix_decidable = True

    def cut(self, batch: DraftBatch) -> torch.Tensor:
        # scored_logprobs (p_curr), gen_logprobs (p_gen), uniforms: [B, T]; without p_gen the draft is one visit old
        anchor = batch.draft_logprobs if batch.gen_logprobs is None else batch.gen_logprobs
        accept = lenient_acceptance_logprob(batch.scored_logprobs.double(), anchor.double(), self.params.lenience)
        return first_rejection(torch.log(batch.uniforms) <= accept, batch.lengths)
