"""Grid files: rules found beside the file, lenience spellings, and bad grids failing before anything runs, naming
the key and the fix."""

import math

import pytest

from specrl_openrlhf.analysis.grid import GridError
from specrl_openrlhf.analysis.grid_file import load_grid, parse_lenience
from tests.helpers import ADAPTIVE, REPO, write_grid


def test_rule_paths_resolve_against_the_grid_file(tmp_path, monkeypatch):
    path = write_grid(tmp_path, "runner: cpu\nsweep: [{policy: ../../rules/keep.py:Keep}]\n")
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "keep.py").write_text(
        "import torch\nimport specrl_openrlhf as sr\n\n\nclass Keep(sr.ReusePolicy):\n"
        "    needs_scores = False\n\n    def cut(self, batch):\n        return batch.lengths\n"
    )
    monkeypatch.chdir(REPO)  # anywhere but beside the grid
    [cell] = load_grid(path).cells()
    assert cell.policy == f"{rules / 'keep.py'}:Keep"


@pytest.mark.parametrize(
    "value, expected, label",
    [(1, 1.0, "1"), (1.65, 1.65, "1.65"), ("e^0.5", math.exp(0.5), "e0.5"), ("exp(2)", math.exp(2), "e2")],
)
def test_lenience_spellings(value, expected, label):
    assert parse_lenience(value, "x") == (pytest.approx(expected), label)


@pytest.mark.parametrize(
    "text, message",
    [
        ("presets: [grpo]\nsweeep: [spec]\n", "unknown key 'sweeep'. Did you mean 'sweep'?"),
        ("presets: [grpo]\nsweep: [specc]\n", "sweep[0]: policy: unknown reuse policy 'specc'. Did you mean 'spec'?"),
        ("presets: [grpo]\nsweep: []\n", "`sweep` is empty"),
        ("presets: [grpo]\n", "`sweep` is missing"),
        ("presets: [grpo]\nsweep: [{policy: spec, lenience: [1, -2]}]\n", "lenience must be > 0, got -2.0"),
        ("presets: [grpo]\nsweep: [{policy: spec, lenience: 0}]\n", "lenience must be > 0"),
        ("presets: [grpo]\nsweep: [{policy: spec, lenience: []}]\n", "`lenience` is empty"),
        ("presets: [grpo]\nsweep: [{policy: spec, lenience: e^x}]\n", "lenience 'e^x' is not a number"),
        ("presets: [grpo]\nsweep: [{policy: random, lenience: 2}]\n", "policy 'random' takes no lenience"),
        ("presets: [grpo]\nsweep: [{policy: spec, lenient: 2}]\n", "unknown key 'lenient'. Did you mean 'lenience'?"),
        ("presets: [gpro]\nsweep: [spec]\n", "presets: gpro: no"),
        ("presets: [grpo]\nseeds: [-1]\nsweep: [spec]\n", "-1 is not a seed"),
        ("runner: slurm\nsweep: [spec]\n", "runner 'slurm' is not one of openrlhf, cpu"),
        ("presets: [grpo]\nsweep: [spec]\nargs: {--lenience: 2}\n", "--lenience is set per cell by the grid"),
        ("presets: [grpo]\nsweep: [spec]\nargs: {--logger.wandb.group: g}\n", "--logger.wandb.group is set per cell"),
        ("runner: cpu\nsweep: [spec]\nargs: {--seeds: 3}\n", "--seeds is set per cell"),
        ("presets: [grpo]\nsweep: [spec]\nargs: {--reuse.trace_dir: t}\n", "--reuse.trace_dir is set per cell"),
        (
            f"presets: [grpo]\nsweep: [{{policy: '{ADAPTIVE}', lenience: [2, 0.5]}}]\n",
            "lenience 0.5: adaptive_lenience: need 1 <= lenience",
        ),
        ("presets: [grpo]\nsweep: [spec]\nargs: [model]\n", "'model' is not a flag"),
        ("runner: cpu\npresets: [ppo]\nsweep: [spec]\n", "the cpu runner trains GRPO only"),
        ("presets: [grpo]\nsweep: [{policy: spec, params: {floor: 1}}]\n", "'spec' takes no floor"),
        ("presets: [grpo]\nsweep: [{policy: spec, params: [1]}]\n", "give a mapping of the rule's parameters"),
        ("sweep: [spec\n", "not valid YAML"),
        ("- spec\n", "a grid is a mapping"),
    ],
)
def test_bad_grids_name_the_key_and_the_fix(tmp_path, text, message):
    with pytest.raises(GridError, match="g.yaml") as error:
        load_grid(write_grid(tmp_path, text))
    assert message in str(error.value)


def test_yaml_off_is_the_off_policy(tmp_path):
    grid = load_grid(write_grid(tmp_path, "presets: [grpo]\nsweep: [off, {policy: off}]\n"))
    assert [c.policy for c in grid.cells()] == ["off", "off"]
