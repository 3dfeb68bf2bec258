"""Lets OpenRLHF's own `python -m openrlhf.cli.train_ppo_ray` take specrl-openrlhf's flags.

OpenRLHF 0.11 builds its parser inside its module's `if __name__ == "__main__":` block and offers no way to add an
argument group (docs/upstream.md proposes one). So `pip install specrl-openrlhf` puts `specrl_openrlhf_hook.pth`
into site-packages: Python reads it at the start of every process, and it imports this module only in a process
whose command line names `openrlhf.cli.train_ppo_ray`. Here `install` steps in only when that module is run with
`-m` and one of our flags (`--rollout_reuse`, `--lenience`, `--reuse.*`) or `--help` is on the command line. Then,
and only for the one `parse_args` call that OpenRLHF's module makes, `hook_upstream_parser` hands its parser to
`specrl_openrlhf.integration.openrlhf_seams`: OpenRLHF's module itself runs as Python runs it, from its own file.

Turn it off with SPECRL_OPENRLHF_HOOK=0; remove it with `pip uninstall specrl-openrlhf` (or delete the .pth file
that `python -m specrl_openrlhf hook` names). Standard library only: it runs before anything else is imported.
"""

import os
import sys

UPSTREAM_MODULE = "openrlhf.cli.train_ppo_ray"
ENTRY_POINT = "specrl_openrlhf.cli.train_ppo_ray"
SWITCH = "SPECRL_OPENRLHF_HOOK"
_OUR_FLAGS = ("--rollout_reuse", "--lenience", "--reuse.")
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


def is_upstream_main(module_globals: dict) -> bool:
    """Whether code runs as OpenRLHF's `train_ppo_ray` executed as `__main__` (by `-m` or runpy)."""
    spec = module_globals.get("__spec__")
    return module_globals.get("__name__") == "__main__" and getattr(spec, "name", None) == UPSTREAM_MODULE


def hook_upstream_parser(take_over):
    """Route the next `ArgumentParser.parse_args` call made by OpenRLHF's `__main__` code to
    `take_over(parser, parse_args, args, namespace, module_globals)`; every other call, from any other code, is
    argparse's own. The hook removes itself at that call. Returns a function that removes it earlier."""
    import argparse

    original = argparse.ArgumentParser.parse_args

    def parse_args(parser, args=None, namespace=None):
        module_globals = sys._getframe(1).f_globals
        if not is_upstream_main(module_globals):
            return original(parser, args, namespace)
        remove()
        return take_over(parser, original, args, namespace, module_globals)

    def remove():
        if argparse.ArgumentParser.parse_args is parse_args:
            argparse.ArgumentParser.parse_args = original

    argparse.ArgumentParser.parse_args = parse_args
    return remove


def _take_over(parser, parse_args, args, namespace, module_globals):
    from specrl_openrlhf.integration.openrlhf_seams import take_over

    return take_over(parser, parse_args, args, namespace, module_globals)


def install() -> bool:
    """Called from the .pth file; returns whether OpenRLHF's parser will get our flags in this process."""
    arguments = upstream_arguments(getattr(sys, "orig_argv", ()))
    if arguments is None or not wants_reuse(arguments) or not enabled():
        return False
    global _installed
    if not _installed:  # site may read the .pth twice
        _installed = True
        hook_upstream_parser(_take_over)
    return True
