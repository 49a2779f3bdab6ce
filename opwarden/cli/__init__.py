"""The `opwarden` command: `main()` and the parser made of one module per subcommand.

Each subcommand module has ``add_parser(sub)`` and its ``cmd_*``: run.py, inspect_model.py,
compare.py (with compare_values.py), ops.py (with op_facets.py for `opwarden ops NAME`),
conformance.py, devices.py (`explain` and `devices`), profile.py, plan.py, bench.py and
check.py; common.py (the model a command runs, the console, the progress bar, argument types,
the exit codes) and feeds.py (feeds from the command line) hold what several share.

Errors never end in a traceback: an argparse mistake or an OptionsError exits 2, any other
OpwardenError or an OSError on a user's path exits 3 (one line, or a JSON object with
``--json``), an unexpected exception exits 4 with one line (``--debug`` shows the traceback),
Ctrl-C exits 130.
"""

from __future__ import annotations

import argparse
import sys

from opwarden.cli.common import EXIT_CODES_TEXT
from opwarden.cli.exits import Parser, run_cli

# What `opwarden --help` says (the module docstring is for readers of the code).
DESCRIPTION = (
    "opwarden: an ONNX runtime in which every operator is a verifiable contract.\n"
    "Run a model, inspect it, compare it value by value against onnxruntime, profile it,\n"
    "plan its memory, benchmark it, and check the kernels' contracts."
)


def _version() -> str:
    from importlib import metadata

    try:
        mine = metadata.version("opwarden")
    except metadata.PackageNotFoundError:
        import opwarden

        mine = opwarden.__version__
    parts = [f"opwarden {mine}"]
    for dep in ("onnx", "numpy"):
        try:
            parts.append(f"{dep} {metadata.version(dep)}")
        except metadata.PackageNotFoundError:
            pass
    return parts[0] + (f" ({', '.join(parts[1:])})" if len(parts) > 1 else "") + (
        f", Python {sys.version.split()[0]}")


def build_parser() -> argparse.ArgumentParser:
    """The `opwarden` parser with every subcommand."""
    from opwarden.cli import (
        batch,
        bench,
        compare,
        conformance,
        devices,
        inspect_model,
        ops,
        plan,
        profile,
        run,
    )
    from opwarden.cli import check as check_cli

    p = Parser(
        prog="opwarden",
        description=DESCRIPTION,
        epilog=EXIT_CODES_TEXT + "\n\nrun 'opwarden COMMAND --help' for a command's options",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=_version(),
                   help="print the versions of opwarden, onnx, numpy and Python")
    p.add_argument("--debug", action="store_true",
                   help="show the full traceback of any error (for bug reports)")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    run.add_parser(sub)
    inspect_model.add_parser(sub)
    compare.add_parser(sub)
    ops.add_parser(sub)
    conformance.add_parser(sub)
    devices.add_explain_parser(sub)
    profile.add_parser(sub)
    plan.add_parser(sub)
    bench.add_parser(sub)
    check_cli.add_parser(sub)
    devices.add_parser(sub)
    batch.add_parser(sub)
    for cmd in sub.choices.values():  # `opwarden run --debug ...` as well as before the command
        cmd.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                         help="show the full traceback of any error (for bug reports)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run `opwarden ARGS...`; returns the exit status (see common.EXIT_CODES_TEXT)."""
    return run_cli(build_parser, argv)
