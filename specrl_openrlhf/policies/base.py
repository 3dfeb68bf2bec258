"""The reuse-policy interface: given a batch of drafts, decide how many leading tokens of each to keep.

A policy is a strategy object built from a frozen, keyword-only parameter dataclass. It never touches an
engine: the rollout hands it padded tensors (and the uniforms it may use) and gets back one cut per draft.
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np
import torch

from ..params import check_lenience  # noqa: F401  (re-exported)
from ..references import short_name


@dataclass(frozen=True, kw_only=True)
class NoParams:
    """Parameters of a policy that takes none."""


@dataclass(frozen=True, kw_only=True)
class EngineTarget:
    """The vLLM engine that verifies a rule's drafts, as `ReusePolicy.engine_arguments` takes it: the installed vLLM
    chooses it (`integration.vllm.versions`); a rule reads it and imports no engine."""

    runner: Literal["v1", "v2"] = "v1"
    """"v1": vLLM <= 0.33's V1 model runner (proposers it calls between steps; ours through `custom_class`); "v2":
    vLLM >= 0.34's model runner V2 (speculators on the device; ours registered by name)."""

    adaptive_verification: bool = False
    """V2 only: vLLM sizes each row's verified draft from the speculator's confidences (it needs full CUDA graphs);
    off, every row verifies its k draft tokens."""

    def __post_init__(self):
        if self.runner not in ("v1", "v2"):
            raise ValueError(f"runner must be 'v1' or 'v2', got {self.runner!r}")
        if self.adaptive_verification and self.runner != "v2":
            raise ValueError("adaptive verification is the V2 runner's (vLLM >= 0.34): runner='v2'")


V1_ENGINE = EngineTarget()  # what the simulator prices, and what a caller that names no engine gets


@dataclass(frozen=True)
class DraftBatch:
    """A batch of drafts, right-padded to the longest one.

    Padding positions hold 0.0 logprobs (age 0) and must be ignored; `mask` marks the real tokens. The rollout and
    replay always fill `gen_logprobs` and `ages`; a hand-built batch may leave them out.
    """

    draft_logprobs: torch.Tensor  # [B, T] float32, log p_prev(y_i): under the policy that drafted or last kept y_i
    scored_logprobs: torch.Tensor | None  # [B, T] float32, log p_curr(y_i); None if the policy skips scoring; in
    # `feedback` batches (whole drafts), NaN past where the rule decided
    lengths: torch.Tensor  # [B] int64, real draft length of each row (0 <= lengths <= T)
    uniforms: torch.Tensor  # [B, T] float64 in [0, 1), fresh and seeded per row; the only randomness a policy uses
    gen_logprobs: torch.Tensor | None = None  # [B, T] float32, log p_gen(y_i): when y_i was decoded
    ages: torch.Tensor | None = None  # [B, T] int64, visits since y_i was decoded, counting this one (>= 1)

    @property
    def mask(self) -> torch.Tensor:  # [B, T] bool
        positions = torch.arange(self.draft_logprobs.shape[1], device=self.lengths.device)
        return positions[None, :] < self.lengths[:, None]


class ReusePolicy(ABC):
    """Decides the cut of each draft: the verified prefix is draft[:cut], the current policy generates the rest.

    Subclasses set the class attributes below, define `Params` (a frozen keyword-only dataclass, a docstring under
    each field, that validates itself in ``__post_init__`` with `specrl_openrlhf.params.check_fields`) and implement
    `cut`. Register them with `specrl_openrlhf.register`.
    """

    name: ClassVar[str] = ""
    Params: ClassVar[type] = NoParams
    # Whether `cut` reads `DraftBatch.scored_logprobs`; if not, the rollout skips the scoring pass and its cost.
    needs_scores: ClassVar[bool] = True
    # Which past visit of the prompt the drafts come from: 1 = the previous one, 2 = two visits back,
    # 0 = no drafts at all (the rollout then behaves exactly like stock generation).
    draft_age: ClassVar[int] = 1

    # Whether the cut of a draft's first k tokens never depends on the tokens after them (true of every rule that
    # stops at the first rejection). Such a rule lets the rollout score a draft in chunks and stop scoring at the
    # first rejection; any other rule gets every draft scored in full.
    prefix_decidable: ClassVar[bool] = False
    # Rules that adapt across batches set this and override `feedback`, `update`, `state_dict` and
    # `load_state_dict` (worked example: policies/adaptive_lenience.py). Every engine reports `feedback` for the
    # batches it cut; one coordinator adds the reports of all engines, calls `update` once per `--reuse.update_every`
    # samples and hands the new `state_dict()` back to every engine.
    keeps_state: ClassVar[bool] = False

    # Whether the first rejected position is drawn from p_curr with the rejected draft token removed (renormalised)
    # instead of from p_curr. With acceptance probability p_curr(y_i) this makes the draft a fixed proposal: each
    # position then follows p_curr whatever produced the draft (`lossless`). The rollout bans the token at the
    # continuation's first step (docs/design.md, "The exact resample").
    excludes_rejected_token: ClassVar[bool] = False
    # Whether every sample follows the current policy whatever produced its draft, also when the policy was trained on
    # it (as in RL). A claim a test must back: tests/policies/test_lossless.py. The quickstart's advice reads it.
    exact_in_rl: ClassVar[bool] = False

    @property
    def verifies_in_engine(self) -> bool:
        """Whether vLLM verifies drafts itself, at every decoding step: `lossless` with `verify="engine"` (our
        proposer drafts from the prompt's history) and `vllm` (vLLM's own proposer). The engine then needs
        `speculative_config` (`engine_arguments`) and the rollout sends no scoring requests."""
        return False

    def engine_arguments(self, engine: EngineTarget = V1_ENGINE) -> dict:
        """What an engine of kind `engine` needs beyond its caller's arguments for this rule
        (`integration.vllm.engine_args`, which names the installed vLLM's)."""
        return {}

    @property
    def draft_choice(self) -> str:
        """What a sample proposes from: "own" (its own previous response, as in SPEC-RL), "majority" (the majority
        path through the prompt's previous responses) or "tree" (their prefix tree, walked; `lossless` only)."""
        return "own"

    @property
    def draft_history(self) -> int:
        """How many of the prompt's visits, from `draft_age` back, the proposal draws on (the cache keeps them)."""
        return 1

    @property
    def visits_kept(self) -> int:
        """Completed visits per prompt the draft cache must keep for this rule."""
        return max(self.draft_age + self.draft_history - 1, 1)

    @property
    def resample_top_k(self) -> int:
        """How many of p_curr's and p_prev's likeliest tokens the rule needs at each draft position to sample a
        rejected position from the residual norm(max(0, p_curr - p_prev)) (`residual`); 0: a rejected position is
        decoded from p_curr, as in SPEC-RL."""
        return 0

    def __init__(self, params=None):
        params = self.Params() if params is None else params
        if not isinstance(params, self.Params):
            raise TypeError(f"{type(self).__name__} takes {self.Params.__name__}, got {type(params).__name__}")
        self.params = params

    @abstractmethod
    def cut(self, batch: DraftBatch) -> torch.Tensor:
        """Return the number of leading draft tokens to keep, [B] int64 with 0 <= cut <= lengths."""

    @property
    def lenience(self) -> float | None:
        """The lenience the rule applies now (reported as `reuse/lenience`), or None if it has none."""
        value = getattr(self.params, "lenience", None)
        return None if value is None else float(value)

    def feedback(self, batch: DraftBatch, cuts: torch.Tensor) -> dict[str, float]:
        """Statistics of one cut batch that `update` needs. Values must be sums (counts, totals): reports from
        several batches and engines combine by adding them."""
        return {}

    def update(self, feedback: dict[str, float]) -> None:
        """Adapt the rule's state to the summed feedback of the samples since the last update."""
        return None

    def state_dict(self) -> dict[str, float]:
        """The rule's state, JSON-serialisable (it travels to every engine and into checkpoints)."""
        return {}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Take over a state produced by `state_dict` (of the coordinator's copy of the rule)."""
        return None

    def describe(self) -> str:
        shown = [f for f in dataclasses.fields(self.params) if f.repr]
        fields = ", ".join(f"{f.name}={getattr(self.params, f.name)!r}" for f in shown)
        return f"{short_name(self.name) or type(self).__name__}({fields})"

    def __repr__(self) -> str:
        return f"<ReusePolicy {self.describe()}>"


def first_rejection(accepted: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Index of the first rejected real token of each row, or the row length if every token was accepted.

    accepted: [B, T] bool; positions at or past `lengths` are ignored.
    """
    positions = torch.arange(accepted.shape[1], device=accepted.device)
    rejected = ~accepted & (positions[None, :] < lengths[:, None])  # [B, T]
    any_rejected = rejected.any(dim=1)  # [B]
    first = rejected.to(torch.int8).argmax(dim=1)  # [B]; argmax returns the first maximum
    return torch.where(any_rejected, first, lengths)


def lenient_acceptance_logprob(scored: torch.Tensor, draft: torch.Tensor, lenience: float) -> torch.Tensor:
    """log min(1, lenience * p_curr / p_prev), elementwise, computed in log space. [B, T] -> [B, T]."""
    if math.isinf(lenience):
        return torch.zeros_like(scored)
    return torch.clamp(math.log(lenience) + scored - draft, max=0.0)


def lenient_cut(batch: DraftBatch, lenience: float) -> torch.Tensor:
    """Algorithm 1 of SPEC-RL, vectorised: accept token i when u_i <= min(1, lenience * p_curr / p_prev)."""
    if batch.scored_logprobs is None:
        raise ValueError("lenient acceptance needs scored logprobs; set needs_scores = True on the policy")
    accept_logprob = lenient_acceptance_logprob(
        batch.scored_logprobs.double(), batch.draft_logprobs.double(), lenience
    )
    accepted = torch.log(batch.uniforms) <= accept_logprob  # [B, T]; log(0) = -inf is always accepted
    return first_rejection(accepted, batch.lengths)


def checked_cuts(policy: ReusePolicy, batch: DraftBatch, cuts) -> torch.Tensor:
    """A rule's cuts, [B] int64, once they are known to keep its contract: one integer per draft, 0 <= cut <= length.
    Anything else is the rule's bug, raised with its name: the rollout then generates the batch normally."""
    name = policy.describe()
    if not isinstance(cuts, torch.Tensor) or cuts.shape != batch.lengths.shape:
        shape = tuple(cuts.shape) if isinstance(cuts, torch.Tensor) else type(cuts).__name__
        raise ValueError(f"rule {name} returned cuts of shape {shape}, want [B] = {tuple(batch.lengths.shape)}")
    if cuts.is_floating_point():
        if not torch.isfinite(cuts).all() or (cuts != torch.round(cuts)).any():
            raise ValueError(f"rule {name} returned cuts that are not whole numbers (NaN, inf or fractions)")
    cuts = cuts.long()
    if (cuts < 0).any() or (cuts > batch.lengths).any():
        raise ValueError(f"rule {name} returned cuts outside [0, draft length]")
    return cuts


def draft_batch(lengths, *, draft_logprobs, gen_logprobs, ages, uniforms, scored_logprobs=None) -> DraftBatch:
    """Right-padded tensors of rows given as 1-D arrays (each at least as long as its row's length): the one way the
    rollout and replay build what a rule sees. Padding is 0; p_curr stays NaN where a row was not scored (only a
    stateful rule's `feedback` sees such rows: whole drafts, scored up to where the rule decided)."""
    lengths = np.asarray(lengths, np.int64)  # [B]
    rows, width = len(lengths), int(lengths.max()) if len(lengths) else 0

    def padded(arrays, dtype):  # [B, T]
        out = np.zeros((rows, width), dtype=dtype)
        for row, (array, length) in enumerate(zip(arrays, lengths.tolist())):
            out[row, :length] = array[:length]
        return torch.from_numpy(out)

    return DraftBatch(
        draft_logprobs=padded(draft_logprobs, np.float32),
        scored_logprobs=None if scored_logprobs is None else padded(scored_logprobs, np.float32),
        lengths=torch.from_numpy(lengths),
        uniforms=padded(uniforms, np.float64),
        gen_logprobs=padded(gen_logprobs, np.float32),
        ages=padded(ages, np.int64),
    )
