"""What per-token log-probs cost vLLM on CPU: the price `lossless` pays for keeping each decoded token's top-k.

Generates the same batch (prompts x exactly `--max-tokens` tokens) on the quickstart's tiny model with no log-probs,
with the sampled token's, with the top k, and with both without detokenizing (continuations skip it unless stop
strings need it). Each setting runs `--repeats` times, alternating, after one warm-up; the minimum is printed.

    python scripts/bench_logprobs.py [--prompts 256 --max-tokens 32 --top-k 20 --repeats 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--top-k", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    from specrl_openrlhf.miniature.engine import add_dtype_argument

    add_dtype_argument(parser, default="float32")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    from specrl_openrlhf.miniature.engine import cpu_dtype, cpu_engine_kwargs, dtype_line, use_cpu_engine_env

    use_cpu_engine_env()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from specrl_openrlhf.miniature.tiny_model import build_tiny_model

    model = build_tiny_model(tempfile.mkdtemp(prefix="bench_logprobs-"), hidden_size=192, eos_logit=-5.0)
    llm = LLM(model=str(model), **cpu_engine_kwargs(dtype=cpu_dtype(args.dtype), max_model_len=256))
    prompts = [TokensPrompt(prompt_token_ids=[5 + i % 50, 7, 9, 11] * 4) for i in range(args.prompts)]
    settings = {
        "no log-probs": {},
        "sampled token's log-prob": {"logprobs": 0},
        f"top {args.top_k}": {"logprobs": args.top_k},
        "sampled token's, no detokenizing": {"logprobs": 0, "detokenize": False},
        f"top {args.top_k}, no detokenizing": {"logprobs": args.top_k, "detokenize": False},
    }

    def run(**extra) -> float:
        params = SamplingParams(max_tokens=args.max_tokens, min_tokens=args.max_tokens, **extra)
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - start

    run()
    times = {name: [] for name in settings}
    for _ in range(args.repeats):
        for name, extra in settings.items():
            times[name].append(run(**extra))
    base = min(times["no log-probs"])
    print(f"{args.prompts} prompts x {args.max_tokens} tokens, min of {args.repeats}; {dtype_line(args.dtype)}")
    for name, seconds in times.items():
        print(f"  {name:<36} {min(seconds):6.2f} s  ({min(seconds) / base:.2f}x no log-probs)")


if __name__ == "__main__":
    main()
