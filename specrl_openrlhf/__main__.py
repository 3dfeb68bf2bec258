"""`python -m specrl_openrlhf COMMAND`: list the reuse policies, replay rules on draft traces, or show the OpenRLHF
command hook."""

import argparse
import sys

from .config import parse_rule
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


def replay_command(args) -> int:
    import time
    from pathlib import Path

    from .analysis.replay import ReplayError, format_table, replay_kept, tally
    from .at_scale.engine_replay import engine_kept
    from .trace import read_traces

    if args.trace_dir is None:  # the folder may also come last, after the rules
        args.trace_dir = args.rollout_reuse.pop() if len(args.rollout_reuse) > 1 else None
    if args.trace_dir is None:
        print("error: name the folder given to --reuse.trace_dir, before or after --rollout_reuse", file=sys.stderr)
        return 2
    if not Path(args.trace_dir).is_dir():
        print(f"error: {args.trace_dir}: no such folder (the folder given to --reuse.trace_dir)", file=sys.stderr)
        return 2
    try:
        for path in args.plugin:
            load_plugin(path)
        policies = [parse_rule(text, args.lenience) for text in args.rollout_reuse]
        records = read_traces(args.trace_dir)
        results = []  # a walk's cut is no prefix of its recorded draft: replay the run's own rule to see it
        if records.proposals == ["own"]:
            results.append(tally("recorded (the run's own cuts)", records, records.cut))
        for policy in policies:
            start = time.perf_counter()
            kept = replay_kept(
                policy, records, engine_kept, batch_size=args.batch_size, update_every=args.update_every
            )
            results.append(tally(policy.describe(), records, kept))
            results[-1].seconds = time.perf_counter() - start
    except (PluginError, ReplayError, FileNotFoundError, ValueError, TypeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(format_table(results, records))
    if args.csv:
        import csv

        from .analysis.replay import csv_rows

        rows = csv_rows(results)
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specrl_openrlhf")
    commands = parser.add_subparsers(dest="command", required=True)
    listing = commands.add_parser("policies", help="list the registered reuse policies")
    listing.add_argument("--plugin", action="append", default=[], help="also load this policy plugin file")
    commands.add_parser("hook", help="show the hook that adds our flags to `python -m openrlhf.cli.train_ppo_ray`")
    replaying = commands.add_parser(
        "replay",
        help="compare acceptance rules on draft traces (recorded with --reuse.trace_dir), no engine needed",
        description="Each rule cuts the recorded drafts with the uniforms the run drew: the run's own rule "
        "reproduces the run's cuts. Rules: a name (spec), NAME@LENIENCE (spec@2.0) or path/rule.py:Class, each "
        "optionally with parameters: path/rule.py:Class@2,decay=0.25.",
    )
    replaying.add_argument(
        "trace_dir", nargs="?", help="the folder given to --reuse.trace_dir (or last, after the rules)"
    )
    replaying.add_argument("--rollout_reuse", nargs="+", required=True, metavar="RULE", help="rules to replay")
    replaying.add_argument("--lenience", type=float, default=None, help="lenience for rules without @LENIENCE")
    replaying.add_argument("--reuse.plugin", dest="plugin", action="append", default=[], metavar="FILE.py")
    replaying.add_argument("--batch-size", type=int, default=256, help="drafts per policy call (default 256)")
    replaying.add_argument(
        "--update-every", type=int, default=None, help="drafts per update of a stateful rule (default: batch size)"
    )
    replaying.add_argument("--csv", default=None, help="also write the table to this CSV file")
    args = parser.parse_args(argv)
    if args.command == "hook":
        return show_hook()
    if args.command == "replay":
        return replay_command(args)
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
