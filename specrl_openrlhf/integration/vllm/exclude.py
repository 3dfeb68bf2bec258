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
"""

from __future__ import annotations

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

EXCLUDE_FIRST_TOKEN = "specrl_exclude_first_token"


def excluded_tokens(params) -> list[int] | None:
    """The tokens a request's first step must not sample, or None."""
    extra = getattr(params, "extra_args", None) or {}
    return extra.get(EXCLUDE_FIRST_TOKEN)


class ExcludeFirstToken(LogitsProcessor):
    """Sets the logits of the request's excluded tokens to -inf until the request has sampled its first token."""

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
        self.device = device
        self.rows: dict[int, tuple[list[int], list[int]]] = {}  # batch row -> (excluded tokens, live output token ids)

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        tokens = excluded_tokens(sampling_params)
        if tokens is not None and (
            not isinstance(tokens, (list, tuple))
            or not tokens
            or any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in tokens)
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

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        # logits: [num_requests, vocab]
        if not self.rows:
            return logits
        rows = [(row, token) for row, (tokens, _) in self.rows.items() for token in tokens if token < logits.shape[1]]
        if rows:
            index = torch.tensor(rows, dtype=torch.long, device=logits.device)  # [n, 2]
            logits[index[:, 0], index[:, 1]] = -float("inf")
        return logits
