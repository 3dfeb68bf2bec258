import dataclasses
import math
import re
import subprocess
import sys
import textwrap

import pytest

import specrl_openrlhf as sr
from specrl_openrlhf.policies import (
    PluginError,
    UnknownPolicyError,
    builtin_names,
    lenient_builtins,
    load_plugin,
    make,
    policy_class,
    registered,
)
from tests.helpers import REPO


def test_builtins_registered():
    names = [
        "off",
        "spec",
        "exact",
        "random",
        "delayed",
        "full",
        "lossless",
        "residual",
        "anchored",
        "vllm",
        "suffix",
        "ngram",
    ]
    assert list(registered())[: len(names)] == builtin_names() == names
    assert lenient_builtins() == ["spec", "delayed", "anchored"]


def test_unknown_name_suggests_and_lists():
    with pytest.raises(UnknownPolicyError) as info:
        make("spce")
    message = str(info.value)
    assert "Did you mean 'spec'?" in message
    for name in ["off", "spec", "exact", "random", "delayed", "full"]:
        assert name in message


@pytest.mark.parametrize("value", [0, -1.0, math.nan, -math.inf])
def test_bad_lenience_names_parameter_value_and_fix(value):
    with pytest.raises(ValueError) as info:
        make("spec", lenience=value)
    message = str(info.value)
    assert "'spec'" in message and "lenience" in message and repr(value) in message and "1.6487" in message


@pytest.mark.parametrize("value", ["1.5", True, None, [1.0]])
def test_lenience_of_wrong_type(value):
    with pytest.raises(TypeError, match="lenience must be a number"):
        make("spec", lenience=value)


def test_unknown_parameter_and_a_lenience_for_a_rule_without_one():
    with pytest.raises(TypeError, match="takes no parameter temperature"):
        make("spec", temperature=1.0)
    with pytest.raises(TypeError, match="'exact' takes no lenience; drop --lenience"):
        make("exact", lenience=2.0)  # it would be silently ignored


def test_params_are_frozen_and_keyword_only():
    params = make("spec", lenience=2.0).params
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.lenience = 3.0
    with pytest.raises(TypeError):
        type(params)(2.0)


@pytest.mark.parametrize("path", sorted((REPO / "policies").glob("*.py")), ids=lambda p: p.name)
def test_worked_examples_and_template_load(path):
    """Every rule in the sandbox loads by reference (FILE.py:Class) with its default parameters; names it registers
    are in the registry; loading twice, as every Ray process does, changes nothing."""
    source = path.read_text()
    classes = re.findall(r"^class (\w+)\(sr\.(?:ReusePolicy|SteeredLenience)\)", source, re.M)
    assert classes, f"{path.name} defines no rule"
    for name in classes:
        cls = policy_class(f"{path}:{name}")
        assert policy_class(f"{path}:{name}") is cls
        assert isinstance(cls(), sr.ReusePolicy)
    for name in re.findall(r'@sr\.register\("(\w+)"\)', source):
        assert name in registered()


def test_bad_plugin_files(tmp_path):
    with pytest.raises(PluginError, match="no such file"):
        load_plugin(tmp_path / "missing.py")
    with pytest.raises(PluginError, match="Python file"):
        load_plugin(tmp_path / "rule.txt")
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(PluginError, match="failed to load: RuntimeError: boom"):
        load_plugin(broken)
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    with pytest.raises(PluginError, match="registered no policy"):
        load_plugin(empty)


def test_plugin_registers_a_new_rule(tmp_path):
    plugin = tmp_path / "keep_two.py"
    plugin.write_text(
        textwrap.dedent(
            """
            import torch
            import specrl_openrlhf as sr

            @sr.register("keep_two_test")
            class KeepTwo(sr.ReusePolicy):
                '''Keep at most two tokens.'''
                needs_scores = False

                def cut(self, batch):
                    return torch.clamp(batch.lengths, max=2)
            """
        )
    )
    assert load_plugin(plugin) == ["keep_two_test"]
    assert sr.make("keep_two_test").name == "keep_two_test"


def test_rules_shipped_as_a_package_load_from_entry_points(tmp_path, monkeypatch):
    """A package advertises `[specrl_openrlhf.policies] name = module:Class`; the name works like a built-in's."""
    package = tmp_path / "team_rules"
    package.mkdir()
    (package / "__init__.py").write_text(
        "import torch\n"
        "import specrl_openrlhf as sr\n\n\n"
        "class KeepOne(sr.ReusePolicy):\n"
        "    needs_scores = False\n\n"
        "    def cut(self, batch):\n"
        "        return torch.clamp(batch.lengths, max=1)\n\n\n"
        "class NotARule:\n"
        "    pass\n"
    )
    metadata = tmp_path / "team_rules-1.0.dist-info"
    metadata.mkdir()
    (metadata / "METADATA").write_text("Metadata-Version: 2.1\nName: team-rules\nVersion: 1.0\n")
    (metadata / "entry_points.txt").write_text(
        "[specrl_openrlhf.policies]\nkeep_one_entry = team_rules:KeepOne\nnot_a_rule = team_rules:NotARule\n"
        "missing_rule = team_rules_missing:Rule\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "keep_one_entry" in registered()  # listed before it is loaded
    rule = sr.ReuseConfig(policy="keep_one_entry").build_policy()
    assert type(rule).__name__ == "KeepOne" and rule.name == "keep_one_entry"
    with pytest.raises(PluginError, match="not_a_rule: the entry point team_rules:NotARule of team-rules is not"):
        make("not_a_rule")
    with pytest.raises(PluginError, match="failed to load: ModuleNotFoundError"):
        make("missing_rule")
    with pytest.raises(UnknownPolicyError, match="Did you mean 'keep_one_entry'"):
        make("keep_one_entri")


def test_cli_lists_policies():
    out = subprocess.run(
        [sys.executable, "-m", "specrl_openrlhf", "policies"], capture_output=True, text=True, check=True
    ).stdout
    for name in ["off", "spec", "exact", "random", "delayed", "full"]:
        assert any(line.startswith(name + " ") for line in out.splitlines())
    assert "lenience=1.6487" in out and "no scoring" in out


def test_core_imports_no_engine():
    """Every core module (all but `integration` and the `cli` shim) imports without vLLM, Ray, OpenRLHF,
    transformers or the plotting and logging stacks, which it loads only inside the functions that need them."""
    heavy = "{'vllm', 'ray', 'openrlhf', 'transformers', 'matplotlib', 'tensorboard', 'yaml'}"
    grid_and_report = "import sys, specrl_openrlhf.grid, specrl_openrlhf.report; print('torch' in sys.modules)"
    torch_loaded = subprocess.run([sys.executable, "-c", grid_and_report], capture_output=True, text=True, check=True)
    assert torch_loaded.stdout.strip() == "False"  # the grid and the report run where torch is not installed
    code = (
        "import importlib, pkgutil, sys, specrl_openrlhf as p\n"
        "for m in pkgutil.walk_packages(p.__path__, 'specrl_openrlhf.'):\n"
        "    if not m.name.startswith(('specrl_openrlhf.integration', 'specrl_openrlhf.cli')):\n"
        "        importlib.import_module(m.name)\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {heavy}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
