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

logger = logging.getLogger(__name__)

FORMAT_NAME = "specrl-draft-cache"
FORMAT_VERSION = 1
MAX_DRAFT_AGE = 2  # the `delayed` policy reads drafts from two visits back
FINISH_REASONS = ("stop", "length", "abort")
_ENTRY_OVERHEAD_BYTES = 256  # dict slots, visit lists, key bytes
_DRAFT_OVERHEAD_BYTES = 128  # the Draft object and two array headers


def prompt_key(prompt_token_ids) -> bytes:
    """A 16-byte digest of the prompt's token ids: the cache key."""
    return hashlib.blake2b(np.asarray(prompt_token_ids, dtype=np.int64).tobytes(), digest_size=16).digest()


def shard_of(key: bytes, num_shards: int) -> int:
    return int.from_bytes(key[:8], "little") % num_shards


@dataclass(frozen=True, eq=False)
class Draft:
    """One cached response. `visit` is the per-prompt number of the visit that produced it, `index` its
    position among that visit's responses."""

    token_ids: np.ndarray  # [L] int32
    logprobs: np.ndarray  # [L] float32, logprob of each token under the policy that accepted or sampled it
    finish_reason: str
    visit: int = 0
    index: int = 0

    def __post_init__(self):
        object.__setattr__(self, "token_ids", np.ascontiguousarray(self.token_ids, dtype=np.int32))
        object.__setattr__(self, "logprobs", np.ascontiguousarray(self.logprobs, dtype=np.float32))
        if self.token_ids.shape != self.logprobs.shape or self.token_ids.ndim != 1:
            raise ValueError(f"draft token_ids {self.token_ids.shape} and logprobs {self.logprobs.shape} differ")
        if self.finish_reason not in FINISH_REASONS:
            object.__setattr__(self, "finish_reason", "abort")

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def nbytes(self) -> int:
        return self.token_ids.nbytes + self.logprobs.nbytes + _DRAFT_OVERHEAD_BYTES


@dataclass
class _Visit:
    visit_id: str | None  # None for visits restored from disk
    number: int
    responses: list[Draft] = field(default_factory=list)
    claims: int = 0


@dataclass
class _Entry:
    visits: list[_Visit] = field(default_factory=list)  # oldest first; the last may be the open one
    open_visit_id: str | None = None
    nbytes: int = _ENTRY_OVERHEAD_BYTES


class DraftCache:
    """In-process draft cache with an LRU memory cap. Not thread-safe: use it from one thread or event loop.

    `keep_visits` completed visits are kept per prompt: the oldest draft age a policy reads (1 for every built-in
    but `delayed`, which needs 2). Keeping more costs memory and buys nothing.
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

    def _open_visit(self, entry: _Entry, visit_id: str) -> _Visit:
        if entry.open_visit_id == visit_id:
            return entry.visits[-1]
        for visit in entry.visits:  # a late commit to a visit that has since been completed
            if visit.visit_id == visit_id:
                return visit
        number = entry.visits[-1].number + 1 if entry.visits else 0
        visit = _Visit(visit_id=visit_id, number=number)
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

    def claim(self, key: bytes, visit_id: str, age: int = 1) -> Draft | None:
        """A draft for one sample of visit `visit_id`, from the completed visit `age` visits back, distinct from
        the drafts given to the visit's other samples; None when there is none."""
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

    def claim_many(self, key: bytes, visit_id: str, age: int, count: int) -> list[Draft | None]:
        """`count` claims at once: the drafts of a whole visit's samples, in slot order."""
        return [self.claim(key, visit_id, age) for _ in range(count)]

    def commit(self, key: bytes, visit_id: str, draft: Draft) -> None:
        """Record a finished sample of visit `visit_id`; it can serve as a draft once that visit is completed."""
        self.commits += 1
        entry = self._touch(key)
        visit = self._open_visit(entry, visit_id)
        draft = Draft(draft.token_ids, draft.logprobs, draft.finish_reason, visit.number, len(visit.responses))
        visit.responses.append(draft)
        entry.nbytes += draft.nbytes
        self.nbytes += draft.nbytes
        self._evict(keep=key)

    def drafts(self, key: bytes) -> list[Draft]:
        """Every response kept for a prompt, oldest visit first (read-only; does not count as a use)."""
        entry = self._entries.get(key)
        return [] if entry is None else [draft for visit in entry.visits for draft in visit.responses]

    def _evict(self, keep: bytes | None = None) -> None:
        while self.nbytes > self.max_bytes and len(self._entries) > (1 if keep in self._entries else 0):
            key, entry = next(iter(self._entries.items()))
            if key == keep:
                self._entries.move_to_end(key)
                continue
            del self._entries[key]
            self.nbytes -= entry.nbytes
            self.evicted_prompts += 1

    def raw_bytes(self) -> int:
        """The token ids and logprobs held, without any overhead (walks every draft: for benchmarks)."""
        return sum(
            d.token_ids.nbytes + d.logprobs.nbytes
            for e in self._entries.values()
            for v in e.visits
            for d in v.responses
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
        path = Path(path)
        keys, visit_entry, visit_number, response_visit, lengths, finish = [], [], [], [], [], []
        tokens, logprobs = [], []
        for entry_index, (key, entry) in enumerate(self._entries.items()):
            keys.append(np.frombuffer(key, dtype=np.uint8))
            for visit in entry.visits[-MAX_DRAFT_AGE:]:
                visit_entry.append(entry_index)
                visit_number.append(visit.number)
                for draft in visit.responses:
                    response_visit.append(len(visit_number) - 1)
                    lengths.append(len(draft))
                    finish.append(FINISH_REASONS.index(draft.finish_reason))
                    tokens.append(draft.token_ids)
                    logprobs.append(draft.logprobs)
        header = json.dumps({"format": FORMAT_NAME, "version": FORMAT_VERSION}).encode()
        arrays = {
            "header": np.frombuffer(header, dtype=np.uint8),
            "keys": np.stack(keys) if keys else np.zeros((0, 16), np.uint8),
            "visit_entry": np.asarray(visit_entry, np.int64),
            "visit_number": np.asarray(visit_number, np.int64),
            "response_visit": np.asarray(response_visit, np.int64),
            "response_length": np.asarray(lengths, np.int64),
            "response_finish": np.asarray(finish, np.uint8),
            "tokens": np.concatenate(tokens) if tokens else np.zeros(0, np.int32),
            "logprobs": np.concatenate(logprobs) if logprobs else np.zeros(0, np.float32),
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
                visit = _Visit(visit_id=None, number=number, responses=drafts)
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


def _read_cache_file(path: Path) -> dict[bytes, list[tuple[int, list[Draft]]]]:
    raw = path.read_bytes()
    with np.load(io.BytesIO(raw), allow_pickle=False) as data:
        header = json.loads(bytes(data["header"]).decode())
        if header.get("format") != FORMAT_NAME:
            raise ValueError(f"not a draft cache (format {header.get('format')!r})")
        if header.get("version") != FORMAT_VERSION:
            raise ValueError(f"format version {header.get('version')!r}, this build reads {FORMAT_VERSION}")
        a = {name: data[name] for name in data.files}
    keys, lengths = a["keys"], a["response_length"]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    if (
        keys.ndim != 2
        or keys.shape[1] != 16
        or offsets[-1] != len(a["tokens"])
        or len(a["tokens"]) != len(a["logprobs"])
    ):
        raise ValueError("inconsistent array sizes")
    if len(a["visit_entry"]) and (a["visit_entry"].max() >= len(keys) or a["visit_entry"].min() < 0):
        raise ValueError("visit refers to a missing prompt")
    if len(a["response_visit"]) and (
        a["response_visit"].max() >= len(a["visit_number"]) or a["response_visit"].min() < 0
    ):
        raise ValueError("response refers to a missing visit")
    if (lengths < 0).any() or (a["response_finish"] >= len(FINISH_REASONS)).any():
        raise ValueError("bad response lengths or finish codes")
    visits: list[list[Draft]] = [[] for _ in a["visit_number"]]
    for r, visit_index in enumerate(a["response_visit"]):
        start, end = offsets[r], offsets[r + 1]
        visits[visit_index].append(
            Draft(
                a["tokens"][start:end].copy(),
                a["logprobs"][start:end].copy(),
                FINISH_REASONS[a["response_finish"][r]],
                int(a["visit_number"][visit_index]),
                len(visits[visit_index]),
            )
        )
    out: dict[bytes, list[tuple[int, list[Draft]]]] = {}
    for v, entry_index in enumerate(a["visit_entry"]):
        out.setdefault(bytes(keys[entry_index]), []).append((int(a["visit_number"][v]), visits[v]))
    return out
