"""Draft cache: each prompt's responses from its last two completed visits, as compact arrays.

A *visit* is one occurrence of a prompt in a rollout batch, with its n samples. Samples of the visit in progress
only ever read drafts from completed visits, so a sample that finishes early never serves as a draft to its own
visit, whatever order requests arrive and finish in. A visit is completed when the next visit of the same
prompt begins (its first `claim` with a new visit id).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import tempfile
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .draft import DRAFT_OVERHEAD_BYTES, FINISH_REASONS, Draft

logger = logging.getLogger(__name__)

FORMAT_NAME = "specrl-draft-cache"
FORMAT_VERSION = 2  # 2: p_gen, ages and top-k beside each token; version 1 files still load
MAX_DRAFT_AGE = 2  # the `delayed` policy reads drafts from two visits back
_ENTRY_OVERHEAD_BYTES = 256  # dict slots, visit lists, key bytes


def prompt_key(prompt_token_ids) -> bytes:
    """A 16-byte digest of the prompt's token ids: the cache key."""
    return hashlib.blake2b(np.asarray(prompt_token_ids, dtype=np.int64).tobytes(), digest_size=16).digest()


def shard_of(key: bytes, num_shards: int) -> int:
    return int.from_bytes(key[:8], "little") % num_shards


@dataclass
class _StoredVisit:
    visit_id: str | None  # None for visits restored from disk
    number: int
    responses: list[Draft] = field(default_factory=list)
    claims: int = 0


@dataclass
class _Entry:
    visits: list[_StoredVisit] = field(default_factory=list)  # oldest first; the last may be the open one
    open_visit_id: str | None = None
    nbytes: int = _ENTRY_OVERHEAD_BYTES


class DraftCache:
    """In-process draft cache with an LRU memory cap. Not thread-safe: use it from one thread or event loop.

    `keep_visits` completed visits are kept per prompt: the oldest draft age a policy reads (1 for every built-in
    but `delayed`, which needs 2). Keeping more costs memory and buys nothing.

    The cap holds after every call: `nbytes` (`stats`' "bytes") never exceeds `max_bytes` once a `claim`, `commit` or
    `load` returns. A claim of a new prompt adds its entry and evicts as a commit does, whether or not its samples
    ever commit (a rollout killed after its claims); the prompt just used goes last, and a prompt whose drafts alone
    exceed the cap is not kept.
    """

    def __init__(self, max_bytes: int = 4 << 30, keep_visits: int = 1):
        if max_bytes <= 0:
            raise ValueError(f"draft cache max_bytes must be > 0, got {max_bytes}")
        if not 1 <= keep_visits <= MAX_DRAFT_AGE:
            raise ValueError(f"draft cache keep_visits must be in [1, {MAX_DRAFT_AGE}], got {keep_visits}")
        self.max_bytes = int(max_bytes)
        self.keep_visits = keep_visits
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self.nbytes = 0
        self.evicted_prompts = 0
        self.claims = 0  # claim calls
        self.hits = 0  # claims that returned a draft
        self.commits = 0

    def __len__(self) -> int:
        return len(self._entries)

    def _touch(self, key: bytes) -> _Entry:
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry()
            self.nbytes += entry.nbytes
        else:
            self._entries.move_to_end(key)
        return entry

    def _open_visit(self, entry: _Entry, visit_id: str) -> _StoredVisit:
        if entry.open_visit_id == visit_id:
            return entry.visits[-1]
        for visit in entry.visits:  # a late commit to a visit that has since been completed
            if visit.visit_id == visit_id:
                return visit
        number = entry.visits[-1].number + 1 if entry.visits else 0
        visit = _StoredVisit(visit_id=visit_id, number=number)
        entry.visits.append(visit)
        entry.open_visit_id = visit_id
        self._trim(entry, self.keep_visits + 1)
        return visit

    def _trim(self, entry: _Entry, visits: int) -> None:
        """Drop the oldest visits of an entry beyond `visits`."""
        while len(entry.visits) > visits:
            freed = sum(d.nbytes for d in entry.visits.pop(0).responses)
            entry.nbytes -= freed
            self.nbytes -= freed

    def claim(self, key: bytes, visit_id: str, age: int = 1, count: int = 1, history: int = 1) -> list[Draft | None]:
        """Drafts for `count` samples of visit `visit_id`, in slot order, from the completed visit `age` visits back,
        distinct from the drafts given to the visit's other samples (None where there is none); with `history` > 1,
        followed by every response of the `history - 1` completed visits before that one (newest first), which a
        proposal over the prompt's history (`lossless`'s tree) draws on too. Every draft store's `claim` answers so."""
        drafts = [self._claim_one(key, visit_id, age) for _ in range(count)]
        if history > 1:
            entry = self._touch(key)
            visit = self._open_visit(entry, visit_id)
            completed = [v for v in entry.visits if v is not visit and v.number < visit.number]
            for back in range(age + 1, age + history):
                if back <= len(completed):
                    drafts.extend(completed[-back].responses)
        self._evict(keep=key)  # a new prompt's entry counts at once: its commits may never come
        return drafts

    def _claim_one(self, key: bytes, visit_id: str, age: int) -> Draft | None:
        self.claims += 1
        entry = self._touch(key)
        visit = self._open_visit(entry, visit_id)
        completed = [v for v in entry.visits if v is not visit and v.number < visit.number]
        if age < 1 or len(completed) < age:
            return None
        source = completed[-age]
        slot = visit.claims
        visit.claims += 1
        if slot >= len(source.responses):
            return None
        self.hits += 1
        return source.responses[slot]

    def commit(self, key: bytes, visit_id: str, draft: Draft) -> None:
        """Record a finished sample of visit `visit_id`; it can serve as a draft once that visit is completed."""
        self.commits += 1
        entry = self._touch(key)
        visit = self._open_visit(entry, visit_id)
        draft = draft.numbered(visit.number, len(visit.responses))
        visit.responses.append(draft)
        entry.nbytes += draft.nbytes
        self.nbytes += draft.nbytes
        self._evict(keep=key)

    def drafts(self, key: bytes) -> list[Draft]:
        """Every response kept for a prompt, oldest visit first (read-only; does not count as a use)."""
        entry = self._entries.get(key)
        return [] if entry is None else [draft for visit in entry.visits for draft in visit.responses]

    def _evict(self, keep: bytes | None = None) -> None:
        """Drop the least recently used prompts until the cache is within its cap; `keep` (the prompt just used) goes
        last, and only if it alone exceeds the cap."""
        while self.nbytes > self.max_bytes and self._entries:
            key = next(iter(self._entries))
            if key == keep and len(self._entries) > 1:
                self._entries.move_to_end(key)
                continue
            self.nbytes -= self._entries.pop(key).nbytes
            self.evicted_prompts += 1

    def raw_bytes(self) -> int:
        """The per-token arrays held, without any overhead (walks every draft: for benchmarks)."""
        return sum(
            d.nbytes - DRAFT_OVERHEAD_BYTES for e in self._entries.values() for v in e.visits for d in v.responses
        )

    def stats(self) -> dict[str, float]:
        return {
            "prompts": len(self._entries),
            "bytes": self.nbytes,
            "max_bytes": self.max_bytes,
            "evicted_prompts": self.evicted_prompts,
            "claims": self.claims,
            "hits": self.hits,
            "commits": self.commits,
        }

    # ---- persistence -------------------------------------------------------------------------------------------

    def save(self, path: str | Path) -> Path:
        """Write the cache to `path` atomically (a temporary file, then rename)."""
        keys, visit_entry, visit_number, response_visit, finish = [], [], [], [], []
        drafts: list[Draft] = []
        for entry_index, (key, entry) in enumerate(self._entries.items()):
            keys.append(np.frombuffer(key, dtype=np.uint8))
            for visit in entry.visits[-MAX_DRAFT_AGE:]:
                visit_entry.append(entry_index)
                visit_number.append(visit.number)
                for draft in visit.responses:
                    response_visit.append(len(visit_number) - 1)
                    finish.append(FINISH_REASONS.index(draft.finish_reason))
                    drafts.append(draft)
        header = json.dumps({"format": FORMAT_NAME, "version": FORMAT_VERSION}).encode()
        arrays = {
            "header": np.frombuffer(header, dtype=np.uint8),
            "keys": np.stack(keys) if keys else np.zeros((0, 16), np.uint8),
            "visit_entry": np.asarray(visit_entry, np.int64),
            "visit_number": np.asarray(visit_number, np.int64),
            "response_visit": np.asarray(response_visit, np.int64),
            "response_finish": np.asarray(finish, np.uint8),
            **pack_drafts(drafts),
        }
        return write_npz(path, arrays)

    def load(self, path: str | Path, *, shard: tuple[int, int] = (0, 1)) -> bool:
        """Merge the drafts saved at `path` (only the keys of `shard` = (index, count)) into this cache.

        A missing, corrupt or foreign file logs a warning and leaves the cache as it was (a cold start).
        Returns whether anything was loaded.
        """
        path = Path(path)
        try:
            loaded = _read_cache_file(path)
        except FileNotFoundError:
            logger.warning("draft cache %s does not exist; starting cold", path)
            return False
        except Exception as error:  # corrupt or foreign: never crash a run over a cache file
            logger.warning("draft cache %s is unreadable (%s: %s); starting cold", path, type(error).__name__, error)
            return False
        index, count = shard
        for key, visits in loaded.items():
            if shard_of(key, count) != index:
                continue
            entry = self._touch(key)
            for number, drafts in visits:
                visit = _StoredVisit(visit_id=None, number=number, responses=drafts)
                entry.visits.append(visit)
                added = sum(d.nbytes for d in drafts)
                entry.nbytes += added
                self.nbytes += added
            entry.visits.sort(key=lambda v: v.number)
            self._trim(entry, self.keep_visits)
        self._evict()
        return bool(loaded)


def write_npz(path: str | Path, arrays: dict, *, compress: bool = False) -> Path:
    """Write `.npz` atomically: a temporary file in the same folder, flushed to disk, then renamed over `path`. A
    failure leaves any earlier file as it was and no temporary file behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            (np.savez_compressed if compress else np.savez)(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def pack_drafts(drafts: list[Draft]) -> dict[str, np.ndarray]:
    """Drafts as flat arrays (one file layout for the cache and the traces); `unpack_drafts` reverses it."""
    lengths = np.array([len(d) for d in drafts], np.int64)
    top_k = np.array([d.top_k for d in drafts], np.int64)

    def flat(name, dtype):
        parts = [getattr(d, name).reshape(-1) for d in drafts if getattr(d, name) is not None]
        return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)

    return {
        "response_length": lengths,
        "response_top_k": top_k,
        "tokens": flat("token_ids", np.int32),
        "logprobs": flat("logprobs", np.float32),
        "gen_logprobs": flat("gen_logprobs", np.float32),
        "ages": flat("ages", np.uint16),
        "top_ids": flat("top_ids", np.int32),
        "top_logprobs": flat("top_logprobs", np.float32),
    }


def unpack_drafts(a: dict[str, np.ndarray], finish: np.ndarray) -> list[Draft]:
    """The drafts of `pack_drafts`' arrays (with `finish` codes). Arrays of format version 1 (token ids and logprobs
    only) load too: p_gen then defaults to the stored logprobs and every age to 0. Raises ValueError on arrays that
    do not fit together."""
    lengths = np.asarray(a["response_length"], np.int64)
    top_k = np.asarray(a.get("response_top_k", np.zeros(len(lengths), np.int64)), np.int64)
    total = int(lengths.sum()) if len(lengths) else 0
    if (lengths < 0).any() or (top_k < 0).any() or len(top_k) != len(lengths) or len(finish) != len(lengths):
        raise ValueError("bad response lengths")
    if (np.asarray(finish) >= len(FINISH_REASONS)).any():
        raise ValueError("bad finish codes")
    per_token = {name: a[name] for name in ("tokens", "logprobs", "gen_logprobs", "ages") if name in a}
    if any(len(v) != total for v in per_token.values()) or len(per_token) < 2:
        raise ValueError("inconsistent array sizes")
    top_total = int((lengths * top_k).sum())
    if top_total and (len(a["top_ids"]) != top_total or len(a["top_logprobs"]) != top_total):
        raise ValueError("inconsistent top-k array sizes")
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    top_offsets = np.concatenate([[0], np.cumsum(lengths * top_k)])
    drafts = []
    for r in range(len(lengths)):
        lo, hi = offsets[r], offsets[r + 1]
        top = (None, None)
        if top_k[r]:
            t_lo, t_hi, shape = top_offsets[r], top_offsets[r + 1], (int(lengths[r]), int(top_k[r]))
            top = (a["top_ids"][t_lo:t_hi].reshape(shape).copy(), a["top_logprobs"][t_lo:t_hi].reshape(shape).copy())
        drafts.append(
            Draft(
                a["tokens"][lo:hi].copy(),
                a["logprobs"][lo:hi].copy(),
                FINISH_REASONS[int(finish[r])],
                gen_logprobs=a["gen_logprobs"][lo:hi].copy() if "gen_logprobs" in a else None,
                ages=a["ages"][lo:hi].copy() if "ages" in a else None,
                top_ids=top[0],
                top_logprobs=top[1],
            )
        )
    return drafts


def _read_cache_file(path: Path) -> dict[bytes, list[tuple[int, list[Draft]]]]:
    raw = path.read_bytes()
    with np.load(io.BytesIO(raw), allow_pickle=False) as data:
        header = json.loads(bytes(data["header"]).decode())
        if header.get("format") != FORMAT_NAME:
            raise ValueError(f"not a draft cache (format {header.get('format')!r})")
        if header.get("version") not in (1, FORMAT_VERSION):
            raise ValueError(f"format version {header.get('version')!r}, this build reads 1 to {FORMAT_VERSION}")
        a = {name: data[name] for name in data.files}
    keys = a["keys"]
    if keys.ndim != 2 or keys.shape[1] != 16:
        raise ValueError("inconsistent key array")
    if len(a["visit_entry"]) and (a["visit_entry"].max() >= len(keys) or a["visit_entry"].min() < 0):
        raise ValueError("visit refers to a missing prompt")
    if len(a["response_visit"]) and (
        a["response_visit"].max() >= len(a["visit_number"]) or a["response_visit"].min() < 0
    ):
        raise ValueError("response refers to a missing visit")
    if len(a["response_visit"]) != len(a["response_length"]):
        raise ValueError("inconsistent response arrays")
    drafts = unpack_drafts(a, a["response_finish"])
    visits: list[list[Draft]] = [[] for _ in a["visit_number"]]
    for draft, visit_index in zip(drafts, a["response_visit"]):
        visits[visit_index].append(draft.numbered(int(a["visit_number"][visit_index]), len(visits[visit_index])))
    out: dict[bytes, list[tuple[int, list[Draft]]]] = {}
    for v, entry_index in enumerate(a["visit_entry"]):
        out.setdefault(bytes(keys[entry_index]), []).append((int(a["visit_number"][v]), visits[v]))
    return out
