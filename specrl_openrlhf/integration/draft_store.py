"""The draft cache as named Ray actors, shared by every vLLM engine of a run.

The same prompt meets a different engine on its next visit, so drafts live outside the engines: in
`num_shards` actors named `specrl_draft_cache_{i}`, a prompt's shard chosen by its key.
The run's settings travel through Ray's key-value store, so that an executor built with no arguments (as OpenRLHF
builds agent executors) finds them, even when the cache actors have died.

Faults: a shard that dies is restarted by Ray. On restart it reloads the drafts saved with the run's latest
checkpoint (or those the run started from) and counts the restart; samples in flight during the outage are
generated normally, and reuse resumes from the next visit of each prompt.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path

import ray

from ..cache import Draft, DraftCache, shard_of

logger = logging.getLogger(__name__)

ACTOR_PREFIX = "specrl_draft_cache_"
CACHE_DIRNAME = "specrl_draft_cache"
# Names one run's settings and shards when several runs share a Ray job (the CPU quickstart runs two side by side);
# set on the rollout actors' runtime env. Empty in a normal OpenRLHF run.
RUN_ENV = "SPECRL_OPENRLHF_RUN"
# Share of the memory cap for drafts of follow-up turns (an agent's 2nd, 3rd... `generate` call for one sample):
# their prompts recur only when the earlier turns were fully reused, so they must not crowd out first-turn drafts.
FOLLOW_UP_SHARE = 0.25
CALL_TIMEOUT_S = 60.0


def current_run() -> str:
    return os.environ.get(RUN_ENV, "")


def actor_name(shard: int, run: str = "") -> str:
    return f"{ACTOR_PREFIX}{run + '_' if run else ''}{shard}"


def shard_file(directory: str | Path, shard: int, num_shards: int) -> Path:
    return Path(directory) / f"drafts-{shard:03d}-of-{num_shards:03d}.npz"


def _kv_key(kind: str, run: str) -> bytes:
    return f"specrl_openrlhf:{kind}:{ray.get_runtime_context().get_job_id()}:{run}".encode()


def _kv_get(kind: str, run: str) -> bytes | None:
    from ray.experimental import internal_kv

    return internal_kv._internal_kv_get(_kv_key(kind, run))


def _kv_put(kind: str, run: str, value: bytes) -> None:
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(_kv_key(kind, run), value, overwrite=True)


def publish_settings(settings: dict, run: str = "") -> None:
    """Store the run's settings in Ray's key-value store (GCS): they outlive any actor, so executors can still
    build the user's reward path and generate normally if the cache actors die."""
    _kv_put("settings", run, json.dumps(settings).encode())


def read_settings(run: str | None = None) -> dict:
    raw = _kv_get("settings", current_run() if run is None else run)
    if raw is None:
        raise RuntimeError("no specrl-openrlhf settings in this Ray job; start runs with specrl_openrlhf.cli")
    return json.loads(raw)


def publish_drafts_dir(directory: str | Path | None, run: str = "") -> None:
    """Where a restarted shard reloads drafts from: the latest checkpoint's, or the directory the run started from."""
    _kv_put("drafts_dir", run, json.dumps(None if directory is None else str(directory)).encode())


def _drafts_dir(run: str) -> str | None:
    raw = _kv_get("drafts_dir", run)
    return None if raw is None else json.loads(raw)


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)
class DraftCacheActor:
    """One shard of the run's draft cache. Async methods: calls are served one at a time on its event loop.

    `max_task_retries=0`: a call that meets a dead shard fails at once, so its sample is generated normally instead
    of waiting for the restart.
    """

    def __init__(self, shard: int, num_shards: int, max_bytes: int, run: str = "", keep_visits: int = 1):
        self.shard, self.num_shards, self.run = shard, num_shards, run
        follow_up_bytes = max(int(max_bytes * FOLLOW_UP_SHARE), 1)
        self.caches = {
            False: DraftCache(max(max_bytes - follow_up_bytes, 1), keep_visits),
            True: DraftCache(follow_up_bytes, keep_visits),
        }
        self.restarts = int(json.loads(_kv_get(f"starts{shard}", run) or b"0"))
        _kv_put(f"starts{shard}", run, json.dumps(self.restarts + 1).encode())
        source = _drafts_dir(run)
        if source:
            for path in sorted(Path(source).glob("drafts-*.npz")):  # any former shard count
                self.caches[False].load(path, shard=(shard, num_shards))
            logger.info("draft cache shard %d: %d prompts loaded from %s", shard, len(self.caches[False]), source)
        if self.restarts:
            logger.warning("draft cache shard %d restarted (%d restarts so far)", shard, self.restarts)

    async def claim(self, key: bytes, visit_id: str, age: int, follow_up: bool = False) -> tuple[Draft | None, int]:
        """(the draft, this shard's restart count)."""
        return self.caches[follow_up].claim(key, visit_id, age), self.restarts

    async def commit(self, key: bytes, visit_id: str, draft: Draft, follow_up: bool = False) -> None:
        self.caches[follow_up].commit(key, visit_id, draft)

    async def save(self, directory: str) -> str:
        return str(self.caches[False].save(shard_file(directory, self.shard, self.num_shards)))

    async def stats(self) -> dict:
        """The first-turn cache's counters, with the follow-up turns' cache under "follow_up"."""
        return {**self.caches[False].stats(), "follow_up": self.caches[True].stats(), "restarts": self.restarts}


def create_draft_cache(
    settings: dict,
    *,
    num_shards: int,
    max_bytes: int,
    load_dir: str | None = None,
    run: str = "",
    keep_visits: int = 1,
) -> list[ray.actor.ActorHandle]:
    """Publish the settings, start the shards (named, so any process of this Ray job can find them) and wait
    until they are up. `keep_visits`: the policy's draft age (completed visits kept per prompt)."""
    publish_settings(settings, run)
    publish_drafts_dir(load_dir, run)
    for shard in range(num_shards):
        _kv_put(f"starts{shard}", run, b"0")
    shards = [
        DraftCacheActor.options(name=actor_name(i, run), get_if_exists=False).remote(
            i, num_shards, max(max_bytes // num_shards, 1), run, keep_visits
        )
        for i in range(num_shards)
    ]
    ray.get([s.stats.remote() for s in shards])
    return shards


def save_draft_cache(shards, directory: str | Path, run: str = "") -> list[str]:
    """Save every shard under `directory` (one file each, written atomically); restarted shards reload from it."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    paths = ray.get([s.save.remote(str(directory)) for s in shards])
    publish_drafts_dir(directory, run)
    return paths


class RayDraftStore:
    """Async claim/commit against the shards, for `AsyncSpeculativeGenerator`. Shards are looked up by name on
    first use and again after a failure, so a store built while a shard was down recovers once it is back."""

    def __init__(self, num_shards: int, run: str = ""):
        self.num_shards, self.run = num_shards, run
        self._handles: dict[int, ray.actor.ActorHandle] = {}
        self._restarts: dict[int, int] = {}

    @property
    def restarts(self) -> int:
        """Shard restarts seen so far, over all shards."""
        return sum(self._restarts.values())

    def _shard(self, key: bytes) -> tuple[int, ray.actor.ActorHandle]:
        shard = shard_of(key, self.num_shards)
        if shard not in self._handles:
            self._handles[shard] = ray.get_actor(actor_name(shard, self.run))
        return shard, self._handles[shard]

    async def _call(self, key: bytes, method: str, *args):
        shard, handle = self._shard(key)
        try:
            return await asyncio.wait_for(getattr(handle, method).remote(key, *args), timeout=CALL_TIMEOUT_S)
        except Exception:
            self._handles.pop(shard, None)
            raise

    async def claim(self, key: bytes, visit_id: str, age: int, follow_up: bool = False) -> Draft | None:
        shard = shard_of(key, self.num_shards)
        draft, self._restarts[shard] = await self._call(key, "claim", visit_id, age, follow_up)
        return draft

    async def commit(self, key: bytes, visit_id: str, draft: Draft, follow_up: bool = False) -> None:
        await self._call(key, "commit", visit_id, draft, follow_up)
