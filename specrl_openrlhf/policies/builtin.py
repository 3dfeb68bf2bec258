"""The built-in reuse policies of the SPEC-RL paper and its ablations."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch

from ..params import DEFAULT_LENIENCE, check_fields, limits
from ..pricing.prices import load_price
from .base import (
    V1_ENGINE,
    DraftBatch,
    EngineTarget,
    ReusePolicy,
    check_lenience,
    first_rejection,
    lenient_acceptance_logprob,
    lenient_cut,
)
from .registry import register


@dataclass(frozen=True, kw_only=True)
class LenienceParams:
    """The parameter of a lenient rule (`spec`, `delayed`, `anchored`)."""

    lenience: float = DEFAULT_LENIENCE
    """The factor on p_curr / p_prev: 1 is exact speculative acceptance, larger reuses more."""

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


HISTORY_PROPOSER = "specrl_openrlhf.integration.vllm.v1.proposer.HistoryProposer"  # vLLM <= 0.33 imports it so
# vLLM >= 0.34: our speculator's method name in vLLM's registry, and its config, which vLLM imports by this name
HISTORY_SPECULATOR = "specrl_history"
HISTORY_SPECULATOR_CONFIG = "specrl_openrlhf.integration.vllm.v2.config.HistorySpeculatorConfig"
SPECULATOR_OPTIONS = ("history_mb", "min_match", "shared", "lookup")  # what the speculator needs when vLLM builds it


@dataclass(frozen=True, kw_only=True)
class LosslessParams:
    """The parameters of `lossless`: where its drafts are verified, what they propose and how many a step carries.
    Every choice is exact: acceptance follows p_curr, so a likelier proposal only keeps more."""

    draft: Literal["own", "majority", "tree"] = "tree"
    """The proposal: "own" (the sample's own previous response, SPEC-RL's draft; `verify="requests"` only),
    "majority" (the majority path through the prompt's previous responses; `verify="requests"` only) or "tree"
    (their tree, walked by sampling p_curr at each node, `specrl_openrlhf.proposal.walk`)."""

    history: Literal[1, 2] = 1
    """How many of the prompt's last visits the proposal draws on; 2 needs draft "majority" or "tree"."""

    verify: Literal["engine", "requests"] = "engine"
    """Where drafts are verified. "engine": inside vLLM, at every decoding step (`integration.vllm.v1.proposer`); the
    engine proposes from the tree of the prompt's previous responses (and its finished siblings) while the sample
    stays in it, and after a rejection from the longest suffix match of at least `min_match` tokens. "requests": on
    our request path, once per visit up to the first rejection (scoring requests, then a continuation), with `draft`
    as the proposal."""

    num_speculative_tokens: int = field(default=16, metadata=limits(at_least=1, at_most=64))
    """The most tokens the engine drafts for a sample at one step (`verify="engine"`)."""

    fixed_tokens: int = field(default=4, metadata=limits(at_least=1, at_most=64))
    """The tokens every row verifies every step where nothing sizes a row's draft: our V2 speculator (vLLM >= 0.34)
    without vLLM's adaptive verification (`--vllm.enforce_eager`, or `adaptive=off`), where vLLM verifies each of a
    row's k slots, so a short draft pays best (docs/benchmarks.md, "At RL scale"). Our budget sizes every row on the V1
    runner, and adaptive verification on the V2 runner, up to `num_speculative_tokens`."""

    min_match: int = field(default=4, metadata=limits(at_least=1, means="tokens a re-entry matches on"))
    """The shortest suffix of the sample a re-entry into the history must match, after a rejection."""

    min_accept_prob: float = field(default=0.1, metadata=limits(at_least=0.0, below=1.0))
    """The static budget's floor on the chance that the draft so far is accepted."""

    budget: Literal["goodput", "static"] = "goodput"
    """Which drafted tokens a step carries. "goodput": the slots whose expected accepted tokens pay for what they add
    to the step, by the step cost the engine measures and the acceptance it learns (`specrl_openrlhf.budget`); zero
    is a valid answer. "static": all of them while the chance that the draft is accepted so far, by the history's
    own log-probs, stays at least `min_accept_prob`."""

    cost_curve: str | dict | None = field(default=None, repr=False)  # the data: `describe` leaves it out
    """A GPU's step curve: the path of a JSON file of `scripts/bench_gpu_step.py` (read once, here, where the run
    starts: the rule then holds the curve's data, which travels to the engines with its parameters) or that data. The
    goodput budget then prices slots on it at `cost_scale` times the rows a step serves instead of on this machine's
    measured step cost, so the drafts are those that GPU would choose (acceptance does not depend on the hardware);
    the drafting check, which measures this machine's steps, is off then."""

    cost_scale: int = field(default=1, metadata=limits(at_least=1, means="rows each row stands for"))
    """How many rows on the GPU of `cost_curve` each of this engine's rows stands for."""

    shared: bool = True
    """In the engine, where the prompt's own history holds no suffix of the sample (or the prompt has none yet),
    re-enter in the engine's other prompts' recent responses, one tree of them all (as vLLM's suffix decoding does
    with its global tree)."""

    lookup: bool = True
    """Also re-enter in the sample's own tokens, its prompt and response so far (prompt lookup, as vLLM's n-gram
    proposer); the longer match of the two wins."""

    history_mb: int = field(default=1024, metadata=limits(at_least=1, means="MiB an engine's histories may take"))
    """The memory an engine's histories may take (MiB); past it the histories of the prompts that left the engine go
    first."""

    engine: Literal["auto", "v1", "v2"] = "auto"
    """Which vLLM runner verifies in the engine: `v1`, our `custom_class` proposer (vLLM <= 0.33's V1 runner, its host
    time paid serially), `v2`, our GPU speculator (vLLM >= 0.34's V2 runner, async scheduling kept), `auto`, the one
    the installed vLLM runs. The simulator runs either; an engine runs the installed vLLM's."""

    adaptive: Literal["auto", "on", "off"] = "auto"
    """With the V2 engine: vLLM's adaptive verification sizes each row's draft from our acceptance model's
    confidences; it needs full CUDA graphs (not `enforce_eager`), so `auto` turns it on where the engine has them;
    `off`: every row verifies `num_speculative_tokens` every step."""

    def __post_init__(self):
        check_fields(self)
        if self.draft == "own" and self.history != 1:
            raise ValueError('history applies to draft "majority" and "tree"; "own" is the one previous response')
        if self.verify == "engine" and self.draft != "tree":
            raise ValueError(
                f"draft={self.draft!r} is proposed once per visit on the request path: add verify='requests' "
                "(the engine proposes from the tree of the prompt's responses at every step)"
            )
        if self.cost_curve is not None:  # a path is read once, here: its data, not the path, reaches the engines
            try:
                curve = load_price(self.cost_curve)
            except ValueError as error:
                raise ValueError(f"cost_curve: {error}") from None
            object.__setattr__(self, "cost_curve", curve.as_data())
        if self.runs_on != "v2" and self.adaptive == "on":
            raise ValueError(f"adaptive=on is vLLM 0.34's adaptive verification: add engine=v2 (engine={self.engine})")

    @property
    def runs_on(self) -> Literal["v1", "v2"]:
        """The engine `engine` names: "auto" resolved against the installed vLLM (`speculative.resolve_engine`)."""
        from .speculative import resolve_engine  # here: importing it registers its rules after ours

        return resolve_engine(self.engine)


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

    def engine_arguments(self, engine: EngineTarget = V1_ENGINE) -> dict:
        """Ours, drafting up to `num_speculative_tokens` a step: the V1 runner's `custom_class` proposer, or on the
        V2 runner our registered speculator, built with the parameters it needs at construction, with vLLM's adaptive
        verification where the engine allows it; per-request acceptance counts (each verification step's drafted and
        accepted tokens) on every finished output; a visit's samples are served in slot order (where the engine has
        more samples than slots, later ones start after earlier ones finished, and draft from them too:
        `rollout.engine_path`)."""
        if not self.verifies_in_engine:
            return {}
        k = self.params.num_speculative_tokens
        if engine.runner == "v1":
            speculative = {"method": "custom_class", "model": HISTORY_PROPOSER, "num_speculative_tokens": k}
        else:
            options = {name: getattr(self.params, name) for name in SPECULATOR_OPTIONS}
            adaptive = self.params.adaptive == "on" or (
                self.params.adaptive == "auto" and engine.adaptive_verification
            )
            speculative = {
                "method": HISTORY_SPECULATOR,
                "num_speculative_tokens": k if adaptive else self.params.fixed_tokens,
                "speculator_options": options,
                "enable_adaptive_verification": adaptive,
            }
        return {
            "speculative_config": speculative,
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
    """The parameter of `residual`."""

    top_k: int = field(default=20, metadata=limits(at_least=1, at_most=1024))  # vLLM's default max_logprobs
    """How many of p_prev's and p_curr's likeliest tokens are kept per draft position to draw a rejected one from the
    residual; what lies beyond them bounds the bias left (`reuse/residual_tail_mass`)."""

    def __post_init__(self):
        check_fields(self)


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
