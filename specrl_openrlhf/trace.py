"""Draft traces (`--reuse.trace_dir`): what every draft looked like when it was cut, for offline replay of rules.

One record per draft: its token ids, its logprobs when drafted (p_prev), under the policy that cut it (p_curr, NaN
when the policy did not score), when each token was decoded (p_gen) and each token's age, its length, the sample's
token budget, whether it ended by a stop condition, its finish reason, the seed material of its uniforms, the cut the
run made (a tree walk: the tokens it kept) and the lenience it applied, and which visit of its prompt it belongs to
(`group`) in which slot: with the token ids, a visit's records are the prompt's previous responses, so `replay` can
propose from them as a run with another `draft` choice would (own, majority path, tree). A run that proposes from
two visits also records the older visit's responses, once per visit, in slot -1.

Each process writes its own `.npz` chunks atomically, so many engines can share one folder: a chunk is written once
`flush_every` records wait, and a background thread writes what waits every `flush_s` seconds. A process that is
killed loses at most the records of its last `flush_s` seconds (and never more than `flush_every`); one that exits
normally loses nothing. `python -m specrl_openrlhf replay DIR` reads them.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .cache import write_npz
from .draft import FINISH_REASONS, Draft
from .seeds import entropy_of

logger = logging.getLogger(__name__)

FORMAT_NAME = "specrl-draft-trace"
FORMAT_VERSION = 3  # 3: token ids, visit groups and slots; 2: p_gen and ages; older traces still load
ENTROPY_WIDTH = 5  # seed, prompt key, draft visit, draft index, draft length: `seeds.entropy_of`
HISTORY_SLOT = -1  # the slot of a record that is no sample's own draft: a response of the visit before


@dataclass
class TraceRecords:
    """Every record of a trace folder, in the order the drafts were cut."""

    lengths: np.ndarray  # [N] int64
    offsets: np.ndarray  # [N + 1] int64, into the token arrays
    tokens: np.ndarray  # [sum L] int64, the draft's token ids (-1 in traces of format 2 and older)
    draft_logprobs: np.ndarray  # [sum L] float32, log p_prev
    scored_logprobs: np.ndarray  # [sum L] float32, log p_curr (NaN where not scored)
    gen_logprobs: np.ndarray  # [sum L] float32, log p_gen
    ages: np.ndarray  # [sum L] int64, visits since decoded, counting the visit that cut the draft
    scored: np.ndarray  # [N] bool
    budget: np.ndarray  # [N] int64, the sample's max_tokens
    draft_ended: np.ndarray  # [N] bool, the draft ended by a stop condition
    finish: np.ndarray  # [N] uint8, index into cache.FINISH_REASONS
    entropy: np.ndarray  # [N, ENTROPY_WIDTH] uint64
    cut: np.ndarray  # [N] int64, the cut the run made
    lenience: np.ndarray  # [N] float64, the lenience the run's rule applied (NaN: none)
    time: np.ndarray  # [N] float64, wall clock of the cut
    group: np.ndarray  # [N] uint64, the visit of its prompt the record belongs to
    slot: np.ndarray  # [N] int64, the sample's slot in that visit (HISTORY_SLOT: a response of the visit before)
    policies: list[str]  # the rules that wrote the trace (describe())
    proposals: list[str]  # what their samples proposed from: own, majority or tree ("own" before format 3)

    def __len__(self) -> int:
        return len(self.lengths)

    def row(self, name: str, r: int) -> np.ndarray:
        """Record `r`'s per-token array `name` (tokens, draft_logprobs, scored_logprobs, gen_logprobs or ages)."""
        return getattr(self, name)[self.offsets[r] : self.offsets[r + 1]]

    @property
    def samples(self) -> np.ndarray:
        """[N] bool: the records that are a sample's own draft (not a response of the visit before)."""
        return self.slot != HISTORY_SLOT


def visit_group(prompt_key: int, visit: int) -> int:
    """The `group` of a prompt's visit: its records are the responses of visit `visit` of the prompt."""
    return (int(prompt_key) ^ (int(visit) * 0x9E3779B97F4A7C15)) & 0xFFFFFFFFFFFFFFFF


class TraceWriter:
    """Appends draft records and writes them out in chunks. Never raises into the rollout: a failed write logs a
    warning and drops that chunk."""

    def __init__(
        self,
        directory: str | Path,
        policy: str,
        *,
        proposal: str = "own",
        flush_every: int = 4096,
        flush_s: float = 10.0,
    ):
        self.directory = Path(directory)
        self.policy, self.proposal = policy, proposal
        self.flush_every, self.flush_s = flush_every, flush_s
        self.prefix = f"trace-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.chunks = 0
        self._rows: list[tuple] = []
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._timer = threading.Thread(target=self._flush_now_and_then, name="specrl-trace-flush", daemon=True)
        self._timer.start()
        atexit.register(self.close)  # a process that ends normally loses nothing

    def record(
        self, draft: Draft, scored_logprobs, ages_now, budget, draft_ended, entropy, cut, lenience, group=0, slot=0
    ) -> None:
        row = (
            draft.logprobs.copy(),
            None if scored_logprobs is None else np.asarray(scored_logprobs, np.float32).copy(),
            draft.gen_logprobs.copy(),
            np.asarray(ages_now, np.int64).copy(),
            int(budget),
            bool(draft_ended),
            FINISH_REASONS.index(draft.finish_reason),
            np.asarray(entropy, np.uint64),
            int(cut),
            float("nan") if lenience is None else float(lenience),
            time.time(),
            draft.token_ids.copy(),
            int(group),
            int(slot),
        )
        with self._lock:
            self._rows.append(row)
            full = len(self._rows) >= self.flush_every
        if full:
            self.flush()

    def _flush_now_and_then(self) -> None:
        while not self._stopped.wait(self.flush_s):
            self.flush()

    def close(self) -> None:
        self._stopped.set()
        self.flush()

    def flush(self) -> Path | None:
        with self._lock:
            rows, self._rows = self._rows, []
            if not rows:
                return None
            try:  # under the lock: chunk numbers stay unique and in order
                return self._write(rows)
            except Exception as error:  # tracing is diagnostics: it must never stop a rollout
                logger.warning("could not write %d draft trace records to %s: %s", len(rows), self.directory, error)
                return None

    def _write(self, rows) -> Path:
        lengths = np.array([len(r[0]) for r in rows], np.int64)

        def tokens(index, dtype, missing=np.nan):
            parts = [r[index] if r[index] is not None else np.full(len(r[0]), missing) for r in rows]
            return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)

        header = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "policy": self.policy, "proposal": self.proposal}
        header = json.dumps(header).encode()
        arrays = {
            "header": np.frombuffer(header, np.uint8),
            "lengths": lengths,
            "draft_logprobs": tokens(0, np.float32),
            "scored_logprobs": tokens(1, np.float32),
            "gen_logprobs": tokens(2, np.float32),
            "ages": tokens(3, np.int64),
            "scored": np.array([r[1] is not None for r in rows], bool),
            "budget": np.array([r[4] for r in rows], np.int64),
            "draft_ended": np.array([r[5] for r in rows], bool),
            "finish": np.array([r[6] for r in rows], np.uint8),
            "entropy": np.stack([r[7] for r in rows]).astype(np.uint64),
            "cut": np.array([r[8] for r in rows], np.int64),
            "lenience": np.array([r[9] for r in rows], np.float64),
            "time": np.array([r[10] for r in rows], np.float64),
            "tokens": tokens(11, np.int32),
            "group": np.array([r[12] for r in rows], np.uint64),
            "slot": np.array([r[13] for r in rows], np.int64),
        }
        path = write_npz(self.directory / f"{self.prefix}-{self.chunks:05d}.npz", arrays, compress=True)
        self.chunks += 1
        return path


def read_traces(directory: str | Path) -> TraceRecords:
    """Every chunk under `directory` (recursively), merged and sorted by the time of the cut. A corrupt or foreign
    chunk is skipped with a warning; no readable chunk at all is an error that names the folder."""
    directory = Path(directory)
    paths = sorted(directory.rglob("trace-*.npz")) if directory.is_dir() else []
    if not paths:
        raise FileNotFoundError(
            f"no draft traces (trace-*.npz) under {directory}; record some with --reuse.trace_dir {directory}"
        )
    parts, policies, proposals = [], [], []
    for path in paths:
        try:
            with np.load(path, allow_pickle=False) as data:
                header = json.loads(bytes(data["header"]).decode())
                if header.get("format") != FORMAT_NAME or header.get("version") not in (1, 2, FORMAT_VERSION):
                    raise ValueError(f"format {header.get('format')!r} version {header.get('version')!r}")
                part = {name: data[name] for name in data.files if name != "header"}
            if "gen_logprobs" not in part:  # version 1: no p_gen, no ages
                part["gen_logprobs"] = part["draft_logprobs"].copy()
                part["ages"] = np.ones(len(part["draft_logprobs"]), np.int64)
            if "tokens" not in part:  # version 2 and older: no token ids; a visit is the drafts' prompt and visit
                part["tokens"] = np.full(len(part["draft_logprobs"]), -1, np.int32)
                part["group"] = np.array([visit_group(e[1], e[2]) for e in part["entropy"]], np.uint64)
                part["slot"] = part["entropy"][:, 3].astype(np.int64)
            tokens = part["lengths"].sum()
            per_token = ("tokens", "draft_logprobs", "scored_logprobs", "gen_logprobs", "ages")
            if any(len(part[k]) != tokens for k in per_token) or part["entropy"].shape[1:] != (ENTROPY_WIDTH,):
                raise ValueError("inconsistent array sizes")
        except Exception as error:
            logger.warning("skipping unreadable draft trace %s (%s: %s)", path, type(error).__name__, error)
            continue
        parts.append(part)
        if header.get("policy") not in policies:
            policies.append(header.get("policy"))
        if header.get("proposal", "own") not in proposals:
            proposals.append(header.get("proposal", "own"))
    if not parts:
        raise ValueError(f"no readable draft traces under {directory}")
    order = np.argsort(np.concatenate([p["time"] for p in parts]), kind="stable")
    lengths = np.concatenate([p["lengths"] for p in parts])
    starts = np.concatenate([[0], np.cumsum(lengths)])[:-1]

    def tokens(name):
        return np.concatenate([p[name] for p in parts])

    index = np.concatenate([np.arange(starts[i], starts[i] + lengths[i]) for i in order]) if len(order) else []
    index = np.asarray(index, np.int64)
    new_lengths = lengths[order]

    def rows(name):
        return np.concatenate([p[name] for p in parts])[order]

    return TraceRecords(
        lengths=new_lengths,
        offsets=np.concatenate([[0], np.cumsum(new_lengths)]).astype(np.int64),
        tokens=tokens("tokens")[index].astype(np.int64),
        draft_logprobs=tokens("draft_logprobs")[index],
        scored_logprobs=tokens("scored_logprobs")[index],
        gen_logprobs=tokens("gen_logprobs")[index],
        ages=tokens("ages")[index].astype(np.int64),
        scored=rows("scored"),
        budget=rows("budget"),
        draft_ended=rows("draft_ended"),
        finish=rows("finish"),
        entropy=rows("entropy"),
        cut=rows("cut"),
        lenience=rows("lenience"),
        time=rows("time"),
        group=rows("group").astype(np.uint64),
        slot=rows("slot").astype(np.int64),
        policies=policies,
        proposals=proposals,
    )


def record_cut(trace: TraceWriter, sample, draft_age: int, lenience: float | None) -> None:
    """Record a cut draft (a `request_path.sample.Sample`). A tree sample records its own previous response (empty
    without one), p_curr from the tree, and the tokens its walk kept as its cut; the first of a visit's samples also
    records the responses of the visit before (slot -1): `replay` can then rebuild the visit's tree, or propose from
    any part of it."""
    seed, key = sample.entropy[:2]
    if sample.tree is None:
        group = visit_group(key, sample.draft.visit)
        draft = sample.draft
        ended, slot = sample.draft_ended, draft.index
        trace.record(
            draft,
            sample.scored,
            sample.ages_now,
            sample.max_tokens,
            ended,
            sample.entropy,
            sample.cut,
            lenience,
            group,
            slot,
        )
        return
    tree = sample.tree
    responses = tree.history.responses
    newest = max(r.visit for r in responses)
    group = visit_group(key, newest)

    def record(response: int | None, entropy, cut: int, slot: int) -> None:
        if response is None:
            nothing = np.zeros(0, np.float32)
            draft, scored = Draft(np.zeros(0, np.int32), nothing, "length", newest, slot), nothing
        else:
            draft, scored = responses[response], tree.logprobs[tree.history.paths[response]]
        ages = draft.ages.astype(np.int64) + draft_age + (newest - draft.visit)
        ended = draft.finish_reason == "stop"
        trace.record(draft, scored, ages, sample.max_tokens, ended, entropy, cut, lenience, group, slot)

    record(sample.own, sample.entropy, sample.cut, int(sample.entropy[3]))
    if not tree.traced:
        tree.traced = True
        for response in range(tree.own_count, len(responses)):
            older = responses[response]
            record(response, entropy_of(seed, key, older.visit, older.index, len(older)), 0, HISTORY_SLOT)
