"""Weight updates for a vLLM engine on CPU, as a vLLM worker extension (used by tests, quickstart, benchmark).

On CPU, `load_weights` after start-up fails (linear layers repack their weights), while
`model_runner.reload_weights` with the full checkpoint-format state dict works. Tensors passed through
`collective_rpc` get mangled, so the state dict travels as a safetensors file path.
"""

from __future__ import annotations

from pathlib import Path

import torch

EXTENSION = "specrl_openrlhf.integration.cpu.weights.WeightReloadExtension"


class WeightReloadExtension:
    """Mixed into vLLM's worker via `worker_extension_cls=EXTENSION`."""

    def reload_safetensors(self, path: str) -> bool:
        from safetensors.torch import load_file

        state = load_file(path)
        self.model_runner.reload_weights(weights_iterator=iter(state.items()))
        return True


def perturbed_state_dict(model_dir: str | Path, noise: float, seed: int) -> dict[str, torch.Tensor]:
    """The model's weights plus Gaussian noise of relative size `noise` (a stand-in for an RL update)."""
    from safetensors.torch import load_file

    state = load_file(str(Path(model_dir) / "model.safetensors"))
    generator = torch.Generator().manual_seed(seed)
    out = {}
    for name, tensor in state.items():
        scale = noise * tensor.float().std() if tensor.numel() > 1 else 0.0
        out[name] = (tensor.float() + scale * torch.randn(tensor.shape, generator=generator)).to(tensor.dtype)
    if "lm_head.weight" not in out and "model.embed_tokens.weight" in out:  # tied embeddings: vLLM wants both
        out["lm_head.weight"] = out["model.embed_tokens.weight"].clone()
    return out


def update_llm_weights(llm, state: dict[str, torch.Tensor], scratch_dir: str | Path) -> None:
    """Load `state` into a `vllm.LLM` started with `worker_extension_cls=EXTENSION`, and drop its prefix cache."""
    from safetensors.torch import save_file

    path = Path(scratch_dir) / "weights.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    llm.collective_rpc("reload_safetensors", args=(str(path),))
    llm.reset_prefix_cache()
