"""The quickstart's flags and the groups they plan (`quickstart_args`); its end-to-end run is
tests/docs/test_prototyping.py (the tutorial's first command is the quickstart's default run)."""

from pathlib import Path

import pytest

from specrl_openrlhf.miniature import quickstart_args
from specrl_openrlhf.miniature.plan import GRIDS, REGIMES


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--rollout_reuse", "specc"], "Did you mean 'spec'"),
        (["--lenience", "-1"], "--lenience: lenience must be > 0, got -1.0"),
        (["--lenience", "nan"], "must be > 0"),
        (["--rollout_reuse", "exact", "--lenience", "2"], "'exact' takes no lenience; drop --lenience"),
        (["--rollout_reuse", "off"], "--rollout_reuse off is the baseline"),
        (["--epochs", "0"], "epochs must be >= 1"),
        (["--samples", "1"], "--samples must be >= 2"),
        (["--seeds", "0,x"], "give seeds as integers"),
        (["--seeds", "1,1"], "give distinct seeds"),
        (["--grid", "lenience", "--only"], "exclude each other"),
        (["--grid", "lenience", "--rollout_reuse", "exact"], "--grid lenience trains its own rules; drop"),
        (["--grid", "drift", "--epochs", "2"], "--grid drift sets --epochs per regime; drop them"),
        (["--rollout_reuse", "rule.py"], "the class name is missing"),
        (["--grid", "drift", "--regimes", "fast"], "--grid drift has the regimes default, many-visits, low-lr"),
        (["--regimes", "default"], "--regimes picks regimes of a grid; add --grid"),
    ],
)
def test_bad_flags_fail_at_once(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        quickstart_args.parse_args([*argv, "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_unwritable_output_folder_fails_at_once(capsys, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    with pytest.raises(SystemExit):
        quickstart_args.parse_args(["--out", str(blocker / "out")])
    assert f"--out {blocker / 'out'}: not a writable folder" in capsys.readouterr().err


def labels(groups):
    return [[run.label for run in group.runs] for group in groups]


def test_the_default_trains_spec_and_the_recommended_rule_beside_off(tmp_path):
    args = quickstart_args.parse_args(["--out", str(tmp_path)])
    assert labels(args.groups) == [["off", "spec@1.65", "lossless"]]
    assert args.main_method.name == "spec@1.65"
    one = quickstart_args.parse_args(["--rollout_reuse", "exact", "--seeds", "0,2", "--out", str(tmp_path)])
    assert labels(one.groups) == [["default-s0-off", "default-s0-exact"], ["default-s2-off", "default-s2-exact"]]
    assert [g.seed for g in one.groups] == [0, 2]
    overridden = quickstart_args.parse_args(
        ["--epochs", "12", "--train-size", "96", "--lr", "1e-4", "--out", str(tmp_path)]
    )
    regime = overridden.groups[0].regime
    assert (regime.epochs, regime.train_size, regime.lr) == (12, 96, 1e-4)


def test_grids_plan_every_regime_and_seed_side_by_side(tmp_path):
    args = quickstart_args.parse_args(["--grid", "drift", "--seeds", "0,1,2", "--out", str(tmp_path)])
    regimes, rules = GRIDS["drift"]
    assert len(args.groups) == len(regimes) * 3 and all(len(g.runs) == 1 + len(rules) for g in args.groups)
    assert {g.regime.name for g in args.groups} == set(regimes)
    for name in regimes:  # the same number of steps in every regime: only how they are spread differs
        regime = REGIMES[name]
        assert regime.epochs * regime.steps_per_epoch(32) == 36
    lenience = quickstart_args.parse_args(["--grid", "lenience", "--out", str(tmp_path)])
    assert [len(g.runs) for g in lenience.groups] == [5, 5]  # 8 rules: two groups, each with its own baseline
    assert labels(lenience.groups)[1][0] == "off#1"
    frontier = quickstart_args.parse_args(["--grid", "frontier", "--seeds", "0,1,2", "--out", str(tmp_path)])
    assert [g.key for g in frontier.groups][:3] == ["default/s0", "default/s1", "default/s2"]
    proposals = ("lossless", "lossless(history=2)", "lossless(verify=requests)", "lossless(draft=own,verify=requests)")
    assert labels(frontier.groups)[0] == ["default-s0-" + name for name in ("off", "spec@1.65", *proposals)]
    part = quickstart_args.parse_args(["--grid", "frontier", "--regimes", "many-visits", "--out", str(tmp_path)])
    assert [g.key for g in part.groups] == ["many-visits/s0"] and len(part.groups[0].runs) == 6


def test_the_peers_grid_sizes_suffix_decodings_cache_as_at_scale(tmp_path):
    """vLLM keeps 10,000 responses, about one step's requests at 512 prompts x 16 samples: `suffix@scale` keeps 1.2
    steps' (32 prompts x 8 samples here); `--cost-curve` prices lossless's budget on a GPU's curve."""
    pytest.importorskip("arctic_inference.suffix_decoding", reason="bash scripts/install.sh builds it")
    curve = str(Path(quickstart_args.__file__).resolve().parents[2] / "docs" / "gpu_step_h200.json")
    args = quickstart_args.parse_args(["--grid", "peers", "--out", str(tmp_path), "--cost-curve", curve])
    runs = {run.method.name: run.method.config for run in args.groups[0].runs}
    assert list(runs) == ["off", "lossless", "suffix", "suffix@scale", "ngram"]
    assert runs["suffix@scale"].params["speculative_config"]["suffix_decoding_max_cached_requests"] == 308
    assert runs["suffix"].params == {} and runs["lossless"].params["cost_curve"] == curve


def test_help_says_what_the_command_does(capsys):
    with pytest.raises(SystemExit):
        quickstart_args.parse_args(["--help"])
    shown = capsys.readouterr().out
    assert shown.startswith("usage: bash scripts/quickstart.sh")
    assert "GRPO on CPU with stock rollouts and speculative ones, side by side" in shown and "--grid drift" in shown
