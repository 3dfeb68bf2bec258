"""Draft traces (`--reuse.trace_dir`): what every draft looked like when it was cut, for offline replay of rules.

One record per draft: its logprobs when drafted (p_prev) and under the policy that cut it (p_curr, NaN when the
policy did not score), its length, the sample's token budget, whether it ended by a stop condition, its finish
reason, the seed material of its uniforms, the cut the run made and the lenience it applied. Each process writes
its own `.npz` chunks (atomically, every `flush_every` records or `flush_s` seconds), so many engines can share one
folder. `python -m specrl_openrlhf replay DIR` reads them back.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .cache import FINISH_REASONS, write_npz

logger = logging.getLogger(__name__)

FORMAT_NAME = "specrl-draft-trace"
FORMAT_VERSION = 1
ENTROPY_WIDTH = 5  # seed, prompt key, draft visit, draft index, draft length: what `uniforms_for` hashes


def uniforms_for(entropy, length: int) -> np.ndarray:
    """The acceptance uniforms of one draft: fresh per (seed, prompt, draft visit, draft index), reproducible."""
    return np.random.default_rng([int(e) for e in entropy]).random(length)


@dataclass
class TraceRecords:
    """Every record of a trace folder, in the order the drafts were cut."""

    lengths: np.ndarray  # [N] int64
    offsets: np.ndarray  # [N + 1] int64, into the token arrays
    draft_logprobs: np.ndarray  # [sum L] float32, log p_prev
    scored_logprobs: np.ndarray  # [sum L] float32, log p_curr (NaN where not scored)
    scored: np.ndarray  # [N] bool
    budget: np.ndarray  # [N] int64, the sample's max_tokens
    draft_ended: np.ndarray  # [N] bool, the draft ended by a stop condition
    finish: np.ndarray  # [N] uint8, index into cache.FINISH_REASONS
    entropy: np.ndarray  # [N, ENTROPY_WIDTH] uint64
    cut: np.ndarray  # [N] int64, the cut the run made
    lenience: np.ndarray  # [N] float64, the lenience the run's rule applied (NaN: none)
    time: np.ndarray  # [N] float64, wall clock of the cut
    policies: list[str]  # the rules that wrote the trace (describe())

    def __len__(self) -> int:
        return len(self.lengths)


class TraceWriter:
    """Appends draft records and writes them out in chunks. Never raises into the rollout: a failed write logs a
    warning and drops that chunk."""

    def __init__(self, directory: str | Path, policy: str, *, flush_every: int = 4096, flush_s: float = 10.0):
        self.directory = Path(directory)
        self.policy = policy
        self.flush_every, self.flush_s = flush_every, flush_s
        self.prefix = f"trace-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.chunks = 0
        self._rows: list[tuple] = []
        self._last_flush = time.monotonic()
        atexit.register(self.flush)  # a process that ends normally loses nothing

    def record(self, *, draft_logprobs, scored_logprobs, budget, draft_ended, finish, entropy, cut, lenience) -> None:
        self._rows.append(
            (
                np.asarray(draft_logprobs, np.float32),
                None if scored_logprobs is None else np.asarray(scored_logprobs, np.float32),
                int(budget),
                bool(draft_ended),
                FINISH_REASONS.index(finish) if finish in FINISH_REASONS else FINISH_REASONS.index("abort"),
                np.asarray(entropy, np.uint64),
                int(cut),
                float("nan") if lenience is None else float(lenience),
                time.time(),
            )
        )
        if len(self._rows) >= self.flush_every or time.monotonic() - self._last_flush > self.flush_s:
            self.flush()

    def flush(self) -> Path | None:
        self._last_flush = time.monotonic()
        if not self._rows:
            return None
        rows, self._rows = self._rows, []
        try:
            return self._write(rows)
        except Exception as error:  # tracing is diagnostics: it must never stop a rollout
            logger.warning("could not write %d draft trace records to %s: %s", len(rows), self.directory, error)
            return None

    def _write(self, rows) -> Path:
        lengths = np.array([len(r[0]) for r in rows], np.int64)
        draft = np.concatenate([r[0] for r in rows]) if rows else np.zeros(0, np.float32)
        scored = np.concatenate(
            [r[1] if r[1] is not None else np.full(len(r[0]), np.nan, np.float32) for r in rows]
        ).astype(np.float32)
        header = json.dumps({"format": FORMAT_NAME, "version": FORMAT_VERSION, "policy": self.policy}).encode()
        arrays = {
            "header": np.frombuffer(header, np.uint8),
            "lengths": lengths,
            "draft_logprobs": draft,
            "scored_logprobs": scored,
            "scored": np.array([r[1] is not None for r in rows], bool),
            "budget": np.array([r[2] for r in rows], np.int64),
            "draft_ended": np.array([r[3] for r in rows], bool),
            "finish": np.array([r[4] for r in rows], np.uint8),
            "entropy": np.stack([r[5] for r in rows]).astype(np.uint64),
            "cut": np.array([r[6] for r in rows], np.int64),
            "lenience": np.array([r[7] for r in rows], np.float64),
            "time": np.array([r[8] for r in rows], np.float64),
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
    parts, policies = [], []
    for path in paths:
        try:
            with np.load(path, allow_pickle=False) as data:
                header = json.loads(bytes(data["header"]).decode())
                if header.get("format") != FORMAT_NAME or header.get("version") != FORMAT_VERSION:
                    raise ValueError(f"format {header.get('format')!r} version {header.get('version')!r}")
                part = {name: data[name] for name in data.files if name != "header"}
            if part["lengths"].sum() != len(part["draft_logprobs"]) or part["entropy"].shape[1:] != (ENTROPY_WIDTH,):
                raise ValueError("inconsistent array sizes")
        except Exception as error:
            logger.warning("skipping unreadable draft trace %s (%s: %s)", path, type(error).__name__, error)
            continue
        parts.append(part)
        if header.get("policy") not in policies:
            policies.append(header.get("policy"))
    if not parts:
        raise ValueError(f"no readable draft traces under {directory}")
    order = np.argsort(np.concatenate([p["time"] for p in parts]), kind="stable")
    lengths = np.concatenate([p["lengths"] for p in parts])
    starts = np.concatenate([[0], np.cumsum(lengths)])[:-1]
    draft_lp = np.concatenate([p["draft_logprobs"] for p in parts])
    scored_lp = np.concatenate([p["scored_logprobs"] for p in parts])
    index = np.concatenate([np.arange(starts[i], starts[i] + lengths[i]) for i in order]) if len(order) else []
    index = np.asarray(index, np.int64)
    new_lengths = lengths[order]

    def rows(name):
        return np.concatenate([p[name] for p in parts])[order]

    return TraceRecords(
        lengths=new_lengths,
        offsets=np.concatenate([[0], np.cumsum(new_lengths)]).astype(np.int64),
        draft_logprobs=draft_lp[index],
        scored_logprobs=scored_lp[index],
        scored=rows("scored"),
        budget=rows("budget"),
        draft_ended=rows("draft_ended"),
        finish=rows("finish"),
        entropy=rows("entropy"),
        cut=rows("cut"),
        lenience=rows("lenience"),
        time=rows("time"),
        policies=policies,
    )
