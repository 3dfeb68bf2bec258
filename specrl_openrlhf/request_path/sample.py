"""A sample on the request path, and what the samples of one visit share (`ScoredHistory`).

Core module: numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..draft import Draft
from ..history import History
from ..metrics import ReuseStats


@dataclass(eq=False)
class ScoredHistory:
    """The tree of a visit's previous responses (`History`, built by the planner), shared by the visit's samples,
    with what the visit learns of it: p_curr of every node, once scored."""

    history: History
    logprobs: np.ndarray  # [N] float32 log p_curr per node, NaN until scored (root: NaN)
    own_count: int  # responses [own_count:] are no sample's own (the visit before)
    scored: bool = False  # every node that will be scored is (`scoring.DraftScorer.visit_rounds`)
    traced: bool = False  # its responses of the visit before were recorded (`--reuse.trace_dir`)

    @classmethod
    def of(cls, history: History, own_count: int) -> ScoredHistory:
        return cls(history, np.full(history.num_nodes, np.nan, np.float32), own_count)

    def unknown(self) -> np.ndarray:
        """[k] int64 nodes (root excluded) whose p_curr is not known."""
        return np.flatnonzero(np.isnan(self.logprobs[1:])) + 1


@dataclass
class Sample:
    """State of one sample through the speculative rollout."""

    prompt_ids: list[int]
    max_tokens: int
    draft: Draft | None = None  # already truncated to what this visit can use
    draft_ended: bool = False  # the (untruncated) draft ended by a stop condition (EOS or stop string)
    scored: np.ndarray | None = None  # [L] float32 log p_curr of the draft tokens, NaN where not scored (yet)
    uniforms: np.ndarray | None = None  # [L] float64
    entropy: tuple[int, ...] = ()  # what the uniforms were drawn from (`entropy_of`; traces store it)
    ages_now: np.ndarray | None = None  # [L] int64, visits since each draft token was decoded, counting this one
    scored_top: tuple[np.ndarray, np.ndarray] | None = None  # ([L, k] ids, [L, k] logprobs) of p_curr (lossless)
    cut: int = 0
    decided: bool = False  # the cut is final
    continued: bool = False  # its continuation was asked for (`next_request`)
    resampled: tuple[int, float] | None = None  # the rejected position, redrawn from the residual: (token, log p_curr)
    excluded: tuple[int, ...] = ()  # tokens the continuation's first step must not sample (`lossless`)
    excluded_mass: float = 0.0  # their summed p_curr
    tree: ScoredHistory | None = None  # the visit's tree of previous responses, shared by its samples (`draft="tree"`)
    own: int | None = None  # the sample's own previous response among the tree's, None without one
    forecast: tuple[int, int] | None = None  # (forecast cut, first draft position) at its first scoring request
    unserved: np.ndarray | None = None  # [k] draft positions a visit's request read from the prefix cache: rescored
    stats: ReuseStats = field(default_factory=ReuseStats)

    @property
    def prefix_len(self) -> int:
        """Tokens the continuation starts after: the verified prefix, and the redrawn token if there is one."""
        return self.cut + (self.resampled is not None)

    @property
    def draft_len(self) -> int:
        return 0 if self.draft is None else len(self.draft)

    @property
    def walks(self) -> bool:
        """It proposes from a tree it has not walked yet: its draft is the path the walk takes (`decide`)."""
        return self.tree is not None and not self.decided

    @property
    def scored_upto(self) -> int:
        """How many leading draft tokens have p_curr."""
        if self.scored is None:
            return 0
        unknown = np.flatnonzero(np.isnan(self.scored))
        return int(unknown[0]) if len(unknown) else len(self.scored)
