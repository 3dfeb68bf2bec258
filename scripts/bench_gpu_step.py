"""What a verification step costs on a GPU: the time of one forward of a Qwen3-1.7B-shaped model (random bf16 weights,
a KV cache of `--context` tokens per row) that carries `tokens` tokens for each of `rows` rows, the shape of a decoding
step (1 token a row) or of a verification step (1 + drafted tokens a row). Plain PyTorch and transformers, and this
package's numpy-only `pricing.curves`: it runs where vLLM does not (the lent GPU machine has neither vLLM nor a model
hub), from a checkout where the package isn't installed too.

    python scripts/bench_gpu_step.py                        # the Qwen3-1.7B shape on the GPU: rows x tokens per row
    python scripts/bench_gpu_step.py --shape tiny --device cpu --rows 2,4 --tokens 1,2 --prefill 16,64   # on CPU
    python scripts/bench_gpu_step.py --context 512,2048,4096 --out curve.json   # curve_ctx512.json, ... one a context
    python scripts/bench_gpu_step.py --curve curve.json --project '{"rows": 48, "carried": 150, "produced": 130}'

It prints one line per (rows, tokens) with the median step time, the time per carried token and per row, and a
prefill column (one forward of `--prefill` prompt tokens, no cache, measured once), writes the curve as JSON (`--out`),
and fits one line t = base + per_row x rows + per_token x tokens to it (`pricing.curves.fit_linear`, for reference).
`--context` takes a comma list: the same grid at each context, one record (and with `--out` one file) per context,
each a single-context curve that `StepCurve.load` reads, the prefill column in each.
`--project` then reads a recorded verification step's mean shape (rows, tokens carried, tokens produced: the proposer's
`reuse/` metrics give them) and prices it on each context's curve (`StepCurve.time`) against plain decoding of the
same rows: a projection from a PyTorch forward, not a vLLM measurement (no scheduler, sampler or rejection sampler).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

try:
    from specrl_openrlhf.pricing.curves import StepCurve, describe, fit_linear
except ImportError:  # a checkout where the package isn't installed (the lent GPU machine): its root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from specrl_openrlhf.pricing.curves import StepCurve, describe, fit_linear

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


def contexts_arg(text: str) -> list[int]:
    """`--context`: one number of cached tokens per row, or a comma list of them."""
    try:
        contexts = [int(c) for c in text.split(",") if c.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma list of token counts: {text!r}") from None
    if not contexts or any(c < 0 for c in contexts) or len(set(contexts)) < len(contexts):
        raise argparse.ArgumentTypeError(f"want distinct token counts of 0 or more: {text!r}")
    return contexts


def step_arg(text: str) -> dict:
    """`--project`: a recorded step's mean shape, {"rows":, "carried":, "produced":}, all positive."""
    try:
        step = {key: float(value) for key, value in json.loads(text).items()}
        if set(step) != {"rows", "carried", "produced"} or not all(v > 0 for v in step.values()):
            raise ValueError
    except (ValueError, TypeError, AttributeError):
        want = '{"rows":, "carried":, "produced":}, each positive'
        raise argparse.ArgumentTypeError(f"want {want}; got {text!r}") from None
    return step


def context_path(out: str, context: int) -> Path:
    """Where a context's file goes when a run measures several: curve.json becomes curve_ctx512.json."""
    path = Path(out)
    return path.with_name(f"{path.stem}_ctx{context}{path.suffix}")


def measure_grid(args, model, config, context: int, device: str, name: str, graphs: bool, out: Path | None):
    """The grid of rows x tokens per row at `context` cached tokens per row: a record and whether graphs still
    capture (a model the graph can't capture is timed eagerly from there on)."""
    print(
        f"device {name}, shape {args.shape}, context {context}, attention {args.attention}, "
        f"{args.repeats} repeats (median)"
    )
    print(f"{'rows':>6} {'tokens/row':>10} {'step ms':>9} {'ms/token':>9} {'ms/row':>8} {'eager ms':>9}")
    record = {"device": name, "shape": args.shape, "context": context, "attention": args.attention, "curve": []}
    token_counts = [int(t) for t in args.tokens.split(",")]
    for rows in [int(r) for r in args.rows.split(",")]:
        cache = static_cache(config, context, max(token_counts))
        for tokens in token_counts:
            eager = step_time(model, config, cache, rows, tokens, context, args.repeats, device)
            seconds = eager
            if graphs:
                try:
                    seconds = graph_step_time(model, config, cache, rows, tokens, context, args.repeats)
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
            if out:  # a run cut short keeps what it measured
                out.write_text(json.dumps(record, indent=1))
        del cache
    return record, graphs


def report(record: dict, source: str, step: dict | None) -> None:
    """A record's fit and, with `step`, its projection: the step priced on the curve (`StepCurve.time`)."""
    model_fit = record.get("fit") or fit_linear(record["curve"])
    print(
        "fit: base {:.3f} ms + {:.4f} ms/row + {:.4f} ms/token (rms {:.1%} of the mean)".format(
            model_fit["base_s"] * 1e3,
            model_fit["per_row_s"] * 1e3,
            model_fit["per_token_s"] * 1e3,
            model_fit["rel_rms"],
        )
    )
    if "fit_eager" in record and record["curve"] and record["curve"][0].get("timing") == "cuda graph":
        eager_fit = record["fit_eager"]
        print(
            "eager fit: base {:.3f} ms + {:.4f} ms/row + {:.4f} ms/token".format(
                eager_fit["base_s"] * 1e3, eager_fit["per_row_s"] * 1e3, eager_fit["per_token_s"] * 1e3
            )
        )
    if step is not None:
        curve = StepCurve.from_data(record, source=source)
        rows, carried, produced = step["rows"], step["carried"], step["produced"]
        verify, plain = curve.time(rows, carried / rows), curve.time(rows, 1.0)
        ratio = (produced / verify) / (rows / plain)  # > 1: verification produces tokens faster
        print(
            f"projection, {record.get('shape', 'an unnamed')} shape on {describe(curve)} (a PyTorch forward, not "
            "vLLM): verification step {:.2f} ms, plain {:.2f} ms, tokens/s ratio {:.2f}".format(
                verify * 1e3, plain * 1e3, ratio
            )
        )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-1.7b")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--rows", default="32,64,128,256,512")
    parser.add_argument("--tokens", default="1,2,4,9", help="tokens per row: 1 decodes, 1 + k verifies k drafts")
    parser.add_argument(
        "--context",
        type=contexts_arg,
        default=[512],
        help="cached tokens per row, or a comma list (512,2048,4096): the same grid at each, one record per context "
        "(--out curve.json writes curve_ctx512.json, curve_ctx2048.json, ...)",
    )
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
        help="prompt tokens of the prefill column: one forward of that many tokens and no cache ('' for none); "
        "measured once, stored with every context's curve",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="write the curve and its fit here (JSON); with several contexts one file each, curve.json becoming "
        "curve_ctx512.json, curve_ctx2048.json, ... (each a single-context curve)",
    )
    parser.add_argument("--curve", default=None, help="read a curve written by --out instead of measuring")
    parser.add_argument(
        "--project",
        type=step_arg,
        default=None,
        help='a step\'s mean shape: {"rows":, "carried":, "produced":}, priced on each context\'s curve',
    )
    args = parser.parse_args(argv)
    if args.project and not args.curve and min(len(set(args.rows.split(","))), len(set(args.tokens.split(",")))) < 2:
        parser.error("--project prices on the measured curve, which needs 2 or more --rows and --tokens")

    if args.curve:
        records = [(json.loads(Path(args.curve).read_text()), args.curve)]
    else:
        import torch

        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
        graphs = device.startswith("cuda") and not args.eager_only
        several = len(args.context) > 1
        records, model = [], None
        for context in args.context:
            if model is None or args.attention == "grouped":  # the grouped attention reads `context` cached tokens
                del model
                model, config = build(args.shape, device, dtype, context if args.attention == "grouped" else None)
            out = None if not args.out else context_path(args.out, context) if several else Path(args.out)
            record, graphs = measure_grid(args, model, config, context, device, name, graphs, out)
            records.append((record, str(out) if out else f"the curve measured at context {context}"))
        prefills = [int(t) for t in args.prefill.split(",") if t.strip()]
        if prefills:  # what a prefill costs: the simulator prices prefill steps on it (`StepCurve.prefill_cost`)
            del model
            model, config = build(args.shape, device, dtype, 0 if args.attention == "grouped" else None)
            column = []
            for tokens in prefills:
                cache = static_cache(config, 0, tokens)
                eager = step_time(model, config, cache, 1, tokens, 0, args.repeats, device)
                seconds = graph_step_time(model, config, cache, 1, tokens, 0, args.repeats) if graphs else eager
                column.append({"tokens": tokens, "seconds": seconds, "eager_seconds": eager})
                print(f"prefill {tokens:>6} tokens {seconds * 1e3:>9.2f} ms", flush=True)
                del cache
            for record, _ in records:  # measured once: no cache, so the same at every context
                record["prefill"] = [dict(point) for point in column]
        for record, source in records:
            record["fit"] = fit_linear(record["curve"])
            record["fit_eager"] = fit_linear([dict(p, seconds=p["eager_seconds"]) for p in record["curve"]])
            if args.out:
                Path(source).write_text(json.dumps(record, indent=1))
        if device.startswith("cuda"):
            print(f"peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    for record, source in records:
        if len(records) > 1:
            print(f"context {record['context']} ({source}):")
        report(record, source, args.project)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
