"""The paper's reward: +1 when the final boxed or numeric answer of the response matches the label (checked
with the `math-verify` library), else 0. `math_verify_reward.py` beside this file is the OpenRLHF entry point.

Malformed output, a parse error or a parse slower than `TIMEOUT_S` scores 0; it never raises. Grading runs in a
small process pool, because a stuck sympy parse can only be stopped by killing its process. A batch is graded in
parallel, and each distinct (response, label) once: grades are kept (up to `KEEP` of them), so the identical
responses that reuse produces, within a step and across steps, cost one parse.

>>> math_verify_reward(["Q: 1+1? The answer is \\\\boxed{2}"], ["Q: 1+1?"], ["2"])
[1.0]
>>> math_verify_reward(["Q: 1+1? I think 3"], ["Q: 1+1?"], ["2"])
[0.0]
"""

from __future__ import annotations

import atexit
import concurrent.futures
import multiprocessing
import os
import threading
import time
from collections import OrderedDict

TIMEOUT_S = 5  # per parse and per comparison, enforced inside the worker (math-verify's own signal alarm)
# Two workers where cores are to spare; one on a 2-core machine, where every rollout actor has its own pool and each
# worker is a Python process that imports math-verify (the quickstart: three actors)
WORKERS = 2 if (os.cpu_count() or 1) > 2 else 1
STARTUP_TIMEOUT_S = 300.0  # a new worker imports math-verify (and re-imports the parent's main module)
STUCK_S = 120.0  # a caller gives up after this long, queueing included, and replaces the pool
KEEP = 1 << 16  # grades kept, least recently used dropped first
_pool: concurrent.futures.ProcessPoolExecutor | None = None
_pool_lock = threading.Lock()
_grades: OrderedDict[tuple[str, str], float] = OrderedDict()
_grades_lock = threading.Lock()
submitted = 0  # parses sent to the pool so far (what the kept grades save)


def _grade(response: str, label: str) -> float:
    """Runs in a worker process's main thread, where math-verify's alarm-based timeouts work: a pathological parse
    gives up after TIMEOUT_S and scores 0, and the worker lives on."""
    from math_verify import parse, verify

    gold = parse(label if "\\boxed" in label or "$" in label else f"${label}$", parsing_timeout=TIMEOUT_S)
    answer = parse(response, parsing_timeout=TIMEOUT_S)
    if not gold or not answer:
        return 0.0
    return 1.0 if verify(gold, answer, timeout_seconds=TIMEOUT_S) else 0.0


def _warm() -> bool:
    import math_verify  # noqa: F401

    return True


def _get_pool() -> concurrent.futures.ProcessPoolExecutor:
    """The grading pool, its workers started and warm: `TIMEOUT_S` then bounds a parse, never a worker's start-up
    (otherwise a slow start times out, the pool is replaced, and the next start times out again)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=WORKERS, mp_context=multiprocessing.get_context("spawn")
            )
            try:
                for future in [pool.submit(_warm) for _ in range(WORKERS)]:
                    future.result(timeout=STARTUP_TIMEOUT_S)
            except BaseException:
                pool.shutdown(wait=False, cancel_futures=True)
                raise
            _pool = pool
        return _pool


def _reset_pool() -> None:
    global _pool
    with _pool_lock:
        if _pool is not None:
            for process in list(getattr(_pool, "_processes", {}).values()):
                process.kill()
            _pool.shutdown(wait=False, cancel_futures=True)
        _pool = None


atexit.register(_reset_pool)


def response_of(query: str, prompt: str) -> str:
    """The response part of OpenRLHF's query (decoded prompt + response)."""
    return query[len(prompt) :] if query.startswith(prompt) else query


def score(response: str, label) -> float:
    """1.0 or 0.0 for one response; 0.0 on malformed input, errors and timeouts."""
    return grade([(response, label)])[0]


def grade(items: list[tuple[str, object]]) -> list[float]:
    """One 0/1 grade per (response, label), the distinct ones not graded before sent to the pool together."""
    global submitted
    keys = [
        (response[-4000:], str(label))
        if isinstance(response, str) and label is not None and str(label).strip()
        else None
        for response, label in items
    ]
    with _grades_lock:
        known = {k: _grades[k] for k in keys if k is not None and k in _grades}
    todo = list(dict.fromkeys(k for k in keys if k is not None and k not in known))
    if todo:
        try:
            pool = _get_pool()
            futures = {k: pool.submit(_grade, *k) for k in todo}
            submitted += len(futures)
        except Exception:
            futures = {}
        deadline = time.monotonic() + STUCK_S
        for k, future in futures.items():
            try:
                known[k] = future.result(timeout=max(deadline - time.monotonic(), 0.0))
            except concurrent.futures.TimeoutError:
                _reset_pool()  # a worker stuck past its own alarm can't be interrupted: kill it
                break
            except Exception:
                continue
        with _grades_lock:
            for k in todo:
                if k in known:
                    _grades[k] = known[k]
                    _grades.move_to_end(k)
            while len(_grades) > KEEP:
                _grades.popitem(last=False)
    return [known.get(k, 0.0) if k is not None else 0.0 for k in keys]


def math_verify_reward(queries, prompts, labels) -> list[float]:
    """One 0/1 reward per query."""
    return grade([(response_of(q, p), label) for q, p, label in zip(queries, prompts, labels)])


def reward_func(queries, prompts, labels):
    """OpenRLHF's entry point: rewards and scores as tensors, plus a logged accuracy."""
    import torch

    rewards = torch.tensor(math_verify_reward(queries, prompts, labels), dtype=torch.float32)
    return {"rewards": rewards, "scores": rewards, "extra_logs": {"reward/math_verify_accuracy": rewards.mean()}}
