"""Offline replay of acceptance rules on recorded draft traces: `python -m specrl_openrlhf replay DIR --rollout_reuse
spec exact random my_rule.py:MyRule`. No engine: each rule cuts the recorded drafts with the uniforms the run drew,
so replaying the rule a run used reproduces that run's cuts, and any other rule sees the very same drafts.

Proposals replay too (`lossless,draft=own`, `lossless,draft=majority`, `lossless,draft=tree`, and `history=2`): a
visit's records hold the prompt's previous responses with their token ids and p_curr, so the majority path or the tree
of them is rebuilt, scored from the records, and walked with each sample's uniforms, as a run with that proposal
would have. A tree needs every response's p_curr: traces of a run that scored whole drafts (tracing scores them whole)
or walked a tree; two visits of history need a run that proposed from two visits. Responses a run verified in the
engine replay through our engine proposer's own code (`replay_verified`).

What replay can't know is what a continuation would have generated: "decoded tokens saved" counts the draft tokens
a rule keeps, which the engine would otherwise have decoded. What it can show is how stale a rule's kept tokens are:
their mean log p_curr / p_gen (the drift since they were decoded) and the share decoded more than two visits ago.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..draft import Draft
from ..history import ROOT, History
from ..markdown import numbers, table
from ..policies import ReusePolicy
from ..policies.base import checked_cuts, draft_batch
from ..policies.stateful import FeedbackCoordinator
from ..proposal import majority_path, walk
from ..seeds import entropy_of, uniforms_for
from ..staleness import OLD_AGE
from ..trace import TraceRecords


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


@dataclass
class Kept:
    """What a rule keeps of each sample's proposal: one row per sample record, and the kept tokens' drift and age."""

    tokens: np.ndarray  # [S] int64, tokens kept
    offered: np.ndarray  # [S] int64, the proposal's length (own draft, majority path, the branch a walk ended on)
    whole: np.ndarray  # [S] bool, kept whole with nothing left to generate (a stop, or the budget)
    drift: np.ndarray  # [k] float64, log p_curr - log p_gen of every kept token
    ages: np.ndarray  # [k] int64, visits since each kept token was decoded


def tally(name: str, records: TraceRecords, cuts) -> ReplayResult:
    """Metrics of a rule's cuts (one per record, as `replay` gives them) or of its `Kept` proposals (`replay_kept`).
    A draft is fully reused when it is kept whole and either ended by a stop condition or filled the sample's budget
    (the rollout then skips generation, as here). Records of the visit before (slot -1) are no sample's."""
    kept = cuts if isinstance(cuts, Kept) else kept_by_cuts(records, np.asarray(cuts))
    drift = kept.drift[np.isfinite(kept.drift)]
    return ReplayResult(
        rule=name,
        drafts=len(kept.tokens),
        draft_tokens=int(kept.offered.sum()),
        reused_tokens=int(kept.tokens.sum()),
        fully_reused=int(kept.whole.sum()),
        kept_drift=float(drift.mean()) if len(drift) else float("nan"),
        kept_old=float((kept.ages > OLD_AGE).mean()) if len(kept.ages) else 0.0,
    )


def kept_by_cuts(records: TraceRecords, cuts: np.ndarray) -> Kept:
    """`Kept` of cuts of the recorded drafts themselves."""
    rows = np.flatnonzero(records.samples)
    kept = np.zeros(len(records.draft_logprobs), bool)  # [sum L]: the tokens the cuts keep
    for r in rows.tolist():
        kept[records.offsets[r] : records.offsets[r] + cuts[r]] = True
    complete = records.draft_ended | (records.lengths >= records.budget)
    return Kept(
        tokens=cuts[rows].astype(np.int64),
        offered=records.lengths[rows],
        whole=(cuts == records.lengths)[rows] & complete[rows],
        drift=records.scored_logprobs[kept].astype(np.float64) - records.gen_logprobs[kept],
        ages=records.ages[kept],
    )


def replay_kept(policy: ReusePolicy, records: TraceRecords, verify=None, **replay_args) -> Kept:
    """What `policy` keeps of every sample's proposal: cuts of the recorded drafts (`replay`), or, for a rule that
    proposes the majority path or the tree of a visit's responses, those rebuilt from the visit's records; on traces
    of responses verified in the engine, `replay_verified` (`verify`: the engine proposer's replay)."""
    if "engine" in records.proposals:
        return replay_verified(policy, records, verify)
    if policy.draft_choice not in ("majority", "tree"):
        return kept_by_cuts(records, replay(policy, records, **replay_args))
    if (records.tokens[: records.offsets[-1]] < 0).any():
        raise ReplayError(
            f"rule {policy.describe()} proposes from a visit's responses, but these traces hold no token ids (format "
            f"2 or older): record them again with this version"
        )
    if "majority" in records.proposals:
        raise ReplayError(
            f"rule {policy.describe()} proposes from a visit's responses, but a run proposing the majority path "
            f"recorded these traces: its drafts are that path, not the responses"
        )
    if policy.draft_history > 1 and records.samples.all():
        raise ReplayError(
            f"rule {policy.describe()} proposes from two visits, but these traces hold one: record a run with "
            f'--reuse.params \'{{"draft": "tree", "history": 2}}\''
        )
    parts = [_visit_kept(policy, records, rows) for rows in _visits(records)]
    order = np.argsort(np.concatenate([rows for rows, _ in parts]), kind="stable")  # back to trace order
    kept = [k for _, k in parts]
    by_row = [row for part in kept for row in part]
    by_row = [by_row[i] for i in order]
    return Kept(
        tokens=np.array([k[0] for k in by_row], np.int64),
        offered=np.array([k[1] for k in by_row], np.int64),
        whole=np.array([k[2] for k in by_row], bool),
        drift=np.concatenate([k[3] for k in by_row]) if by_row else np.zeros(0),
        ages=np.concatenate([k[4] for k in by_row]).astype(np.int64) if by_row else np.zeros(0, np.int64),
    )


def replay_verified(policy: ReusePolicy, records: TraceRecords, verify=None) -> Kept:
    """What a proposal keeps of responses a run verified in the engine (traces written by `lossless` with
    `verify="engine"`): each visit's records hold the history the engine drafted from (slot -1) and each sample's
    response, a sample of p_curr whatever was proposed. `lossless` in the engine: our engine proposer's own code
    verifies each visit again, its samples drafting from the history and from each other as they run (`verify`:
    `at_scale.engine_replay.engine_kept`, which `python -m specrl_openrlhf replay` passes; this layer can't import
    it). `lossless` on the request path keeps the response's longest prefix inside the history's tree, which is what
    its exact walk keeps of a p_curr sample. No p_curr of drafts: no drift."""
    if policy.name != "lossless" or (not policy.verifies_in_engine and policy.draft_choice != "tree"):
        raise ReplayError(
            f"rule {policy.describe()} needs p_curr of drafts, which responses verified in the engine never had: "
            "these traces replay lossless (in the engine) and lossless,verify=requests (its tree)"
        )
    if policy.verifies_in_engine and verify is None:
        raise ReplayError(
            f"rule {policy.describe()} is replayed by the engine proposer itself: python -m specrl_openrlhf replay "
            "drives it (or pass verify=specrl_openrlhf.at_scale.engine_replay.engine_kept)"
        )
    visits = [
        (
            [records.row("tokens", r).tolist() for r in rows[~records.samples[rows]].tolist()],
            [records.row("tokens", r).tolist() for r in rows[records.samples[rows]].tolist()],
        )
        for rows in _visits(records)
    ]
    if policy.verifies_in_engine:
        verified = [pair for visit in verify(policy.params, visits) for pair in visit]
        tokens, offered = [k for k, _ in verified], [d for _, d in verified]
    else:  # the tree's exact walk keeps the response's longest prefix that is a path of the tree
        tokens, offered = [], []
        for history_responses, responses in visits:
            history = History()
            for response in history_responses:
                history.add(response)
            for response in responses:
                kept, cursor = 0, [ROOT]
                while kept < len(response) and (cursor := history.advance(cursor, response[kept : kept + 1])):
                    kept += 1
                tokens.append(kept)
                offered.append(kept + (kept < len(response) and bool(len(history))))
    lengths = [len(r) for _, responses in visits for r in responses]
    return Kept(
        tokens=np.array(tokens, np.int64),
        offered=np.array(offered, np.int64),
        whole=np.array(tokens, np.int64) == np.array(lengths, np.int64),
        drift=np.zeros(0),
        ages=np.zeros(0, np.int64),
    )


def _visits(records: TraceRecords) -> list[np.ndarray]:
    """The record indices of every visit (a prompt's group), in trace order."""
    _, inverse = np.unique(records.group, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.flatnonzero(np.diff(inverse[order])) + 1
    return np.split(order, bounds)


def _visit_kept(policy: ReusePolicy, records: TraceRecords, rows: np.ndarray):
    """(the visit's sample records, what each keeps) for a majority-path or tree proposal over the visit's records."""
    samples = rows[records.samples[rows]]
    samples = samples[np.argsort(records.slot[samples], kind="stable")]
    older = rows[~records.samples[rows]] if policy.draft_history > 1 else rows[:0]
    sources = [r for r in samples.tolist() if records.lengths[r]] + older.tolist()
    if not sources:
        return samples, [(0, 0, False, np.zeros(0), np.zeros(0, np.int64)) for _ in samples]
    drafts = [
        Draft(
            records.row("tokens", r),
            records.row("draft_logprobs", r),
            "stop" if records.draft_ended[r] else "length",
            visit=int(records.entropy[r][2]),
            index=int(records.slot[r]),
        )
        for r in sources
    ]
    history = History.of_drafts(drafts)
    p_curr = np.full(history.num_nodes, np.nan, np.float32)  # [N], from the records through each node
    for source, r in enumerate(sources):
        nodes, scored = history.paths[source], records.row("scored_logprobs", r)
        unknown = np.isnan(p_curr[nodes])
        p_curr[nodes[unknown]] = scored[unknown]
    own_of = {r: i for i, r in enumerate(sources[: len(sources) - len(older)])}
    out = []
    for r in samples.tolist():
        budget = int(records.budget[r])
        if policy.draft_choice == "tree":
            uniforms = uniforms_for(records.entropy[r], history.max_depth + 1)
            route = walk(history, p_curr, uniforms, own_of.get(r), budget)
            nodes = route.nodes
            offered = min(len(history.paths[route.branch]), budget)
            whole = route.complete or len(nodes) >= budget
        else:
            nodes, offered, whole = _majority_kept(policy, history, p_curr, records, r, budget)
        source_rows = np.array(sources, np.int64)[history.arrays.source[nodes]]
        positions = history.arrays.depth[nodes] - 1
        gen = np.array([records.row("gen_logprobs", s)[p] for s, p in zip(source_rows.tolist(), positions.tolist())])
        ages = np.array([records.row("ages", s)[p] for s, p in zip(source_rows.tolist(), positions.tolist())])
        drift = p_curr[nodes].astype(np.float64) - gen if len(nodes) else np.zeros(0)
        out.append((len(nodes), offered, whole, drift, ages.astype(np.int64)))
    return samples, out


def _majority_kept(policy, history: History, p_curr: np.ndarray, records: TraceRecords, r: int, budget: int):
    """(kept nodes, path length, kept whole) of the majority path for sample record `r`, cut by the rule with the
    uniforms the run drew for it."""
    path = majority_path(history)
    nodes = path[:budget]
    seed, key = (int(e) for e in records.entropy[r][:2])
    visit = history.responses[int(history.arrays.source[path[0]])].visit if len(path) else 0
    entropy = entropy_of(seed, key, visit, int(records.slot[r]), len(nodes))
    batch = draft_batch(
        [len(nodes)],
        draft_logprobs=[np.zeros(len(nodes))],
        gen_logprobs=[np.zeros(len(nodes))],
        ages=[np.ones(len(nodes), np.int64)],
        uniforms=[uniforms_for(entropy, len(nodes))],
        scored_logprobs=[p_curr[nodes]],
    )
    cut = int(checked_cuts(policy, batch, policy.cut(batch))[0]) if len(nodes) else 0
    ended = len(path) and history.arrays.stop[path[-1]]  # the path ends where a response ended by a stop
    whole = cut == len(nodes) and (bool(ended) or len(nodes) >= budget)
    return nodes[:cut], len(nodes), whole


def replay(
    policy: ReusePolicy, records: TraceRecords, *, batch_size: int = 256, update_every: int | None = None
) -> np.ndarray:
    """The cut `policy` makes on every record, [N] int64, in trace order. A stateful rule gets its feedback and
    updates as in a run: one update per `update_every` drafts (default: `batch_size`)."""
    if policy.draft_choice != "own":
        raise ReplayError(
            f"rule {policy.describe()} proposes from a visit's responses, not from each recorded draft: "
            f"use replay_kept"
        )
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
    head = ["rule", "reuse ratio", "mean verified prefix", "full-reuse ratio", "decoded tokens saved"]
    head += ["kept: log p_curr/p_gen", "kept: older than 2 visits", "replay s"]
    rows = [
        [r.rule, f"{r.reuse_ratio:.3f}", f"{r.mean_verified_prefix:.1f}", f"{r.full_reuse_ratio:.3f}", r.reused_tokens]
        + [f"{r.kept_drift:.4f}", f"{r.kept_old:.3f}", f"{r.seconds:.2f}"]
        for r in results
    ]
    intro = (
        f"{int(records.samples.sum())} traced samples, {int(records.lengths[records.samples].sum())} draft tokens "
        f"(recorded by: {', '.join(p for p in records.policies if p)}; proposals: {', '.join(records.proposals)})"
    )
    return intro + "\n\n" + table(head, rows, numbers(1, len(head)))


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
