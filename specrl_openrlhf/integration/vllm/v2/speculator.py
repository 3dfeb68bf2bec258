"""`HistorySpeculator`: our V2 speculator as vLLM >= 0.34 builds it (`init_speculator`: once per tensor-parallel rank,
in each worker, with the request state), a thin adapter of vLLM's `BaseSpeculator` calls onto `drafter.HistoryDrafter`.

Nothing here may stop an engine: a drafter that cannot be built, or fails at a call, logs once, and from then on
every slot drafts the row's last token with confidence 0 (adaptive verification admits none of them; without it each
is verified and almost always rejected: exact, only slower), and the rollout hears "no proposer" and says so. It
subclasses vLLM 0.34's class; on vLLM <= 0.33 the module imports and nothing builds it.
"""

from __future__ import annotations

import logging

import torch

try:
    from vllm.v1.worker.gpu.spec_decode.speculator import BaseSpeculator
except ImportError:  # vLLM <= 0.33: no V2 speculators
    BaseSpeculator = object

from .drafter import DrafterSettings, HistoryDrafter

logger = logging.getLogger(__name__)

OPTIONS = ("history_mb", "min_match", "shared", "lookup", "compile")  # what `speculator_options` may set


def settings_of(vllm_config, device: torch.device) -> DrafterSettings:
    """The drafter's settings from vLLM's config and our `speculator_options` (the step compiled on a GPU unless
    they say `"compile": false`)."""
    spec = vllm_config.speculative_config
    options = {"compile": torch.device(device).type == "cuda"} | dict(spec.speculator_options or {})
    return DrafterSettings(
        max_num_reqs=int(vllm_config.scheduler_config.max_num_seqs),
        max_model_len=int(vllm_config.model_config.max_model_len),
        k=int(spec.num_speculative_tokens),
        **{name: options[name] for name in OPTIONS if name in options},
    )


def budget_line(k: int, adaptive: bool) -> str:
    """How a row's draft length is set, as the start-up log says it."""
    if adaptive:
        return f"up to {k} tokens a row, admitted by vLLM's adaptive verification on our acceptance model's survival"
    return f"{k} tokens every row, every step (adaptive verification off: it needs full CUDA graphs)"


class HistorySpeculator(BaseSpeculator):
    receives_histories = True  # `histories.update_histories` hands it the rollout's updates

    def __init__(self, vllm_config, device: torch.device, req_states):
        spec = vllm_config.speculative_config
        rows, self.k = int(vllm_config.scheduler_config.max_num_seqs), int(spec.num_speculative_tokens)
        self.enable_adaptive_verification = bool(spec.enable_adaptive_verification)
        self.drafter: HistoryDrafter | None = None
        self.fallback = torch.zeros(rows, self.k, dtype=torch.int64, device=device)
        self.draft_token_confidence_probs = torch.zeros(rows, self.k, dtype=torch.float32, device=device)
        try:
            self.drafter = HistoryDrafter(settings_of(vllm_config, device), req_states, device)
            self.draft_token_confidence_probs = self.drafter.confidences
            self.drafter.warm_up()
        except Exception as error:  # an engine must start whatever happens here
            self._fail(error)
        logger.info("specrl_history (vLLM's V2 runner): %s", budget_line(self.k, self.enable_adaptive_verification))

    def _fail(self, error: Exception) -> None:
        logger.warning("specrl_history disabled (%s: %s): rows decode as usual", type(error).__name__, error)
        self.drafter = None
        self.draft_token_confidence_probs.zero_()

    def _call(self, name: str, *args):
        if self.drafter is None:
            return None
        try:
            return getattr(self.drafter, name)(*args)
        except Exception as error:  # a failing drafter never stops the engine
            self._fail(error)
            return None

    def add_request(self, req_index: int) -> None:
        self._call("add_request", req_index)

    def on_requests_finished(self, finished_req_ids) -> None:
        self._call("on_requests_finished", finished_req_ids)

    def reset_state(self) -> None:
        self._call("reset_state")

    def update(self, key, prompt_len, reset, params, responses, logprobs=None) -> None:
        self._call("update", key, prompt_len, reset, params, responses, logprobs)

    def report(self, details: bool = False) -> dict:
        return self._call("report", details) or {"proposers": 0, "history_mb": 0.0}

    def init_cudagraph_manager(self, cudagraph_mode) -> None:
        return None  # model-free: no graphs of its own

    def capture(self) -> None:
        return None

    @torch.inference_mode()
    def propose(
        self,
        input_batch,
        attn_metadata,
        slot_mappings,
        last_hidden_states,
        aux_hidden_states,
        num_sampled: torch.Tensor,  # [num_reqs] int32, tokens each row sampled this step (0: in prefill)
        num_rejected: torch.Tensor,  # [num_reqs] int32, draft tokens each row rejected this step
        last_sampled: torch.Tensor,  # [max_num_reqs, 1] int64, each request's last sampled token
        next_prefill_tokens,
        temperature,
        seeds,
        dp_sync_state=None,
        dummy_run: bool = False,
        skip_attn_for_dummy_run: bool = False,
        mm_inputs=None,
        is_profile: bool = False,
        num_speculative_tokens: int | None = None,
    ) -> torch.Tensor:
        rows = input_batch.num_reqs
        if not dummy_run and self.drafter is not None:
            drafts = self._call("propose", input_batch.idx_mapping, num_sampled, num_rejected, last_sampled)
            if drafts is not None:
                return drafts
        if dummy_run:
            return self.fallback[:rows]
        # [num_reqs, k]: the row's last token in every slot, confidence 0
        self.fallback[:rows] = last_sampled.reshape(-1)[input_batch.idx_mapping.long()][:, None]
        return self.fallback[:rows]
