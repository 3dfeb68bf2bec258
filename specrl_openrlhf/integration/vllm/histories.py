"""The histories an engine's proposers draft from, as the rollout sends them: one format and one call for both
engines.

The rollout (`rollout.engine_path.HistoryChannel`) registers each prompt's history with `collective_rpc`
(`update_histories`, run in every worker with the worker as its first argument). An *update* is a tuple (prompt
digest `cache.prompt_key`, prompt length, reset, the rule's parameters as `params_message` gives them, responses as
lists of token ids, their log-probs or None): `reset` starts the prompt's visit with its previous responses, else
finished responses of the visit join it.

Where the worker runs our V2 speculator (vLLM >= 0.34: `v2.speculator`, at `worker.model_runner.speculator`), the
updates go to it, and it applies them by count (every tensor-parallel rank sees the same calls at the same step
boundary, so every rank drafts the same); elsewhere they go to this process's V1 board (`v1.board`, vLLM <= 0.33's
`custom_class` proposer). Either answers what `report` gives: "proposers" 0 means none runs here, and the rollout then
says so and generates normally.

The V2 speculator learns a request's prompt from its id (`request_id`: the rollout names its requests so; vLLM adds a
suffix of its own), where the V1 proposer finds it by the digest of the row's leading tokens.
"""

from __future__ import annotations

import dataclasses
import uuid

from ...policies.builtin import LosslessParams

REQUEST_PREFIX = "specrl-"  # a request id that carries its prompt's digest: `request_id`


def receiver(worker):
    """Where this worker's histories go: our V2 speculator where the worker runs it, else the V1 board."""
    speculator = getattr(getattr(worker, "model_runner", None), "speculator", None)
    if getattr(speculator, "receives_histories", False):
        return speculator
    from .v1 import board

    return board.BOARD


def update_histories(worker, updates) -> dict:
    """Run by `collective_rpc` in every worker: `updates` is a list of updates (the module's docstring). Returns the
    receiver's report: "proposers" 0 means none runs here, so the histories will not be used."""
    target = receiver(worker)
    for key, prompt_len, reset, params, responses, logprobs in updates:
        target.update(bytes(key), int(prompt_len), bool(reset), params, responses, logprobs)
    return target.report()


def budget_details(worker) -> dict:
    """Run by `collective_rpc`: what `update_histories` answers, and the diagnostics only benchmarks read."""
    return receiver(worker).report(details=True)


def params_message(params: LosslessParams) -> dict:
    """The rule's parameters as `update_histories` carries them."""
    return dataclasses.asdict(params)


def request_id(key: bytes) -> str:
    """A fresh request id for a sample of the prompt with digest `key` (`cache.prompt_key`), which `key_of` reads."""
    return f"{REQUEST_PREFIX}{key.hex()}-{uuid.uuid4().hex[:12]}"


def key_of(request_id: str) -> bytes | None:
    """The prompt digest a request id carries (`request_id`; vLLM's n samples of a request are "{i}_{id}"), or None
    where it carries none."""
    head, underscore, rest = request_id.partition("_")
    if underscore and head.isdigit():
        request_id = rest
    if not request_id.startswith(REQUEST_PREFIX):
        return None
    digest = request_id[len(REQUEST_PREFIX) :].partition("-")[0]
    try:
        return bytes.fromhex(digest) if digest else None
    except ValueError:
        return None
