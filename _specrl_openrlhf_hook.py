"""Lets OpenRLHF's own `python -m openrlhf.cli.train_ppo_ray` take specrl-openrlhf's flags.

OpenRLHF 0.11 builds its parser inside its module's `if __name__ == "__main__":` block and offers no way to add an
argument group (docs/upstream.md proposes one). So `pip install specrl-openrlhf` puts `specrl_openrlhf_hook.pth`
into site-packages: Python reads it at the start of every process, and it imports this module only in a process
whose command line names `openrlhf.cli.train_ppo_ray`. Here `install` steps in only when that module is run with
`-m` and one of our flags (`--rollout_reuse`, `--lenience`, `--reuse.*`, and the engine size OpenRLHF has no flag
for: `--vllm.max_num_seqs`, `--vllm.max_num_batched_tokens`) or `--help` is on the command line. Then
it calls `specrl_openrlhf.integration.openrlhf.seams.install`, which takes the one `parse_args` call that OpenRLHF's
module makes: OpenRLHF's module itself runs as Python runs it, from its own file. The dependency runs one way: the
seams module knows nothing of this one.

Turn it off with SPECRL_OPENRLHF_HOOK=0; remove it with `pip uninstall specrl-openrlhf` (or delete the .pth file
that `python -m specrl_openrlhf hook` names). Standard library only until it steps in: every process reads it.
"""

import os
import sys

UPSTREAM_MODULE = "openrlhf.cli.train_ppo_ray"
ENTRY_POINT = "specrl_openrlhf.cli.train_ppo_ray"
SWITCH = "SPECRL_OPENRLHF_HOOK"
_OUR_FLAGS = ("--rollout_reuse", "--lenience", "--reuse.", "--vllm.max_num_seqs", "--vllm.max_num_batched_tokens")
_HELP = ("-h", "--help")
_installed = False


def upstream_arguments(orig_argv) -> list[str] | None:
    """The arguments after `-m openrlhf.cli.train_ppo_ray`, or None if the process runs something else."""
    args = list(orig_argv[1:])
    for i, arg in enumerate(args):
        if arg == "-m":
            return args[i + 2 :] if i + 1 < len(args) and args[i + 1] == UPSTREAM_MODULE else None
        if arg == "-c" or not arg.startswith("-"):  # a script, a command or stdin runs; not a module
            return None
    return None


def wants_reuse(arguments) -> bool:
    """Whether a command line uses our flags (or asks for help, which then lists them)."""
    return any(a.startswith(_OUR_FLAGS) or a in _HELP for a in arguments)


def enabled() -> bool:
    return os.environ.get(SWITCH, "1").strip().lower() not in ("0", "false", "off", "no")


def install() -> bool:
    """Called from the .pth file; returns whether OpenRLHF's parser will get our flags in this process."""
    arguments = upstream_arguments(getattr(sys, "orig_argv", ()))
    if arguments is None or not wants_reuse(arguments) or not enabled():
        return False
    global _installed
    if not _installed:  # site may read the .pth twice
        _installed = True
        from specrl_openrlhf.integration.openrlhf import seams  # cheap: the command's code loads when it runs

        seams.install()
    return True
