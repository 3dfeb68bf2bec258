"""A run's reuse actors on Ray: its settings and shared state (`ReuseRun`), and the draft cache shards.

The same prompt meets a different engine on its next visit, so drafts live outside the engines: in `num_shards`
actors named `specrl_draft_cache_{i}`, a prompt's shard chosen by its key. One more named actor, `ReuseRun`, holds
what every process of the run shares: the settings an executor (built with no arguments, as OpenRLHF builds agent
executors) needs to build the user's reward path and our rollout, where drafts are saved, how often each shard
started, and the coordinator of a rule that keeps state. Every name carries the run's `RUN_ENV` value, so several
runs can share one Ray job (the CPU quickstart trains them side by side).

Faults: a shard that dies is restarted by Ray; on restart it reloads the drafts saved with the run's latest checkpoint
(or those the run started from) and counts the restart. Samples in flight during the outage are generated normally,
and reuse resumes from the next visit of each prompt. `ReuseRun` is restarted too, with its settings (they are its
constructor's arguments, which Ray replays); what it learned since (the latest checkpoint's drafts, the restart
counts, an adaptive rule's state) starts over, as docs/reliability.md says.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import pickle
from dataclasses import dataclass
from pathlib import Path

import ray

from ...cache import DraftCache, shard_of
from ...config import ReuseConfig
from ...draft import Draft

logger = logging.getLogger(__name__)

ACTOR_PREFIX = "specrl_draft_cache_"
RUN_ACTOR = "specrl_openrlhf_run"
CACHE_DIRNAME = "specrl_draft_cache"
# Names one run's actors when several runs share a Ray job (the CPU quickstart runs them side by side); set on the
# rollout actors' runtime env. Empty in a normal OpenRLHF run.
RUN_ENV = "SPECRL_OPENRLHF_RUN"
# Share of the memory cap for drafts of follow-up turns (an agent's 2nd, 3rd... `generate` call for one sample):
# their prompts recur only when the earlier turns were fully reused, so they must not crowd out first-turn drafts.
FOLLOW_UP_SHARE = 0.25
CALL_TIMEOUT_S = 60.0
TRIM_EVERY_COMMITS = 128  # commit calls between returns of freed memory to the system
# Commits wait this long (or for the next claim of their shard) to leave together: a few calls per step, not one per
# sample, so the shard's process wakes seldom while the engines generate. A killed engine loses what waits.
COMMIT_DELAY_S = 0.1


def packed(drafts) -> bytes:
    """Drafts (in any picklable structure) as one in-band pickle for a Ray call. Ray serialises each numpy array as
    a buffer of its own, 4-6 per draft: in the quickstart's profile, sending commits took 1.15 s of the rollout
    actor's CPU per 100 s (docs/benchmarks.md, 'Draft cache at the paper's scale'); one pickle of the batch is one
    buffer."""
    return pickle.dumps(drafts, protocol=pickle.HIGHEST_PROTOCOL)


def unpacked(payload: bytes):
    """The drafts of `packed` (the run's own actors sent them)."""
    return pickle.loads(payload)


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


def run_actor_name(run: str = "") -> str:
    return f"{RUN_ACTOR}{'_' + run if run else ''}"


def shard_file(directory: str | Path, shard: int, num_shards: int) -> Path:
    return Path(directory) / f"drafts-{shard:03d}-of-{num_shards:03d}.npz"


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)
class ReuseRun:
    """A run's settings and the state its processes share (see the module docstring)."""

    def __init__(self, settings: dict, drafts_dir: str | None = None):
        self._settings = settings
        self.drafts_dir = drafts_dir  # where a (re)starting shard loads drafts from
        self.shard_starts: dict[int, int] = {}
        self.coordinator = None  # a stateful rule's authoritative `FeedbackCoordinator`, built on use

    def settings(self) -> dict:
        return self._settings

    def shard_started(self, shard: int) -> tuple[int, str | None]:
        """A shard (re)starts: (its restarts so far, where to load drafts from)."""
        restarts = self.shard_starts.get(shard, 0)
        self.shard_starts[shard] = restarts + 1
        return restarts, self.drafts_dir

    def set_drafts_dir(self, directory: str | None) -> None:
        self.drafts_dir = directory

    def report(self, feedback: dict[str, float], samples: int) -> dict[str, float]:
        """A stateful rule's feedback from one engine; returns the rule's state for every engine to load."""
        if self.coordinator is None:
            # Imported here: the policies import torch, which the shards (this module's other actors) never need.
            from ...policies.stateful import FeedbackCoordinator

            config = ReuseConfig.from_json(self._settings["reuse_config"])
            self.coordinator = FeedbackCoordinator(config.build_policy(), int(self._settings["update_every"]))
        return self.coordinator.report(feedback, samples)


def run_actor(run: str | None = None):
    """The `ReuseRun` of this process's run (by name)."""
    return ray.get_actor(run_actor_name(current_run() if run is None else run))


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
        self.commit_calls = 0
        try:
            self.restarts, source = ray.get(run_actor(run).shard_started.remote(shard), timeout=CALL_TIMEOUT_S)
        except Exception as error:  # without the run's actor the shard still serves, cold
            logger.warning("draft cache shard %d: the run's actor is unreachable (%s); starting cold", shard, error)
            self.restarts, source = 0, None
        if source:
            for path in sorted(Path(source).glob("drafts-*.npz")):  # any former shard count
                self.caches[False].load(path, shard=(shard, num_shards))
            logger.info("draft cache shard %d: %d prompts loaded from %s", shard, len(self.caches[False]), source)
        if self.restarts:
            logger.warning("draft cache shard %d restarted (%d restarts so far)", shard, self.restarts)

    async def claim(self, payload: bytes) -> tuple[bytes, int]:
        """Claims of several visits at once: `packed` (key, visit id, age, count, follow_up, history) tuples. Returns
        (the `packed` list of their drafts, each as `DraftCache.claim` gives it; this shard's restart count)."""
        claims = unpacked(payload)
        return packed([self.caches[c[4]].claim(c[0], c[1], c[2], c[3], c[5]) for c in claims]), self.restarts

    async def commit(self, payload: bytes) -> None:
        """Store finished samples: `packed` (key, visit id, draft, follow_up) tuples."""
        for key, visit_id, draft, follow_up in unpacked(payload):
            # Ray may hand a large argument over as a read-only view of its shared object store, and an unpickled
            # array may view the payload: a copy keeps the cache out of both.
            self.caches[follow_up].commit(key, visit_id, draft.copy())
        self.commit_calls += 1
        if self.commit_calls % TRIM_EVERY_COMMITS == 0:
            _return_free_memory()

    async def save(self, directory: str) -> str:
        return str(self.caches[False].save(shard_file(directory, self.shard, self.num_shards)))

    async def stats(self) -> dict:
        """The first-turn cache's counters, with the follow-up turns' cache under "follow_up"."""
        return {**self.caches[False].stats(), "follow_up": self.caches[True].stats(), "restarts": self.restarts}

    async def memory(self) -> tuple[int, int]:
        """(memory this shard alone holds, the raw per-token bytes of its drafts). The first is the unique set size:
        Ray's shared object store pages are not counted."""
        import psutil

        return psutil.Process().memory_full_info().uss, self.caches[False].raw_bytes()


@dataclass
class ReuseActors:
    """A run's `ReuseRun` and cache shards, as started by `start_reuse`. Keep it: Ray ends an actor (not detached)
    when its last handle goes."""

    run: object
    shards: list
    run_name: str = ""

    @property
    def handles(self) -> list:
        return [self.run, *self.shards]

    def save(self, directory: str | Path) -> list[str]:
        """Save every shard under `directory` (one file each, written atomically); restarted shards reload from it."""
        Path(directory).mkdir(parents=True, exist_ok=True)
        paths = ray.get([s.save.remote(str(directory)) for s in self.shards])
        ray.get(self.run.set_drafts_dir.remote(str(directory)))
        return paths


def start_reuse(
    settings: dict, config: ReuseConfig, *, load_dir: str | None = None, run: str = "", policy=None
) -> ReuseActors:
    """Start the run's `ReuseRun` (named, `get_if_exists`: one per run in the Ray job) and its cache shards (named,
    so any process of the job finds them), and wait until they are up (`policy`: the config's rule, if built)."""
    name = run_actor_name(run)
    handle = ReuseRun.options(name=name, get_if_exists=True).remote(settings, load_dir)
    if ray.get(handle.settings.remote()) != settings:  # a finished run's actor under this name: replace it
        ray.kill(handle, no_restart=True)
        handle = ReuseRun.options(name=name).remote(settings, load_dir)
    policy = config.build_policy() if policy is None else policy
    num_shards, keep_visits = config.cache_shards, policy.visits_kept
    shards = [
        DraftCacheActor.options(name=actor_name(i, run)).remote(
            i, num_shards, max(config.cache_max_bytes // num_shards, 1), run, keep_visits
        )
        for i in range(num_shards)
    ]
    ray.get([s.stats.remote() for s in shards])
    return ReuseActors(handle, shards, run)


class CallBatcher:
    """Coalesces calls to one shard: items leave together once `max_items` are waiting or `delay_s` after the first,
    as one actor call (`send(items)` -> one result per item, or None for all). Each item's future gets its result, or
    the call's error."""

    def __init__(self, send, max_items: int = 64, delay_s: float = 0.005):
        self.send, self.max_items, self.delay_s = send, max_items, delay_s
        self._waiting: list[tuple[tuple, asyncio.Future]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._in_flight: set[asyncio.Future] = set()  # calls sent and not yet answered

    def submit(self, item: tuple) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self._waiting.append((item, done))
        if len(self._waiting) >= self.max_items:
            self.flush()
        elif self._timer is None:
            self._timer = loop.call_later(self.delay_s, self.flush)
        return done

    def flush(self) -> None:
        """Send what waits now."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        waiting, self._waiting = self._waiting, []
        if not waiting:
            return

        def settle(task: asyncio.Future) -> None:
            results = None if task.cancelled() or task.exception() is not None else task.result()
            for index, (_, done) in enumerate(waiting):
                if done.done():
                    continue
                if task.cancelled():
                    done.cancel()
                elif task.exception() is not None:
                    done.set_exception(task.exception())
                else:
                    done.set_result(None if results is None else results[index])

        sent = asyncio.ensure_future(self.send([item for item, _ in waiting]))
        sent.add_done_callback(settle)
        self._in_flight.add(sent)
        sent.add_done_callback(self._in_flight.discard)

    async def drain(self) -> None:
        """Send what waits, and return once every call sent so far has been answered (or has failed: its items'
        futures carry that)."""
        self.flush()
        if self._in_flight:
            await asyncio.wait(list(self._in_flight))


class RayDraftStore:
    """Async claim/commit against the shards, for `AsyncSpeculativeGenerator`. Claims of the visits that start
    together (a step's prompts) leave as one call per shard; a sample does not wait for its commit: commits are
    coalesced per shard (for up to `COMMIT_DELAY_S`). A claim waits until its shard has answered every commit sent
    before it, so a prompt's next visit finds them: Ray runs an async actor's calls out of order, so sending them
    first is not enough. A commit that fails is counted in `lost_commits`. Shards are looked up by name on first use
    and again after a failure, so a store built while a shard was down recovers once it is back, and one whose shard
    was replaced (killed and started again under its name) moves to the new one at once."""

    def __init__(self, num_shards: int, run: str = "", claim_delay_s: float = 0.002):
        self.num_shards, self.run = num_shards, run
        self._handles: dict[int, ray.actor.ActorHandle] = {}
        self._restarts: dict[int, int] = {}
        self._commits = {
            shard: CallBatcher(functools.partial(self._send, shard), max_items=256, delay_s=COMMIT_DELAY_S)
            for shard in range(num_shards)
        }
        self._claims = {
            shard: CallBatcher(functools.partial(self._claim, shard), delay_s=claim_delay_s)
            for shard in range(num_shards)
        }
        self.lost_commits = 0

    @property
    def restarts(self) -> int:
        """Shard restarts seen so far, over all shards."""
        return sum(self._restarts.values())

    async def _call(self, shard: int, method: str, *args, retry: bool = True):
        if shard not in self._handles:
            self._handles[shard] = ray.get_actor(actor_name(shard, self.run))
        try:
            return await asyncio.wait_for(getattr(self._handles[shard], method).remote(*args), timeout=CALL_TIMEOUT_S)
        except ray.exceptions.RayActorError:
            # The shard we knew is gone for good (Ray restarts keep a handle alive); a new one under its name serves
            # this call. None: the call fails and its sample is generated normally.
            self._handles.pop(shard, None)
            if not retry:
                raise
            return await self._call(shard, method, *args, retry=False)
        except Exception:
            self._handles.pop(shard, None)
            raise

    async def _send(self, shard: int, items: list) -> None:
        await self._call(shard, "commit", packed(items))

    async def _claim(self, shard: int, items: list) -> list:
        drafts, self._restarts[shard] = await self._call(shard, "claim", packed(items))
        return unpacked(drafts)

    async def claim(
        self, key: bytes, visit_id: str, age: int, count: int, follow_up: bool = False, history: int = 1
    ) -> list:
        shard = shard_of(key, self.num_shards)
        await self._commits[shard].drain()
        return await self._claims[shard].submit((key, visit_id, age, count, follow_up, history))

    async def commit(self, key: bytes, visit_id: str, draft: Draft, follow_up: bool = False) -> None:
        """Queue a finished sample's draft; returns at once (see the class docstring)."""
        sent = self._commits[shard_of(key, self.num_shards)].submit((key, visit_id, draft, follow_up))
        sent.add_done_callback(self._count_loss)

    def _count_loss(self, sent: asyncio.Future) -> None:
        if sent.cancelled() or sent.exception() is not None:
            self.lost_commits += 1

    async def report(self, feedback: dict[str, float], samples: int) -> dict[str, float]:
        """A stateful rule's feedback, to the run's coordinator (`ReuseRun`); the answer is the rule's state."""
        return await asyncio.wait_for(run_actor(self.run).report.remote(feedback, samples), timeout=CALL_TIMEOUT_S)
