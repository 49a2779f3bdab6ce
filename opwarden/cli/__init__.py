"""The `opwarden` command: run | ops | conformance | explain (more arrive with their issues)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np

from opwarden.cli.feeds import parse_inputs as _parse_inputs
from opwarden.cli.feeds import random_feeds as _random_feeds


def _console():
    from rich.console import Console

    return Console()


def _load_default() -> tuple[bytes, str]:
    from opwarden import zoo

    return zoo.build("resnet50", seed=0).SerializeToString(), "light ResNet-50 (seeded weights)"


def _model_source(arg: str | None) -> tuple[Any, str]:
    """A model path, a light-zoo name (e.g. "resnet50"), or the embedded default."""
    import os

    from opwarden import zoo

    if not arg:
        return _load_default()
    if not os.path.exists(arg) and arg in zoo.LIGHT_MODELS:
        return zoo.build(arg, seed=0).SerializeToString(), f"light {arg} (seeded weights)"
    return arg, arg


def cmd_run(args: argparse.Namespace) -> int:
    from opwarden.session import InferenceSession

    if args.model:
        source: Any = args.model
        label = args.model
    else:
        source, label = _load_default()
    t0 = time.perf_counter()
    sess = InferenceSession(source)
    t_load = time.perf_counter() - t0
    feeds = _random_feeds(sess, args.seed)
    feeds.update(_parse_inputs(args.input or []))
    times = []
    outs: list[Any] = []
    for _ in range(max(1, args.runs)):
        t0 = time.perf_counter()
        outs = sess.run(None, feeds)
        times.append(time.perf_counter() - t0)
    result = {
        "model": label,
        "load_ms": round(t_load * 1e3, 3),
        "run_ms_median": round(float(np.median(times)) * 1e3, 3),
        "runs": len(times),
        "outputs": [_summary(a.name, o) for a, o in zip(sess.get_outputs(), outs)],
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    con = _console()
    con.print(
        f"[bold]{label}[/bold]: loaded in {result['load_ms']:.1f} ms, "
        f"run median {result['run_ms_median']:.1f} ms over {len(times)} run(s)"
    )
    for o in result["outputs"]:
        con.print(
            f"  {o['name']}: {o['dtype']}{o['shape']}  first values {o['values']}"
            + (f"  argmax {o['argmax']}" if "argmax" in o else "")
        )
    return 0


def _summary(name: str, x: Any) -> dict[str, Any]:
    if not isinstance(x, np.ndarray):
        return {"name": name, "dtype": type(x).__name__, "shape": [], "values": str(x)[:80]}
    flat = x.reshape(-1)
    out = {
        "name": name,
        "dtype": str(x.dtype),
        "shape": list(x.shape),
        "values": [v.item() if hasattr(v, "item") else v for v in flat[:5]],
    }
    if x.dtype.kind == "f" and flat.size:
        out["argmax"] = int(np.argmax(flat))
        out["nan_count"] = int(np.isnan(flat).sum())
    return out


def cmd_ops(args: argparse.Namespace) -> int:
    from opwarden.ops import REGISTRY

    rows = []
    for o in REGISTRY.all():
        rows.append(
            {
                "op": o.op_type,
                "domain": o.domain or "ai.onnx",
                "since": o.since,
                "variants": [v.describe() for v in o.variants],
                "contract": o.contract.describe(),
                "has_infer": o.infer_fn is not None,
                "has_grad": o.grad_fn is not None,
            }
        )
    if args.device:
        from opwarden.devices import get_device

        dev = get_device(args.device)
        if dev.kind == "profile":
            # a profile device runs its host's kernels under its own capability rules
            from opwarden.cli.devices import device_matrix

            matrix = device_matrix(dev.name)
            if args.json:
                print(json.dumps(matrix, indent=1, default=str))
                return 0
            from rich.table import Table

            table = Table(title=f"{dev.name}: {len(matrix)} operators ({dev.description})")
            for col in ("op", "detail"):
                table.add_column(col)
            for r in matrix:
                detail = {k: v for k, v in r.items() if k not in ("op", "op_type")}
                table.add_row(str(r.get("op") or r.get("op_type")), json.dumps(detail, default=str))
            _console().print(table)
            return 0
        rows = [r for r in rows if any(v["device"] == dev.name for v in r["variants"])]
    if args.json:
        print(json.dumps(rows, indent=1, default=str))
        return 0
    from rich.table import Table

    table = Table(title=f"{len(rows)} operator versions")
    for col in ("domain", "op", "since", "variants", "devices", "dtypes"):
        table.add_column(col)
    for r in rows:
        devs = sorted({v["device"] for v in r["variants"]})
        dts = sorted(
            {
                d
                for v in r["variants"]
                for d in (v["dtypes"] if isinstance(v["dtypes"], list) else [])
            }
        )
        table.add_row(
            r["domain"],
            r["op"],
            str(r["since"]),
            ", ".join(v["name"] for v in r["variants"]),
            ", ".join(devs),
            ", ".join(dts) or "schema",
        )
    _console().print(table)
    return 0


def cmd_conformance(args: argparse.Namespace) -> int:
    from collections import Counter

    from rich.markup import escape

    from opwarden.verify import conformance as conf

    results = conf.run_all(args.filter or (), progress=not args.json and sys.stderr.isatty())
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
        con = _console()
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


def cmd_explain(args: argparse.Namespace) -> int:
    from opwarden.session import InferenceSession

    source = args.model if args.model else _load_default()[0]
    sess = InferenceSession(source, providers=args.providers.split(",") if args.providers else None)
    rows = sess.explain()
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    from rich.table import Table

    table = Table(title="placement")
    for col in ("node", "op", "device", "variant", "rejected"):
        table.add_column(col)
    for r in rows:
        rej = "; ".join(f"{x['variant']}: {x['reason']}" for x in r["rejected"])
        note = f" (from {r['decomposed_from']})" if r["decomposed_from"] else ""
        table.add_row(r["node"], r["op_type"] + note, r["device"], r["variant"], rej)
    _console().print(table)
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    import os

    from opwarden.options import SessionOptions
    from opwarden.session import InferenceSession
    from opwarden.trace import report

    source, label = (args.model, args.model) if args.model else _load_default()
    opts = SessionOptions(trace=True, checks=args.checks.split(",") if args.checks else ())
    providers = args.providers.split(",") if getattr(args, "providers", None) else None
    sess = InferenceSession(source, sess_options=opts, providers=providers)
    feeds = _random_feeds(sess, 0)
    feeds.update(_parse_inputs(args.input or []))
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
    con = _console()
    con.print(t)
    a = Table(title="top anomalies")
    for col in ("node", "op type", "variant", "µs", "why"):
        a.add_column(col)
    for r in top:
        a.add_row(r["node"], r["op_type"], r["variant"], f"{r['exec_us']:.0f}", r["reason"])
    con.print(a)
    con.print(f"trace: {trace_path}\nflame graph: {flame_path}")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from opwarden.options import SessionOptions
    from opwarden.plan import report
    from opwarden.session import InferenceSession

    source, label = _model_source(args.model)
    sess = InferenceSession(source, sess_options=SessionOptions())
    feeds = _random_feeds(sess, 0, batch=args.batch)
    feeds.update(_parse_inputs(args.input or []))
    plan = sess.plan_for(feeds)
    picture = report.save_picture(plan, args.png) if args.png else None
    if args.json:
        out = plan.to_dict()
        out["model"] = label
        if picture:
            out["picture"] = picture
        print(json.dumps(out, indent=1))
        return 0
    con = _console()
    con.print(report.table(plan, limit=None if args.all else 40))
    for line in report.summary_lines(plan):
        con.print(line)
    if picture:
        con.print(f"arena picture: {picture}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="opwarden", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run a model (default: embedded light ResNet-50)")
    r.add_argument("model", nargs="?")
    r.add_argument("--input", action="append", metavar="NAME=FILE.npy")
    r.add_argument("--runs", type=int, default=1)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--json", action="store_true")
    r.set_defaults(fn=cmd_run)
    o = sub.add_parser("ops", help="every operator with its versions, variants, devices, dtypes")
    o.add_argument("--device")
    o.add_argument("--json", action="store_true")
    o.set_defaults(fn=cmd_ops)
    c = sub.add_parser("conformance", help="run the ONNX backend node suite")
    c.add_argument("--filter", action="append", help="substring of test names (repeatable)")
    c.add_argument("--json", action="store_true")
    c.add_argument(
        "--update-expected",
        action="store_true",
        help="rewrite the expected-failures list shipped in opwarden/verify/",
    )
    c.set_defaults(fn=cmd_conformance)
    e = sub.add_parser("explain", help="device and kernel variant per node, with reasons")
    e.add_argument("model", nargs="?")
    e.add_argument("--providers")
    e.add_argument("--json", action="store_true")
    e.set_defaults(fn=cmd_explain)
    pr = sub.add_parser("profile", help="run with tracing: per-op-type table, anomalies, trace")
    pr.add_argument("model", nargs="?")
    pr.add_argument("--runs", type=int, default=3)
    pr.add_argument("--checks", help="comma-separated: nan,inf,shape,dtype,contract or all")
    pr.add_argument("--input", action="append", metavar="NAME=FILE.npy")
    pr.add_argument("--json", action="store_true")
    pr.add_argument("--providers", help="comma-separated devices in priority order, e.g. torch,cpu")
    pr.add_argument("--out", default="opwarden_profile")
    pr.set_defaults(fn=cmd_profile)
    pl = sub.add_parser("plan", help="static memory plan: arena, lower bound, buffers, picture")
    pl.add_argument("model", nargs="?", help="model path or light-zoo name (default ResNet-50)")
    pl.add_argument("--json", action="store_true")
    pl.add_argument("--png", metavar="FILE", help="arena picture (.svg: no dependency; else PNG)")
    pl.add_argument("--batch", type=int, default=1, help="value for symbolic input dims")
    pl.add_argument("--input", action="append", metavar="NAME=FILE.npy")
    pl.add_argument("--all", action="store_true", help="list every buffer")
    pl.set_defaults(fn=cmd_plan)
    from opwarden.cli import bench
    from opwarden.cli import check as check_cli
    from opwarden.cli import devices as dcli

    bench.add_parser(sub)
    check_cli.add_parser(sub)
    dcli.add_parser(sub)
    e.set_defaults(fn=dcli.cmd_explain)
    return p


def main(argv: list[str] | None = None) -> int:
    from opwarden.errors import OpwardenError

    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args) or 0)
    except OpwardenError as e:
        print(f"opwarden: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2

