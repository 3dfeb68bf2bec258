"""One training run's metrics, normalised (`RunSeries`), from OpenRLHF-shaped logs of either kind of run (`step_row`).

Core module: standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..metrics import BUDGET_GAUGES, PER_DRAFT_METRICS
from ..references import short_name

STAGES = {  # OpenRLHF's timing keys -> our stage names
    "timing/generation": "rollout_s",
    "timing/make_experience": "make_experience_s",
    "timing/ppo_train": "train_s",
    "timing/broadcast": "sync_s",  # the weight sync
}
SUMMED = (
    "decoded_tokens",
    "reused_tokens",
    "draft_tokens",
    "scored_tokens",
    "drafts_found",
    "fallbacks",
    "resampled_tokens",
    "scoring_requests",
    "resample_requests",
    "branch_switches",
    "reentries",
)


def step_row(step: int, logs: dict[str, float]) -> dict:
    """One step's row from OpenRLHF-shaped logs (`rollout/num_samples`, `rollout/reward_mean`, `timing/*`, and the
    per-sample `reuse/*` metrics averaged over samples): totals per step, and per-draft values as means over the
    samples that had a draft."""
    n = float(logs.get("rollout/num_samples", 0.0))
    row: dict = {"step": step, "samples": n}
    decoded = logs.get("reuse/decoded_tokens")
    if decoded is None:  # a stock run decodes every response token
        decoded = logs.get("rollout/response_length_mean", logs.get("response_length"))
    if decoded is not None:
        row["decoded_tokens"] = decoded * n
    row.update({k: logs[f"reuse/{k}"] * n for k in SUMMED if k != "decoded_tokens" and f"reuse/{k}" in logs})
    for mean in ("full_reuse_ratio", "accepted_per_step"):  # means over the step's samples
        if f"reuse/{mean}" in logs:
            row[mean] = logs[f"reuse/{mean}"]
    reward = logs.get("rollout/reward_mean", logs.get("reward"))
    if reward is not None:
        row["reward"] = reward
    reports = logs.get("reuse/engine_reports", 0.0)  # the budget's gauges: means over samples that carry one
    if reports:
        row.update({k: logs[f"reuse/{k}"] / reports for k in BUDGET_GAUGES if f"reuse/{k}" in logs})
    hit_rate = logs.get("reuse/drafts_found", 0.0)
    if hit_rate:
        row.update({k: logs[f"reuse/{k}"] / hit_rate for k in PER_DRAFT_METRICS if f"reuse/{k}" in logs})
    row.update({ours: logs[tag] for tag, ours in STAGES.items() if tag in logs})
    phases = [logs.get(f"reuse/time_{p}_s", 0.0) for p in ("scoring", "generation", "assembly")]
    if sum(phases) and "rollout_s" in row:  # the rollout's share spent scoring, from the samples' latency
        row["scoring_s"] = row["rollout_s"] * phases[0] / sum(phases)
    if row.get("draft_tokens"):
        row["kept_share"] = row.get("reused_tokens", 0.0) / row["draft_tokens"]
    if row.get("reused_tokens"):  # the price of what was kept: draft tokens scored per token kept
        row["scored_per_kept"] = row.get("scored_tokens", 0.0) / row["reused_tokens"]
    return row


@dataclass
class RunSeries:
    """One training run, normalised: per-step rows and evaluations, whatever wrote them."""

    name: str
    policy: str
    lenience: float | None
    group: str  # runs of one group share a baseline (the group's `off` run)
    source: str
    method: str = ""  # the rule as compared across seeds (name and lenience)
    regime: str = ""
    seed: int | None = None
    steps: list[dict] = field(default_factory=list)  # step, rollout_s, decoded_tokens, reward, ... (totals per step)
    evals: list[dict] = field(default_factory=list)  # step or epoch, and one accuracy per dataset
    accuracy_before: float | None = None

    def __post_init__(self):
        self.method = self.method or short_name(self.policy)

    @property
    def is_baseline(self) -> bool:
        return self.policy == "off"

    def total(self, key: str) -> float:
        return sum(float(row.get(key) or 0.0) for row in self.steps)

    def step_mean(self, key: str) -> float | None:
        """A per-step value's mean over the steps that report it (None if none does)."""
        values = [float(row[key]) for row in self.steps if row.get(key) is not None]
        return sum(values) / len(values) if values else None

    def per_draft_mean(self, key: str) -> float | None:
        """A per-draft value over the whole run: the mean over every draft of every step."""
        weights = [(row[key], row.get("drafts_found", 0.0)) for row in self.steps if row.get(key) is not None]
        drafts = sum(w for _, w in weights)
        return sum(v * w for v, w in weights) / drafts if drafts else None

    def final_accuracy(self) -> dict[str, float]:
        return {k: v for k, v in self.evals[-1].items() if k not in ("step", "epoch")} if self.evals else {}


def baseline_of(run: RunSeries, runs: list[RunSeries]) -> RunSeries | None:
    return next((r for r in runs if r.group == run.group and r.is_baseline), None)
