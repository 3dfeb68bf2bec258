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
import functools
import json
import logging
import os
from pathlib import Path

import ray

from ..adaptive import FeedbackCoordinator
from ..cache import Draft, DraftCache, shard_of
from ..config import ReuseConfig

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
TRIM_EVERY_COMMITS = 128  # commit calls between returns of freed memory to the system


def _return_free_memory() -> None:
    """glibc keeps freed small allocations (drafts of evicted visits, claim buffers) for reuse; hand them back, so
    that a shard's footprint follows what it holds."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


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
        self.coordinator: FeedbackCoordinator | None = None  # shard 0 only, built on the first report
        self.commit_calls = 0
        self.restarts = int(json.loads(_kv_get(f"starts{shard}", run) or b"0"))
        _kv_put(f"starts{shard}", run, json.dumps(self.restarts + 1).encode())
        source = _drafts_dir(run)
        if source:
            for path in sorted(Path(source).glob("drafts-*.npz")):  # any former shard count
                self.caches[False].load(path, shard=(shard, num_shards))
            logger.info("draft cache shard %d: %d prompts loaded from %s", shard, len(self.caches[False]), source)
        if self.restarts:
            logger.warning("draft cache shard %d restarted (%d restarts so far)", shard, self.restarts)

    async def claim(
        self, key: bytes, visit_id: str, age: int, count: int, follow_up: bool = False
    ) -> tuple[list[Draft | None], int]:
        """(drafts for `count` samples of the visit, this shard's restart count)."""
        return self.caches[follow_up].claim_many(key, visit_id, age, count), self.restarts

    async def commit(self, items: list[tuple[bytes, str, Draft, bool]]) -> None:
        """Store finished samples, (key, visit id, draft, follow_up) each."""
        for key, visit_id, draft, follow_up in items:
            # Ray hands large arguments over as read-only views of one buffer in its shared object store: a copy
            # keeps the cache out of the object store, which OpenRLHF needs for its own batches.
            draft = Draft(draft.token_ids.copy(), draft.logprobs.copy(), draft.finish_reason)
            self.caches[follow_up].commit(key, visit_id, draft)
        self.commit_calls += 1
        if self.commit_calls % TRIM_EVERY_COMMITS == 0:
            _return_free_memory()

    async def report(self, feedback: dict[str, float], samples: int) -> dict[str, float]:
        """A stateful rule's feedback from one engine (shard 0 coordinates the run's rule); returns its state.
        The state is kept in Ray's key-value store after each update, so a restarted shard carries on from it."""
        if self.coordinator is None:
            settings = read_settings(self.run)
            config = ReuseConfig.from_json(settings["reuse_config"])
            self.coordinator = FeedbackCoordinator(config.build_policy(), int(settings["update_every"]))
            saved = _kv_get("rule_state", self.run)
            if saved is not None:
                self.coordinator.policy.load_state_dict(json.loads(saved))
        updates = self.coordinator.updates
        state = self.coordinator.report(feedback, samples)
        if self.coordinator.updates != updates:
            _kv_put("rule_state", self.run, json.dumps(state).encode())
        return state

    async def save(self, directory: str) -> str:
        return str(self.caches[False].save(shard_file(directory, self.shard, self.num_shards)))

    async def stats(self) -> dict:
        """The first-turn cache's counters, with the follow-up turns' cache under "follow_up"."""
        return {**self.caches[False].stats(), "follow_up": self.caches[True].stats(), "restarts": self.restarts}

    async def memory(self) -> tuple[int, int]:
        """(memory this shard alone holds, the raw token and logprob bytes of its drafts). The first is the unique set
        size: Ray's shared object store pages are not counted."""
        import psutil

        return psutil.Process().memory_full_info().uss, self.caches[False].raw_bytes()


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


class CommitBatcher:
    """Coalesces commits to one shard: they leave together once `max_items` are waiting or `delay_s` after the
    first, as one actor call. Each caller still learns whether its own commit failed."""

    def __init__(self, send, max_items: int = 64, delay_s: float = 0.005):
        self.send, self.max_items, self.delay_s = send, max_items, delay_s
        self._waiting: list[tuple[tuple, asyncio.Future]] = []
        self._timer: asyncio.TimerHandle | None = None

    async def commit(self, item: tuple) -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self._waiting.append((item, done))
        if len(self._waiting) >= self.max_items:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self.delay_s, self._flush)
        await done

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        waiting, self._waiting = self._waiting, []
        if not waiting:
            return

        def settle(task: asyncio.Future) -> None:
            for _, done in waiting:
                if done.done():
                    continue
                if task.cancelled():
                    done.cancel()
                elif task.exception() is not None:
                    done.set_exception(task.exception())
                else:
                    done.set_result(None)

        asyncio.ensure_future(self.send([item for item, _ in waiting])).add_done_callback(settle)


class RayDraftStore:
    """Async claim/commit against the shards, for `AsyncSpeculativeGenerator`: one call per visit to claim its
    drafts, and commits coalesced per shard. Shards are looked up by name on first use and again after a failure,
    so a store built while a shard was down recovers once it is back."""

    def __init__(self, num_shards: int, run: str = ""):
        self.num_shards, self.run = num_shards, run
        self._handles: dict[int, ray.actor.ActorHandle] = {}
        self._restarts: dict[int, int] = {}
        self._batchers = {shard: CommitBatcher(functools.partial(self._send, shard)) for shard in range(num_shards)}

    @property
    def restarts(self) -> int:
        """Shard restarts seen so far, over all shards."""
        return sum(self._restarts.values())

    async def _call(self, shard: int, method: str, *args):
        if shard not in self._handles:
            self._handles[shard] = ray.get_actor(actor_name(shard, self.run))
        try:
            return await asyncio.wait_for(getattr(self._handles[shard], method).remote(*args), timeout=CALL_TIMEOUT_S)
        except Exception:
            self._handles.pop(shard, None)
            raise

    async def _send(self, shard: int, items: list) -> None:
        await self._call(shard, "commit", items)

    async def claim(self, key: bytes, visit_id: str, age: int, count: int, follow_up: bool = False) -> list:
        shard = shard_of(key, self.num_shards)
        drafts, self._restarts[shard] = await self._call(shard, "claim", key, visit_id, age, count, follow_up)
        return drafts

    async def commit(self, key: bytes, visit_id: str, draft: Draft, follow_up: bool = False) -> None:
        await self._batchers[shard_of(key, self.num_shards)].commit((key, visit_id, draft, follow_up))

    async def report(self, feedback: dict[str, float], samples: int) -> dict[str, float]:
        return await self._call(0, "report", feedback, samples)
