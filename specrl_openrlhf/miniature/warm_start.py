"""A starting policy: a tiny Qwen3 model, supervised on a task's noisy teacher (the quickstart's `task`, the long
corpus's `walk_task`: its `warm_start_examples`), cached on disk.

The cache key is every setting that shapes the weights, so changing one builds a new model and a second run with
the same settings loads the first one's. A model is built in a temporary folder and renamed into place when
complete: an interrupted build leaves nothing that a later run would take for a model.

The quickstart's default one (seed 0, its default settings: `DEFAULT_TASK`) ships with the package (`SHIPPED`, under
its cache key), so a fresh clone's first run skips the build, minutes on a CPU; `python -m
specrl_openrlhf.miniature.warm_start` builds it again into the package (after a change that changes its key). A build
elsewhere gives the same weights up to the CPU's float rounding.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import user_cache
from .task import TaskConfig

FORMAT = 3  # bump when the build changes in a way the settings do not show
COMPLETE = "specrl_warm_start.json"
SHIPPED = Path(__file__).resolve().parent / "warm_starts"  # models shipped with the package, a folder a cache key


@dataclass(frozen=True, kw_only=True)
class WarmStartConfig:
    hidden_size: int = 192  # 3 heads of 64; 128 learns the sums too poorly for RL to gain reliably
    num_layers: int = 2
    steps: int = 400
    batch_size: int = 64
    lr: float = 2e-3
    seed: int = 0


# The quickstart's default task (`--held-out-size 200`, seed 0): the shipped model's. The train split's size is not
# in the key (the warm start never reads the train split).
DEFAULT_TASK = TaskConfig(held_out_size=200, seed=0)


def default_cache_root() -> Path:
    return user_cache("warm_start")


def cache_key(config: WarmStartConfig, task: TaskConfig) -> str:
    """Every setting that shapes the weights; the train split's size does not (the warm start never reads it)."""
    task_settings = {k: v for k, v in dataclasses.asdict(task).items() if k != "train_size"}
    settings = {"format": FORMAT, "model": dataclasses.asdict(config), "task": task_settings}
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def warm_start(config: WarmStartConfig, task: TaskConfig, cache_root: str | Path | None = None, progress=None) -> Path:
    """The folder of the warm-started model (HF format, with its tokenizer): the shipped one where the settings are
    its (and no `cache_root` is given), else built once per settings into the cache."""
    key = cache_key(config, task)
    if cache_root is None and (SHIPPED / key / COMPLETE).is_file():
        return SHIPPED / key
    root = Path(cache_root) if cache_root is not None else default_cache_root()
    final = root / key
    if (final / COMPLETE).is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(dir=root, prefix=".building-"))
    try:
        _build(building, config, task, progress)
        (building / COMPLETE).write_text(
            json.dumps({"model": dataclasses.asdict(config), "task": dataclasses.asdict(task)})
        )
        try:
            os.replace(building, final)
        except OSError:  # another run finished the same model first
            if not (final / COMPLETE).is_file():
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return final


def _build(path: Path, config: WarmStartConfig, task: TaskConfig, progress) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .tiny_model import EOS_ID, build_tiny_model

    build_tiny_model(
        path,
        hidden_size=config.hidden_size,
        num_layers=config.num_layers,
        intermediate_size=2 * config.hidden_size,
        embedding_scale=1.0,
        eos_logit=0.0,
        seed=config.seed,
    )
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    torch.manual_seed(config.seed)
    examples = task.warm_start_examples(config.steps * config.batch_size, seed=config.seed + 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)
    warmup = max(config.steps // 10, 1)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup) * max(0.05, 1.0 - step / config.steps)
    )
    model.train()
    for step in range(config.steps):
        batch = examples[step * config.batch_size : (step + 1) * config.batch_size]
        input_ids, labels = [], []
        for prompt, solution in batch:
            prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            solution_ids = tokenizer(solution, add_special_tokens=False)["input_ids"] + [EOS_ID]
            input_ids.append(prompt_ids + solution_ids)
            labels.append([-100] * len(prompt_ids) + solution_ids)  # learn the solution, not the prompt
        width = max(map(len, input_ids))
        x = torch.tensor([ids + [0] * (width - len(ids)) for ids in input_ids])  # [B, T]
        y = torch.tensor([lab + [-100] * (width - len(lab)) for lab in labels])  # [B, T]
        mask = (torch.arange(width)[None, :] < torch.tensor([len(ids) for ids in input_ids])[:, None]).long()
        loss = model(input_ids=x, attention_mask=mask, labels=y).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        if progress is not None:
            progress(step + 1, config.steps, loss.detach().item())
    model.save_pretrained(path)


if __name__ == "__main__":  # the shipped model, built again into the package
    print(warm_start(WarmStartConfig(), DEFAULT_TASK, cache_root=SHIPPED))
