"""A vLLM logits-processor plugin: a request may exclude a set of tokens from its first sampled step.

`lossless` draws the position where a sample leaves its proposal from p_curr without the proposal's tokens there C
(the rejected draft token, or every child of the tree node it left). With this plugin the continuation does that
itself: its first step samples from p_curr with the logits of C at -inf (p_curr without C, renormalised), and every
later step from p_curr. That costs no request beyond the continuation, and it is exact at any
vocabulary size, where top-k log-probs would miss the tail.

vLLM loads the plugin in every engine of an environment where this package is installed (entry-point group
`vllm.logits_processors`, pyproject.toml). It acts only on requests whose `SamplingParams.extra_args` list tokens
under `EXCLUDE_FIRST_TOKEN`. vLLM skips plugins when speculative decoding is configured, and an engine may run without
them: the rollout then sees an excluded token come back and draws the position again (`request_path`), so results
stay exact either way, only slower.

vLLM 0.32's model runner V2 (the default on GPUs with Triton) loads the same entry points and refuses to start an
engine, any engine of the environment, if a plugin is not a V2 `LogitsProcessor`. So the class is one of those too,
which acts on no request there (`add_request` declines every one): on V2 the rollout draws the position again as
above. vLLM 0.29 has no V2 interface and runs every engine of an environment with such a plugin on V1.
"""

from __future__ import annotations

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from ...params import is_integer

try:  # vLLM >= 0.32: the model runner V2's interface, which its plugin loader requires
    from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsProcessor as V2LogitsProcessor

    V2_BASES: tuple[type, ...] = (V2LogitsProcessor,)
except ImportError:  # vLLM 0.29
    V2_BASES = ()

EXCLUDE_FIRST_TOKEN = "specrl_exclude_first_token"


def excluded_tokens(params) -> list[int] | None:
    """The tokens a request's first step must not sample, or None."""
    extra = getattr(params, "extra_args", None) or {}
    return extra.get(EXCLUDE_FIRST_TOKEN)


class ExcludeFirstToken(LogitsProcessor, *V2_BASES):
    """Sets the logits of the request's excluded tokens to -inf until the request has sampled its first token (the
    V1 model runner's interface); under the model runner V2 it acts on no request."""

    def __init__(self, vllm_config, *args):
        # V1: (vllm_config, device, is_pin_memory); V2: (vllm_config, req_states)
        self.v2 = len(args) == 1
        self.rows: dict[int, tuple[list[int], list[int]]] = {}  # batch row -> (excluded tokens, live output token ids)

    def add_request(self, req_idx: int, sampling_params) -> bool:
        return False  # V2: a request that asks for exclusions gets its position drawn again by the rollout

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        tokens = excluded_tokens(sampling_params)
        if tokens is not None and (
            not isinstance(tokens, (list, tuple)) or not tokens or any(not is_integer(t) or t < 0 for t in tokens)
        ):
            raise ValueError(
                f"extra_args[{EXCLUDE_FIRST_TOKEN!r}] must be a non-empty list of token ids (ints >= 0), "
                f"got {tokens!r}"
            )

    def is_argmax_invariant(self) -> bool:
        return False  # excluding the likeliest token changes greedy decoding

    @staticmethod
    def _new_row(params, prompt_token_ids, output_token_ids) -> tuple[list[int], list[int]] | None:
        tokens = None if params is None else excluded_tokens(params)
        if not tokens or output_token_ids:  # a preempted request resumes after its first token
            return None
        return [int(t) for t in tokens], output_token_ids

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.rows, batch_update, self._new_row)
        for row in [row for row, (_, outputs) in self.rows.items() if outputs]:  # the first token is sampled
            del self.rows[row]

    def apply(self, logits: torch.Tensor, ctx=None) -> torch.Tensor:
        # logits: [num_requests, vocab]; ctx: V2's batch layout (V2 runs no request through this processor)
        if self.v2 or not self.rows:
            return logits
        rows = [(row, token) for row, (tokens, _) in self.rows.items() for token in tokens if token < logits.shape[1]]
        if rows:
            index = torch.tensor(rows, dtype=torch.long, device=logits.device)  # [n, 2]
            logits[index[:, 0], index[:, 1]] = -float("inf")
        return logits
