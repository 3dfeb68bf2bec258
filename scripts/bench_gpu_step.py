"""What a verification step costs on a GPU: the time of one forward of a Qwen3-1.7B-shaped model (random bf16 weights,
a KV cache of `--context` tokens per row) that carries `tokens` tokens for each of `rows` rows, the shape of a decoding
step (1 token a row) or of a verification step (1 + drafted tokens a row). Plain PyTorch and transformers, nothing
else: it runs where vLLM does not (the lent GPU machine has neither vLLM nor a model hub).

    python scripts/bench_gpu_step.py                        # the Qwen3-1.7B shape on the GPU: rows x tokens per row
    python scripts/bench_gpu_step.py --shape tiny --device cpu --rows 2,4 --tokens 1,2 --prefill 16,64   # on CPU
    python scripts/bench_gpu_step.py --curve curve.json --project '{"rows": 48, "carried": 150, "produced": 130}'

It prints one line per (rows, tokens) with the median step time, the time per carried token and per row, and a
prefill column (one forward of `--prefill` prompt tokens, no cache), writes the curve as JSON (`--out`), and fits
the proposer's step-cost model t = base + per_row x rows + per_token x tokens to it.
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


def grouped_attention(context: int):
    """Attention over `context` cached positions plus the step's own, causal among those, that reads the cache once
    per key-value head, as an engine's kernels do: transformers' SDPA path copies the cache once per query head (GQA
    with a mask), which makes the per-row cost several times an engine's. The query heads of a key-value head go along
    the sequence axis instead. Registered under transformers' attention interface (its public seam)."""
    import torch
    import torch.nn.functional as F

    masks = {}

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        # query [rows, query heads, T, d]; key, value [rows, kv heads, context + max T, d] (the whole static cache)
        rows, query_heads, tokens, dim = query.shape
        kv_heads = key.shape[1]
        group = query_heads // kv_heads
        seen = context + tokens
        grouped = query.reshape(rows, kv_heads, group * tokens, dim)  # [rows, kv heads, group x T, d]
        mask = None
        if tokens > 1:
            if (tokens, query.device) not in masks:
                step = torch.arange(group * tokens, device=query.device) % tokens
                masks[tokens, query.device] = (
                    torch.arange(seen, device=query.device)[None, :] <= context + step[:, None]
                )
            mask = masks[tokens, query.device]  # [group x T, context + T]
        out = F.scaled_dot_product_attention(
            grouped, key[:, :, :seen], value[:, :, :seen], attn_mask=mask, scale=scaling
        )
        return out.reshape(rows, query_heads, tokens, dim).transpose(1, 2).contiguous(), None

    return attention


def build(shape: str, device: str, dtype, context: int | None = None):
    """The model with random weights; with `context`, attention is `grouped_attention(context)`."""
    import torch
    from transformers import AttentionInterface, Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**SHAPES[shape], max_position_embeddings=32768)
    if context is not None:
        AttentionInterface.register("grouped_cache_reads", grouped_attention(context))
        config._attn_implementation = "grouped_cache_reads"
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(config).to(dtype)
    return model.eval(), config


def static_cache(config, context: int, max_tokens: int):
    """A preallocated KV cache of `context + max_tokens` positions per row, written in place as an engine's paged
    cache is (a DynamicCache would copy the whole cache every step). Its values don't change a forward's cost: the
    step attends to `context` cached positions plus the ones it carries."""
    from transformers import StaticCache

    return StaticCache(config=config, max_cache_len=context + max_tokens)


def rewind(cache, context: int) -> None:
    """Set every layer's write position back to `context`, so that each repeat is the same step. Recent transformers
    keep it in a tensor (read inside a captured CUDA graph, so reset before each replay), older ones take
    `cache_position`."""
    import torch

    for layer in getattr(cache, "layers", ()):
        length = getattr(layer, "cumulative_length", None)
        if isinstance(length, torch.Tensor):
            with torch.inference_mode():  # the forward made it an inference tensor
                length.fill_(context)
        elif length is not None:
            layer.cumulative_length = context


def forward(model, cache, ids, positions, cache_position):
    return model(
        input_ids=ids, position_ids=positions, cache_position=cache_position, past_key_values=cache, use_cache=True
    )


def step_inputs(config, rows: int, tokens: int, context: int, device: str):
    import torch

    ids = torch.randint(0, config.vocab_size, (rows, tokens), device=device)
    cache_position = context + torch.arange(tokens, device=device)
    return ids, cache_position.expand(rows, tokens), cache_position


def step_time(model, config, cache, rows: int, tokens: int, context: int, repeats: int, device: str) -> float:
    """The median seconds of an eager forward of [rows, tokens] new tokens after `context` cached ones (logits of
    every position: verification needs them all). Each repeat writes the same cache positions: the same step."""
    import torch

    ids, positions, cache_position = step_inputs(config, rows, tokens, context, device)
    times = []
    for attempt in range(repeats + 2):  # two warm-ups
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        rewind(cache, context)
        start = time.perf_counter()
        with torch.inference_mode():
            forward(model, cache, ids, positions, cache_position)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        if attempt >= 2:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def graph_step_time(model, config, cache, rows: int, tokens: int, context: int, repeats: int) -> float:
    """The same step replayed as a CUDA graph: the GPU's time without Python's launch overhead, which is what an
    engine that captures its decoding steps (vLLM does) pays."""
    import torch

    ids, positions, cache_position = step_inputs(config, rows, tokens, context, "cuda")
    with torch.inference_mode():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            rewind(cache, context)
            forward(model, cache, ids, positions, cache_position)
        torch.cuda.current_stream().wait_stream(side)
        rewind(cache, context)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            forward(model, cache, ids, positions, cache_position)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for attempt in range(repeats + 2):
        rewind(cache, context)
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        if attempt >= 2:
            times.append(start.elapsed_time(stop) / 1e3)
    del graph
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
    parser.add_argument(
        "--attention",
        choices=["grouped", "transformers"],
        default="grouped",
        help="grouped: one cache read per key-value head, as an engine's kernels; transformers: its SDPA path",
    )
    parser.add_argument("--eager-only", action="store_true", help="on a GPU, time eager forwards only")
    parser.add_argument(
        "--prefill",
        default="256,1024,4096",
        help="prompt tokens of the prefill column: one forward of that many tokens and no cache ('' for none)",
    )
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
        context = args.context if args.attention == "grouped" else None
        model, config = build(args.shape, device, dtype, context)
        name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
        print(
            f"device {name}, shape {args.shape}, context {args.context}, attention {args.attention}, "
            f"{args.repeats} repeats (median)"
        )
        graphs = device.startswith("cuda") and not args.eager_only
        print(f"{'rows':>6} {'tokens/row':>10} {'step ms':>9} {'ms/token':>9} {'ms/row':>8} {'eager ms':>9}")
        record = {
            "device": name,
            "shape": args.shape,
            "context": args.context,
            "attention": args.attention,
            "curve": [],
        }
        token_counts = [int(t) for t in args.tokens.split(",")]
        for rows in [int(r) for r in args.rows.split(",")]:
            cache = static_cache(config, args.context, max(token_counts))
            for tokens in token_counts:
                eager = step_time(model, config, cache, rows, tokens, args.context, args.repeats, device)
                seconds = eager
                if graphs:
                    try:
                        seconds = graph_step_time(model, config, cache, rows, tokens, args.context, args.repeats)
                    except Exception as error:  # a model the graph can't capture: say so, and time eagerly
                        print(f"warning: CUDA graph capture failed ({error!r}); eager timings from here on")
                        graphs, seconds = False, eager
                point = {"rows": rows, "tokens": tokens, "seconds": seconds, "eager_seconds": eager}
                point["timing"] = "cuda graph" if graphs else "eager"
                record["curve"].append(point)
                ms = seconds * 1e3
                print(
                    f"{rows:>6} {tokens:>10} {ms:>9.2f} {ms / (rows * tokens):>9.4f} {ms / rows:>8.3f} "
                    f"{eager * 1e3:>9.2f}",
                    flush=True,
                )
                if args.out:  # a run cut short keeps what it measured
                    Path(args.out).write_text(json.dumps(record, indent=1))
            del cache
        prefills = [int(t) for t in args.prefill.split(",") if t.strip()]
        if prefills:  # what a prefill costs: the simulator prices prefill steps on it (`StepCurve.prefill_cost`)
            del model
            model, config = build(args.shape, device, dtype, 0 if args.attention == "grouped" else None)
            record["prefill"] = []
            for tokens in prefills:
                cache = static_cache(config, 0, tokens)
                eager = step_time(model, config, cache, 1, tokens, 0, args.repeats, device)
                seconds = graph_step_time(model, config, cache, 1, tokens, 0, args.repeats) if graphs else eager
                record["prefill"].append({"tokens": tokens, "seconds": seconds, "eager_seconds": eager})
                print(f"prefill {tokens:>6} tokens {seconds * 1e3:>9.2f} ms", flush=True)
                del cache
        record["fit"] = fit(record["curve"])
        record["fit_eager"] = fit([dict(p, seconds=p["eager_seconds"]) for p in record["curve"]])
        if device.startswith("cuda"):
            print(f"peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    model_fit = record["fit"]
    print(
        "fit: base {:.3f} ms + {:.4f} ms/row + {:.4f} ms/token (rms {:.1%} of the mean)".format(
            model_fit["base_s"] * 1e3,
            model_fit["per_row_s"] * 1e3,
            model_fit["per_token_s"] * 1e3,
            model_fit["rel_rms"],
        )
    )
    if "fit_eager" in record and record["curve"] and record["curve"][0]["timing"] == "cuda graph":
        eager_fit = record["fit_eager"]
        print(
            "eager fit: base {:.3f} ms + {:.4f} ms/row + {:.4f} ms/token".format(
                eager_fit["base_s"] * 1e3, eager_fit["per_row_s"] * 1e3, eager_fit["per_token_s"] * 1e3
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
