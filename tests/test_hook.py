"""The hook that lets `python -m openrlhf.cli.train_ppo_ray` take our flags: when it steps in, and what it touches."""

import argparse
import subprocess
import sys

import pytest

import _specrl_openrlhf_hook as hook
from specrl_openrlhf.integration.openrlhf import seams


@pytest.mark.parametrize(
    "orig_argv, expected",
    [
        (["python", "-m", "openrlhf.cli.train_ppo_ray", "--lenience", "2"], ["--lenience", "2"]),
        (["python", "-u", "-m", "openrlhf.cli.train_ppo_ray"], []),
        (["python", "-m", "openrlhf.cli.train_sft", "--rollout_reuse", "spec"], None),
        (["python", "script.py", "-m", "openrlhf.cli.train_ppo_ray"], None),  # a script's own arguments
        (["python", "-c", "pass", "-m", "openrlhf.cli.train_ppo_ray"], None),
        (["python"], None),
        ([], None),
    ],
)
def test_upstream_arguments(orig_argv, expected):
    assert hook.upstream_arguments(orig_argv) == expected


def test_our_flags_or_help_trigger_it():
    assert hook.wants_reuse(["--actor.model_name_or_path", "m", "--rollout_reuse", "spec"])
    assert hook.wants_reuse(["--reuse.dry_run"]) and hook.wants_reuse(["-h"]) and hook.wants_reuse(["--lenience=2"])
    assert not hook.wants_reuse(["--actor.model_name_or_path", "m", "--rollout.temperature", "1.0"])
    assert hook.wants_reuse(["--vllm.max_num_seqs", "256"]) and hook.wants_reuse(
        ["--vllm.max_num_batched_tokens=4096"]
    )
    assert not hook.wants_reuse(["--vllm.num_engines", "4", "--vllm.enable_prefix_caching"])  # OpenRLHF's own


def test_every_flag_of_ours_triggers_it():
    """The hook is stdlib only, so it spells our flags itself: each `ReuseConfig` flag must be among them."""
    import dataclasses

    from specrl_openrlhf.config import ReuseConfig

    for field in dataclasses.fields(ReuseConfig):
        assert hook.wants_reuse([field.metadata["flag"]]), field.metadata["flag"]


@pytest.mark.parametrize("value, on", [(None, True), ("1", True), ("0", False), ("off", False), ("FALSE", False)])
def test_switch(monkeypatch, value, on):
    if value is None:
        monkeypatch.delenv(hook.SWITCH, raising=False)
    else:
        monkeypatch.setenv(hook.SWITCH, value)
    assert hook.enabled() is on


def test_the_parser_hook_takes_only_openrlhfs_main_parser_once():
    taken = []

    def take_over(parser, parse_args, args, namespace, module_globals):
        taken.append(module_globals["__name__"])
        return parse_args(parser, args, namespace)

    remove = seams.hook_upstream_parser(take_over)
    try:
        argparse.ArgumentParser().parse_args([])  # any other code's parser: argparse's own
        assert taken == [] and argparse.ArgumentParser.parse_args.__module__ == seams.__name__
        upstream_main = {"__name__": "__main__", "__spec__": type("Spec", (), {"name": seams.UPSTREAM_MODULE})()}
        exec("import argparse\nargparse.ArgumentParser().parse_args([])", upstream_main)
        assert taken == ["__main__"]
        assert argparse.ArgumentParser.parse_args.__module__ == "argparse"  # gone after its one call
    finally:
        remove()
    assert argparse.ArgumentParser.parse_args.__module__ == "argparse"


PROBE = (
    "import sys, argparse; "
    "print('_specrl_openrlhf_hook' in sys.modules, argparse.ArgumentParser.parse_args.__module__)"
)


def test_other_processes_are_untouched():
    plain = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    assert plain.stdout.split() == ["False", "argparse"]  # the .pth line does not even import the module
    # The module name on the command line, but not as `-m`: imported by the .pth line's cheap test, and inert.
    command = [sys.executable, "-c", PROBE, "-m", "openrlhf.cli.train_ppo_ray", "--rollout_reuse", "spec"]
    assert subprocess.run(command, capture_output=True, text=True, check=True).stdout.split()[1] == "argparse"


def test_the_pth_file_is_installed():
    result = subprocess.run([sys.executable, "-m", "specrl_openrlhf", "hook"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "specrl_openrlhf_hook.pth" in result.stdout and "SPECRL_OPENRLHF_HOOK=0" in result.stdout


def test_the_hook_and_the_seams_depend_one_way():
    """The hook (read by every process) names the seams module; the seams module never imports the hook, and costs
    no torch, Ray or OpenRLHF to import."""
    assert hook.UPSTREAM_MODULE == seams.UPSTREAM_MODULE
    probe = (
        "import sys; from specrl_openrlhf.integration.openrlhf import seams as openrlhf_seams; "
        "print(sorted(m for m in ('_specrl_openrlhf_hook', 'torch', 'ray', 'openrlhf', 'vllm') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
