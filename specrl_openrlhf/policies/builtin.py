"""The built-in reuse policies of the SPEC-RL paper and its ablations."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..lenience import DEFAULT_LENIENCE
from ..pricing.prices import load_price
from .base import DraftBatch, ReusePolicy, check_lenience, first_rejection, lenient_acceptance_logprob, lenient_cut
from .registry import register


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
    exact_in_rl = True  # stock generation

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


HISTORY_PROPOSER = "specrl_openrlhf.integration.vllm.proposer.HistoryProposer"  # vLLM imports it by this name
DRAFT_CHOICES = ("own", "majority", "tree")
VERIFY_CHOICES = ("engine", "requests")
BUDGET_CHOICES = ("goodput", "static")


@dataclass(frozen=True, kw_only=True)
class LosslessParams:
    """verify: where drafts are verified. "engine" (the default): inside vLLM, at every decoding step
    (`integration.vllm.proposer`): the engine proposes from the tree of the prompt's previous responses (and of its
    finished siblings) while the sample stays in it, and after a rejection from the longest suffix match of at least
    `min_match` tokens, up to `num_speculative_tokens` tokens at a time. budget: which of those tokens a step carries.
    "goodput" (the default): the slots whose expected accepted tokens pay for what they add to the step, by the step
    cost the engine measures and the acceptance it learns (`specrl_openrlhf.budget`); zero is a valid answer.
    "static": all of them while the chance that the draft is accepted so far, by the history's own log-probs, stays at
    least `min_accept_prob`. "requests": on our request path, once per visit up to the first rejection (scoring
    requests, then a continuation), with `draft` as the proposal: "own" (the sample's own previous response, SPEC-RL's
    draft), "majority" (the majority path through the prompt's previous responses) or "tree" (their tree, walked by
    sampling p_curr at each node, `specrl_openrlhf.proposal.walk`). history: how many of the prompt's last visits the
    proposal draws on (1 or 2; not "own"). Acceptance follows p_curr, so the likelier proposal keeps more; every choice
    is exact. cost_curve: a GPU's step curve, the path of a JSON file of `scripts/bench_gpu_step.py` (read once, here,
    where the run starts: the rule then holds the curve's data, which travels to the engines with its parameters) or
    that data: the goodput budget then prices slots on it at `cost_scale` times the rows a step serves instead of on
    this machine's measured step cost, so the drafts are those that GPU would choose (acceptance does not depend on
    the hardware); the drafting check, which measures this machine's steps, is off then. shared: in the engine, where
    the prompt's own history holds no suffix of the sample (or the prompt has none yet), re-enter in the engine's other
    prompts' recent responses, one tree of them all (as vLLM's suffix decoding does with its global tree). lookup: and
    in the sample's own tokens, its prompt and response so far (prompt lookup, as vLLM's n-gram proposer): the longer
    match of the two. history_mb: the memory an engine's histories may take (MiB); past it the histories of the
    prompts that left the engine go first."""

    draft: str = "tree"
    history: int = 1
    verify: str = "engine"
    num_speculative_tokens: int = 16
    min_match: int = 4
    min_accept_prob: float = 0.1
    budget: str = "goodput"
    cost_curve: str | dict | None = field(default=None, repr=False)  # the data: `describe` leaves it out
    cost_scale: int = 1
    shared: bool = True
    lookup: bool = True
    history_mb: int = 1024

    def __post_init__(self):
        if self.draft not in DRAFT_CHOICES:
            raise ValueError(f"draft must be one of {DRAFT_CHOICES}, got {self.draft!r}; 'own' is SPEC-RL's draft")
        if isinstance(self.history, bool) or self.history not in (1, 2):
            raise ValueError(
                f"history must be 1 or 2 (visits of the prompt the proposal draws on), got {self.history!r}"
            )
        if self.draft == "own" and self.history != 1:
            raise ValueError('history applies to draft "majority" and "tree"; "own" is the one previous response')
        if self.verify not in VERIFY_CHOICES:
            raise ValueError(f"verify must be one of {VERIFY_CHOICES}, got {self.verify!r}")
        if self.verify == "engine" and self.draft != "tree":
            raise ValueError(
                f"draft={self.draft!r} is proposed once per visit on the request path: add verify='requests' "
                "(the engine proposes from the tree of the prompt's responses at every step)"
            )
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 64:
            raise ValueError(f"num_speculative_tokens must be an integer in [1, 64], got {k!r}")
        m = self.min_match
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"min_match must be a positive integer (tokens a re-entry matches on), got {m!r}")
        if self.budget not in BUDGET_CHOICES:
            raise ValueError(f"budget must be one of {BUDGET_CHOICES}, got {self.budget!r}")
        if isinstance(self.min_accept_prob, bool) or not 0.0 <= self.min_accept_prob < 1.0:
            raise ValueError(f"min_accept_prob must be in [0, 1), got {self.min_accept_prob!r}")
        if self.cost_curve is not None:  # a path is read once, here: its data, not the path, reaches the engines
            try:
                curve = load_price(self.cost_curve)
            except ValueError as error:
                raise ValueError(f"cost_curve: {error}") from None
            object.__setattr__(self, "cost_curve", curve.as_data())
        for name in ("shared", "lookup"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        mb = self.history_mb
        if isinstance(mb, bool) or not isinstance(mb, int) or mb < 1:
            raise ValueError(f"history_mb must be a positive integer (MiB an engine's histories may take), got {mb!r}")
        if isinstance(self.cost_scale, bool) or not isinstance(self.cost_scale, int) or self.cost_scale < 1:
            raise ValueError(f"cost_scale must be an integer >= 1 (rows each row stands for), got {self.cost_scale!r}")


@register("lossless")
class Lossless(ReusePolicy):
    """The proposal as a fixed one: keep token i while u_i <= p_curr(y_i); the first rejected position is drawn from
    p_curr without y_i (renormalised). Each output position then follows p_curr exactly, however the proposal was
    produced: also in RL, where it is what the policy was just trained on. Needs no p_prev. With `draft="tree"` (the
    default) the proposal is the tree of the prompt's previous responses, walked the same way with every child of a
    node as a candidate (`specrl_openrlhf.proposal.walk`); `cut` is the rule on one path (`draft="own"` or "majority").

    >>> import torch
    >>> p_curr, u = torch.tensor([[0.9, 0.5, 0.9]]), torch.tensor([[0.5, 0.6, 0.1]], dtype=torch.float64)
    >>> batch = DraftBatch(torch.zeros(1, 3), torch.log(p_curr), torch.tensor([3]), u)
    >>> Lossless().cut(batch).tolist()
    [1]
    """

    Params = LosslessParams
    prefix_decidable = True
    excludes_rejected_token = True
    exact_in_rl = True

    @property
    def verifies_in_engine(self) -> bool:
        return self.params.verify == "engine"

    def engine_arguments(self) -> dict:
        """Our proposer, drafting up to `num_speculative_tokens` a step, and per-request acceptance counts (each
        verification step's drafted and accepted tokens) on every finished output; a visit's samples are served in
        slot order (where the engine has more samples than slots, later ones start after earlier ones finished, and
        draft from them too: `rollout.engine_path`)."""
        if not self.verifies_in_engine:
            return {}
        k = self.params.num_speculative_tokens
        return {
            "speculative_config": {"method": "custom_class", "model": HISTORY_PROPOSER, "num_speculative_tokens": k},
            "per_request_spec_decode_metrics": "detailed",
            "scheduling_policy": "priority",
        }

    @property
    def draft_choice(self) -> str:
        return self.params.draft

    @property
    def draft_history(self) -> int:
        return self.params.history

    @property
    def lenience(self) -> float | None:
        return None  # no ratio to p_prev

    def cut(self, batch: DraftBatch) -> torch.Tensor:
        if batch.scored_logprobs is None:
            raise ValueError("lossless needs scored logprobs; set needs_scores = True on the policy")
        accepted = torch.log(batch.uniforms) <= batch.scored_logprobs.double()  # [B, T]; u_i <= p_curr(y_i)
        return first_rejection(accepted, batch.lengths)


@dataclass(frozen=True, kw_only=True)
class ResidualParams:
    """top_k: how many of p_prev's and p_curr's likeliest tokens are kept per draft position to draw a rejected one
    from the residual; what lies beyond them bounds the bias left (`reuse/residual_tail_mass`)."""

    top_k: int = 20  # vLLM's default max_logprobs

    def __post_init__(self):
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or not 1 <= self.top_k <= 1024:
            raise ValueError(f"top_k must be an integer in [1, 1024], got {self.top_k!r}")


@register("residual")
class Residual(ReusePolicy):
    """Speculative sampling against p_prev: keep token i while u_i <= min(1, p_curr / p_prev), redraw the first
    rejected position from norm(max(0, p_curr - p_prev)). Exact only for drafts drawn independently of the update
    that made p_curr; in RL the policy was trained on the draft, and the output leans towards it (use `lossless`)."""

    Params = ResidualParams
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
