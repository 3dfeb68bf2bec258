"""vLLM 0.34's adaptive verification as the simulator runs it (`AdaptiveVerification`): how many of the draft slots
a step scheduled it verifies, and which (`vllm/v1/worker/gpu/spec_decode/adaptive_verification.py`).

Terminology (vLLM's):
- *confidence*: a speculator's per-slot estimate that the slot's draft token is accepted given the ones before it;
  a slot's *survival* is the running product of its row's confidences up to it (a prefix of a row survives);
- *draft budget* (`draft_budget`, `AdaptiveVerificationManager.get_num_tokens`): the number b of draft slots to
  verify that maximises (the rows that sample + the summed survival of the b best slots) / (the drafter's cost at the
  step's rows + the verification step's cost with b drafts), b at most the slots scheduled and the logits one chunk
  of verification holds. It runs on the host before the step, so it reads each row's confidences *one step stale*
  (those of the draft before: all ones for a row new since);
- *admission* (`admit_slots`, `assign_draft_token_budget`): on the device, the budget's b slots of the best current
  survival, a prefix of each row; ties in the batch's order;
- *step shape* (`StepShape`): what the step's cost reads besides its drafts: its decoding rows and their contexts,
  its prefill chunks (as the engine will run them) and its rows that sample.

vLLM turns it on with `enable_adaptive_verification`; it needs full CUDA graphs (never `enforce_eager`). The costs
are whoever drives it's (`AdmissionCost`): vLLM profiles them at start-up (the verification step by tokens, at one
context), the simulator prices them (`at_scale`).

Engine-free: numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .requests import Request


@dataclass(frozen=True)
class StepShape:
    """An engine step as its cost reads it, before its drafts: its decoding rows and the tokens they held before it,
    its prefill tokens, sequences and what those had cached, the prompt tokens whose log-probs it computes, the rows
    it schedules and those that sample (decoding rows, and prompts whose prefill it completes)."""

    decode_rows: int
    decode_context: int
    prefill_tokens: int
    prefill_rows: int
    prefill_context: int
    logit_tokens: int
    rows: int
    sampling_rows: int

    @property
    def non_draft_tokens(self) -> int:
        return self.decode_rows + self.prefill_tokens


def step_shape(rows: list[Request], prefill_budget: int) -> StepShape:
    """The shape of the step the engine is about to run on `rows` (in slot order), prefills taking what is left of the
    token budget (`prefill_budget`) in slot order, as `engine.EngineSimulator` runs them."""
    decode_rows = decode_context = tokens = prefilling = context = logits = sampling = 0
    budget = max(prefill_budget, 0)
    for request in rows:
        if request.prefilled >= request.to_prefill:
            decode_rows, decode_context, sampling = decode_rows + 1, decode_context + request.context, sampling + 1
            continue
        chunk = min(request.to_prefill - request.prefilled, budget)
        budget -= chunk
        tokens, prefilling = tokens + chunk, prefilling + (chunk > 0)
        context += request.prefilled if chunk else 0
        logits += chunk if request.prompt_logprobs else 0
        sampling += request.prefilled + chunk == request.to_prefill and not request.restored
    return StepShape(decode_rows, decode_context, tokens, prefilling, context, logits, len(rows), sampling)


class AdmissionCost(Protocol):
    """Seconds a step costs, as adaptive verification weighs them: the verification step's forward at each draft
    budget of `drafts` ([B]: its shape's tokens and those drafts), and the drafter's time a step at `rows` rows."""

    def verify(self, shape: StepShape, drafts: np.ndarray) -> np.ndarray: ...

    def draft(self, rows: int) -> float: ...


def draft_budget(
    stale: np.ndarray, scheduled: np.ndarray, sampling_rows: int, costs: np.ndarray, max_drafts: int
) -> int:
    """vLLM's `get_num_tokens`: the draft budget b in 0..min(scheduled slots, `max_drafts`) that maximises
    (sampling_rows + the summed stale survival of the best b slots) / costs[b]. `stale` [R, K] float32: each row's
    confidences one step stale; `scheduled` [R]: the slots each row was scheduled; `costs` [B]: a step's seconds at
    each budget (`draft` + `verify`), B at least the budget's range.

    >>> stale = np.array([[0.9, 0.9, 0.5], [0.2, 0.9, 0.9]], np.float32)
    >>> draft_budget(stale, np.array([3, 3]), 2, 1.0 + 0.2 * np.arange(7), 6)  # 0.9 and 0.81 pay, 0.405 does not
    2
    """
    survival = np.cumprod(stale.astype(np.float64), axis=1)
    valid = np.arange(stale.shape[1])[None, :] < np.asarray(scheduled)[:, None]
    most = min(int(np.sum(scheduled)), max(max_drafts, 0))
    scores = np.sort(survival[valid])[::-1][:most]
    expected = np.concatenate(([sampling_rows], sampling_rows + np.cumsum(scores)))
    return int(np.argmax(expected / np.asarray(costs, np.float64)[: most + 1]))


def admit_slots(confidences: np.ndarray, capacities: np.ndarray, budget: int) -> np.ndarray:
    """vLLM's `assign_draft_token_budget`: [R] slots each row verifies, the `budget` slots of the best survival (the
    running float32 product of `confidences` [R, K], among each row's first `capacities` [R]), a prefix of each row;
    ties handed out in row order. Where the budget holds every slot, every slot.

    >>> admit_slots(np.array([[0.9, 0.5], [0.9, 0.9]], np.float32), np.array([2, 2]), 3).tolist()
    [1, 2]
    """
    capacities = np.asarray(capacities, np.int64)
    if budget >= capacities.sum():
        return capacities.copy()
    if budget <= 0:
        return np.zeros_like(capacities)
    survival = np.cumprod(np.asarray(confidences, np.float32), axis=1, dtype=np.float32)
    bits = survival.view(np.int32).astype(np.int64)  # non-negative floats order as their bits
    bits[np.arange(bits.shape[1])[None, :] >= capacities[:, None]] = -1  # past a row's scheduled slots
    threshold = np.sort(bits.ravel())[::-1][budget - 1]  # the largest that still admits `budget` slots
    above = (bits > threshold).sum(axis=1)
    tied = (bits == threshold).sum(axis=1)
    ties_left = budget - above.sum()
    before = np.cumsum(tied) - tied
    return above + np.minimum(tied, np.maximum(ties_left - before, 0))


class AdaptiveVerification:
    """Adaptive verification for one engine: each request's confidences as recorded at the last two drafts (`record`,
    vLLM's `record_confidences`; `added`, its `add_request`), and each step's admission (`admit`), which trims every
    decoding row's draft in place. `max_drafts(rows)`: the draft slots one verification chunk's logits leave at `rows`
    rows (vLLM's `max_total_logits` less a bonus token a row); `k`: slots a row."""

    def __init__(self, k: int, cost: AdmissionCost, max_drafts):
        self.k, self.cost, self.max_drafts = k, cost, max_drafts
        self._stale: dict[str, np.ndarray] = {}  # the count reads these: recorded one draft before the current one
        self._current: dict[str, np.ndarray] = {}  # the admission reads these
        self.binding = 0  # steps whose budget held fewer slots than were scheduled

    def added(self, request_id: str) -> None:
        """A request (re)enters the batch: its confidences are ones until it has drafted twice."""
        self._stale.pop(request_id, None)
        self._current.pop(request_id, None)

    def record(self, request_ids: list[str], confidences: np.ndarray) -> None:
        """Each row's confidences [R, K] for the draft just proposed."""
        self._stale = {r: self._current[r] for r in request_ids if r in self._current}
        self._current = {r: confidences[i].copy() for i, r in enumerate(request_ids)}

    def admit(self, rows: list[Request], prefill_budget: int) -> bool:
        """Trim the drafts the step scheduled (each decoding row's `draft`, already within the token budget) to the
        slots adaptive verification admits; returns whether it trimmed any."""
        shape = step_shape(rows, prefill_budget)
        decoding = [r for r in rows if r.prefilled >= r.to_prefill]
        order = sorted(
            decoding, key=lambda r: (not r.draft, len(r.draft) != self.k, len(r.draft), r.admitted)
        )  # vLLM's `sort_batch_req_ids`: verification rows first, the full ones before those the budget cut
        scheduled = np.array([len(r.draft) for r in order], np.int64)
        if not scheduled.sum():
            return False
        ones = np.ones(self.k, np.float32)
        stale = np.stack([self._stale.get(r.id, ones) for r in order])
        current = np.stack([self._current.get(r.id, ones) for r in order])
        most = min(int(scheduled.sum()), max(int(self.max_drafts(shape.rows)), 0))
        costs = self.cost.draft(shape.rows) + self.cost.verify(shape, np.arange(most + 1))
        budget = draft_budget(stale, scheduled, shape.sampling_rows, costs, most)
        if budget >= scheduled.sum():
            return False
        self.binding += 1
        for request, admitted in zip(order, admit_slots(current, scheduled, budget)):
            request.draft = request.draft[: int(admitted)]
        return True
