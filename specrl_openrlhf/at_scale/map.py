"""`python scripts/bench_at_scale.py --map`: for each shipped corpus x regime x model x GPU, which rule and path is
fastest against stock and by how much (the run at the regime's spacing, as its visits mix a first visit and later
ones: `spacing`), with the regime's host time (`projected`), with the host hidden
(`projected_async`) and with no host at all (`projected_no_host`), and how `lossless`'s best path stands against
`exact` (the paper's near-exact rule) and vLLM's suffix decoding. One line a cell (`MAP ...`), then a markdown table,
then the map as a picture (`heatmap`).

The engine path's verification reads each row's cache once a step (`--attention once`), a lower bound of its cost;
the map prices the same steps of `lossless` in the engine a second time, its cache read for each of a row's tokens
(`per_token`), as its upper bound (`lossless@per_token`, against stock priced the same way). Its budget drafted on
`once`'s price in both: the two differ only in the price.

Simulations are shared across cells where they do not depend on the price (`run.run_rules`), so the map costs about
one run per corpus and regime, and one more of `lossless` per model x GPU (its budget prices drafts on each).
"""

from __future__ import annotations

import math
import time

from ..markdown import table
from ..miniature.corpus import PRESETS
from ..simulator.regime import DEFAULT_REGIME, REGIMES
from .heatmap import draw_map
from .lenience import corpus_figures
from .run import Cell, fastest, load_corpus, run_rules
from .spacing import visit_projections

READINGS = ("projected", "projected_async", "projected_no_host")
REGIMES_MAPPED = tuple(REGIMES)
MODELS_MAPPED = ("qwen3-1.7b", "qwen3-8b", "qwen3-14b")
GPUS_MAPPED = ("h100", "h200", "b200")
LOSSLESS_PATHS = ("lossless", "lossless,verify=requests")
UPPER_BOUND = "lossless@per_token"  # the engine path with a verification step's attention read per token


def run_map(rule_names, corpus_name, first_corpus, base: Cell, host, image, started: float) -> int:
    """Every cell of the map, its table, and its picture at `image`; `base` gives every cell but its corpus, regime,
    model and GPU (a regime of the map keeps `base`'s host)."""
    rows, speedups = [], {}
    for name in PRESETS:
        corpus = first_corpus if corpus_name == name else load_corpus(name)
        print(f"[at-scale] corpus {name}, against an RL run: {corpus_figures(corpus)}")
        cache: dict = {}
        for regime in REGIMES_MAPPED:
            shaped = REGIMES[regime].with_fields(host=base.regime.host)
            for model in MODELS_MAPPED:
                for gpu in GPUS_MAPPED:
                    where = base.at(model=model, gpu=gpu, regime=shaped)
                    result = cell_projections(rule_names, corpus, where, host, cache)
                    rows.append(cell(name, model, gpu, result, regime))
                    speedups[(name, regime, model, gpu)] = {
                        r: tuple(getattr(p, reading) for reading in READINGS) for r, p in result.items()
                    }
                    print("MAP " + " ".join(f"{k}={v}" for k, v in rows[-1].items()))
    print(map_table(rows))
    draw_map(speedups, image)
    print(f"[at-scale] the map drawn to {image}")
    print(f"RESULT cells={len(rows)} host={base.regime.host} wall_s={time.perf_counter() - started:.0f}")
    return 0


def cell_projections(rule_names, corpus, where: Cell, host, cache: dict) -> dict:
    """Every rule of `rule_names` against stock in one cell, and, where `lossless` is among them, its engine path's
    steps priced with `per_token` attention too (`UPPER_BOUND`)."""
    runs = run_rules(rule_names, corpus, where, host, cache)
    price, _ = where.price()
    result = visit_projections(runs, host, price, where.regime.full_batch, where.regime.visits)["run"]
    if "lossless" in runs and where.attention == "once" and where.curve is None:
        bound = where.at(attention="per_token")
        runs = run_rules(["off", "lossless"], corpus, bound, host, cache)
        price, _ = bound.price()
        result[UPPER_BOUND] = visit_projections(runs, host, price, where.regime.full_batch, where.regime.visits)[
            "run"
        ]["lossless"]
    return result


def cell(corpus: str, model: str, gpu: str, result: dict, regime: str = DEFAULT_REGIME) -> dict:
    """One cell: the fastest rule by each host reading (stock, `off`, where no rule beats it) and its margin over the
    runner-up, and lossless's best path against exact and suffix (its `per_token` bound beside it where priced)."""
    rules = [r for r in result if r != UPPER_BOUND]
    best, margin = fastest(result, "projected", rules)
    best_async, margin_async = fastest(result, "projected_async", rules)
    best_none, _ = fastest(result, "projected_no_host", rules)
    paths = [r for r in LOSSLESS_PATHS if r in result]
    lossless = max(paths, key=lambda r: result[r].projected) if paths else None

    def against(other: str) -> float:
        if lossless is None or other not in result:
            return math.nan
        return result[lossless].projected / result[other].projected

    bound = result.get(UPPER_BOUND)
    return {
        "corpus": corpus,
        "regime": regime,
        "model": model,
        "gpu": gpu,
        "best": best,
        "projected": round(result[best].projected, 3),
        "margin": round(margin, 3),
        "best_async": best_async,
        "projected_async": round(result[best_async].projected_async, 3),
        "margin_async": round(margin_async, 3),
        "best_no_host": best_none,
        "projected_no_host": round(result[best_none].projected_no_host, 3),
        "lossless_path": lossless,
        "lossless": round(result[lossless].projected, 3) if lossless else math.nan,
        "over_exact": round(against("exact"), 3),
        "over_suffix": round(against("suffix"), 3),
        "breakeven_host_ms": round(result[lossless].breakeven_host_ms, 2) if lossless else math.nan,
        "engine_per_token": round(bound.projected, 3) if bound else math.nan,
        "engine_per_token_async": round(bound.projected_async, 3) if bound else math.nan,
    }


def map_table(rows: list[dict]) -> str:
    head = [
        "corpus",
        "regime",
        "model",
        "GPU",
        "fastest (host measured)",
        "× stock",
        "× runner-up",
        "fastest (host hidden)",
        "× stock",
        "× runner-up",
        "fastest (no host)",
        "× stock",
        "lossless's best path",
        "× stock",
        "× exact",
        "× suffix",
        "lossless ties stock at host ms",
        "engine path, per_token attention: × stock",
        "host hidden",
    ]
    figures = (
        "projected",
        "projected_async",
        "lossless",
        "over_exact",
        "over_suffix",
        "breakeven_host_ms",
        "engine_per_token",
        "engine_per_token_async",
    )
    body = [
        [c["corpus"], c["regime"], c["model"], c["gpu"], c["best"], f"{c['projected']:.2f}", f"{c['margin']:.2f}"]
        + [c["best_async"], f"{c['projected_async']:.2f}", f"{c['margin_async']:.2f}"]
        + [c["best_no_host"], f"{c['projected_no_host']:.2f}", c["lossless_path"]]
        + [f"{c[k]:.2f}" for k in figures[2:]]
        for c in rows
    ]
    align = ["left"] * 5 + ["right", "right", "left", "right", "right", "left", "right", "left"] + ["right"] * 6
    return table(head, body, align)
