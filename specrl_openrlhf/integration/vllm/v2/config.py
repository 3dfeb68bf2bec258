"""`HistorySpeculatorConfig`: what vLLM >= 0.34 reads of our speculator (its `SpeculatorConfig`), by the qualified name
`registration` gives its registry. It subclasses vLLM 0.34's class; on vLLM <= 0.33, which has none, the module still
imports (every module of the package does, on every vLLM) and nothing registers it.
"""

from __future__ import annotations

try:
    from vllm.v1.worker.gpu.spec_decode.speculator_config import SpeculatorConfig
except ImportError:  # vLLM <= 0.33: no V2 speculators
    SpeculatorConfig = object

SPECULATOR_CLASS = "specrl_openrlhf.integration.vllm.v2.speculator.HistorySpeculator"


class HistorySpeculatorConfig(SpeculatorConfig):
    """A model-free speculator (no draft checkpoint: `base_method` None), with options of its own
    (`speculator_options`: the rule's `LosslessParams` it needs at construction), that scans the request state's token
    ids on the device (dense, not UVA) and gives adaptive verification confidences of its own (its acceptance model,
    not draft logits)."""

    speculator_class = SPECULATOR_CLASS
    supported_options = frozenset({"speculator_options"})
    prefer_dense_token_history = True
    adaptive_verification_uses_draft_logits = False

    @classmethod
    def configure(cls, spec) -> None:
        if spec.num_speculative_tokens is None:
            raise ValueError(
                "speculative_config for specrl_history needs num_speculative_tokens "
                "(--reuse.params '{\"num_speculative_tokens\": K}' sets it for lossless)"
            )
        super().configure(spec)
