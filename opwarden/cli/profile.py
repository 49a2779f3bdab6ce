"""`opwarden profile [MODEL] [--warmup W] [--runs N] [--checks ...] [--providers ...] [--out DIR]`.

Runs the model `--warmup` times untraced-for-the-report (the cold first run packs weights and
binds the plan), then `--runs` traced runs: a table of kernel time by op type (guard checks
apart), the top anomalies of the warm runs (faults, NaN/Inf, slowest against the roofline
estimate, whose FLOPs come from each operator's declared cost rule), and a Chrome trace
(trace.json) and flame graph (flame.svg) of the warm runs written to --out.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from opwarden.cli.common import (
    add_model_arg,
    console,
    model_source,
    non_negative_int,
    positive_int,
    progress,
    providers_list,
    writable_dir,
)
from opwarden.cli.feeds import make_feeds, parse_dims


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add `profile` to the opwarden subcommands."""
    pr = sub.add_parser("profile", help="run with tracing: per-op-type table, anomalies, trace",
                        description=__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arg(pr)
    pr.add_argument("--warmup", type=non_negative_int, default=1,
                    help="runs before the traced ones, left out of every figure (default 1)")
    pr.add_argument("--runs", type=positive_int, default=3, help="traced runs (default 3)")
    pr.add_argument("--checks", help="comma-separated: nan,inf,shape,dtype,contract or all")
    pr.add_argument("--input", action="append", metavar="NAME=FILE.npy",
                    help="feed this input from a .npy file (repeatable; others are random)")
    pr.add_argument("--dim", action="append", metavar="NAME=N",
                    help="size of a symbolic input dimension for random feeds (default 1)")
    pr.add_argument("--json", action="store_true", help="print the result as JSON")
    pr.add_argument("--providers", type=providers_list,
                    help="comma-separated devices in priority order, e.g. torch,cpu")
    pr.add_argument("--out", default="opwarden_profile",
                    help="folder for trace.json and flame.svg (default ./opwarden_profile)")
    pr.set_defaults(fn=cmd_profile)
    return pr


def traced_runs(
    sess: Any, feeds: dict[str, Any], warmup: int, runs: int
) -> tuple[list[Any], list[Any]]:
    """(trace records, faults) of `runs` runs after `warmup` runs whose records and faults
    are left out."""
    records: list[Any] = []
    with progress("profiling", total=warmup + runs) as bar:
        for _ in range(warmup):
            sess.run(None, feeds)
            bar.advance()
        seen = len(sess.faults)
        for _ in range(runs):
            sess.run(None, feeds)
            records.extend(sess.trace)
            bar.advance()
    return records, sess.faults[seen:]


def cmd_profile(args: argparse.Namespace) -> int:
    """Profile the model; print (or --json) the op-type table and anomalies, write the files."""
    from opwarden.options import SessionOptions
    from opwarden.session import InferenceSession
    from opwarden.trace import report

    out_dir = writable_dir(args.out, "--out")  # before the work, not after it
    source, label = model_source(args.model)
    checks = tuple(c for c in args.checks.split(",") if c) if args.checks else ()
    opts = SessionOptions(trace=True, checks=checks)
    sess = InferenceSession(source, sess_options=opts, providers=args.providers)
    feeds = make_feeds(sess, args.input, 0, dims=parse_dims(args.dim))
    records, warm_faults = traced_runs(sess, feeds, args.warmup, args.runs)
    trace_path = report_chrome(records, os.path.join(out_dir, "trace.json"))
    flame_path = report.flame_svg(records, os.path.join(out_dir, "flame.svg"),
                                  title=f"{label}, {args.runs} run(s) after {args.warmup} "
                                  f"warm-up on {', '.join(sess.get_providers())}")
    table = report.by_op_type(records)
    top = report.anomalies(records, warm_faults)
    result = {
        "model": label,
        "providers": sess.get_providers(),
        "warmup": args.warmup,
        "runs": args.runs,
        "by_op_type": table,
        "anomalies": top,
        "faults": [f.as_dict() for f in warm_faults],
        "warmup_faults": len(sess.faults) - len(warm_faults),
        "trace": trace_path,
        "flame": flame_path,
    }
    if args.json:
        print(json.dumps(result, indent=1, default=str))
        return 0
    _print(result)
    return 0


def report_chrome(records: list[Any], path: str) -> str:
    """The Chrome trace of the warm runs' records."""
    from opwarden.trace.records import chrome_trace

    return chrome_trace(records, path)


def _print(result: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=f"{escape(result['model'])}: {result['runs']} traced run(s) after "
                    f"{result['warmup']} warm-up, kernel time by op type (guard checks apart)")
    for col in ("op type", "count", "total ms", "mean µs", "max µs", "share", "guard ms"):
        t.add_column(col, justify="right" if col != "op type" else "left")
    for r in result["by_op_type"]:
        t.add_row(
            escape(r["op_type"]),
            str(r["count"]),
            f"{r['total_us'] / 1e3:.2f}",
            f"{r['mean_us']:.0f}",
            f"{r['max_us']:.0f}",
            f"{100 * r['share']:.1f}%",
            f"{r['guard_us'] / 1e3:.2f}",
        )
    con = console()
    con.print(t)
    a = Table(title="top anomalies (warm runs)")
    for col in ("node", "op type", "variant", "µs", "why"):
        a.add_column(col)
    for r in result["anomalies"]:
        a.add_row(escape(r["node"]), escape(r["op_type"]), escape(r["variant"]),
                  f"{r['exec_us']:.0f}", escape(r["reason"]))
    con.print(a)
    con.print(f"trace: {escape(result['trace'])}\nflame graph: {escape(result['flame'])}")
