"""A vLLM logits-processor plugin: a request may exclude a set of tokens from its first sampled step.

`lossless` draws the position where a sample leaves its proposal from p_curr without the proposal's tokens there C
(the rejected draft token, or every child of the tree node it left). With this plugin the continuation does that
itself: its first step samples from p_curr with the logits of C at -inf (p_curr without C, renormalised), and every
later step from p_curr. That costs no request beyond the continuation, and it is exact at any vocabulary size, where
top-k log-probs would miss the tail.

vLLM loads the plugin in every engine of an environment where this package is installed (entry-point group
`vllm.logits_processors`, pyproject.toml), in each of its model runners, and refuses to start an engine, any engine of
the environment, if the plugin fails to import or is not the runner's kind of processor. So this module imports on
every vLLM and `ExcludeFirstToken` is the processor of each runner that vLLM has:
- the V1 model runner (vLLM <= 0.33): `V1Exclusions`, per batch row, from vLLM's batch updates. vLLM's V1 builds no
  plugin in an engine with a speculative config;
- the model runner V2 (vLLM >= 0.32; the only one from 0.34): `V2Exclusions`, per request slot, on the device. vLLM
  hands `add_request` each request's `SamplingParams` and the slot it fills; `apply` bans the tokens on the logits
  row whose position is the request's last prompt token, the row its first output token is sampled from (a request
  resumed after preemption has its first token already: no row of it is there again).
Either acts only on requests whose `SamplingParams.extra_args` list tokens under `EXCLUDE_FIRST_TOKEN`. Where it can't
act (it failed to build, or the engine runs no plugin), it steps aside with a warning: the rollout then sees an
excluded token come back and draws the position again (`request_path`), so results stay exact either way, only slower.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from ...params import is_integer

logger = logging.getLogger(__name__)

try:  # vLLM <= 0.33: the V1 model runner's interface
    from vllm.v1.sample.logits_processor import LogitsProcessor as V1LogitsProcessor
    from vllm.v1.sample.logits_processor.builtin import process_dict_updates
except ImportError:  # vLLM >= 0.34 has no V1 model runner
    V1LogitsProcessor = process_dict_updates = None
try:  # vLLM >= 0.32: the model runner V2's interface, which its plugin loader requires
    from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsProcessor as V2LogitsProcessor
except ImportError:  # vLLM 0.29
    V2LogitsProcessor = None

EXCLUDE_FIRST_TOKEN = "specrl_exclude_first_token"
RUNNER_BASES: tuple[type, ...] = tuple(base for base in (V1LogitsProcessor, V2LogitsProcessor) if base is not None)


def excluded_tokens(params) -> list[int] | None:
    """The tokens a request's first step must not sample, or None."""
    extra = getattr(params, "extra_args", None) or {}
    return extra.get(EXCLUDE_FIRST_TOKEN)


def check_excluded_tokens(params) -> None:
    """Raises ValueError, naming the key, where a request's exclusions are not a non-empty list of token ids."""
    tokens = excluded_tokens(params)
    if tokens is not None and (
        not isinstance(tokens, (list, tuple)) or not tokens or any(not is_integer(t) or t < 0 for t in tokens)
    ):
        raise ValueError(
            f"extra_args[{EXCLUDE_FIRST_TOKEN!r}] must be a non-empty list of token ids (ints >= 0), got {tokens!r}"
        )


class V1Exclusions:
    """The V1 model runner's side: batch row -> (excluded tokens, the row's live output token ids), from vLLM's batch
    updates; a row leaves once its first token is sampled."""

    def __init__(self):
        self.rows: dict[int, tuple[list[int], list[int]]] = {}

    @staticmethod
    def _new_row(params, prompt_token_ids, output_token_ids) -> tuple[list[int], list[int]] | None:
        tokens = None if params is None else excluded_tokens(params)
        if not tokens or output_token_ids:  # a preempted request resumes after its first token
            return None
        return [int(t) for t in tokens], output_token_ids

    def update_state(self, batch_update) -> None:
        process_dict_updates(self.rows, batch_update, self._new_row)
        for row in [row for row, (_, outputs) in self.rows.items() if outputs]:  # the first token is sampled
            del self.rows[row]

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        # logits: [num_requests, vocab]
        rows = [(row, token) for row, (tokens, _) in self.rows.items() for token in tokens if token < logits.shape[1]]
        if rows:
            index = torch.tensor(rows, dtype=torch.long, device=logits.device)  # [n, 2]
            logits[index[:, 0], index[:, 1]] = -float("inf")
        return logits


class V2Exclusions:
    """The model runner V2's side, per request slot: the excluded tokens (padded with -1) and the position of the
    request's last prompt token, on the host (written by `add_request`) and on the device (copied by `stage`, which
    vLLM calls before the forward of every step that admitted a request). `apply` needs no host sync."""

    def __init__(self, req_states):
        # req_states: vLLM's LogitsProcRequestState (device, max_num_reqs, prompt_len[max_num_reqs] with .np)
        self.device = req_states.device
        self.prompt_len = req_states.prompt_len.np  # [max_num_reqs] host, written by vLLM before add_request
        slots = req_states.max_num_reqs
        self.tokens = np.full((slots, 1), -1, dtype=np.int64)  # [max_num_reqs, width] excluded tokens, -1: none
        self.last_prompt_pos = np.full(slots, -1, dtype=np.int64)  # [max_num_reqs]; -1: the slot excludes nothing
        self.tokens_dev = self.last_prompt_pos_dev = None
        self.changed = True

    def add_request(self, slot: int, params) -> bool:
        tokens = excluded_tokens(params) or []
        if len(tokens) > self.tokens.shape[1]:  # widen every slot (padding), the device copy with it
            wider = np.full((self.tokens.shape[0], 1 << (len(tokens) - 1).bit_length()), -1, dtype=np.int64)
            wider[:, : self.tokens.shape[1]] = self.tokens
            self.tokens = wider
        self.tokens[slot] = -1
        self.tokens[slot, : len(tokens)] = tokens
        self.last_prompt_pos[slot] = int(self.prompt_len[slot]) - 1 if tokens else -1
        self.changed = True
        return bool(tokens)

    def stage(self) -> None:
        if self.changed:
            # copies (also on the CPU): add_request may rewrite the host arrays while a step reads the device's
            self.tokens_dev = torch.from_numpy(self.tokens).to(self.device, non_blocking=True, copy=True)
            self.last_prompt_pos_dev = torch.from_numpy(self.last_prompt_pos).to(
                self.device, non_blocking=True, copy=True
            )
            self.changed = False

    def apply(self, logits: torch.Tensor, ctx) -> torch.Tensor:
        # logits: [num_logits_rows, vocab]; ctx: vLLM's LogitsContext (idx_mapping_np [num_reqs] host,
        # expanded_idx_mapping [num_logits_rows] row -> slot, pos [num_logits_rows] each row's input position)
        if self.tokens_dev is None or not (self.last_prompt_pos[ctx.idx_mapping_np] >= 0).any():
            return logits  # no request of this batch excludes anything (decided on the host)
        slots = ctx.expanded_idx_mapping.long()  # [rows]
        first = ctx.pos.long() == self.last_prompt_pos_dev[slots]  # [rows]: the row samples its first output token
        tokens = self.tokens_dev[slots]  # [rows, width]
        banned = first[:, None] & (tokens >= 0) & (tokens < logits.shape[1])  # [rows, width]
        penalty = torch.zeros(tokens.shape, dtype=logits.dtype, device=logits.device).masked_fill_(
            banned, -float("inf")
        )
        logits.scatter_add_(1, tokens.clamp(0, logits.shape[1] - 1), penalty)  # adding 0 leaves a logit as it is
        return logits


class ExcludeFirstToken(*RUNNER_BASES):
    """Sets the logits of a request's excluded tokens to -inf at the step that samples its first token: a V1 and a
    V2 logits processor (vLLM's V1 runner builds it with (vllm_config, device, is_pin_memory), V2's with
    (vllm_config, req_states)), which hands each call to the side it was built for."""

    def __init__(self, vllm_config, *args):
        self.v1 = self.v2 = None
        try:
            if len(args) == 1:
                self.v2 = V2Exclusions(args[0])
            else:
                self.v1 = V1Exclusions()
        except Exception as error:  # an engine must start whatever happens here
            logger.warning(
                "%s steps aside in this engine (%s: %s): lossless draws each rejected position with an extra request",
                EXCLUDE_FIRST_TOKEN,
                type(error).__name__,
                error,
            )

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        check_excluded_tokens(sampling_params)

    def is_argmax_invariant(self) -> bool:
        return False  # excluding the likeliest token changes greedy decoding

    def update_state(self, batch_update) -> None:  # V1
        if self.v1 is not None:
            self.v1.update_state(batch_update)

    def add_request(self, req_idx: int, sampling_params) -> bool:  # V2
        return self.v2 is not None and self.v2.add_request(req_idx, sampling_params)

    def apply_staged_writes(self) -> None:  # V2
        if self.v2 is not None:
            self.v2.stage()

    def apply(self, logits: torch.Tensor, ctx=None) -> torch.Tensor:
        # V1: apply(logits [num_requests, vocab]); V2: apply(logits [num_logits_rows, vocab], ctx)
        if self.v2 is not None and ctx is not None:
            return self.v2.apply(logits, ctx)
        if self.v1 is not None and ctx is None and self.v1.rows:
            return self.v1.apply(logits)
        return logits
