"""The small GRPO trainer step that OpenRLHF runs with DeepSpeed on GPUs, on a tiny model on CPU.

It takes OpenRLHF's `Experience`s (from its real `SamplesGenerator`), normalises rewards within each prompt's group
(OpenRLHF's `group_norm` estimator), and minimises OpenRLHF's own `PolicyLoss` (PPO clip) with AdamW. The old
logprobs are the rollout's: the engine's, which for reused tokens are their scored logprobs under the weights that
produced the rollout. No KL term, so no reference model.

OpenRLHF's loss module is loaded by file path, as OpenRLHF's own tests do: its package `openrlhf.models` imports
flash-attn when imported. Its `models/utils.py` imports DeepSpeed only for ZeRO-3 helpers that this step never
calls, so a placeholder stands in for DeepSpeed while the two files load, when DeepSpeed is not installed.

`PartialTrainer` is the real-model benchmark's step: plain policy gradient with GRPO's advantages on a causal LM's
last layers (`real_model`).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import torch

_PACKAGE = "_specrl_openrlhf_models"


def openrlhf_loss_module():
    """OpenRLHF's `openrlhf/models/loss.py` (with its sibling `utils.py`), loaded without its package."""
    if f"{_PACKAGE}.loss" in sys.modules:
        return sys.modules[f"{_PACKAGE}.loss"]
    spec = importlib.util.find_spec("openrlhf")
    models_dir = Path(spec.origin).parent / "models"
    package = types.ModuleType(_PACKAGE)
    package.__path__ = [str(models_dir)]
    sys.modules[_PACKAGE] = package
    placeholder = None
    if importlib.util.find_spec("deepspeed") is None:
        placeholder = sys.modules["deepspeed"] = types.ModuleType("deepspeed")
    try:
        for name in ("utils", "loss"):
            module_spec = importlib.util.spec_from_file_location(f"{_PACKAGE}.{name}", models_dir / f"{name}.py")
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[module_spec.name] = module
            module_spec.loader.exec_module(module)
    finally:
        if placeholder is not None and sys.modules.get("deepspeed") is placeholder:
            del sys.modules["deepspeed"]  # nothing else in the process may take it for DeepSpeed
    return sys.modules[f"{_PACKAGE}.loss"]


@dataclass(frozen=True, kw_only=True)
class GRPOConfig:
    lr: float = 1.5e-4
    micro_batch_size: int = 128  # samples per optimizer step
    clip_eps: float = 0.2
    max_grad_norm: float = 1.0
    seed: int = 0


def group_advantages(rewards: torch.Tensor, groups: list) -> torch.Tensor:
    """OpenRLHF's group_norm: (r - mean) / (std + 1e-9) over the samples of the same prompt. [N] -> [N]."""
    advantages = torch.zeros_like(rewards, dtype=torch.float32)
    for group in set(groups):
        index = torch.tensor([i for i, g in enumerate(groups) if g == group])
        r = rewards[index].float()
        advantages[index] = (r - r.mean()) / ((r.std() if len(r) > 1 else 0.0) + 1e-9)
    return advantages


class GRPOTrainer:
    """One HF causal LM and its optimizer; `step` trains on one rollout batch of OpenRLHF `Experience`s."""

    def __init__(self, model_dir: str | Path, config: GRPOConfig):
        from transformers import AutoModelForCausalLM

        torch.manual_seed(config.seed)
        self.config = config
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.lr, weight_decay=0.0)
        loss = openrlhf_loss_module()
        self.policy_loss = loss.PolicyLoss(clip_eps_low=config.clip_eps, clip_eps_high=config.clip_eps)
        self.log_probs_from_logits = sys.modules[f"{_PACKAGE}.utils"].log_probs_from_logits
        self._generator = torch.Generator().manual_seed(config.seed)

    def step(self, experiences) -> dict[str, float]:
        """One PPO epoch over the batch in micro-batches; returns the mean loss, clip ratio and grad norm."""
        rewards = torch.cat([e.rewards.float() for e in experiences])  # [N]
        advantages = group_advantages(rewards, [e.prompts[0] for e in experiences])  # [N]
        order = torch.randperm(len(experiences), generator=self._generator).tolist()
        totals = {"loss": 0.0, "clip_ratio": 0.0, "grad_norm": 0.0}
        steps = 0
        for start in range(0, len(order), self.config.micro_batch_size):
            chosen = order[start : start + self.config.micro_batch_size]
            loss, clip_ratio = self._loss([experiences[i] for i in chosen], advantages[chosen])
            loss.backward()
            loss = loss.detach()
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
            self.optimizer.step()
            self.optimizer.zero_grad()
            totals["loss"] += loss.item()
            totals["clip_ratio"] += clip_ratio.item()
            totals["grad_norm"] += float(grad_norm)
            steps += 1
        return {key: value / max(steps, 1) for key, value in totals.items()}

    def _loss(self, experiences, advantages: torch.Tensor):
        width = max(e.sequences.shape[1] for e in experiences)

        def pad(tensor, length):  # right-pad [1, n] to [1, length] with zeros
            return torch.nn.functional.pad(tensor, (0, length - tensor.shape[1]))

        sequences = torch.cat([pad(e.sequences, width) for e in experiences])  # [B, T]
        attention = torch.cat([pad(e.attention_mask, width) for e in experiences])  # [B, T]
        action_mask = torch.cat([pad(e.action_mask, width - 1) for e in experiences]).float()  # [B, T-1]
        old_log_probs = torch.cat([pad(e.rollout_log_probs.float(), width - 1) for e in experiences])  # [B, T-1]
        logits = self.model(input_ids=sequences, attention_mask=attention).logits[:, :-1].float()  # [B, T-1, V]
        log_probs = self.log_probs_from_logits(logits, sequences[:, 1:])  # [B, T-1]
        token_advantages = advantages[:, None].expand_as(log_probs) * action_mask  # [B, T-1]
        loss, clip_ratio, *_ = self.policy_loss(log_probs, old_log_probs, token_advantages, action_mask=action_mask)
        return loss, clip_ratio

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The weights in checkpoint format, for the engine (see `weights.py`)."""
        return {name: tensor.detach().clone() for name, tensor in self.model.state_dict().items()}


class PartialTrainer:
    """Policy-gradient steps on the last decoder layers and the final norm of a causal LM (bfloat16 autocast where the
    CPU computes bfloat16 natively, `engine.cpu_dtype`; float32 elsewhere): loss = -mean over samples of A * mean
    log p(response tokens), A the group-normalised reward (GRPO's).

    With `token_mean`, the mean is over the batch's tokens (DAPO's token-level loss) instead: a token that responses of
    opposite advantage share then cancels, where a mean over each response's tokens pushes it down when the responses
    that lose are shorter (stopping early, or miscounting a long walk, is then learnt)."""

    MICRO_BATCH = 4

    def __init__(
        self, model_dir: Path, lr: float, layers: int, seed: int, dtype: str = "auto", token_mean: bool = False
    ):
        import torch
        from transformers import AutoModelForCausalLM

        from .engine import cpu_dtype

        self.autocast = cpu_dtype(dtype) == "bfloat16"

        torch.manual_seed(seed)
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        for parameter in self.model.parameters():
            parameter.requires_grad_(False)
        trained = [*self.model.model.layers[-layers:].parameters(), self.model.model.norm.weight]
        for parameter in trained:
            parameter.requires_grad_(True)
        self.token_mean = token_mean
        self.optimizer = torch.optim.Adam(trained, lr=lr)
        self.trained = {name for name, parameter in self.model.named_parameters() if parameter.requires_grad}

    def state(self) -> dict:
        """What resumes training where it stopped: the trained parameters and the optimizer's moments."""
        import copy

        weights = {k: v.detach().clone() for k, v in self.model.named_parameters() if k in self.trained}
        moments = copy.deepcopy(self.optimizer.state_dict())  # a copy: the optimizer updates its own in place
        return {"weights": weights, "optimizer": moments}

    def load_state(self, state: dict) -> None:
        import torch

        with torch.no_grad():
            for name, parameter in self.model.named_parameters():
                if name in self.trained:
                    parameter.copy_(state["weights"][name])
        self.optimizer.load_state_dict(state["optimizer"])

    def step(self, prompts: list[list[int]], responses: list[list[int]], rewards: list[float], groups: list[int]):
        import torch

        advantages = group_advantages(torch.tensor(rewards), groups)  # [N]
        chosen = [i for i in range(len(rewards)) if advantages[i] != 0 and responses[i]]
        tokens = sum(len(responses[i]) for i in chosen)
        for start in range(0, len(chosen), self.MICRO_BATCH):
            batch = chosen[start : start + self.MICRO_BATCH]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
                loss = sum(
                    self._sample_loss(prompts[i], responses[i], advantages[i])
                    / (tokens if self.token_mean else len(chosen) * len(responses[i]))
                    for i in batch
                )
            loss.backward()
        if chosen:
            self.optimizer.step()
            self.optimizer.zero_grad()
        return len(chosen)

    def _sample_loss(self, prompt: list[int], response: list[int], advantage):
        import torch

        ids = torch.tensor([prompt + response])  # [1, P + R]
        hidden = self.model.model(input_ids=ids).last_hidden_state[0, len(prompt) - 1 : -1]  # [R, H]
        logprobs = torch.log_softmax(self.model.lm_head(hidden).float(), dim=-1)  # [R, V]
        taken = logprobs.gather(1, torch.tensor(response)[:, None])[:, 0]  # [R]
        return -advantage * taken.sum()

    def write(self, path: Path, precision: str = "bfloat16") -> str:
        """The weights as a safetensors file for the engine, in `precision` (a float32 engine reading bfloat16
        weights samples a rounded policy: drift that no update made)."""
        import torch

        from .weights import write_weights

        dtype = getattr(torch, precision)
        return write_weights({k: v.to(dtype, copy=True) for k, v in self.model.state_dict().items()}, path)
