"""`opwarden check`: every registered kernel variant against its operator's contract."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
from typing import Any

from opwarden.cli.common import progress
from opwarden.errors import OptionsError


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the `check` subcommand to an argparse subparsers object."""
    p = sub.add_parser(
        "check", help="verify kernel variants against their contracts (numerics, NaN, threads, ...)"
    )
    p.add_argument(
        "--op",
        action="append",
        default=[],
        help="operator (Name or domain::Name) or variant name; repeatable",
    )
    p.add_argument("--device", help="only variants of this device (cpu, torch, ...)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="FILE_OR_MODULE",
        help="load user code that defines operators first",
    )
    p.add_argument("--checks", help="comma-separated subset of the checks (default: all of "
                   "numerics, boundary, nan, overflow, mutation, alias, workspace, concurrency, "
                   "shape, grad)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="one concurrency round for built-in ops (the default for a full run)",
    )
    p.set_defaults(fn=cmd_check)
    return p


def import_user_code(spec: str) -> Any:
    """Import a Python file (by path) or a module (by dotted name) that registers operators."""
    if spec.endswith(".py") or os.sep in spec or os.path.exists(spec):
        path = os.path.abspath(spec)
        if not os.path.exists(path):
            raise OptionsError(f"--import {spec}: no such file")
        name = "opwarden_user_" + os.path.splitext(os.path.basename(path))[0]
        loader = importlib.util.spec_from_file_location(name, path)
        if loader is None or loader.loader is None:
            raise OptionsError(f"--import {spec}: not a Python file")
        mod = importlib.util.module_from_spec(loader)
        sys.modules[name] = mod
        folder = os.path.dirname(path)
        sys.path.insert(0, folder)  # so the file can import its neighbours
        try:
            loader.loader.exec_module(mod)
        except Exception as e:
            sys.modules.pop(name, None)
            raise OptionsError(f"--import {spec}: {type(e).__name__}: {e}") from e
        finally:
            if folder in sys.path:
                sys.path.remove(folder)
        return mod
    try:
        return importlib.import_module(spec)
    except ImportError as e:
        raise OptionsError(f"--import {spec}: {e}") from e


def _text(report: Any, out: Any) -> None:
    from opwarden.verify.harness import CHECKS

    for v in report.variants:
        if v.ok and not os.environ.get("OPWARDEN_CHECK_VERBOSE"):
            continue
        marks = " ".join(f"{c}={v.checks[c]}" for c in CHECKS if c in v.checks)
        dom = f"{v.domain}::" if v.domain else ""
        print(
            f"{'FAIL' if not v.ok else 'ok  '} {dom}{v.op}-{v.since} {v.variant}: {marks}", file=out
        )
        for f in v.failures:
            print(f"     {f['check']}: {f['detail']}", file=out)
            if f.get("input"):
                print(
                    f"       smallest failing input: {json.dumps(f['input'], default=str)}",
                    file=out,
                )
    s = report.summary()
    n_bad = sum(not v.ok for v in report.variants)
    print(
        f"{len(report.variants)} variants checked in {report.seconds:.1f} s: "
        f"{len(report.variants) - n_bad} ok, {n_bad} violating a contract",
        file=out,
    )
    for c, counts in s.items():
        print(
            f"  {c:12s} pass {counts['pass']:4d}  fail {counts['fail']:4d}  "
            f"skip {counts['skip']:4d}",
            file=out,
        )


def cmd_check(args: argparse.Namespace) -> int:
    """Run the harness; exit 1 when any contract is violated, 0 otherwise."""
    from opwarden.verify.harness import Report, check

    for spec in args.imports or []:
        import_user_code(spec)
    if args.device:
        from opwarden.devices.base import get_device
        from opwarden.errors import OpwardenError

        try:
            get_device(args.device)  # brings in an optional provider's variants (torch)
        except OpwardenError as e:
            print(f"opwarden check: {e}", file=sys.stderr)
            return 2  # a usage error
    checks = None
    if getattr(args, "checks", None):
        checks = [c.strip() for c in args.checks.split(",") if c.strip()]
    targets = list(args.op or []) or [None]
    full = targets == [None]
    report = Report()
    with progress("check") as bar:
        def tick(vr: Any) -> None:
            bar.advance()
            bar.describe(f"check {vr.op} {vr.variant}: {len(report.variants)} done")

        for t in targets:
            r = check(t, device=args.device, checks=checks,
                      quick=bool(getattr(args, "quick", False)) or full, progress=tick)
            report.variants.extend(r.variants)
            report.seconds += r.seconds
    if args.json:
        print(json.dumps(report.to_json(), indent=1, default=str))
    else:
        _text(report, sys.stdout)
    return 0 if report.ok else 1


def main(argv: list[str] | None = None) -> int:
    """`python -m opwarden.cli.check ...`: the same as `opwarden check ...`."""
    from opwarden.cli.exits import Parser, run_cli

    def build() -> argparse.ArgumentParser:
        p = Parser(prog="opwarden")
        add_parser(p.add_subparsers(dest="cmd", required=True))
        return p

    return run_cli(build, ["check", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
