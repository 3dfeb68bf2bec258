"""`python scripts/bench_at_scale.py --map`: for each shipped corpus x model x GPU, which rule and path is fastest
against stock and by how much, with this machine's host time (`projected`) and with the host hidden
(`projected_async`), and how `lossless`'s best path stands against `exact` (the paper's near-exact rule) and vLLM's
suffix decoding. One line a cell (`MAP ...`), then a markdown table.

Simulations are shared across cells where they do not depend on the price (`at_scale.run_rules`), so the map costs
about one run per corpus, and one more of `lossless` per model x GPU (its budget prices drafts on each).
"""

from __future__ import annotations

import math
import time

from .at_scale import load_corpus, projections, run_rules, step_price
from .corpus import PRESETS

MODELS_MAPPED = ("qwen3-1.7b", "qwen3-8b", "qwen3-14b")
GPUS_MAPPED = ("h100", "h200", "b200")
LOSSLESS_PATHS = ("lossless", "lossless:requests")


def run_map(args, first_corpus, host, started: float) -> int:
    rows = []
    for name in PRESETS:
        corpus = first_corpus if args.corpus == name else load_corpus(name)
        cache: dict = {}
        for model in MODELS_MAPPED:
            for gpu in GPUS_MAPPED:
                runs = run_rules(args, corpus, model, gpu, host, cache)
                price, _ = step_price(args, model, gpu)
                result = projections(runs, host, price, args.schedule.max_num_seqs)
                rows.append(cell(name, model, gpu, result))
                print("MAP " + " ".join(f"{k}={v}" for k, v in rows[-1].items()))
    print(map_table(rows))
    print(f"RESULT cells={len(rows)} prefix_caching={args.prefix_caching} wall_s={time.perf_counter() - started:.0f}")
    return 0


def cell(corpus: str, model: str, gpu: str, result: dict) -> dict:
    """One cell: the fastest rule by each host reading, and lossless's best path against exact and suffix."""
    rules = [r for r in result if r != "off"]
    best = max(rules, key=lambda r: result[r].projected)
    best_async = max(rules, key=lambda r: result[r].projected_async)
    paths = [r for r in LOSSLESS_PATHS if r in result]
    lossless = max(paths, key=lambda r: result[r].projected) if paths else None

    def against(other: str) -> float:
        if lossless is None or other not in result:
            return math.nan
        return result[lossless].projected / result[other].projected

    return {
        "corpus": corpus,
        "model": model,
        "gpu": gpu,
        "best": best,
        "projected": round(result[best].projected, 3),
        "best_async": best_async,
        "projected_async": round(result[best_async].projected_async, 3),
        "lossless_path": lossless,
        "lossless": round(result[lossless].projected, 3) if lossless else math.nan,
        "over_exact": round(against("exact"), 3),
        "over_suffix": round(against("suffix"), 3),
        "breakeven_host_ms": round(result[lossless].breakeven_host_ms, 2) if lossless else math.nan,
    }


def map_table(rows: list[dict]) -> str:
    lines = [
        "| corpus | model | GPU | fastest (host measured here) | × stock | fastest (host hidden) | × stock | "
        "lossless's best path | × stock | × exact | × suffix | lossless ties stock at host ms |",
        "| --- | --- | --- | --- | ---: | --- | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for c in rows:
        lines.append(
            f"| {c['corpus']} | {c['model']} | {c['gpu']} | {c['best']} | {c['projected']:.2f} | {c['best_async']} | "
            f"{c['projected_async']:.2f} | {c['lossless_path']} | {c['lossless']:.2f} | {c['over_exact']:.2f} | "
            f"{c['over_suffix']:.2f} | {c['breakeven_host_ms']:.2f} |"
        )
    return "\n".join(lines)
