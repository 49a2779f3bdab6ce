"""`opwarden devices [--json]`, the device matrix, and `opwarden explain` (parser, rendering)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from opwarden.cli.common import providers_list
from opwarden.place.summary import summarize


def explain_json(sess: Any) -> dict[str, Any]:
    """The explanation as JSON-ready data: `nodes` and `summary`."""
    rows = sess.explain()
    nodes = [
        {
            "name": r["name"],
            "op_type": r["op_type"],
            "device": r["device"],
            "variant": r["variant"],
            "reason": r.get("reason"),
            "layout": r.get("layout"),
            "inserted": r.get("inserted"),
            "decomposed_from": r.get("decomposed_from"),
            "origin": r.get("origin"),
        }
        for r in rows
    ]
    return {"nodes": nodes, "summary": summarize(rows, getattr(sess.placements, "report", {}))}


def render_explain(sess: Any, as_json: bool = False, out: Any = None) -> int:
    """Print `opwarden explain` for a session: a per-node table and the summary line."""
    data = explain_json(sess)
    if as_json:
        print(json.dumps(data, indent=1, default=str), file=out)
        return 0
    from rich.table import Table

    from opwarden.cli.common import console

    con = console(file=out)
    table = Table(title="placement")
    for col in ("node", "op", "device", "variant", "layout", "reason"):
        table.add_column(col, overflow="fold")
    for r in data["nodes"]:
        op = r["op_type"] + (f" (from {r['decomposed_from']})" if r["decomposed_from"] else "")
        if r["inserted"]:
            op += f" [inserted {r['inserted']}]"
        if r.get("origin") and r["origin"] != [r["name"]]:
            op += f" = {' + '.join(r['origin'])}"
        table.add_row(
            r["name"], op, r["device"], r["variant"], r["layout"] or "", r["reason"] or ""
        )
    con.print(table)
    con.print(data["summary"]["text"])
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    """`opwarden explain [MODEL] [--providers edge-npu,cpu] [--json]`."""
    from opwarden.cli.common import model_source, writable_file
    from opwarden.place.picture import save_placement_svg
    from opwarden.session import InferenceSession

    if args.svg:
        writable_file(args.svg, "--svg", (".svg",))
    source, label = model_source(args.model)  # a path, a light-zoo name, or the default
    sess = InferenceSession(source, providers=args.providers)
    if args.svg:
        save_placement_svg(sess.placements, args.svg, sess.placements.report, label)
    return render_explain(sess, args.json)


def add_explain_parser(sub: Any) -> argparse.ArgumentParser:
    """Add `explain` to the opwarden subcommands."""
    e = sub.add_parser("explain", help="device and kernel variant per node, with reasons")
    e.add_argument("model", nargs="?", help="model path or light-zoo name (default ResNet-50)")
    e.add_argument("--providers", type=providers_list,
                   help="comma-separated devices in priority order, e.g. edge-npu,cpu")
    e.add_argument("--json", action="store_true", help="print the explanation as JSON")
    e.add_argument("--svg", metavar="FILE.svg",
                   help="also write the placement picture: the graph coloured by device")
    e.set_defaults(fn=cmd_explain)
    return e


# -- opwarden devices ---------------------------------------------------------------------------


def device_matrix(name: str) -> list[dict[str, Any]]:
    """The capability matrix of one device: per operator, its variants and constraints."""
    from opwarden.devices import get_device

    return get_device(name).capabilities()


def cmd_devices(args: argparse.Namespace) -> int:
    from opwarden.devices import devices, get_device, load_profile

    for path in args.profile or ():
        load_profile(path)
    if args.show:
        dev = get_device(args.show)
        data: Any = {**dev.describe(), "ops": dev.capabilities()}
        if args.json:
            print(json.dumps(data, indent=1, default=str))
            return 0
        return _print_matrix(dev, data["ops"])
    rows = [d.describe() for d in devices()]
    if args.json:
        print(json.dumps(rows, indent=1, default=str))
        return 0
    from rich.table import Table

    from opwarden.cli.common import console

    t = Table(title=f"{len(rows)} devices")
    for col in ("name", "kind", "layout", "memory", "concurrent", "ops", "description"):
        t.add_column(col)
    for r in rows:
        mem = "host" if r["memory_bytes"] is None else f"{r['memory_bytes'] / 2**20:g} MiB"
        kind = r["kind"] + (" (simulated)" if r["simulated"] else "")
        t.add_row(
            r["name"], kind, r["preferred_layout"], mem, "yes" if r["concurrent"] else "no",
            str(r["op_count"]), r["description"],
        )
    console().print(t)
    return 0


def _print_matrix(dev: Any, ops: list[dict[str, Any]]) -> int:
    from rich.table import Table

    from opwarden.cli.common import console

    t = Table(title=f"{dev.name}: {len(ops)} operators")
    for col in ("op", "variant", "dtypes", "layouts", "constraints"):
        t.add_column(col, overflow="fold")
    for o in ops:
        for v in o["variants"]:
            dts = v["dtypes"] if isinstance(v["dtypes"], str) else ", ".join(v["dtypes"])
            cons = "; ".join(c["description"] for c in v["constraints"])
            t.add_row(o["op"], v["name"], dts, ", ".join(v["layouts"]), cons)
    console().print(t)
    return 0


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add `opwarden devices` to the CLI's subparsers."""
    p = sub.add_parser("devices", help="devices and their capabilities (operators, constraints)")
    p.add_argument("--show", metavar="DEVICE", help="the operator matrix of one device")
    p.add_argument(
        "--profile", action="append", metavar="FILE.toml", help="load a device profile first"
    )
    p.add_argument("--json", action="store_true", help="print the devices as JSON")
    p.set_defaults(fn=cmd_devices)
    return p
