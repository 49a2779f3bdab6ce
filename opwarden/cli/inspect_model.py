"""`opwarden inspect MODEL [--devices a,b] [--json]`: a model's summary, without running it.

From the file alone: inputs and outputs (dtypes, shapes with their symbolic dimensions),
opsets, IR version, producer and metadata, the operator histogram (subgraph bodies counted
apart), parameters (count and bytes; the largest initializers), Constant nodes, and external
data (files, sizes, tensors; a missing or short file is reported, not raised). Then, through the
placement path (place.partition.Partitioner, the same decision a session makes for each node),
which nodes each registered device runs, runs through a decomposition, or refuses, with the
reason. Nothing is planned, compiled or run.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from typing import Any

import onnx

from opwarden.cli.common import add_model_arg, console, model_source, progress, providers_list

# Largest initializers listed.
TOP_INITIALIZERS = 5
# Node names listed per refused operator type.
NODES_PER_OP = 5


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add `inspect` to the opwarden subcommands."""
    p = sub.add_parser("inspect", help="summarize a model without running it: I/O, ops, "
                       "parameters, external data, what each device runs",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arg(p, required=True)
    p.add_argument("--devices", type=providers_list, metavar="A,B",
                   help="devices to ask, names or .toml profiles (default: every registered "
                   "device)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(fn=cmd_inspect)
    return p


# -- types --------------------------------------------------------------------------------------
def dtype_text(elem: int) -> str:
    """'float32', 'int64', 'string', ... for an ONNX element type."""
    from opwarden.dtypes import dtype_name, np_dtype

    try:
        return dtype_name(np_dtype(elem))
    except (KeyError, TypeError):
        return onnx.TensorProto.DataType.Name(elem).lower() if elem else "undefined"


def shape_of(tt: Any) -> list[Any] | None:
    """Dims of a tensor type: ints, symbolic names, "?" for an unnamed unknown; None: no rank."""
    if not tt.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
            for d in tt.shape.dim]


def type_text(tp: onnx.TypeProto) -> dict[str, Any]:
    """{"type": "tensor"|"sequence"|..., "dtype"/"elem", "shape"} of a TypeProto."""
    kind = tp.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        tt = getattr(tp, kind)
        return {"type": "tensor" if kind == "tensor_type" else "sparse tensor",
                "dtype": dtype_text(tt.elem_type), "shape": shape_of(tt)}
    if kind == "sequence_type":
        return {"type": "sequence", "elem": type_text(tp.sequence_type.elem_type)}
    if kind == "optional_type":
        return {"type": "optional", "elem": type_text(tp.optional_type.elem_type)}
    if kind == "map_type":
        return {"type": "map", "key": dtype_text(tp.map_type.key_type),
                "elem": type_text(tp.map_type.value_type)}
    return {"type": "unknown"}


def type_label(t: dict[str, Any]) -> str:
    """One line for a type_text result: float32[N,3,224,224], seq(float32[?]), ..."""
    if t["type"] in ("tensor", "sparse tensor"):
        shape = "[?]" if t["shape"] is None else f"[{','.join(str(d) for d in t['shape'])}]"
        return ("sparse " if t["type"] == "sparse tensor" else "") + t["dtype"] + shape
    if t["type"] in ("sequence", "optional"):
        return f"{t['type']}({type_label(t['elem'])})"
    if t["type"] == "map":
        return f"map({t['key']}, {type_label(t['elem'])})"
    return "?"


# -- the proto facts ----------------------------------------------------------------------------
def _elements(dims: Any) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


def tensor_bytes(t: onnx.TensorProto) -> int:
    """Bytes of a tensor's data from its dims and type (strings: their actual lengths)."""
    from opwarden.dtypes import np_dtype

    n = _elements(t.dims)
    if t.data_type == onnx.TensorProto.STRING:
        return sum(len(s) for s in t.string_data)
    try:
        size = np_dtype(t.data_type).itemsize
    except KeyError:
        return 0
    if t.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4,
                       getattr(onnx.TensorProto, "FLOAT4E2M1", -1)):
        return (n + 1) // 2
    return n * size


def io_rows(graph: onnx.GraphProto) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(inputs without the initializers, outputs) as name + type_text."""
    init = {t.name for t in graph.initializer}
    ins = [{"name": v.name, **type_text(v.type)} for v in graph.input if v.name not in init]
    outs = [{"name": v.name, **type_text(v.type)} for v in graph.output]
    return ins, outs


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs a node's attributes hold (If branches, Loop/Scan bodies)."""
    out = []
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            out.append(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            out.extend(a.graphs)
    return out


def op_histogram(graph: onnx.GraphProto) -> tuple[Counter, Counter]:
    """(top-level op counts, counts inside subgraph bodies), keyed "domain::Op" or "Op"."""
    top: Counter = Counter()
    nested: Counter = Counter()

    def key(n: onnx.NodeProto) -> str:
        dom = n.domain if n.domain not in ("", "ai.onnx") else ""
        return f"{dom}::{n.op_type}" if dom else n.op_type

    stack = []
    for n in graph.node:
        top[key(n)] += 1
        stack.extend(subgraphs(n))
    while stack:
        g = stack.pop()
        for n in g.node:
            nested[key(n)] += 1
            stack.extend(subgraphs(n))
    return top, nested


def external_files(proto: onnx.ModelProto, base_dir: str | None) -> list[dict[str, Any]]:
    """Per external-data file: tensors stored there, bytes they need, the file's size or why
    it cannot be read (missing, outside the model's folder, shorter than the tensors need)."""
    from opwarden.errors import ModelError
    from opwarden.ir.tensors import external_path

    files: dict[str, dict[str, Any]] = {}
    for t in _all_tensors(proto.graph):
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location", "")
        f = files.setdefault(loc, {"location": loc, "tensors": 0, "bytes_needed": 0,
                                   "file_bytes": None, "problem": None})
        f["tensors"] += 1
        length = int(info["length"]) if info.get("length", "").isdigit() else tensor_bytes(t)
        offset = int(info["offset"]) if info.get("offset", "").isdigit() else 0
        f["bytes_needed"] = max(f["bytes_needed"], offset + length)
    for f in files.values():
        try:
            path = external_path(base_dir, f["location"], f"external file {f['location']!r}")
        except ModelError as e:
            f["problem"] = str(e)
            continue
        if not os.path.isfile(path):
            f["problem"] = f"missing: {path}"
            continue
        f["file_bytes"] = os.path.getsize(path)
        if f["file_bytes"] < f["bytes_needed"]:
            f["problem"] = (f"file has {f['file_bytes']} bytes, its tensors need "
                            f"{f['bytes_needed']}")
    return sorted(files.values(), key=lambda f: f["location"])


def _all_tensors(graph: onnx.GraphProto):
    yield from graph.initializer
    for n in graph.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                yield a.t
        for g in subgraphs(n):
            yield from _all_tensors(g)


def parameters(graph: onnx.GraphProto) -> dict[str, Any]:
    """Initializers (count, elements, bytes, the largest) and Constant nodes (count, bytes)."""
    rows = [{"name": t.name, "dtype": dtype_text(t.data_type), "shape": list(t.dims),
             "elements": _elements(t.dims), "bytes": tensor_bytes(t),
             "external": t.data_location == onnx.TensorProto.EXTERNAL}
            for t in graph.initializer]
    for s in graph.sparse_initializer:
        rows.append({"name": s.values.name, "dtype": dtype_text(s.values.data_type),
                     "shape": list(s.dims), "elements": _elements(s.dims),
                     "bytes": tensor_bytes(s.values) + tensor_bytes(s.indices),
                     "external": False, "sparse": True})
    consts = [a.t for n in graph.node if n.op_type == "Constant" for a in n.attribute
              if a.type == onnx.AttributeProto.TENSOR]
    rows.sort(key=lambda r: -r["bytes"])
    return {
        "count": len(rows),
        "elements": sum(r["elements"] for r in rows),
        "bytes": sum(r["bytes"] for r in rows),
        "largest": rows[:TOP_INITIALIZERS],
        "constant_nodes": len(consts),
        "constant_bytes": sum(tensor_bytes(t) for t in consts),
    }


def proto_summary(proto: onnx.ModelProto, base_dir: str | None) -> dict[str, Any]:
    """Everything `inspect` reads from the protobuf itself."""
    g = proto.graph
    ins, outs = io_rows(g)
    top, nested = op_histogram(g)
    return {
        "ir_version": proto.ir_version,
        "producer": " ".join(x for x in (proto.producer_name, proto.producer_version) if x),
        "domain": proto.domain,
        "model_version": proto.model_version,
        "graph": g.name,
        "doc_string": proto.doc_string[:500],
        "metadata": {p.key: p.value for p in proto.metadata_props},
        "opsets": {(i.domain or "ai.onnx"): i.version for i in proto.opset_import},
        "inputs": ins,
        "outputs": outs,
        "nodes": len(g.node),
        "ops": dict(top.most_common()),
        "subgraph_ops": dict(nested.most_common()),
        "functions": [f"{f.domain}::{f.name}" if f.domain else f.name for f in proto.functions],
        "parameters": parameters(g),
        "external_data": external_files(proto, base_dir),
    }


# -- what each device runs (the placement path, nothing compiled) -----------------------------
def _ir_model(source: Any, proto: onnx.ModelProto, external: list[dict[str, Any]]):
    """(the loaded IR model, notes) for the device check; external tensors whose files cannot
    be read become graph inputs of their type and shape (the check needs their facts only)."""
    import warnings

    from opwarden.ir.load import load

    notes: list[str] = []
    if any(f["problem"] for f in external):
        proto = _weights_as_inputs(proto)
        source = proto
        notes.append("external data unreadable: its weights were taken as inputs for the "
                     "device check")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = load(source)
    notes.extend(str(w.message) for w in caught)
    return model, notes


def _weights_as_inputs(proto: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    g = out.graph
    keep = [t for t in g.initializer if t.data_location != onnx.TensorProto.EXTERNAL]
    moved = [t for t in g.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    declared = {v.name for v in g.input}
    del g.initializer[:]
    g.initializer.extend(keep)
    for t in moved:
        if t.name not in declared:
            g.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return out


def _device_list(wanted: list[str] | None) -> list[Any]:
    """The devices asked: the named ones (a .toml path loads a device profile), else all."""
    from opwarden.devices import devices, get_device, load_profile

    if not wanted:
        return devices()
    out = []
    for name in wanted:
        dev = load_profile(name) if name.lower().endswith(".toml") else get_device(name)
        if dev not in out:
            out.append(dev)
    return out


def _refuse(refused: dict[str, dict[str, Any]], node: Any, why: str) -> None:
    key = f"{node.domain}::{node.op_type}" if node.domain else node.op_type
    r = refused.setdefault(key, {"op": key, "count": 0, "nodes": [], "reason": why})
    r["count"] += 1
    if len(r["nodes"]) < NODES_PER_OP:
        r["nodes"].append(node.name)


def _one_device(dev: Any, model: Any, nodes: list[Any],
                invalid: list[tuple[Any, str]], bar: Any) -> dict[str, Any]:
    """Which of `nodes` `dev` alone runs, runs decomposed, or refuses (with the reason); the
    `invalid` nodes (no operator accepts them) are refused everywhere."""
    from opwarden.ir.graph import Graph
    from opwarden.place.partition import Partitioner

    g = model.graph
    part = Partitioner([dev], model.opsets, None)
    runs, decomposed = 0, []
    refused: dict[str, dict[str, Any]] = {}
    bar.describe(f"inspect: asking {dev.name}")
    for node in nodes:
        bar.advance()
        ok, why = dev.accepts(node)
        if ok:
            runs += 1
            continue
        scratch = Graph(g.name, values=dict(g.values), outer=g.outer)
        try:
            part.node(node, scratch, 0)  # decomposes where that lets the device run it
        except Exception:  # noqa: BLE001 - any refusal counts, UnsupportedOpError or not
            _refuse(refused, node, why)
            continue
        decomposed.append({"node": node.name, "op": node.op_type, "reason": why})
    for node, why in invalid:
        _refuse(refused, node, why)
    return {
        "device": dev.name,
        "kind": dev.kind + (" (simulated)" if dev.simulated else ""),
        "nodes": len(nodes) + len(invalid),
        "runs": runs,
        "decomposed": decomposed,
        "unsupported": sorted(refused.values(), key=lambda r: -r["count"]),
    }


def device_support(source: Any, proto: onnx.ModelProto, external: list[dict[str, Any]],
                   wanted: list[str] | None) -> dict[str, Any]:
    """Per device, the model's top-level nodes it runs, decomposes or refuses; nodes no
    operator of this opset accepts at all are listed under "invalid"."""
    from opwarden.ir.validate import check_node
    from opwarden.place.facts import complete_facts

    devs = _device_list(wanted)
    try:
        model, notes = _ir_model(source, proto, external)
    except Exception as e:  # noqa: BLE001 - the summary above stands without this part
        return {"error": f"{type(e).__name__}: {e}", "devices": [], "invalid": [], "notes": []}
    invalid, bad = [], {}
    for node in model.graph.all_nodes():
        try:
            check_node(node)
        except Exception as e:  # noqa: BLE001 - reported per node
            invalid.append({"node": node.name, "op": node.op_type, "reason": str(e)})
            bad[id(node)] = str(e)
    nodes = [n for n in model.graph.nodes if id(n) not in bad]
    top_bad = [(n, bad[id(n)]) for n in model.graph.nodes if id(n) in bad]
    if any(d.kind == "profile" for d in devs):
        try:
            complete_facts(model.graph, model.opsets)
        except Exception as e:  # noqa: BLE001 - profiles then judge with the facts there are
            notes.append(f"facts incomplete: {type(e).__name__}: {e}")
    with progress("inspect", total=len(devs) * len(nodes)) as bar:
        rows = [_one_device(d, model, nodes, top_bad, bar) for d in devs]
    return {"devices": rows, "invalid": invalid, "notes": notes}


def summarize_model(arg: str, wanted: list[str] | None = None) -> dict[str, Any]:
    """The whole `inspect` result for a model argument (path or light-zoo name)."""
    from opwarden.ir.load import read_source

    source, label = model_source(arg)
    src = read_source(source)
    base_dir = None if isinstance(source, bytes) else os.path.dirname(os.path.abspath(source))
    out: dict[str, Any] = {"model": label}
    if not isinstance(source, bytes):
        out["file_bytes"] = os.path.getsize(source)
    out.update(proto_summary(src.proto, base_dir))
    out["support"] = device_support(source, src.proto, out["external_data"], wanted)
    return out


def cmd_inspect(args: argparse.Namespace) -> int:
    """Print (or --json) the summary of one model."""
    data = summarize_model(args.model, args.devices)
    if args.json:
        print(json.dumps(data, indent=1, default=str))
        return 0
    print_summary(data)
    return 0


def _count(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return str(int(n))


def print_summary(d: dict[str, Any]) -> None:
    """The human form of `inspect`: a header, then one table per part."""
    from rich.markup import escape
    from rich.table import Table

    from opwarden.errors import describe_bytes

    con = console()
    p = d["parameters"]
    opsets = ", ".join(f"{k} {v}" for k, v in d["opsets"].items())
    con.print(f"[bold]{escape(d['model'])}[/bold]: ONNX IR {d['ir_version']}, opsets {opsets}"
              + (f", producer {escape(d['producer'])}" if d["producer"] else ""))
    con.print(f"graph {escape(d['graph'])!r}: {d['nodes']} nodes of {len(d['ops'])} op types; "
              f"{_count(p['elements'])} parameters ({describe_bytes(p['bytes'])}) in "
              f"{p['count']} initializers; {p['constant_nodes']} Constant nodes "
              f"({describe_bytes(p['constant_bytes'])})")
    for key in ("inputs", "outputs"):
        t = Table(title=key)
        for col in ("name", "type"):
            t.add_column(col)
        for r in d[key]:
            t.add_row(escape(r["name"]), escape(type_label(r)))
        con.print(t)
    t = Table(title="operators")
    for col in ("op", "count") + (("in subgraphs",) if d["subgraph_ops"] else ()):
        t.add_column(col, justify="left" if col == "op" else "right")
    for op in dict.fromkeys([*d["ops"], *d["subgraph_ops"]]):
        t.add_row(escape(op), str(d["ops"].get(op, 0)),
                  *((str(d["subgraph_ops"].get(op, 0)),) if d["subgraph_ops"] else ()))
    con.print(t)
    if p["largest"]:
        t = Table(title=f"largest initializers (of {p['count']})")
        for col in ("name", "dtype", "shape", "parameters", "bytes"):
            t.add_column(col, justify="right" if col in ("parameters", "bytes") else "left")
        for r in p["largest"]:
            t.add_row(escape(r["name"]), r["dtype"], str(r["shape"]), f"{r['elements']:,}",
                      describe_bytes(r["bytes"]) + (" (external)" if r["external"] else ""))
        con.print(t)
    _print_external(con, d["external_data"])
    if d["metadata"]:
        t = Table(title="metadata")
        for col in ("key", "value"):
            t.add_column(col)
        for k, v in d["metadata"].items():
            t.add_row(escape(k), escape(v[:200]))
        con.print(t)
    _print_support(con, d["support"])


def _print_external(con: Any, files: list[dict[str, Any]]) -> None:
    from rich.markup import escape
    from rich.table import Table

    from opwarden.errors import describe_bytes

    if not files:
        return
    t = Table(title="external data")
    for col in ("file", "tensors", "needs", "file size", "problem"):
        t.add_column(col)
    for f in files:
        size = "-" if f["file_bytes"] is None else describe_bytes(f["file_bytes"])
        t.add_row(escape(f["location"]), str(f["tensors"]), describe_bytes(f["bytes_needed"]),
                  size, f"[red]{escape(f['problem'])}[/red]" if f["problem"] else "ok")
    con.print(t)


def _print_support(con: Any, s: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    if s.get("error"):
        con.print(f"[red]device check not possible[/red]: {escape(s['error'])}")
        return
    t = Table(title="what each device runs (top-level nodes, as placement decides)")
    for col in ("device", "kind", "runs", "decomposed", "refused: op (nodes): reason"):
        t.add_column(col, justify="right" if col in ("runs", "decomposed") else "left")
    for r in s["devices"]:
        refused = "\n".join(f"{escape(u['op'])} ({u['count']}): {escape(u['reason'])}"
                            for u in r["unsupported"]) or "-"
        t.add_row(r["device"], r["kind"], f"{r['runs']}/{r['nodes']}",
                  str(len(r["decomposed"])), refused)
    con.print(t)
    for v in s["invalid"]:
        con.print(f"[red]invalid node[/red] {escape(v['node'])} ({escape(v['op'])}): "
                  f"{escape(v['reason'])}")
    for n in s["notes"]:
        con.print(f"note: {escape(n)}")
