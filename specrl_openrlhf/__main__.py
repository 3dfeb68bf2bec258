"""`python -m specrl_openrlhf policies [--plugin FILE.py ...]`: list the registered reuse policies."""

import argparse
import sys

from .policies import PluginError, describe_policies, load_plugin


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specrl_openrlhf")
    commands = parser.add_subparsers(dest="command", required=True)
    listing = commands.add_parser("policies", help="list the registered reuse policies")
    listing.add_argument("--plugin", action="append", default=[], help="also load this policy plugin file")
    args = parser.parse_args(argv)
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
