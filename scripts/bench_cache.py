"""Benchmark the draft cache actors at the paper's scale: one step is 1024 prompts x 8 samples x up to 4096 tokens.

Engines are simulated by client actors that drive `RayDraftStore` exactly as our executor does: per visit, one
claim for a prompt's 8 samples, then 8 commits (coalesced per shard), every prompt in flight at once. Two visits
run: the first fills the cache, the second claims those drafts back and commits new ones. Printed per shard count:
the wall time of the second visit's cache work, claim and commit latency percentiles, throughput, and the shards'
memory against the raw bytes they hold (int32 token ids + float32 logprobs).

    python scripts/bench_cache.py [--prompts 1024 --n 8 --max-tokens 4096 --shards 1 4 8 --engines 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

import numpy as np


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=1024)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--engines", type=int, default=2, help="client actors standing in for vLLM engines")
    return parser.parse_args(argv)


def make_engine_class():
    import ray

    @ray.remote(num_cpus=0)
    class Engine:
        """Drives the draft store like `AsyncSpeculativeGenerator`: a claim per visit, a commit per sample."""

        def __init__(self, num_shards: int, run: str):
            from specrl_openrlhf.integration.openrlhf.draft_store import RayDraftStore

            self.store = RayDraftStore(num_shards, run)

        async def visit(self, prompts: list[int], n: int, max_tokens: int, visit: int, seed: int):
            from specrl_openrlhf.cache import prompt_key
            from specrl_openrlhf.draft import Draft

            rng = np.random.default_rng(seed)
            claims, commits = [], []
            drafts = {  # made before the clock starts: an engine has its samples already
                p: [
                    Draft(rng.integers(0, 150_000, length).astype(np.int32), rng.random(length, np.float32), "stop")
                    for length in rng.integers(max_tokens // 8, max_tokens + 1, n).tolist()
                ]
                for p in prompts
            }

            async def one_prompt(p):
                key = prompt_key([p, 17, 23])
                start = time.perf_counter()
                got = await self.store.claim(key, f"v{visit}-{p}", 1, n)
                claims.append(time.perf_counter() - start)

                async def commit(draft):
                    start = time.perf_counter()
                    await self.store.commit(key, f"v{visit}-{p}", draft)
                    commits.append(time.perf_counter() - start)
                    return len(draft)

                lengths = await asyncio.gather(*[commit(d) for d in drafts[p]])
                return sum(d is not None for d in got), sum(lengths)

            start = time.perf_counter()
            results = await asyncio.gather(*[one_prompt(p) for p in prompts])
            return {
                "wall_s": time.perf_counter() - start,
                "claims": claims,
                "commits": commits,
                "drafts_returned": sum(r[0] for r in results),
                "tokens_committed": sum(r[1] for r in results),
            }

    return Engine


def shard_memory(shards) -> tuple[int, int]:
    """(memory the shards hold alone, raw token + logprob bytes held)."""
    import ray

    memory = ray.get([s.memory.remote() for s in shards])
    return sum(m[0] for m in memory), sum(m[1] for m in memory)


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    import ray

    from specrl_openrlhf.config import ReuseConfig
    from specrl_openrlhf.integration.openrlhf.draft_store import start_reuse

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    engine_class = make_engine_class()
    samples = args.prompts * args.n
    print(
        f"{args.prompts} prompts x {args.n} samples x up to {args.max_tokens} tokens per visit, "
        f"{args.engines} engines, every prompt in flight at once"
    )
    print(" shards  visit2_s  claim_p50_ms  claim_p99_ms  commit_p50_ms  commit_p99_ms  MB/s  uss/raw  held_MB")
    for num_shards in args.shards:
        run = f"bench{num_shards}"
        config = ReuseConfig(policy="spec", cache_shards=num_shards, cache_max_gb=64.0)
        reuse = start_reuse({"reuse_config": config.to_json()}, config, run=run)
        shards = reuse.shards
        base_rss, _ = shard_memory(shards)
        engines = [engine_class.remote(num_shards, run) for _ in range(args.engines)]
        split = [list(range(args.prompts))[e :: args.engines] for e in range(args.engines)]
        for visit in (1, 2):
            results = ray.get(
                [
                    e.visit.remote(p, args.n, args.max_tokens, visit, 1000 * visit + i)
                    for i, (e, p) in enumerate(zip(engines, split))
                ]
            )
        wall = max(r["wall_s"] for r in results)
        claims = np.concatenate([r["claims"] for r in results]) * 1e3
        commits = np.concatenate([r["commits"] for r in results]) * 1e3
        returned = sum(r["drafts_returned"] for r in results)
        committed = sum(r["tokens_committed"] for r in results)
        rss, raw = shard_memory(shards)
        assert returned == samples, f"visit 2 got {returned} drafts of {samples}"
        moved_mb = 2 * committed * 14 / 1e6  # the drafts claimed back plus the ones committed (14 bytes a token)
        print(
            f"{num_shards:>7} {wall:>9.2f} {np.percentile(claims, 50):>13.1f} {np.percentile(claims, 99):>13.1f} "
            f"{np.percentile(commits, 50):>14.1f} {np.percentile(commits, 99):>14.1f} {moved_mb / wall:>5.0f} "
            f"{(rss - base_rss) / raw:>8.2f} {raw / 1e6:>8.0f}"
        )
        for handle in engines + reuse.handles:
            ray.kill(handle, no_restart=True)
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
