"""Our V2 speculator's registration in vLLM's speculator registry, from our `vllm.general_plugins` entry point
(`plugin.register`), which vLLM calls in every process it starts (front end, engine core, workers).

Importable with any vLLM: where the registry is missing (vLLM <= 0.33), `register` steps aside and the V1 proposer
runs instead (`versions`). The config is registered by its qualified name, which vLLM imports only when an engine
asks for the method, so nothing of vLLM 0.34 is imported here.
"""

from __future__ import annotations

from ....policies.builtin import HISTORY_SPECULATOR, HISTORY_SPECULATOR_CONFIG


def registry():
    """vLLM's `register_speculative_method`, or None where this vLLM has no V2 speculator registry."""
    try:
        from vllm.v1.worker.gpu.spec_decode.speculator_config import register_speculative_method
    except ImportError:
        return None
    return register_speculative_method


def register() -> bool:
    """Register `HISTORY_SPECULATOR` (idempotent); False where this vLLM has no registry."""
    register_method = registry()
    if register_method is None:
        return False
    register_method(HISTORY_SPECULATOR, HISTORY_SPECULATOR_CONFIG)
    return True
