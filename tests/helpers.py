"""Helpers that several test modules share (a module of their own, so no test module imports another)."""

import math
import textwrap
import types
from pathlib import Path

import numpy as np

import specrl_openrlhf as sr

REPO = Path(__file__).resolve().parents[1]
ADAPTIVE = f"{REPO / 'policies' / 'adaptive_lenience.py'}:AdaptiveLenience"
GRIDS = REPO / "configs" / "grids"


def a_real_picture(path: Path) -> bool:
    """A PNG that decodes to a figure with something drawn on it (not blank)."""
    from PIL import Image

    with Image.open(path) as image:
        pixels = np.asarray(image.convert("L"), dtype=np.float64)
    return image.format == "PNG" and min(pixels.shape) > 100 and pixels.std() > 10


def flag_value(command: list[str], flag: str) -> str | None:
    """The last value given to `flag` (argparse keeps the last)."""
    values = [command[i + 1] for i, word in enumerate(command[:-1]) if word == flag]
    return values[-1] if values else None


def result_fields(line: str) -> dict[str, str]:
    """A `RESULT` (or `MAP`) line's fields: each word after the first cut at its first `=` outside brackets, so that a
    rule's label keeps its own (`projected[lossless,verify=requests]=0.95`, `fastest=lossless,verify=requests`)."""
    fields = {}
    for word in line.split()[1:]:
        depth, cut = 0, None
        for i, char in enumerate(word):
            depth += (char == "[") - (char == "]")
            if char == "=" and depth == 0:
                cut = i
                break
        if cut is not None:
            fields[word[:cut]] = word[cut + 1 :]
    return fields


def write_grid(tmp_path, text: str) -> Path:
    """A grid file `g.yaml` holding `text`, beside the presets it may name (common, grpo)."""
    (tmp_path / "configs" / "grids").mkdir(parents=True, exist_ok=True)
    for name in ("common", "grpo"):
        (tmp_path / "configs" / f"{name}.args").write_text("--rollout.n_samples_per_prompt 8\n")
    path = tmp_path / "configs" / "grids" / "g.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def draft(tokens, logprobs=None, finish="stop"):
    logprobs = [-1.0] * len(tokens) if logprobs is None else logprobs
    return sr.Draft(np.asarray(tokens, np.int32), np.asarray(logprobs, np.float32), finish)


def history_of(*responses, logprobs=None):
    """A `History` of token lists (and their p_prev, if given)."""
    from specrl_openrlhf.history import History

    history = History()
    for i, response in enumerate(responses):
        history.add(response, None if logprobs is None else logprobs[i])
    return history


def cut_drafts(planner, count: int, seed: int = 0):
    """`count` scored drafts of varying length through the planner, as a rollout would cut them."""
    rng = np.random.default_rng(seed)
    samples = []
    for i in range(count):
        length = int(rng.integers(1, 30))
        logprobs = rng.uniform(-2.0, 0.0, length).astype(np.float32)
        sample = planner.new_sample([1, 2, 3], 64, draft([5] * length, logprobs), key=i.to_bytes(16, "little"))
        if planner.scores_drafts:  # as the rollout does: only rules that score drafts get p_curr
            sample.scored = logprobs - rng.exponential(0.3, length).astype(np.float32)
        samples.append(sample)
    planner.decide(samples)
    return samples


# A check that a sampler follows its law passes below chi-square's 1 - 1e-5 quantile: an engine's draws are not
# seeded, and the suite holds dozens of such checks, so at 99.9% one run in a few dozen would fail by chance. A check
# that a biased sampler is caught needs only exceed the 99.9% quantile.
Z_FOLLOWS, Z_DETECTS = 4.2649, 3.0902  # the standard normal's 1 - 1e-5 and 99.9% quantiles


def chi2_quantile(dof: int, z: float) -> float:
    """Chi-square's quantile at the standard normal's `z` with `dof` degrees of freedom (Wilson-Hilferty)."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def chi2_statistic(counts: np.ndarray, p: np.ndarray) -> tuple[float, int]:
    """Pearson's chi-square of `counts` against `p` (tokens expected fewer than 5 times pooled), and its dof."""
    n = counts.sum()
    likely = p * n >= 5
    expected = np.append(p[likely] * n, p[~likely].sum() * n)
    observed = np.append(counts[likely], counts[~likely].sum())
    keep = expected > 0
    chi2 = float(((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    return chi2, int(keep.sum()) - 1


def chi2_passes(counts: np.ndarray, p: np.ndarray) -> bool:
    """`counts` are consistent with `p`: chi-square below its 1 - 1e-5 quantile."""
    chi2, dof = chi2_statistic(counts, p)
    return chi2 < chi2_quantile(dof, Z_FOLLOWS)


def chi2_detects(counts: np.ndarray, p: np.ndarray) -> bool:
    """`counts` are not drawn from `p`: chi-square above its 99.9% quantile."""
    chi2, dof = chi2_statistic(counts, p)
    return chi2 > chi2_quantile(dof, Z_DETECTS)


def samples_generator(actors, tokenizer, loader, eval_loader=None, *, batch_size: int, n_samples: int):
    """OpenRLHF's `SamplesGenerator` over `actors`, with the arguments it reads (`batch_size` prompts a batch)."""
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

    args = types.SimpleNamespace(
        rollout=types.SimpleNamespace(
            batch_size=batch_size, n_samples_per_prompt=n_samples, vllm_generate_batch_size=None
        ),
        vllm=types.SimpleNamespace(enable_sleep=False),
        algo=types.SimpleNamespace(
            dynamic_filtering_enable=False, advantage=types.SimpleNamespace(is_correction_level="token")
        ),
    )
    return SamplesGenerator(types.SimpleNamespace(args=args), loader, eval_loader, tokenizer, actors)


# ---- a speculative rollout on the session's engine (tests/integration/rollout, tests/integration/vllm) -------------

PROMPTS = [[3 + p, 40, 41, 42, 43] * 7 for p in range(6)]  # 35 tokens: more than one 32-token block


def params(**overrides):
    from vllm import SamplingParams

    base = dict(n=4, max_tokens=64, logprobs=0)
    base.update(overrides)
    return SamplingParams(**base)


def generator(engine, policy, *, seed=0, store=None, scoring="chunked", generate=None, samples_per_visit=4):
    from specrl_openrlhf.integration.rollout.generator import AsyncSpeculativeGenerator, LocalDraftStore
    from specrl_openrlhf.integration.vllm.edge import engine_generate, engine_limits, stop_token_ids

    max_token_id, max_model_len = engine_limits(engine.model_config, engine.tokenizer)
    planner = sr.SpeculativePlanner(
        policy,
        seed=seed,
        max_token_id=max_token_id,
        max_model_len=max_model_len,
        scoring=scoring,
        stop_token_ids=stop_token_ids(engine.model_config, engine.tokenizer),
        processed_logprobs=str(engine.model_config.logprobs_mode).endswith("processed_logprobs"),
    )
    store = store or LocalDraftStore(keep_visits=policy.visits_kept)
    return AsyncSpeculativeGenerator(
        generate or engine_generate(engine), policy, store, samples_per_visit=samples_per_visit, planner=planner
    )


def rollout(async_engine, gen, prompts, sampling):
    from specrl_openrlhf.integration.rollout.generator import gather_samples

    _, runner = async_engine
    return runner.run(gather_samples(gen, prompts, sampling))


def score(async_engine, prompt, response):
    """Current-policy logprob of each response token (one uncached scoring request)."""
    from specrl_openrlhf.integration.vllm.edge import engine_generate, scoring_params
    from specrl_openrlhf.request_path.scoring_messages import ScoringRequest

    engine, runner = async_engine
    request = ScoringRequest(list(prompt) + list(response), 0, len(response), False)
    out = runner.run(engine_generate(engine)(request.token_ids, scoring_params(request)))
    return [out.prompt_logprobs[len(prompt) + i][t].logprob for i, t in enumerate(response)]


# ---- the law of an engine's samples (exactness tests) ----------------------------------------------------------


def probs(engine_pair, prompt, temperature) -> np.ndarray:
    """The model's next-token law at `temperature` after `prompt` (processed log-probs: after temperature)."""
    from vllm import SamplingParams

    from specrl_openrlhf.integration.vllm.edge import engine_generate

    engine, runner = engine_pair
    params = SamplingParams(max_tokens=1, logprobs=128, temperature=temperature)
    answer = runner.run(engine_generate(engine)(list(prompt), params))
    p = np.zeros(128)
    for token, logprob in answer.outputs[0].logprobs[0].items():
        p[token] = math.exp(logprob.logprob)
    return p / p.sum()


def joint_after(engine_pair, prompt, tokens, temperature):
    """(counts, law) of the (second, third) tokens of samples after `prompt`: cells (t1, t2) for every t1 expected at
    least 5 times, and one cell for all other t1."""
    second = probs(engine_pair, prompt, temperature)
    rows = [int(t) for t in np.flatnonzero(second * len(tokens) >= 5)]
    counts, law = np.zeros(len(rows) * 128 + 1), np.zeros(len(rows) * 128 + 1)
    for i, t1 in enumerate(rows):
        law[i * 128 : (i + 1) * 128] = second[t1] * probs(engine_pair, prompt + [t1], temperature)
    law[-1] = 1.0 - second[rows].sum()
    index = {t1: i for i, t1 in enumerate(rows)}
    for t1, t2 in tokens:
        counts[index[t1] * 128 + t2 if t1 in index else -1] += 1
    return counts, law


class NoHostSync:
    """A context in which any torch op that makes the host wait for the device fails the test: reading a value
    (`.item()`, `int(t)`, `.tolist()`), `nonzero`, indexing with a boolean mask, `unique`, `masked_select`. On CPU
    tensors nothing waits, so this is how a CPU test sees a host sync that a GPU would pay (CUDA's sync debug mode is
    the GPU's own check: `scripts/bench_speculator_gpu.py`)."""

    SYNCING = {
        "aten::_local_scalar_dense",
        "aten::nonzero",
        "aten::nonzero_static",
        "aten::masked_select",
        "aten::is_nonzero",
        "aten::equal",
        "aten::_unique2",
        "aten::unique_consecutive",
        "aten::unique_dim",
    }

    def __enter__(self):
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        syncing = self.SYNCING

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = func._schema.name
                boolean_index = name == "aten::index" and any(
                    getattr(i, "dtype", None) in (torch.bool, torch.uint8) for i in (args[1] if len(args) > 1 else ())
                )
                if name in syncing or boolean_index:
                    raise AssertionError(f"a host sync in the step: {func}")
                return func(*args, **(kwargs or {}))

        self.mode = Mode()
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self.mode.__exit__(*exc)
