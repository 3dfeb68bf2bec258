"""The lenience curve (`at_scale.lenience`): spec@ℓ from ℓ = 1 to ∞, kept of the drafted epochs and
projected, beside the SPEC-RL paper's ablation."""

import doctest
import json

import pytest

from specrl_openrlhf.at_scale import cli, lenience
from specrl_openrlhf.at_scale.lenience import (
    LENIENCES,
    PAPER_LENIENCE,
    curve_rules,
    kept_of_drafted,
    paper_kept,
)
from specrl_openrlhf.at_scale.run import load_corpus

from .test_cli import toy_corpus


def test_doctests():
    assert doctest.testmod(lenience).failed == 0


def test_the_curve_runs_the_papers_five_leniences_then_full():
    rules = curve_rules()
    assert list(rules) == ["1", "e^0.2", "e^0.5", "e^0.8", "e^2", "∞"] and list(LENIENCES) == list(rules)[:5]
    assert list(rules.values()) == ["spec@1", "spec@1.2214", "spec@1.6487", "spec@2.2255", "spec@7.3891", "spec@inf"]
    assert set(PAPER_LENIENCE["tokens_m"]) == set(LENIENCES) and "Ablation on lenience" in PAPER_LENIENCE["source"]
    assert paper_kept("1") == pytest.approx((554.8 - 419.1) / (554.8 * 14 / 15))


def test_kept_of_drafted_counts_the_cut_kept_and_the_continuation_generated(tmp_path):
    corpus = load_corpus(toy_corpus(tmp_path, scored=True))
    assert kept_of_drafted("spec@inf", corpus) == (10, 0)  # every draft of epoch 0 kept whole, nothing generated
    # lenience 1 on the toy's scores (-0.25 now, -0.5 then): the ratio exceeds 1, every draft kept whole too
    assert kept_of_drafted("spec@1", corpus) == (10, 0)
    scores = [[[s - 1.0 for s in p] for p in e] for e in corpus.scores]  # now far less likely than then: cut early
    kept, generated = kept_of_drafted(
        "spec@1", corpus.__class__(corpus.prompts, corpus.responses, corpus.meta, corpus.logprobs, scores)
    )
    assert kept < 10 and kept + generated == 10  # a cut's continuation is the recorded response's rest


def test_the_curve_replaces_rules_and_needs_a_scoring_pass(tmp_path, capsys):
    args = cli.parse_args(["--corpus", toy_corpus(tmp_path, scored=True), "--lenience-curve", "--rules", "off"])
    assert args.rules == ["off", *curve_rules().values()]
    with pytest.raises(SystemExit):
        cli.parse_args(["--corpus", toy_corpus(tmp_path), "--lenience-curve"])
    assert "has no scoring pass" in capsys.readouterr().err


def test_the_curve_prints_kept_of_drafted_and_projected_beside_the_paper(tmp_path, capsys):
    pytest.importorskip("aiconfigurator_core")
    host = tmp_path / "host.json"
    host.write_text(json.dumps({"points": [{"rows": 1, "seconds": 0.001}, {"rows": 8, "seconds": 0.002}]}))
    argv = ["--corpus", toy_corpus(tmp_path, scored=True), "--host", str(host), "--lenience-curve"]
    assert cli.main([*argv, "--requests-per-engine", "4", "--max-num-seqs", "8", "--model", "qwen3-1.7b"]) == 0
    out = capsys.readouterr().out
    assert "| ∞ (full) | spec@inf |" in out and "| 26% |" in out
    fields = dict(item.split("=", 1) for item in out.splitlines()[-1].split()[1:])
    kept = [float(fields[f"kept_of_drafted[{rule}]"]) for rule in curve_rules().values()]
    assert kept == sorted(kept) and 0 <= kept[0] and kept[-1] == 1.0  # more lenient keeps more; ∞ keeps every draft
    assert [float(fields[f"paper_kept[{rule}]"]) for rule in curve_rules().values()] == [
        0.262,
        0.595,
        0.719,
        0.792,
        0.850,
        1.0,
    ]
    for rule in curve_rules().values():
        assert float(fields[f"projected[{rule}]"]) > 0 and float(fields[f"projected_async[{rule}]"]) > 0
    assert fields["corpus"].endswith("c.npz") and fields["model"] == "qwen3-1.7b" and fields["gpu"] == "h100"


def test_the_corpus_figures_stand_beside_the_papers(tmp_path):
    corpus = load_corpus(toy_corpus(tmp_path, scored=True))
    line = lenience.corpus_figures(corpus)
    for word in ("mean_tokens=", "cut_share=", "repeated_share=", "surprisal_p80=", "kept[ℓ=e^2]="):
        assert word in line
    assert f"(paper {paper_kept('1'):.2f})" in line  # ℓ = 1 beside the paper's 26%
