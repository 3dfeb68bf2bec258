"""Weight updates for a vLLM engine on CPU, as a vLLM worker extension (used by tests, the quickstart, benchmarks).

On CPU, `load_weights` after start-up fails (linear layers repack their weights), while
`model_runner.reload_weights` with the full checkpoint-format state dict works. Tensors passed through
`collective_rpc` get mangled, so the state dict travels as a safetensors file path.
"""

from __future__ import annotations

from pathlib import Path

import torch

EXTENSION = "specrl_openrlhf.miniature.weights.WeightReloadExtension"


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
    return out


def write_weights(state: dict[str, torch.Tensor], path: str | Path) -> str:
    """Save a checkpoint-format state dict as safetensors, with `lm_head.weight` present (vLLM wants both halves of
    tied embeddings)."""
    from safetensors.torch import save_file

    state = {k: v.detach().contiguous() for k, v in state.items()}
    if "lm_head.weight" not in state and "model.embed_tokens.weight" in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    save_file(state, str(path))
    return str(path)


async def reload_async_engine(engine, path: str) -> None:
    """Load a weights file into vLLM's async engine (started with `worker_extension_cls=EXTENSION`) and drop its
    prefix cache, as OpenRLHF's broadcast does: cached blocks hold old weights."""
    await engine.collective_rpc("reload_safetensors", args=(path,))
    await engine.reset_prefix_cache()


def rollout_actor_class():
    """OpenRLHF's `RolloutRayActor` with `reload_weights(path)` added: its own weight sync (NCCL, CUDA IPC) needs
    GPUs. Start it with `worker_extension_cls=EXTENSION`."""
    import ray
    from openrlhf.trainer.ray.vllm_engine import RolloutRayActor

    class CPURolloutActor(RolloutRayActor.__ray_actor_class__):
        async def reload_weights(self, path: str) -> None:
            await reload_async_engine(self.llm, path)

        def take_steps(self) -> dict:
            """The engine's steps since the last call (`integration.vllm.step_log`), as `EngineSteps.as_dict`."""
            from ..integration.vllm.step_log import take_steps

            return take_steps(self.llm).as_dict()

        def flush_traces(self) -> None:
            """Write out our executor's draft traces before the actor is killed."""
            if hasattr(self.executor, "flush_traces"):
                self.executor.flush_traces()

    return ray.remote(num_cpus=0)(CPURolloutActor)
