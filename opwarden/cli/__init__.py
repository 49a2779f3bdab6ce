"""The `opwarden` command: `main()` and the parser made of one module per subcommand.

Each subcommand module has ``add_parser(sub)`` and its ``cmd_*``: run.py, ops.py (with
op_facets.py for `opwarden ops NAME`), conformance.py, devices.py (`explain` and `devices`),
profile.py, plan.py, bench.py and check.py; common.py (the model a command runs, the console)
and feeds.py (feeds from the command line) hold what several share. An OpwardenError raised
by a command is printed as one line and exits with status 2.
"""

from __future__ import annotations

import argparse
import sys

# What `opwarden --help` says (the module docstring is for readers of the code).
DESCRIPTION = (
    "The `opwarden` command: run | ops | conformance | explain (more arrive with their issues)."
)


def build_parser() -> argparse.ArgumentParser:
    from opwarden.cli import bench, conformance, devices, ops, plan, profile, run
    from opwarden.cli import check as check_cli

    p = argparse.ArgumentParser(prog="opwarden", description=DESCRIPTION)
    sub = p.add_subparsers(dest="cmd", required=True)
    run.add_parser(sub)
    ops.add_parser(sub)
    conformance.add_parser(sub)
    devices.add_explain_parser(sub)
    profile.add_parser(sub)
    plan.add_parser(sub)
    bench.add_parser(sub)
    check_cli.add_parser(sub)
    devices.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    from opwarden.errors import OpwardenError

    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args) or 0)
    except OpwardenError as e:
        print(f"opwarden: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
