"""`python -m specrl_openrlhf COMMAND`: list the reuse policies, or show the OpenRLHF command hook."""

import argparse
import sys

from .policies import PluginError, describe_policies, load_plugin


def show_hook() -> int:
    """Where the hook that lets `python -m openrlhf.cli.train_ppo_ray` take our flags lives, and its switch."""
    import site
    from pathlib import Path

    import _specrl_openrlhf_hook as hook

    folders = [*site.getsitepackages(), site.getusersitepackages()]
    installed = [Path(f, "specrl_openrlhf_hook.pth") for f in folders if Path(f, "specrl_openrlhf_hook.pth").is_file()]
    print(f"hook file: {installed[0] if installed else 'not installed (reinstall the package with pip)'}")
    print(f"state: {'on' if hook.enabled() else 'off'} ({hook.SWITCH}={'1' if hook.enabled() else '0'})")
    print(
        f"`python -m {hook.UPSTREAM_MODULE}` with --rollout_reuse, --lenience or --reuse.* (or --help) runs "
        f"`python -m {hook.ENTRY_POINT}`; without them it runs OpenRLHF untouched.\n"
        f"Turn it off: export {hook.SWITCH}=0. Remove it: pip uninstall specrl-openrlhf, or delete the hook file."
    )
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specrl_openrlhf")
    commands = parser.add_subparsers(dest="command", required=True)
    listing = commands.add_parser("policies", help="list the registered reuse policies")
    listing.add_argument("--plugin", action="append", default=[], help="also load this policy plugin file")
    commands.add_parser("hook", help="show the hook that adds our flags to `python -m openrlhf.cli.train_ppo_ray`")
    args = parser.parse_args(argv)
    if args.command == "hook":
        return show_hook()
    try:
        for path in args.plugin:
            load_plugin(path)
    except PluginError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(describe_policies())
    return 0


if __name__ == "__main__":
    sys.exit(main())
