"""Corpora of RL rollouts for the simulator (`analysis.simulator`): stock generation from a policy trained between
epochs, recorded once and cached.

The real model's: SmolLM2-135M-Instruct (`smollm2`, a temperature folded into its weights as in `real_model`) on the
word problems, `samples` samples of each of `prompts` prompts an epoch, and between epochs `updates` policy-gradient
steps on that epoch's rollouts (`PartialTrainer`, group-normalised rewards with `real_model`'s format bonus), each on
`prompts_per_update` prompts' groups: the next epoch's responses come from a policy trained on the last epoch's, the
drift a returning prompt meets. Stock generation, because an exact rule's output has the same law, and a response that
no draft shaped is what the simulator's coupling needs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..analysis.simulator import Corpus

FORMAT = 1  # bump when the recording changes


@dataclass(frozen=True, kw_only=True)
class CorpusSettings:
    prompts: int = 64
    samples: int = 16
    epochs: int = 3
    max_tokens: int = 224
    temperature: float = 0.35  # folded into the weights (`smollm2.sharpen`); sampled at temperature 1
    lr: float = 1e-4
    train_layers: int = 2
    updates: int = 4  # policy-gradient steps between epochs
    prompts_per_update: int = 4  # each on this many prompts' groups of the epoch just recorded
    max_num_seqs: int = 256
    seed: int = 0
    dtype: str = "auto"

    def __post_init__(self):
        for name in ("prompts", "samples", "epochs", "max_tokens", "train_layers", "max_num_seqs"):
            if getattr(self, name) < 1:
                raise ValueError(f"corpus {name} must be at least 1, got {getattr(self, name)}")
        if self.samples < 2:
            raise ValueError("corpus samples must be at least 2 (group-normalised rewards)")

    def key(self) -> str:
        """The cache key: what the recording depends on (not the dtype, which only sets its speed)."""
        fields = {k: v for k, v in dataclasses.asdict(self).items() if k != "dtype"}
        return hashlib.sha256(json.dumps({"format": FORMAT, **fields}, sort_keys=True).encode()).hexdigest()[:16]


def default_path(settings: CorpusSettings) -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specrl_openrlhf" / "corpus"
    return root / f"smollm2-{settings.prompts}x{settings.samples}x{settings.epochs}-{settings.key()}.npz"


def cached_or_recorded(settings: CorpusSettings, path: Path | None = None, progress=print) -> Corpus:
    """The corpus at `path` (default: the cache's), recorded there first if it is not."""
    path = Path(path) if path is not None else default_path(settings)
    if path.exists():
        return Corpus.load(path)
    progress(f"[corpus] recording {settings} into {path} (once; minutes)")
    corpus = record(settings, progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    corpus.save(path)
    return corpus


def record(settings: CorpusSettings, progress=print) -> Corpus:
    import random

    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from ..rewards.math_grader import grade
    from .engine import cpu_dtype, cpu_engine_kwargs, machine, use_cpu_engine_env
    from .grpo import PartialTrainer
    from .real_model import FORMAT_BONUS, boxed
    from .smollm2 import converted
    from .weights import EXTENSION
    from .word_problems import chat_prompt, splits

    use_cpu_engine_env()
    model_dir = converted(temperature=settings.temperature)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    problems, _ = splits(settings.prompts, 1, seed=settings.seed)
    prompts = [chat_prompt(tokenizer, p) for p in problems]
    longest = max(len(p) for p in prompts) + settings.max_tokens
    dtype = cpu_dtype(settings.dtype)
    llm = LLM(
        model=str(model_dir),
        worker_extension_cls=EXTENSION,
        **cpu_engine_kwargs(
            dtype=dtype,
            kv_cache_bytes=max(settings.max_num_seqs * longest * (48 << 10), 256 << 20),
            max_model_len=longest + 8,
            max_num_seqs=settings.max_num_seqs,
            max_num_batched_tokens=8192,
            seed=settings.seed,
        ),
    )
    trainer = PartialTrainer(model_dir, settings.lr, settings.train_layers, settings.seed, settings.dtype)
    rng = random.Random(settings.seed)
    responses = []
    meta = {"model": "SmolLM2-135M-Instruct", **dataclasses.asdict(settings), "machine": machine(), "engine": dtype}
    for epoch in range(settings.epochs):
        params = SamplingParams(n=settings.samples, max_tokens=settings.max_tokens, temperature=1.0)
        outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=True)
        epoch_responses = [[list(c.token_ids) for c in o.outputs] for o in outputs]
        responses.append(epoch_responses)
        tokens = sum(len(r) for p in epoch_responses for r in p)
        progress(f"[corpus] epoch {epoch}: {tokens} response tokens")
        if epoch + 1 == settings.epochs:
            break
        for update in range(settings.updates):  # the policy moves: the next epoch meets drift
            chosen = rng.sample(range(settings.prompts), min(settings.prompts_per_update, settings.prompts))
            batch = [(p, r) for p in chosen for r in epoch_responses[p]]
            texts = [tokenizer.decode(r, skip_special_tokens=True) for _, r in batch]
            labels = [problems[p].answer for p, _ in batch]
            rewards = [c + FORMAT_BONUS * boxed(t) for c, t in zip(grade(list(zip(texts, labels))), texts)]
            groups = [p for p, _ in batch]
            trained = trainer.step([prompts[p] for p in groups], [r for _, r in batch], rewards, groups)
            progress(f"[corpus] epoch {epoch}: update {update + 1}/{settings.updates} on {trained} samples")
        with tempfile.TemporaryDirectory() as scratch:
            llm.collective_rpc("reload_safetensors", args=(trainer.write(Path(scratch) / "w.safetensors"),))
        llm.reset_prefix_cache()
    del llm
    return Corpus(prompts, responses, meta)
