"""What a verification step costs on a GPU: the time of one forward of a Qwen3-1.7B-shaped model (random bf16 weights,
a KV cache of `--context` tokens per row) that carries `tokens` tokens for each of `rows` rows, the shape of a decoding
step (1 token a row) or of a verification step (1 + drafted tokens a row). Plain PyTorch and transformers, nothing
else: it runs where vLLM does not (the lent GPU machine has neither vLLM nor a model hub).

    python scripts/bench_gpu_step.py                        # the Qwen3-1.7B shape on the GPU: rows x tokens per row
    python scripts/bench_gpu_step.py --shape tiny --device cpu --rows 2,4 --tokens 1,2   # a check on CPU
    python scripts/bench_gpu_step.py --curve curve.json --project '{"rows": 48, "carried": 150, "produced": 130}'

It prints one line per (rows, tokens) with the median step time, the time per carried token and per row, writes the
curve as JSON (`--out`), and fits the proposer's step-cost model t = base + per_row x rows + per_token x tokens to it.
`--project` then reads a recorded verification step's mean shape (rows, tokens carried, tokens produced: the proposer's
`reuse/` metrics give them) and prints what it would cost on the curve against plain decoding of the same rows: a
projection from a PyTorch forward, not a vLLM measurement (no scheduler, sampler or rejection sampler).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

SHAPES = {
    # Qwen3-1.7B's config.json: hidden 2048, 28 layers, 16 query and 8 key-value heads of 128, MLP 6144, vocab 151936
    "qwen3-1.7b": dict(
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        vocab_size=256,
        tie_word_embeddings=True,
    ),
}


def build(shape: str, device: str, dtype):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**SHAPES[shape], max_position_embeddings=32768)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(config).to(dtype)
    return model.eval(), config


def filled_cache(config, rows: int, context: int, device: str, dtype):
    """A KV cache of `context` random positions per row (what a prefill would leave; its values don't change a
    forward's cost)."""
    import torch
    from transformers import DynamicCache

    cache = DynamicCache()
    shape = (rows, config.num_key_value_heads, context, config.head_dim)
    for layer in range(config.num_hidden_layers):
        cache.update(
            torch.randn(shape, device=device, dtype=dtype), torch.randn(shape, device=device, dtype=dtype), layer
        )
    return cache


def step_time(model, config, cache, rows: int, tokens: int, context: int, repeats: int, device: str) -> float:
    """The median seconds of a forward of [rows, tokens] new tokens after `context` cached ones (logits of every
    position: verification needs them all)."""
    import torch

    ids = torch.randint(0, config.vocab_size, (rows, tokens), device=device)
    positions = (context + torch.arange(tokens, device=device)).expand(rows, tokens)
    times = []
    for attempt in range(repeats + 2):  # two warm-ups
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.inference_mode():
            model(input_ids=ids, position_ids=positions, past_key_values=cache, use_cache=True)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        if attempt >= 2:
            times.append(time.perf_counter() - start)
        cache.crop(-tokens)  # back to the context: every repeat is the same step
    return statistics.median(times)


def fit(curve: list[dict]) -> dict:
    """Least squares of t = base + per_row x rows + per_token x (rows x tokens per row) over the curve's points."""
    import numpy as np

    x = np.array([[1.0, p["rows"], p["rows"] * p["tokens"]] for p in curve])
    y = np.array([p["seconds"] for p in curve])
    params, *_ = np.linalg.lstsq(x, y, rcond=None)
    residual = float(np.sqrt(np.mean((x @ params - y) ** 2)) / np.mean(y)) if len(y) else float("nan")
    return {
        "base_s": float(params[0]),
        "per_row_s": float(params[1]),
        "per_token_s": float(params[2]),
        "rel_rms": residual,
    }


def project(model_fit: dict, step: dict) -> dict:
    """A recorded verification step's mean shape on the fitted curve, against plain decoding of the same rows."""
    rows, carried, produced = float(step["rows"]), float(step["carried"]), float(step["produced"])
    verify = model_fit["base_s"] + model_fit["per_row_s"] * rows + model_fit["per_token_s"] * carried
    plain = model_fit["base_s"] + model_fit["per_row_s"] * rows + model_fit["per_token_s"] * rows
    return {
        "verify_step_s": verify,
        "plain_step_s": plain,
        "tokens_per_s_ratio": (produced / verify) / (rows / plain),  # > 1: verification produces tokens faster
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-1.7b")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--rows", default="32,64,128,256,512")
    parser.add_argument("--tokens", default="1,2,4,9", help="tokens per row: 1 decodes, 1 + k verifies k drafts")
    parser.add_argument("--context", type=int, default=512, help="cached tokens per row")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None, help="write the curve and its fit here (JSON)")
    parser.add_argument("--curve", default=None, help="read a curve written by --out instead of measuring")
    parser.add_argument("--project", default=None, help='a step\'s mean shape: {"rows":, "carried":, "produced":}')
    args = parser.parse_args(argv)

    if args.curve:
        record = json.loads(Path(args.curve).read_text())
    else:
        import torch

        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        model, config = build(args.shape, device, dtype)
        name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
        print(f"device {name}, shape {args.shape}, context {args.context}, {args.repeats} repeats (median)")
        print(f"{'rows':>6} {'tokens/row':>10} {'step ms':>9} {'ms/token':>9} {'ms/row':>8}")
        curve = []
        for rows in [int(r) for r in args.rows.split(",")]:
            cache = filled_cache(config, rows, args.context, device, dtype)
            for tokens in [int(t) for t in args.tokens.split(",")]:
                seconds = step_time(model, config, cache, rows, tokens, args.context, args.repeats, device)
                curve.append({"rows": rows, "tokens": tokens, "seconds": seconds})
                ms = seconds * 1e3
                print(f"{rows:>6} {tokens:>10} {ms:>9.2f} {ms / (rows * tokens):>9.4f} {ms / rows:>8.3f}", flush=True)
            del cache
        record = {"device": name, "shape": args.shape, "context": args.context, "curve": curve}
        record["fit"] = fit(curve)
    model_fit = record["fit"]
    print(
        "fit: base {:.3f} ms + {:.4f} ms/row + {:.4f} ms/token (rms {:.1%} of the mean)".format(
            model_fit["base_s"] * 1e3,
            model_fit["per_row_s"] * 1e3,
            model_fit["per_token_s"] * 1e3,
            model_fit["rel_rms"],
        )
    )
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=1))
    if args.project:
        projected = project(model_fit, json.loads(args.project))
        print(
            "projection (a PyTorch forward, not vLLM): verification step {:.2f} ms, plain {:.2f} ms, tokens/s ratio "
            "{:.2f}".format(
                projected["verify_step_s"] * 1e3, projected["plain_step_s"] * 1e3, projected["tokens_per_s_ratio"]
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
