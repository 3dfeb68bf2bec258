"""Lets OpenRLHF's own `python -m openrlhf.cli.train_ppo_ray` take specrl-openrlhf's flags.

`pip install specrl-openrlhf` puts `specrl_openrlhf_hook.pth` into site-packages. Python reads it at the start of
every process, and it imports this module only in a process whose command line names `openrlhf.cli.train_ppo_ray`.
Here `install` steps in only when that module is run with `-m` and one of our flags (`--rollout_reuse`,
`--lenience`, `--reuse.*`) or `--help` is on the command line: runpy's lookup of the module then gets
`specrl_openrlhf.cli.train_ppo_ray`, which runs OpenRLHF's own `__main__` block with our argument group added.
Without our flags, OpenRLHF runs untouched.

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


class _EntryPointLoader:
    """Gives runpy the code of our entry point in place of OpenRLHF's module body."""

    def __init__(self, upstream_loader):
        self.upstream_loader = upstream_loader

    def get_code(self, fullname):
        source = f"import {ENTRY_POINT} as _entry\n_entry.main(prog=__import__('os').path.basename(__file__))\n"
        return compile(source, self.get_filename(fullname), "exec")

    def __getattr__(self, name):
        return getattr(self.upstream_loader, name)


class _MainModuleFinder:
    """Answers runpy's single lookup of the upstream module, then leaves `sys.meta_path`, so that any later
    `import openrlhf.cli.train_ppo_ray` (our entry point does one) gets OpenRLHF's real module."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != UPSTREAM_MODULE:
            return None
        sys.meta_path.remove(self)
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _EntryPointLoader(spec.loader)
        return spec


def install() -> bool:
    """Called from the .pth file; returns whether the entry point will take over this process."""
    arguments = upstream_arguments(getattr(sys, "orig_argv", ()))
    if arguments is None or not wants_reuse(arguments) or not enabled():
        return False
    if not any(isinstance(finder, _MainModuleFinder) for finder in sys.meta_path):  # site may read the .pth twice
        sys.meta_path.insert(0, _MainModuleFinder())
    return True
