"""What a corpus (`corpus`) is recorded from: a policy, its prompts and the reward its updates earn.

- `smollm2`: SmolLM2-135M-Instruct (a temperature folded into its weights, `smollm2.sharpen`) on one word problem a
  prompt (`word_problems`), rewarded for the right answer with `real_model`'s format bonus.
- `tiny`: the tiny Qwen3 model (`tiny_model`) warm-started on the walk task (`walk_task`: long responses, two forks
  a line), the temperature folded in the same way, rewarded by the task's `reward`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import user_cache

MODELS = ("smollm2", "tiny")
WALK_WARM_START_BATCH = 8  # `walk_task.WARM_START_RUN`: walks of about the same length
WALK_WARM_START_LR = 3e-3


@dataclass(frozen=True)
class Source:
    """A policy's folder (HF format, with its tokenizer), the prompts (token ids) and the reward of a response (its
    prompt's index and its text; a batch at a time)."""

    name: str
    model_dir: Path
    tokenizer: object
    prompts: list[list[int]]
    rewards: Callable[[list[tuple[int, str]]], list[float]]
    kv_bytes_per_token: int


def source(settings) -> Source:
    """The source `settings.policy` names (`MODELS`), for `settings.prompts` prompts."""
    if settings.policy not in MODELS:
        raise ValueError(f"corpus policy must be one of {MODELS}, got {settings.policy!r}")
    return _smollm2(settings) if settings.policy == "smollm2" else _tiny(settings)


def _smollm2(settings) -> Source:
    from transformers import AutoTokenizer

    from ..rewards.math_grader import grade
    from .real_model import FORMAT_BONUS, boxed
    from .smollm2 import converted
    from .word_problems import chat_prompt, splits

    model_dir = converted(temperature=settings.temperature)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    problems, _ = splits(settings.prompts, 1, seed=settings.seed)

    def rewards(batch):
        texts = [text for _, text in batch]
        correct = grade([(text, problems[p].answer) for p, text in batch])
        return [c + FORMAT_BONUS * boxed(t) for c, t in zip(correct, texts)]

    prompts = [chat_prompt(tokenizer, p) for p in problems]
    return Source("SmolLM2-135M-Instruct", model_dir, tokenizer, prompts, rewards, 48 << 10)


def _tiny(settings) -> Source:
    from transformers import AutoTokenizer

    from .walk_task import WalkTaskConfig, prompt, reward
    from .warm_start import WarmStartConfig, warm_start

    task = WalkTaskConfig(seed=settings.seed)
    config = WarmStartConfig(
        steps=settings.warm_start_steps, batch_size=WALK_WARM_START_BATCH, lr=WALK_WARM_START_LR, seed=settings.seed
    )
    model_dir = sharpened(warm_start(config, task, progress=_every(50)), settings.temperature)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    starts = task.problems(settings.prompts)
    prompts = [tokenizer(prompt(s), add_special_tokens=False)["input_ids"] for s in starts]
    layers, width = _shape(model_dir)
    return Source(
        "tiny Qwen3 (walk task)",
        model_dir,
        tokenizer,
        prompts,
        lambda batch: [reward(text, starts[p]) for p, text in batch],
        2 * layers * width * 4,  # keys and values, float32
    )


def _every(steps: int):
    def progress(step, total, loss):
        if step % steps == 0 or step == total:
            print(f"[corpus] warm start: step {step}/{total}, loss {loss:.4f}", flush=True)

    return progress


def _shape(model_dir: Path) -> tuple[int, int]:
    config = json.loads((model_dir / "config.json").read_text())
    return config["num_hidden_layers"], config["num_key_value_heads"] * config["head_dim"]


def sharpened(model_dir: Path, temperature: float) -> Path:
    """`model_dir` with `temperature` folded into its weights (`smollm2.sharpen`), in the user's cache beside it;
    `model_dir` itself at temperature 1."""
    if not 0.0 < temperature <= 1.0:
        raise ValueError(f"temperature must be in (0, 1], got {temperature}")
    if temperature == 1.0:
        return model_dir
    final = user_cache("sharpened") / f"{model_dir.name}-T{temperature:g}"
    if (final / "model.safetensors").is_file():
        return final
    import torch
    from transformers import AutoModelForCausalLM

    from .smollm2 import sharpen

    final.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(dir=final.parent, prefix=".building-"))
    try:
        shutil.copytree(model_dir, building, dirs_exist_ok=True)
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        sharpen(model, temperature)
        model.save_pretrained(building)
        try:
            os.replace(building, final)
        except OSError:  # another run finished it first
            if not (final / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return final
