"""Speculative rollouts over several visits of the same prompts, with the weights changing between visits.

`python -m specrl_openrlhf.integration.cpu.demo` (what scripts/quickstart.sh runs) prints a per-visit reuse table;
scripts/bench_rollout.py uses `run_visits` to time `off` against `spec` side by side.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

COLUMNS = [
    ("visit", "visit", "{:>5}"),
    ("policy", "policy", "{:>7}"),
    ("drafts", "reuse/drafts_found", "{:>6.0f}"),
    ("full", "reuse/full_reuse_ratio", "{:>5.2f}"),
    ("prefix", "reuse/mean_verified_prefix_len", "{:>6.1f}"),
    ("reused", "reuse/reused_tokens", "{:>7.0f}"),
    ("decoded", "reuse/decoded_tokens", "{:>7.0f}"),
    ("scored", "reuse/scored_tokens", "{:>7.0f}"),
    ("accept", "reuse/acceptance_rate", "{:>6.3f}"),
    ("logratio", "reuse/mean_log_ratio", "{:>8.4f}"),
    ("score_s", "reuse/time_scoring_s", "{:>7.2f}"),
    ("gen_s", "reuse/time_generation_s", "{:>6.2f}"),
]


def format_row(row: dict) -> str:
    return " ".join(fmt.format(row[key]) for _, key, fmt in COLUMNS)


def header() -> str:
    widths = [len(fmt.format(0 if "f" in fmt else "")) for _, _, fmt in COLUMNS]
    return " ".join(f"{title:>{w}}" for (title, _, _), w in zip(COLUMNS, widths))


def start_engine(model_dir, **overrides):
    from .engine import start_llm

    return start_llm(model_dir, max_model_len=2048, **overrides)


def run_visits(llm, model_dir, rollouts: dict, prompts, params, visits: int, noise: float, on_row=print):
    """For each visit: load freshly perturbed weights, then run every rollout (name -> SpeculativeLLM) on the
    same prompts. Returns one metrics row per (visit, rollout)."""
    from .weights import perturbed_state_dict, update_llm_weights

    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for visit in range(visits):
            update_llm_weights(llm, perturbed_state_dict(model_dir, noise, seed=visit), scratch)
            for name, rollout in rollouts.items():
                batch = rollout.generate(prompts, params)
                row = {"visit": visit, "policy": name, **batch.metrics}
                rows.append(row)
                on_row(row)
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--policy", default="spec", help="reuse policy (see `python -m specrl_openrlhf policies`)")
    parser.add_argument("--lenience", type=float, default=None)
    parser.add_argument("--visits", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4, help="samples per prompt")
    parser.add_argument("--max_tokens", type=int, default=128)
    parser.add_argument("--noise", type=float, default=0.3, help="relative weight noise per visit")
    parser.add_argument("--model_dir", default=os.path.join(tempfile.gettempdir(), "specrl_tiny_model"))
    args = parser.parse_args(argv)

    from vllm import SamplingParams

    from ..config import ReuseConfig
    from .tiny_model import build_tiny_model
    from .vllm_rollout import SpeculativeLLM

    policy = ReuseConfig(policy=args.policy, lenience=args.lenience).build_policy()
    model_dir = build_tiny_model(Path(args.model_dir))
    llm = start_engine(model_dir)
    prompts = [[3 + p % 90, 40, 41, 42, 43] * 6 for p in range(args.prompts)]
    params = SamplingParams(n=args.n, max_tokens=args.max_tokens, logprobs=0)
    print(f"\nSpeculative rollout demo: policy {policy.describe()}, {args.prompts} prompts x {args.n} samples")
    print(header())
    run_visits(
        llm,
        model_dir,
        {args.policy: SpeculativeLLM(llm, policy)},
        prompts,
        params,
        args.visits,
        args.noise,
        on_row=lambda row: print(format_row(row), flush=True),
    )
    print("visit 0 has no drafts; later visits reuse verified prefixes and decode only the rest.")
    llm.llm_engine.engine_core.shutdown()


if __name__ == "__main__":
    main()
