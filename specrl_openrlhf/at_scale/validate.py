"""`python scripts/bench_at_scale.py --validate`: the simulator (`simulator.engine`) against the real engine at
bench_real_model's size, on the same prompts and weights: each rule's own responses replayed (verification is one-hot,
so an output token equal to the draft's is exactly a kept one), the engine steps and kept shares compared.
"""

from __future__ import annotations

import os

from ..markdown import numbers, table
from ..simulator.corpus import Corpus
from ..simulator.engine import EngineSimulator, Schedule
from .proposers import build
from .rules import bench_rule

# the real engine's rules (`real_model_settings.RULES`) and the simulator's names for them: the engine path and the
# request path (its scoring requests and continuations, `simulator.request_workload`)
VALIDATED = {
    "off": "off",
    "lossless": "lossless",
    "suffix": "suffix",
    "lossless(verify=requests)": "lossless,verify=requests",
}


async def engine_visits(settings, progress=print) -> dict[str, tuple[Corpus, list[tuple[int, int, int]]]]:
    """The real engine at bench_real_model's size (`settings`: a `real_model.Settings`), no training between visits,
    per rule: its responses as a corpus, and per visit the engine steps it ran, the response tokens it kept from
    drafts and all its response tokens. Verification is one-hot, so an output token equal to the draft's is exactly
    a kept one: replaying a rule's own responses, the simulator should find the engine's own verdicts."""
    import random

    import vllm
    from transformers import AutoTokenizer

    from ..integration.rollout.generator import gather_samples
    from ..integration.vllm.step_log import take_steps
    from ..miniature.real_model import Lane, engine_args, new_generator
    from ..miniature.smollm2 import converted
    from ..miniature.word_problems import chat_prompt, splits

    model_dir = converted(temperature=settings.temperature)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    train, _ = splits(settings.prompts * 16, settings.held_out, seed=1234)
    problems = random.Random(settings.seeds[0]).sample(train, settings.prompts)
    prompts = [chat_prompt(tokenizer, p) for p in problems]
    params = vllm.SamplingParams(n=settings.samples, max_tokens=settings.max_tokens, temperature=1.0, logprobs=0)
    lanes, measured, responses = [], {}, {}
    try:
        for method in settings.methods():
            args = engine_args(model_dir, settings, method.config.build_policy(), max(len(p) for p in prompts))
            lane = Lane(method, vllm.AsyncLLMEngine.from_engine_args(vllm.AsyncEngineArgs(**args)))
            lane.generator = new_generator(lane, settings, settings.seeds[0])
            lanes.append(lane)
        for visit in range(settings.visits):
            for lane in lanes:
                take_steps(lane.engine)
                batch = await gather_samples(lane.generator, prompts, params)
                steps, s, rule = take_steps(lane.engine), batch.stats, lane.method.name
                measured.setdefault(rule, []).append((len(steps), s.reused_tokens, s.reused_tokens + s.decoded_tokens))
                responses.setdefault(rule, []).append([[list(o.token_ids) for o in row] for row in batch.outputs])
                progress(f"[validate] visit {visit} {lane.method.name}: {len(steps)} steps")
    finally:
        for lane in lanes:
            lane.engine.shutdown()
            lane.engine = lane.generator = None  # gone before the interpreter's exit, where vLLM's __del__ would fail
    meta = {"model": "SmolLM2-135M-Instruct", "validation": True}
    return {rule: (Corpus(prompts, responses[rule], meta), measured[rule]) for rule in measured}


def validated(rules: list[str]) -> tuple[dict[str, str], list[str]]:
    """The engine's rules `--rules` names (their spellings) that this check runs, off always, and those it can't: a
    ratio rule has no engine-path twin here, ngram no replay of its own responses. A rule that does not parse is a
    ValueError (`rules.bench_rule`)."""
    for rule in rules:
        bench_rule(rule)
    checked = {name: rule for name, rule in VALIDATED.items() if rule == "off" or rule in rules}
    return checked, [rule for rule in rules if rule not in checked.values()]


def validate(args) -> int:
    """`--validate`: the simulator against the engine at bench_real_model's size, for off and those of lossless (in
    the engine and on the request path) and suffix that `--rules` names; lossless's budget priced on the H200 curve in
    both."""
    import asyncio

    from ..miniature.engine import use_cpu_engine_env
    from ..miniature.real_model_settings import DEFAULT_CURVE, Settings
    from ..pricing.curves import StepCurve
    from ..simulator.request_workload import NoDrafts, request_workload

    checked, skipped = validated(args.rules)
    if skipped:
        print(f"[validate] not checked against an engine: {', '.join(skipped)}")
    use_cpu_engine_env()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"  # as bench_real_model: the model's own OpenMP threads
    settings = Settings(
        prompts=3,
        samples=8,
        visits=args.visits,
        seeds=(0,),
        rules=tuple(checked),
        cost_curve=str(DEFAULT_CURVE),
        lr=0.0,
    )
    curve = StepCurve.load(DEFAULT_CURVE)
    engine = asyncio.run(engine_visits(settings, progress=print))
    schedule = Schedule(max_num_seqs=settings.prompts * settings.samples, prompts_per_step=settings.prompts)
    errors, rows = {}, []
    for name, rule in checked.items():
        corpus, visits = engine[name]  # the rule's own responses: the engine's verdicts are in them
        corpus = Corpus(corpus.prompts, corpus.responses, {**corpus.meta, "max_tokens": settings.max_tokens})
        parsed = bench_rule(rule)
        if parsed.path == "requests":  # its requests, no proposer in the engine
            workload = request_workload(parsed.policy, corpus)
            sim = EngineSimulator(corpus, schedule, NoDrafts(), workload=workload).run()
        else:
            proposer = build(parsed.policy, corpus, schedule, curve, 10_000)  # vLLM's cache: every visit here
            sim = EngineSimulator(corpus, schedule, proposer).run()
        later = [r for r in sim.records if r.rl_step >= 1]  # from the second visit on: the first has no previous one
        tokens = sum(total for *_, total in visits[1:])
        kept = sum(r.accepted for r in later) + sim.kept_outside  # the request path's kept prefixes: none in visit 1
        sim_steps, sim_kept = len(later), kept / tokens
        real_steps, real_kept = sum(steps for steps, *_ in visits[1:]), sum(kept for _, kept, _ in visits[1:]) / tokens
        errors[rule] = (sim_steps / real_steps - 1, (sim_kept - real_kept) / real_kept if real_kept else 0.0)
        rows.append([rule, real_steps, sim_steps, f"{real_kept:.1%}", f"{sim_kept:.1%}"])
    head = ["rule", "engine steps", "simulated steps", "engine kept", "simulated kept"]
    print(table(head, rows, numbers(1, len(head))))
    print(
        "RESULT "
        + "".join(f"steps_err[{r}]={e[0]:+.3f} kept_err[{r}]={e[1]:+.3f} " for r, e in errors.items())
        + f"visits={settings.visits}"
    )
    return 0
