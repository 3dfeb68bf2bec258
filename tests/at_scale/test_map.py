"""The map (`at_scale.map`): each cell names the fastest rule by each host reading and `lossless`'s best
path against `exact` and suffix decoding."""

import json
import math

import pytest

from specrl_openrlhf.at_scale.map import cell, map_table
from specrl_openrlhf.pricing.projection import Projection


def projection(projected: float, projected_async: float, breakeven: float = math.nan) -> Projection:
    return Projection(projected, projected_async, breakeven, True, 1.0, 1.0, 1.0, 38.0)


def test_a_cell_names_the_fastest_rule_by_each_host_reading_and_lossless_against_its_peers():
    result = {
        "off": projection(1.0, 1.0),
        "lossless": projection(0.6, 1.3, 200.0),  # the engine path: behind with the host paid, ahead with it hidden
        "lossless,verify=requests": projection(0.9, 0.9, 1300.0),
        "exact": projection(1.2, 1.2),
        "suffix": projection(0.45, 0.7),
    }
    c = cell("long", "qwen3-8b", "h100", result)
    assert (c["best"], c["projected"]) == ("exact", 1.2)
    assert (c["best_async"], c["projected_async"]) == ("lossless", 1.3)
    assert (
        c["lossless_path"] == "lossless,verify=requests" and c["lossless"] == 0.9 and c["breakeven_host_ms"] == 1300.0
    )
    assert c["over_exact"] == pytest.approx(0.75) and c["over_suffix"] == pytest.approx(2.0)
    table = map_table([c])
    row = "| long | openrlhf | qwen3-8b | h100 | exact | 1.20 | 1.20 | lossless | 1.30 | 1.08 |"
    assert row in table


def test_where_no_rule_beats_stock_the_cell_names_stock():
    result = {"off": projection(1.0, 1.0), "lossless": projection(0.9, 1.2), "spec@1.65": projection(0.98, 0.98)}
    c = cell("long", "qwen3-8b", "h100", result)
    assert (c["best"], c["projected"]) == ("off", 1.0)
    assert (c["best_async"], c["projected_async"]) == ("lossless", 1.2)


def test_a_cell_without_a_peer_says_nan_not_a_number_made_up():
    c = cell("short", "qwen3-1.7b", "b200", {"off": projection(1.0, 1.0), "lossless": projection(1.1, 1.2, 30.0)})
    assert c["lossless_path"] == "lossless" and math.isnan(c["over_exact"]) and math.isnan(c["over_suffix"])


def test_the_engine_paths_per_token_bound_sits_beside_it_and_never_wins_a_cell():
    result = {
        "off": projection(1.0, 1.0),
        "lossless": projection(1.1, 1.2),
        "lossless@per_token": projection(1.4, 1.5),  # a bound of lossless, not a rule of its own
    }
    c = cell("long", "qwen3-8b", "h100", result)
    assert c["best"] == c["best_async"] == "lossless"
    assert (c["engine_per_token"], c["engine_per_token_async"]) == (1.4, 1.5)
    assert "| 1.40 | 1.50 |" in map_table([c])


def test_the_map_runs_each_cell_and_draws_its_picture(tmp_path, capsys, monkeypatch):
    pytest.importorskip("aiconfigurator_core")
    pytest.importorskip("matplotlib")
    from specrl_openrlhf.at_scale import cli, map

    from .test_cli import toy_corpus

    corpus = toy_corpus(tmp_path, scored=True)
    monkeypatch.setattr(map, "PRESETS", (corpus,))  # one cell: the toy corpus, one model, one GPU
    monkeypatch.setattr(map, "MODELS_MAPPED", ("qwen3-1.7b",))
    monkeypatch.setattr(map, "GPUS_MAPPED", ("h100",))
    monkeypatch.setattr(map, "REGIMES_MAPPED", ("openrlhf",))
    host = tmp_path / "host.json"
    host.write_text(json.dumps({"points": [{"rows": 1, "seconds": 0.001}, {"rows": 8, "seconds": 0.002}]}))
    image = tmp_path / "map.png"
    argv = ["--corpus", corpus, "--host", str(host), "--rules", "off,lossless,exact", "--map"]
    assert cli.main([*argv, "--map-image", str(image), "--requests-per-engine", "4", "--max-num-seqs", "8"]) == 0
    lines = capsys.readouterr().out.splitlines()
    cells = [dict(item.split("=", 1) for item in line.split()[1:]) for line in lines if line.startswith("MAP ")]
    assert len(cells) == 1 and cells[0]["model"] == "qwen3-1.7b"
    # the engine path's own steps priced per token too: an upper bound of its cost, so at most its speedup
    c = cells[0]
    assert c["lossless_path"] == "lossless" and 0 < float(c["engine_per_token"]) <= float(c["lossless"])
    assert lines[-1].startswith("RESULT cells=1 ") and image.read_bytes()[:4] == b"\x89PNG"
