"""Offline replay of acceptance rules on recorded draft traces: `python -m specrl_openrlhf replay DIR --rollout_reuse
spec exact random my_rule.py:MyRule`. No engine: each rule cuts the recorded drafts with the uniforms the run drew,
so replaying the rule a run used reproduces that run's cuts, and any other rule sees the very same drafts.

What replay can't know is what a continuation would have generated: "decoded tokens saved" counts the draft tokens
a rule keeps, which the engine would otherwise have decoded. What it can show is how stale a rule's kept tokens are:
their mean log p_curr / p_gen (the drift since they were decoded) and the share decoded more than two visits ago.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from .adaptive import FeedbackCoordinator
from .policies import ReusePolicy
from .rollout import checked_cuts, draft_batch
from .staleness import OLD_AGE
from .trace import TraceRecords, uniforms_for


class ReplayError(ValueError):
    """A rule that the traces can't answer for (it needs scores the run never computed)."""


@dataclass
class ReplayResult:
    rule: str
    drafts: int
    draft_tokens: int
    reused_tokens: int  # = decoded tokens saved
    fully_reused: int  # drafts kept whole that needed no continuation
    kept_drift: float = float("nan")  # over kept tokens: mean log p_curr - log p_gen (NaN: none scored)
    kept_old: float = 0.0  # over kept tokens: the share decoded more than two visits ago
    seconds: float = 0.0

    @property
    def reuse_ratio(self) -> float:
        return self.reused_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def mean_verified_prefix(self) -> float:
        return self.reused_tokens / self.drafts if self.drafts else 0.0

    @property
    def full_reuse_ratio(self) -> float:
        return self.fully_reused / self.drafts if self.drafts else 0.0


def tally(name: str, records: TraceRecords, cuts: np.ndarray) -> ReplayResult:
    """Metrics of a set of cuts, one per record; a draft is fully reused when it is kept whole and either ended by a
    stop condition or filled the sample's budget (the rollout then skips generation, as here)."""
    whole = cuts == records.lengths
    complete = records.draft_ended | (records.lengths >= records.budget)
    kept = np.zeros(len(records.draft_logprobs), bool)  # [sum L]: the tokens the cuts keep
    for r, cut in enumerate(cuts.tolist()):
        kept[records.offsets[r] : records.offsets[r] + cut] = True
    drift = records.scored_logprobs[kept].astype(np.float64) - records.gen_logprobs[kept]
    drift = drift[np.isfinite(drift)]
    return ReplayResult(
        rule=name,
        drafts=len(records),
        draft_tokens=int(records.lengths.sum()),
        reused_tokens=int(cuts.sum()),
        fully_reused=int((whole & complete).sum()),
        kept_drift=float(drift.mean()) if len(drift) else float("nan"),
        kept_old=float((records.ages[kept] > OLD_AGE).mean()) if kept.any() else 0.0,
    )


def replay(
    policy: ReusePolicy, records: TraceRecords, *, batch_size: int = 256, update_every: int | None = None
) -> np.ndarray:
    """The cut `policy` makes on every record, [N] int64, in trace order. A stateful rule gets its feedback and
    updates as in a run: one update per `update_every` drafts (default: `batch_size`)."""
    if policy.needs_scores and not records.scored.all():
        raise ReplayError(
            f"rule {policy.describe()} reads p_curr, but {int((~records.scored).sum())} of {len(records)} traced "
            f"drafts were never scored (the run's rule did not score them). Record traces with a rule that scores "
            f"drafts (spec, exact, delayed), or replay rules that don't (random, full)."
        )
    coordinator = FeedbackCoordinator(policy, update_every or batch_size) if policy.keeps_state else None
    cuts = np.zeros(len(records), np.int64)
    for start in range(0, len(records), batch_size):
        rows = range(start, min(start + batch_size, len(records)))
        lengths = records.lengths[start : rows.stop]  # [B]
        batch = draft_batch(
            lengths,
            draft_logprobs=[records.row("draft_logprobs", r) for r in rows],
            gen_logprobs=[records.row("gen_logprobs", r) for r in rows],
            ages=[records.row("ages", r) for r in rows],
            uniforms=[uniforms_for(records.entropy[r], int(records.lengths[r])) for r in rows],
            scored_logprobs=[records.row("scored_logprobs", r) for r in rows] if policy.needs_scores else None,
        )
        batch_cuts = checked_cuts(policy, batch, policy.cut(batch))
        if coordinator is not None:
            coordinator.report(policy.feedback(batch, batch_cuts), len(rows))
        cuts[start : rows.stop] = batch_cuts.numpy()
    return cuts


def format_table(results: list[ReplayResult], records: TraceRecords) -> str:
    lines = [
        f"{len(records)} traced drafts, {int(records.lengths.sum())} draft tokens "
        f"(recorded by: {', '.join(p for p in records.policies if p)})",
        "",
        "| rule | reuse ratio | mean verified prefix | full-reuse ratio | decoded tokens saved "
        "| kept: log p_curr/p_gen | kept: older than 2 visits | replay s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        lines.append(
            f"| {r.rule} | {r.reuse_ratio:.3f} | {r.mean_verified_prefix:.1f} | {r.full_reuse_ratio:.3f} | "
            f"{r.reused_tokens} | {r.kept_drift:.4f} | {r.kept_old:.3f} | {r.seconds:.2f} |"
        )
    return "\n".join(lines)


def csv_rows(results: list[ReplayResult]) -> list[dict]:
    """One row per rule, with the derived ratios, for `--csv`."""
    return [
        {
            **dataclasses.asdict(r),
            "reuse_ratio": r.reuse_ratio,
            "mean_verified_prefix": r.mean_verified_prefix,
            "full_reuse_ratio": r.full_reuse_ratio,
        }
        for r in results
    ]
