"""The paper's reward: +1 when the final boxed or numeric answer of the response matches the label (checked
with the `math-verify` library), else 0. `math_verify_reward.py` beside this file is the OpenRLHF entry point.

Malformed output, a parse error or a parse slower than `TIMEOUT_S` scores 0; it never raises. Grading runs in a
small process pool, because a stuck sympy parse can only be stopped by killing its process.

>>> math_verify_reward(["Q: 1+1? The answer is \\\\boxed{2}"], ["Q: 1+1?"], ["2"])
[1.0]
>>> math_verify_reward(["Q: 1+1? I think 3"], ["Q: 1+1?"], ["2"])
[0.0]
"""

from __future__ import annotations

import atexit
import concurrent.futures
import multiprocessing
import threading

TIMEOUT_S = 5.0
_pool: concurrent.futures.ProcessPoolExecutor | None = None
_pool_lock = threading.Lock()


def _grade(response: str, label: str) -> float:
    """Runs in a worker process, so a pathological parse can be abandoned and the worker killed."""
    import logging

    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns that we handle timeouts ourselves

    gold = parse(label if "\\boxed" in label or "$" in label else f"${label}$", parsing_timeout=None)
    answer = parse(response, parsing_timeout=None)
    if not gold or not answer:
        return 0.0
    return 1.0 if verify(gold, answer, timeout_seconds=None) else 0.0


def _get_pool() -> concurrent.futures.ProcessPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=2, mp_context=multiprocessing.get_context("spawn")
            )
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


def score(response: str, label, timeout_s: float = TIMEOUT_S) -> float:
    """1.0 or 0.0 for one response; 0.0 on malformed input, errors and timeouts."""
    if not isinstance(response, str) or label is None or not str(label).strip():
        return 0.0
    try:
        return _get_pool().submit(_grade, response[-4000:], str(label)).result(timeout=timeout_s)
    except concurrent.futures.TimeoutError:
        _reset_pool()  # the stuck worker can't be interrupted: kill it
        return 0.0
    except Exception:
        return 0.0


def math_verify_reward(queries, prompts, labels) -> list[float]:
    """One 0/1 reward per query."""
    return [score(response_of(q, p), label) for q, p, label in zip(queries, prompts, labels)]


def reward_func(queries, prompts, labels):
    """OpenRLHF's entry point: rewards and scores as tensors, plus a logged accuracy."""
    import torch

    rewards = torch.tensor(math_verify_reward(queries, prompts, labels), dtype=torch.float32)
    return {"rewards": rewards, "scores": rewards, "extra_logs": {"reward/math_verify_accuracy": rewards.mean()}}
