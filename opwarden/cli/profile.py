"""`opwarden profile [MODEL] [--runs N] [--checks ...] [--providers ...] [--out DIR] [--json]`.

Runs the model with tracing: a table of kernel time by op type (guard checks apart), the top
anomalies, and a Chrome trace (trace.json) and flame graph (flame.svg) written to --out.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from opwarden.cli.common import console, model_source
from opwarden.cli.feeds import parse_inputs, random_feeds


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add `profile` to the opwarden subcommands."""
    pr = sub.add_parser("profile", help="run with tracing: per-op-type table, anomalies, trace")
    pr.add_argument("model", nargs="?", help="model path or light-zoo name (default ResNet-50)")
    pr.add_argument("--runs", type=int, default=3)
    pr.add_argument("--checks", help="comma-separated: nan,inf,shape,dtype,contract or all")
    pr.add_argument("--input", action="append", metavar="NAME=FILE.npy")
    pr.add_argument("--json", action="store_true")
    pr.add_argument("--providers", help="comma-separated devices in priority order, e.g. torch,cpu")
    pr.add_argument("--out", default="opwarden_profile")
    pr.set_defaults(fn=cmd_profile)
    return pr


def cmd_profile(args: argparse.Namespace) -> int:
    import os

    from opwarden.options import SessionOptions
    from opwarden.session import InferenceSession
    from opwarden.trace import report

    source, label = model_source(args.model)
    opts = SessionOptions(trace=True, checks=args.checks.split(",") if args.checks else ())
    providers = args.providers.split(",") if getattr(args, "providers", None) else None
    sess = InferenceSession(source, sess_options=opts, providers=providers)
    feeds = random_feeds(sess, 0)
    feeds.update(parse_inputs(args.input or []))
    records = []
    show = not args.json and sys.stderr.isatty() and args.runs > 1
    if show:
        from rich.progress import Progress

        with Progress(transient=True) as bar:
            task = bar.add_task("profiling", total=args.runs)
            for _ in range(args.runs):
                sess.run(None, feeds)
                records.extend(sess.trace)
                bar.advance(task)
    else:
        for _ in range(args.runs):
            sess.run(None, feeds)
            records.extend(sess.trace)
    os.makedirs(args.out, exist_ok=True)
    trace_path = sess.end_profiling(os.path.join(args.out, "trace.json"))
    flame_path = report.flame_svg(records, os.path.join(args.out, "flame.svg"))
    table = report.by_op_type(records)
    top = report.anomalies(sess.trace, sess.faults)
    result = {
        "model": label,
        "runs": args.runs,
        "by_op_type": table,
        "anomalies": top,
        "faults": [f.as_dict() for f in sess.faults],
        "trace": trace_path,
        "flame": flame_path,
    }
    if args.json:
        print(json.dumps(result, indent=1, default=str))
        return 0
    from rich.table import Table

    t = Table(title=f"{label}: {args.runs} run(s), kernel time by op type (guard checks apart)")
    for col in ("op type", "count", "total ms", "mean µs", "max µs", "share", "guard ms"):
        t.add_column(col, justify="right" if col != "op type" else "left")
    for r in table:
        t.add_row(
            r["op_type"],
            str(r["count"]),
            f"{r['total_us'] / 1e3:.2f}",
            f"{r['mean_us']:.0f}",
            f"{r['max_us']:.0f}",
            f"{100 * r['share']:.1f}%",
            f"{r['guard_us'] / 1e3:.2f}",
        )
    con = console()
    con.print(t)
    a = Table(title="top anomalies")
    for col in ("node", "op type", "variant", "µs", "why"):
        a.add_column(col)
    for r in top:
        a.add_row(r["node"], r["op_type"], r["variant"], f"{r['exec_us']:.0f}", r["reason"])
    con.print(a)
    con.print(f"trace: {trace_path}\nflame graph: {flame_path}")
    return 0
