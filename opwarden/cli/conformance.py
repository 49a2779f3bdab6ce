"""`opwarden conformance [--filter SUBSTRING] [--json] [--update-expected]`.

Runs the ONNX backend node suite (opwarden.verify.conformance) and compares the failures with
the expected-failures list shipped in opwarden/verify/; exit status 1 when a case fails that
is not listed or passes that is.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from opwarden.cli.common import console, progress


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add `conformance` to the opwarden subcommands."""
    c = sub.add_parser("conformance", help="run the ONNX backend node suite")
    c.add_argument("--filter", action="append",
                   help="only the cases whose name contains this (repeatable)")
    c.add_argument("--json", action="store_true", help="print the summary as JSON")
    c.add_argument(
        "--update-expected",
        action="store_true",
        help="rewrite the expected-failures list shipped in opwarden/verify/",
    )
    c.set_defaults(fn=cmd_conformance)
    return c


def cmd_conformance(args: argparse.Namespace) -> int:
    from collections import Counter

    from rich.markup import escape

    from opwarden.verify import conformance as conf

    cases = conf.load_cases(args.filter or ())
    results = []
    with progress("ONNX node suite", total=len(cases)) as bar:
        for case in cases:
            results.append(conf.run_case(case))
            bar.advance()
    expected = conf.read_expected()
    passed = [r for r in results if r.status == "pass"]
    failed = [r for r in results if r.status == "fail"]
    skipped = [r for r in results if r.status == "skip"]
    new_fail = [r for r in failed if r.name not in expected]
    fixed = [r for r in passed if r.name in expected]
    if args.update_expected and not args.filter:
        conf.write_expected(results)
    summary = {
        "total": len(results),
        "passed": len(passed),
        "failed": len(failed),
        "skipped": [{"name": r.name, "reason": r.reason} for r in skipped],
        "unexpected_failures": [{"name": r.name, "reason": r.reason} for r in new_fail],
        "unexpected_passes": [r.name for r in fixed],
    }
    if args.json:
        summary["failures"] = [{"name": r.name, "reason": r.reason} for r in failed]
        print(json.dumps(summary, indent=1))
    else:
        con = console()
        con.print(
            f"ONNX node suite: [bold]{len(passed)}[/bold] of {len(results)} pass, "
            f"{len(failed)} fail ({len(new_fail)} not in the expected-failures list, "
            f"{len(fixed)} listed but now passing)"
        )
        for why, n in Counter(r.reason for r in skipped).items():
            con.print(f"  [yellow]skipped[/yellow] {n} cases: {escape(why)}")
        kinds = Counter(r.reason.split(":")[0] for r in failed)
        for k, n in kinds.most_common(8):
            con.print(f"  {n:5d}  {k}")
        for r in new_fail[:20]:
            con.print(f"  [red]new failure[/red] {r.name}: {escape(r.reason[:150])}")
    return 1 if (new_fail or fixed) and not args.update_expected else 0
