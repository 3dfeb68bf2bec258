"""The one seam OpenRLHF 0.11 lacks for a command-line extension, and the narrow hook that stands in for it.

OpenRLHF's `train_ppo_ray` builds its parser, validates the arguments and calls `train(args)` inside its module's
`if __name__ == "__main__":` block; no function lets a package extend the parser or run code between validation and
training. So the module runs as it is, from its own file (runpy for our command, Python's `-m` for OpenRLHF's own
command through `_specrl_openrlhf_hook`, which calls `install` and knows nothing else of the package), and only the
one `parse_args` call its code makes comes to `take_over`:

- the parser gets our argument group (generated from `ReuseConfig`) and a one-line usage;
- after parsing, our flags are validated with OpenRLHF's (errors name the flag and the fix, before Ray starts);
- when reuse is on, or a dry run is asked for, that module's own namespace gets a `train` of ours, which prepares the
  run (see `cli.train_with_reuse`) and then calls OpenRLHF's `train`, and, for a rule verified in the
  engine, a `create_vllm_engines` whose engines run our proposer (`engines`).

Nothing else in the process is touched, and tracebacks show OpenRLHF's frames from OpenRLHF's file. Importing this
module is cheap (the hook imports it at start-up): the command's code loads when OpenRLHF's parser is reached.
docs/upstream.md proposes `build_parser()` and `main(argv)` upstream, which would retire this module.
"""

from __future__ import annotations

import argparse
import functools
import runpy
import sys

UPSTREAM_MODULE = "openrlhf.cli.train_ppo_ray"  # also in _specrl_openrlhf_hook (stdlib only); a test ties them


def is_upstream_main(module_globals: dict) -> bool:
    """Whether code runs as OpenRLHF's `train_ppo_ray` executed as `__main__` (by `-m` or runpy)."""
    spec = module_globals.get("__spec__")
    return module_globals.get("__name__") == "__main__" and getattr(spec, "name", None) == UPSTREAM_MODULE


def hook_upstream_parser(take_over):
    """Route the next `ArgumentParser.parse_args` call made by OpenRLHF's `__main__` code to
    `take_over(parser, parse_args, args, namespace, module_globals)`; every other call, from any other code, is
    argparse's own. The hook removes itself at that call. Returns a function that removes it earlier."""
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


def install() -> None:
    """OpenRLHF's own command (`python -m openrlhf.cli.train_ppo_ray`) with our flags: called by
    `_specrl_openrlhf_hook` at the process's start, before that module parses its arguments."""
    hook_upstream_parser(take_over)


def take_over(parser, parse_args, args, namespace, module_globals, *, prog: str | None = None, reached=None):
    """What OpenRLHF's one `parse_args` call does with our hook in place (see the module docstring)."""
    from .cli import after_parse, extend_parser

    if reached is not None:
        reached.append(True)
    if prog:
        parser.prog = prog
    extend_parser(parser)
    namespace = parse_args(parser, args, namespace)
    take_over_names = after_parse(parser, namespace)
    if take_over_names is not None:
        take_over_names(module_globals)
    return namespace


def run_upstream(argv: list[str], prog: str) -> None:
    """Run OpenRLHF's `train_ppo_ray` as `__main__` with `argv`, its parser taken over by `take_over`."""
    reached: list[bool] = []
    remove = hook_upstream_parser(functools.partial(take_over, prog=prog, reached=reached))
    saved = sys.argv
    sys.argv = [prog, *argv]
    try:
        runpy.run_module(UPSTREAM_MODULE, run_name="__main__", alter_sys=True)
    except ImportError as error:
        if reached:  # an import inside training: not ours to explain
            raise
        raise SystemExit(
            f"{prog}: OpenRLHF's {UPSTREAM_MODULE} could not be imported ({type(error).__name__}: {error}). It needs "
            "OpenRLHF's GPU stack (flash-attn, DeepSpeed): install openrlhf[vllm] on a GPU node (docs/install.md)."
        ) from error
    finally:
        remove()
        sys.argv = saved


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    """Run OpenRLHF's `train_ppo_ray` with our flags (`prog` names the command in help and errors)."""
    from .cli import PROG

    run_upstream(sys.argv[1:] if argv is None else list(argv), prog or PROG)
