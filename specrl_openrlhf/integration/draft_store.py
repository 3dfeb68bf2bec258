"""The draft cache as named Ray actors, shared by every vLLM engine of a run.

The same prompt meets a different engine on its next visit, so drafts live outside the engines: in
`num_shards` actors named `specrl_draft_cache_{i}`, a prompt's shard chosen by its key.
The run's settings travel through Ray's key-value store, so that an executor built with no arguments (as OpenRLHF
builds agent executors) finds them, even when the cache actors have died.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import ray

from ..cache import Draft, DraftCache, shard_of

logger = logging.getLogger(__name__)

ACTOR_PREFIX = "specrl_draft_cache_"
CACHE_DIRNAME = "specrl_draft_cache"


def shard_file(directory: str | Path, shard: int, num_shards: int) -> Path:
    return Path(directory) / f"drafts-{shard:03d}-of-{num_shards:03d}.npz"


@ray.remote(num_cpus=0)
class DraftCacheActor:
    """One shard of the run's draft cache. Async methods: calls are served one at a time on its event loop."""

    def __init__(self, shard: int, num_shards: int, max_bytes: int, load_dir: str | None = None):
        self.shard, self.num_shards = shard, num_shards
        self.cache = DraftCache(max_bytes=max_bytes)
        if load_dir:
            for path in sorted(Path(load_dir).glob("drafts-*.npz")):  # any former shard count
                self.cache.load(path, shard=(shard, num_shards))
            logger.info("draft cache shard %d: %d prompts restored from %s", shard, len(self.cache), load_dir)

    async def claim(self, key: bytes, visit_id: str, age: int) -> Draft | None:
        return self.cache.claim(key, visit_id, age)

    async def commit(self, key: bytes, visit_id: str, draft: Draft) -> None:
        self.cache.commit(key, visit_id, draft)

    async def save(self, directory: str) -> str:
        return str(self.cache.save(shard_file(directory, self.shard, self.num_shards)))

    async def stats(self) -> dict:
        return self.cache.stats()


def _settings_key() -> bytes:
    return f"specrl_openrlhf:settings:{ray.get_runtime_context().get_job_id()}".encode()


def publish_settings(settings: dict) -> None:
    """Store the run's settings in Ray's key-value store (GCS): they outlive any actor, so executors can still
    build the user's reward path and generate normally if the cache actors die."""
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(_settings_key(), json.dumps(settings).encode(), overwrite=True)


def read_settings() -> dict:
    from ray.experimental import internal_kv

    raw = internal_kv._internal_kv_get(_settings_key())
    if raw is None:
        raise RuntimeError("no specrl-openrlhf settings in this Ray job; start runs with specrl_openrlhf.cli")
    return json.loads(raw)


def create_draft_cache(
    settings: dict, *, num_shards: int, max_bytes: int, load_dir: str | None = None
) -> list[ray.actor.ActorHandle]:
    """Publish the settings, start the shards (named, so any process of this Ray job can find them) and wait
    until they are up."""
    publish_settings(settings)
    shards = [
        DraftCacheActor.options(name=f"{ACTOR_PREFIX}{i}", get_if_exists=False).remote(
            i, num_shards, max(max_bytes // num_shards, 1), load_dir
        )
        for i in range(num_shards)
    ]
    ray.get([s.stats.remote() for s in shards])
    return shards


def save_draft_cache(shards, directory: str | Path) -> list[str]:
    """Save every shard under `directory` (one file each, written atomically)."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    return ray.get([s.save.remote(str(directory)) for s in shards])


class RayDraftStore:
    """Async claim/commit against the shards, for `AsyncSpeculativeGenerator`."""

    def __init__(self, shards):
        self.shards = shards

    @classmethod
    def connect(cls, num_shards: int) -> RayDraftStore:
        """Find the run's shards by name."""
        return cls([ray.get_actor(f"{ACTOR_PREFIX}{i}") for i in range(num_shards)])

    def _shard(self, key: bytes):
        return self.shards[shard_of(key, len(self.shards))]

    async def claim(self, key: bytes, visit_id: str, age: int) -> Draft | None:
        return await asyncio.wait_for(self._shard(key).claim.remote(key, visit_id, age), timeout=60)

    async def commit(self, key: bytes, visit_id: str, draft: Draft) -> None:
        await asyncio.wait_for(self._shard(key).commit.remote(key, visit_id, draft), timeout=60)
