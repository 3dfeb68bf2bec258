"""Corpora of RL rollouts for the simulator (`simulator.engine`): stock generation from a policy trained between
epochs, recorded once; the named ones (`PRESETS`: `short`, `drift`, `long`) ship with the package.

A policy (`corpus_sources`: SmolLM2-135M-Instruct on word problems for `short` and `drift`, the tiny Qwen3 model
warm-started on the walk task for `long`), `samples` samples of each of `prompts` prompts an epoch, and between epochs
`updates` policy-gradient steps on that epoch's rollouts (`PartialTrainer`, group-normalised rewards), each on
`prompts_per_update` prompts' groups: the next epoch's responses come from a policy trained on the last epoch's, the
drift a returning prompt meets. Stock generation, because an exact rule's output has the same law, and a response that
no draft shaped is what the simulator's coupling needs. Each token's log-prob is kept as sampled, and after each
update the new policy scores the last epoch's responses (the scoring pass a ratio rule reads).

    python -m specrl_openrlhf.miniature.corpus long     # re-records a shipped corpus

A recording stopped part way (`--checkpoint`, in the user's cache by default) resumes from its last finished epoch.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..simulator.corpus import Corpus, quality
from . import user_cache

KV_CACHE_CAP = 8 << 30  # long responses: vLLM preempts past it rather than the machine swapping
SHIPPED = Path(__file__).resolve().parent / "corpora"  # the named corpora, recorded with `PRESETS`


@dataclass(frozen=True, kw_only=True)
class CorpusSettings:
    policy: str = "smollm2"  # what it is recorded from (`corpus_sources.MODELS`)
    prompts: int = 64
    samples: int = 16
    epochs: int = 3
    max_tokens: int = 224
    temperature: float = 0.35  # folded into the weights (`smollm2.sharpen`); sampled at temperature 1
    lr: float = 1e-4
    token_mean: bool = False  # the loss a mean over the batch's tokens (DAPO's), not over samples
    train_layers: int = 2
    updates: int = 4  # policy-gradient steps between epochs
    prompts_per_update: int = 4  # each on this many prompts' groups of the epoch just recorded
    max_num_seqs: int = 256
    warm_start_steps: int = 0  # the tiny policy's supervised steps on its task's teacher
    seed: int = 0
    dtype: str = "auto"

    def __post_init__(self):
        from .corpus_sources import MODELS

        if self.policy not in MODELS:
            raise ValueError(f"corpus policy must be one of {MODELS}, got {self.policy!r}")
        for name in ("prompts", "samples", "epochs", "max_tokens", "train_layers", "max_num_seqs"):
            if getattr(self, name) < 1:
                raise ValueError(f"corpus {name} must be at least 1, got {getattr(self, name)}")
        if self.samples < 2:
            raise ValueError("corpus samples must be at least 2 (group-normalised rewards)")
        if self.lr <= 0 or self.updates < 0 or self.prompts_per_update < 1:
            raise ValueError(
                f"corpus lr must be > 0, updates >= 0 and prompts_per_update >= 1, got {self.lr}, {self.updates}, "
                f"{self.prompts_per_update}"
            )


SHORT = CorpusSettings(prompts=32, samples=8, updates=2, prompts_per_update=4)
PRESETS = {  # sized for 2 CPU cores: short records in half an hour, long in minutes
    "short": SHORT,
    # short's prompts with twice its learning rate: the policy moves between epochs as much as a GRPO run's does.
    # float32 as short was recorded: a bfloat16 engine's rounding would be measured as drift too.
    "drift": dataclasses.replace(SHORT, lr=2e-4, dtype="float32"),
    # the walk task's long responses from the tiny policy: an RL policy's entropy (mostly certain, forks a line), and
    # the learning rate and updates that move it between visits as the paper's GRPO run moved (docs/benchmarks.md):
    # each epoch's rollouts trained on once, in two steps of half its prompts, as an RL step trains on its batch
    "long": CorpusSettings(
        policy="tiny",
        prompts=32,
        samples=8,
        epochs=4,
        max_tokens=1024,
        temperature=1.0,
        lr=3e-4,
        updates=2,
        prompts_per_update=16,
        token_mean=True,
        warm_start_steps=600,
        dtype="float32",
    ),
}


def named(name: str) -> Path:
    """The shipped file of a named corpus (`PRESETS`)."""
    if name not in PRESETS:
        raise ValueError(f"--corpus takes {', '.join(PRESETS)} or a corpus file, got {name!r}")
    return SHIPPED / f"{name}.npz"


def record(settings: CorpusSettings, progress=print, checkpoint: Path | None = None) -> Corpus:
    """The corpus `settings` describe. With `checkpoint` (a folder), each finished epoch is saved there with the
    trainer's state and the sampler's, and a later call with the same settings goes on from the last one saved (the
    engine's own random state is not saved: a resumed recording is another draw, of the same law)."""
    import random

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from .corpus_sources import source
    from .engine import cpu_dtype, cpu_engine_kwargs, machine, use_cpu_engine_env
    from .grpo import PartialTrainer
    from .weights import EXTENSION

    use_cpu_engine_env()
    policy = source(settings)
    prompts, tokenizer = policy.prompts, policy.tokenizer
    longest = max(len(p) for p in prompts) + settings.max_tokens
    dtype = cpu_dtype(settings.dtype)
    kv_bytes = settings.max_num_seqs * longest * policy.kv_bytes_per_token
    llm = LLM(
        model=str(policy.model_dir),
        worker_extension_cls=EXTENSION,
        **cpu_engine_kwargs(
            dtype=dtype,
            kv_cache_bytes=min(max(kv_bytes, 256 << 20), KV_CACHE_CAP),
            max_model_len=longest + 8,
            max_num_seqs=settings.max_num_seqs,
            max_num_batched_tokens=8192,
            seed=settings.seed,
        ),
    )
    trainer = PartialTrainer(
        policy.model_dir, settings.lr, settings.train_layers, settings.seed, settings.dtype, settings.token_mean
    )
    precision = "float32" if dtype == "float32" and settings.policy == "tiny" else "bfloat16"
    rng = random.Random(settings.seed)
    responses, logprobs, scores = [], [], [_unscored(settings)]
    meta = {"model": policy.name, **dataclasses.asdict(settings), "machine": machine(), "engine": dtype}
    saved = load_checkpoint(checkpoint, settings, prompts) if checkpoint else None
    if saved:
        partial, rng_state, trainer_state = saved
        responses, logprobs, scores = partial.responses, partial.logprobs, partial.scores
        rng.setstate(rng_state)
        trainer.load_state(trainer_state)
        with tempfile.TemporaryDirectory() as scratch:
            weights = trainer.write(Path(scratch) / "w.safetensors", precision)
            llm.collective_rpc("reload_safetensors", args=(weights,))
        progress(f"[corpus] resuming from {checkpoint} after epoch {len(responses) - 1}")
    for epoch in range(len(responses), settings.epochs):
        if epoch > 0:  # the new policy scores the last epoch's responses, as a ratio rule's scoring requests do
            scores.append(score(llm, prompts, responses[-1]))
        params = SamplingParams(n=settings.samples, max_tokens=settings.max_tokens, temperature=1.0, logprobs=0)
        outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=True)
        epoch_responses = [[list(c.token_ids) for c in o.outputs] for o in outputs]
        responses.append(epoch_responses)
        logprobs.append([[sampled_logprobs(c) for c in o.outputs] for o in outputs])
        so_far = Corpus(prompts, responses, {"max_tokens": settings.max_tokens}, logprobs, scores)
        progress(f"[corpus] epoch {epoch}: " + " ".join(f"{k}={v:.3f}" for k, v in quality(so_far).items()))
        if epoch + 1 == settings.epochs:
            break
        for update in range(settings.updates):  # the policy moves: the next epoch meets drift
            chosen = rng.sample(range(settings.prompts), min(settings.prompts_per_update, settings.prompts))
            batch = [(p, r) for p in chosen for r in epoch_responses[p]]
            rewards = policy.rewards([(p, tokenizer.decode(r, skip_special_tokens=True)) for p, r in batch])
            groups = [p for p, _ in batch]
            trained = trainer.step([prompts[p] for p in groups], [r for _, r in batch], rewards, groups)
            progress(
                f"[corpus] epoch {epoch}: update {update + 1}/{settings.updates} on {trained} samples, mean reward "
                f"{np.mean(rewards):.3f}"
            )
        with tempfile.TemporaryDirectory() as scratch:
            weights = trainer.write(Path(scratch) / "w.safetensors", precision)
            llm.collective_rpc("reload_safetensors", args=(weights,))
        llm.reset_prefix_cache()
        if checkpoint:
            save_checkpoint(checkpoint, settings, Corpus(prompts, responses, meta, logprobs, scores), rng, trainer)
    del llm
    return Corpus(prompts, responses, meta, logprobs, scores)


def save_checkpoint(folder: Path, settings: CorpusSettings, partial: Corpus, rng, trainer) -> None:
    """The epochs recorded so far, the sampler's state and the trainer's, written whole or not at all."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    partial.save(folder / "partial.tmp.npz")
    state = {"settings": dataclasses.asdict(settings), "rng": rng.getstate(), "trainer": trainer.state()}
    torch.save(state, folder / "state.tmp.pt")
    (folder / "partial.tmp.npz").replace(folder / "partial.npz")
    (folder / "state.tmp.pt").replace(folder / "state.pt")


def load_checkpoint(folder: Path, settings: CorpusSettings, prompts: list[list[int]]):
    """(partial corpus, sampler state, trainer state) saved for these settings and `prompts` (token ids: the prompt's
    format is code, not a setting), or None: none saved, another recording's, or unreadable (said, and recorded
    afresh)."""
    import torch

    if not (folder / "state.pt").is_file():
        return None
    try:
        state = torch.load(folder / "state.pt", weights_only=False)
        partial = Corpus.load(folder / "partial.npz")
    except Exception as error:  # a checkpoint cut short or corrupt: start again rather than fail
        print(f"[corpus] ignoring the checkpoint in {folder}: {error!r}")
        return None
    if state["settings"] != dataclasses.asdict(settings) or len(partial.responses) != len(partial.scores):
        print(f"[corpus] ignoring the checkpoint in {folder}: another recording's settings")
        return None
    if [list(p) for p in partial.prompts] != [list(p) for p in prompts]:
        print(f"[corpus] ignoring the checkpoint in {folder}: another recording's prompts (their format changed)")
        return None
    return partial, state["rng"], state["trainer"]


def _unscored(settings: CorpusSettings) -> list:
    return [[np.zeros(0, np.float32) for _ in range(settings.samples)] for _ in range(settings.prompts)]


def sampled_logprobs(completion) -> np.ndarray:
    """[len] each sampled token's log-prob, from a completion asked for `logprobs=0`."""
    return np.array(
        [entry[token].logprob for token, entry in zip(completion.token_ids, completion.logprobs)], np.float32
    )


def score(llm, prompts: list[list[int]], responses: list[list[list[int]]]) -> list[list[np.ndarray]]:
    """[P][n] the log-probs of each response's tokens under the engine's weights: one scoring request each
    (`prompt_logprobs`), as the request path's scorer sends them."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
    requests = [TokensPrompt(prompt_token_ids=p + r) for p, rs in zip(prompts, responses) for r in rs]
    outputs = iter(llm.generate(requests, params, use_tqdm=True))
    scored = []
    for prompt, samples in zip(prompts, responses):
        row = []
        for response in samples:
            entries = next(outputs).prompt_logprobs[len(prompt) :]
            row.append(np.array([entry[token].logprob for token, entry in zip(response, entries)], np.float32))
        scored.append(row)
    return scored


def default_checkpoint(name: str) -> Path:
    return user_cache("corpora") / name


def main(argv=None) -> int:
    """Re-records a named corpus into the package (`PRESETS`) and prints its quality figures. With `--lr`,
    `--updates` or `--prompts-per-update`, records a variant of it (a policy that drifts more or less between epochs)
    into `--out`."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m specrl_openrlhf.miniature.corpus", description=main.__doc__)
    parser.add_argument("name", choices=sorted(PRESETS))
    parser.add_argument("--out", default=None, help="where to write it (default: the shipped file)")
    parser.add_argument("--lr", type=float, default=None, help="the trainer's learning rate (default: the preset's)")
    parser.add_argument(
        "--updates", type=int, default=None, help="policy-gradient steps between epochs (default: the preset's)"
    )
    parser.add_argument(
        "--prompts-per-update", type=int, default=None, help="prompts' groups in each step (default: the preset's)"
    )
    parser.add_argument(
        "--checkpoint",
        default=None,
        help="a folder where each finished epoch is saved, and a run stopped part way resumes (default: "
        "specrl_openrlhf/corpora/NAME in the user's cache); removed once the corpus is written",
    )
    args = parser.parse_args(argv)
    given = (("lr", args.lr), ("updates", args.updates), ("prompts_per_update", args.prompts_per_update))
    overrides = {k: v for k, v in given if v is not None}
    if overrides and args.out is None:
        parser.error("--lr, --updates and --prompts-per-update record a variant of a preset: name its file with --out")
    try:
        settings = dataclasses.replace(PRESETS[args.name], **overrides)
    except ValueError:
        parser.error(f"--lr must be > 0, --updates >= 0 and --prompts-per-update >= 1, got {overrides}")
    variant = "".join(f"-{k}{v}" for k, v in overrides.items())
    checkpoint = Path(args.checkpoint) if args.checkpoint else default_checkpoint(args.name + variant)
    corpus = record(settings, checkpoint=checkpoint)
    path = Path(args.out) if args.out else named(args.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    corpus.save(path)
    shutil.rmtree(checkpoint, ignore_errors=True)
    figures = quality(corpus)
    print(f"[corpus] {args.name}{variant}: {path} " + " ".join(f"{k}={v:.3f}" for k, v in figures.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
