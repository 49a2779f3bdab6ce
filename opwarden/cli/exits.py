"""Exit codes and errors of the `opwarden` command: no traceback for any mistake.

`run_cli(build, argv)` parses with `Parser` (argparse that raises UsageError instead of
exiting) and runs the command: a usage mistake or an OptionsError exits 2, any other
OpwardenError or an OSError on a user's path 3 (one line on stderr, or with ``--json`` a JSON
object ``{"error": {"type", "message", "exit_code"}}`` on stdout), an unexpected exception 4
with one line (``--debug`` re-raises it for the traceback), Ctrl-C 130.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from opwarden.cli.common import EXIT_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_USAGE


class UsageError(Exception):
    """A command-line mistake argparse found (turned into exit status 2)."""

    def __init__(self, message: str, usage: str) -> None:
        super().__init__(message)
        self.usage = usage


class Parser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of exiting, so that `main` can answer in JSON
    when `--json` was asked for, and so that in-process callers get a return code."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(message, self.format_usage())


def _wants_json(argv: list[str]) -> bool:
    return "--json" in argv


def _report(kind: str, message: str, code: int, as_json: bool, extra: str = "") -> int:
    """Print one error (a line on stderr, or a JSON object on stdout) and return `code`."""
    if as_json:
        print(json.dumps({"error": {"type": kind, "message": message, "exit_code": code}}))
    else:
        print(f"opwarden: error: {kind}: {message}{extra}", file=sys.stderr)
    return code


def run_cli(build: Callable[[], argparse.ArgumentParser], argv: list[str] | None = None) -> int:
    """Parse `argv` with `build()`'s parser and run the chosen command; returns the exit
    status (see common.EXIT_CODES_TEXT)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    as_json = _wants_json(args_list)
    debug = "--debug" in args_list
    try:
        args: Any = build().parse_args(args_list)
        return int(args.fn(args) or 0)
    except UsageError as e:
        if as_json:
            return _report("UsageError", str(e), EXIT_USAGE, True)
        sys.stderr.write(e.usage)
        print(f"opwarden: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as e:  # --help and --version
        return e.code if isinstance(e.code, int) else (0 if e.code is None else EXIT_USAGE)
    except KeyboardInterrupt:
        print("opwarden: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BaseException as e:  # noqa: BLE001 - the one place every error becomes an exit code
        if debug:
            raise
        return _handle(e, as_json)


def _handle(e: BaseException, as_json: bool) -> int:
    from opwarden.errors import OptionsError, OpwardenError

    if isinstance(e, OptionsError):
        return _report(type(e).__name__, str(e), EXIT_USAGE, as_json)
    if isinstance(e, OpwardenError):
        return _report(type(e).__name__, str(e), EXIT_INPUT, as_json)
    if isinstance(e, OSError):
        msg = e.strerror or str(e)
        if e.filename is not None and str(e.filename) not in msg:
            msg += f": {str(e.filename)!r}"
        return _report(type(e).__name__, msg, EXIT_INPUT, as_json)
    if isinstance(e, MemoryError):
        return _report("MemoryError", "out of memory", EXIT_INPUT, as_json)
    return _report(
        type(e).__name__, f"internal error: {e}", EXIT_INTERNAL, as_json,
        extra="\nopwarden: this is a bug in opwarden; rerun with --debug for the traceback",
    )
