"""`opwarden ops [NAME] [--device DEVICE] [--json]`: the operators, or every facet of one.

Without NAME: every registered operator version with its variants, devices and dtypes (with
``--device``: those a device runs; a profile device's capability matrix). With NAME
(``Conv``, ``opwarden::FusedConv``): its schema, contract, reference kernel, shape rule,
gradient, cost (FLOPs) rule, pieces (a fused operator's), decomposition, variants and how each
device runs it, each with the file and line where it lives (gathered by op_facets.py). An
unknown NAME is an UnsupportedOpError (exit 3).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from opwarden.cli.common import console


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add `ops` to the opwarden subcommands."""
    o = sub.add_parser("ops", help="every operator with its versions, variants, devices, dtypes")
    o.add_argument(
        "name", nargs="?", metavar="NAME",
        help="one operator ([DOMAIN::]OP_TYPE): every facet, with where it lives",
    )  # fmt: skip
    o.add_argument("--device", help="only the operators this device runs (cpu, torch, a profile)")
    o.add_argument("--json", action="store_true", help="print the listing as JSON")
    o.set_defaults(fn=cmd_ops)
    return o


def cmd_ops(args: argparse.Namespace) -> int:
    if getattr(args, "name", None):
        return _one_op(args)
    return _list_ops(args)


def _list_ops(args: argparse.Namespace) -> int:
    """The table of every operator version (the profile matrix with --device PROFILE)."""
    from opwarden.ops import REGISTRY

    rows: list[dict[str, Any]] = []
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
            console().print(table)
            return 0
        runs = {(c["domain"], c["op"], v.get("since")) for c in dev.capabilities()
                for v in c["variants"]}  # the device's own answer (openvino asks OpenVINO)
        rows = [r for r in rows if (r["domain"], r["op"], r["since"]) in runs]
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
    console().print(table)
    return 0


def _one_op(args: argparse.Namespace) -> int:
    from opwarden.cli.op_facets import facets

    data = facets(args.name)
    if args.device:
        from opwarden.devices import get_device

        dev = get_device(args.device)
        data["devices"] = [d for d in data["devices"] if d["device"] == dev.name]
        runs = dev.host or "cpu" if dev.kind == "profile" else dev.name  # a profile: its host's
        for ver in data["versions"]:
            ver["variants"] = [v for v in ver["variants"] if v["device"] == runs]
    if args.json:
        print(json.dumps(data, indent=1, default=str))
        return 0
    con = console()
    con.print(f"[bold]{_e(data['op'])}[/bold] (domain {_e(data['domain'])}): "
              f"{len(data['versions'])} registered version(s)")  # fmt: skip
    for ver in data["versions"]:
        _print_version(con, ver)
    con.print("[bold]devices[/bold]")
    for d in data["devices"]:
        _print_device(con, d)
    return 0


def _e(v: Any) -> str:
    from rich.markup import escape

    return escape(str(v))


def _at(loc: dict[str, Any] | None) -> str:
    if not loc:
        return "[dim](no Python source)[/dim]"
    extra = f" ({loc['tree']})" if loc.get("tree") else ""
    return f"[cyan]{_e(loc['at'])}[/cyan]{_e(extra)}"


def _rule(r: dict[str, Any] | None, none: str = "none") -> str:
    if r is None:
        return none
    if "location" not in r:
        return _e(r["function"])
    via = "".join(f"; via {_e(x['name'])}={_e(x['function'])} {_at(x['location'])}"
                  for x in r.get("via", ()))  # fmt: skip
    return f"{_e(r['function'])}  {_at(r['location'])}{via}"


def _print_version(con: Any, ver: dict[str, Any]) -> None:
    con.print(f"\n[bold]{_e(ver['qualname'])}[/bold]")
    _print_schema(con, ver["schema"])
    _print_contract(con, ver["contract"])
    con.print(f"  [bold]reference[/bold]      {_rule(ver['reference'])}")
    con.print(f"  [bold]shape rule[/bold]     {_rule(ver['shape_rule'])}")
    con.print(f"  [bold]gradient[/bold]       {_rule(ver['gradient'], 'none (no .grad rule)')}")
    if ver["gradcheck_cases"]:
        con.print(f"    gradcheck cases {_rule(ver['gradcheck_cases'])}")
    if ver["samples"]:
        con.print(f"  [bold]samples[/bold]        {_rule(ver['samples'])}")
    cost = ver["cost"]
    con.print(f"  [bold]cost[/bold]           {_rule(cost)}; read by {_at(cost['reader'])}")
    if ver["pieces"]:
        pieces = ver["pieces"]
        con.print(f"  [bold]pieces[/bold]         {_rule(pieces)}; read by "
                  f"{_at(pieces['reader'])}")  # fmt: skip
    if not ver["decomposition"]:
        con.print("  [bold]decomposition[/bold]  none (no function body in the schema)")
    for d in ver["decomposition"]:
        nodes = ", ".join(d["nodes"]) or "-"
        con.print(f"  [bold]decomposition[/bold]  opset {d['opset']} {_e(d['kind'])}: "
                  f"{_e(nodes)}  {_at(d['location'])}; read by {_at(d['reader'])}")  # fmt: skip
    con.print(f"  [bold]variants[/bold]       {len(ver['variants'])}")
    for v in ver["variants"]:
        _print_variant(con, v)


def _print_schema(con: Any, s: dict[str, Any]) -> None:
    versions = ", ".join(str(v) for v in s["since_versions"])
    con.print(f"  [bold]schema[/bold]         {_e(s['source'])}, domain {_e(s['domain'])}, "
              f"since-versions {_e(versions)}")  # fmt: skip
    if "location" in s:
        con.print(f"    declared at  {_at(s['location'])}")
    for v, loc in s.get("locations", {}).items():
        con.print(f"    version {v:<4} {_at(loc)}")
    if s.get("reader"):
        con.print(f"    read by      {_at(s['reader'])}")

    def params(ps: list[dict[str, Any]]) -> str:
        return ", ".join(f"{p['name']}: {p['type']}"
                         + ("" if p["option"] == "single" else f" ({p['option']})")
                         for p in ps) or "-"  # fmt: skip

    con.print(f"    inputs       {_e(params(s['inputs']))}")
    con.print(f"    outputs      {_e(params(s['outputs']))}")
    for k, dts in s["type_constraints"].items():
        shown = dts if isinstance(dts, str) else ", ".join(dts)
        con.print(f"    type {_e(k):<7} {_e(shown)}")
    for a in s["attrs"]:
        req = ("required" if a["required"] else f"default {a['default']!r}" if a["has_default"]
               else "optional, no default")
        allowed = f"; allowed: {a['allowed']}" if a["allowed"] else ""
        con.print(f"    attr {_e(a['name'])} {_e(a['type'])}, {_e(req)}{_e(allowed)}")


def _print_contract(con: Any, c: dict[str, Any]) -> None:
    named = c.get("defined")
    where = f"; {_e(named['name'])} at {_at(named)}" if named else ""
    con.print(f"  [bold]contract[/bold]       {_at(c['location'])}{where}")
    skip = {"location", "defined", "workspace_bytes", "allowed"}
    fields = ", ".join(f"{k}={v!r}" for k, v in c.items() if k not in skip)
    con.print(f"    {_e(fields)}")
    ws = c["workspace_bytes"]
    if isinstance(ws, dict):
        con.print(f"    workspace_bytes {_rule(ws)}")
    else:
        con.print(f"    workspace_bytes={ws!r}")
    for k, v in c["allowed"].items():
        con.print(f"    allowed {_e(k)}: {_e(v)}")


def _print_variant(con: Any, v: dict[str, Any]) -> None:
    dts = v["dtypes"]
    if isinstance(dts, dict):
        dts = "; ".join(f"{k}: {', '.join(x)}" for k, x in dts.items())
    elif isinstance(dts, list):
        dts = ", ".join(dts)
    ref = ", reference" if v["reference"] else ""
    con.print(f"    [bold]{_e(v['name'])}[/bold] on {_e(v['device'])}: dtypes {_e(dts)}, "
              f"layout {_e(v['layout'])}, priority {v['priority']}{ref}")  # fmt: skip
    con.print(f"      kernel     {_rule(v['kernel'])}")
    con.print(f"      when       {_rule(v['when'], 'always')}")
    ws = v["workspace"]
    value = "" if ws.get("value") is None else f" = {ws['value']}"
    at = f"  {_at(ws['location'])}" if ws.get("location") else ""
    con.print(f"      workspace  {_e(ws['rule'])}{_e(value)}{at}")
    if v["specialize"]:
        con.print(f"      specialize {_rule(v['specialize'])}")
    if v["in_place_when"]:
        con.print(f"      in place   {_rule(v['in_place_when'])}")


def _print_device(con: Any, d: dict[str, Any]) -> None:
    what = f"{d['kind']}, {d['preferred_layout']}"
    if d.get("compute_dtype"):
        what += f", {d['compute_dtype']} compute"
    if d["kind"] == "profile":
        what += f", executed by {d['host']}"
    runs = "" if d["runs"] else ": does not run it"
    con.print(f"  [bold]{_e(d['device'])}[/bold] ({_e(what)}){runs}")
    if "variants" in d:
        if d["variants"]:
            con.print(f"    variants   {_e(', '.join(d['variants']))}")
        for c in d["constraints"]:
            con.print(f"    constraint {_e(c['attr'])}: {_e(c['description'])}  "
                      f"{_at(c['location'])}")  # fmt: skip
        return
    for e in d.get("entries", ()):
        dts = e["dtypes"] if isinstance(e["dtypes"], str) else ", ".join(e["dtypes"])
        note = f" ({e['note']})" if e["note"] else ""
        con.print(f"    entry {_e(e['name'])}: dtypes {_e(dts)}, layouts "
                  f"{_e(', '.join(e['layouts']))}{_e(note)}  {_at(e['location'])}")  # fmt: skip
        for c in e["constraints"]:
            con.print(f"      constraint {_e(c['description'])}  {_at(c['location'])}")
    if "fused" in d:
        con.print(f"    {_e(d['fused']['rule'])}  {_at(d['fused']['location'])}")
