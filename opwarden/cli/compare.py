"""`opwarden compare MODEL --vs onnxruntime [--atol A --rtol R] [--input N=F.npy] [--json]`.

Finds the first node where opwarden and onnxruntime disagree. On a copy of the model every
node output of the main graph becomes a graph output; both runtimes run it on the same feeds
(the `--input` files, else seeded random tensors of the declared shapes, a symbolic dimension
taking ``--dim NAME=N`` or 1): onnxruntime with ORT_DISABLE_ALL, opwarden at
``--optimization-level`` 0 by default, so that no fusion renames or removes a value. Every
value is judged (compare_values.py); the report names the first node in topological order
whose output diverges, with its error, its inputs (and whether they agreed) and its attributes,
then a per-node table. Outputs of random operators (RandomNormal, Bernoulli, a training-mode
Dropout, ...) and everything computed from them are skipped with that reason, as is any value
a runtime did not return. Exit status 1 when a node diverges, 0 when every value agrees.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from opwarden.cli.common import (
    EXIT_OK,
    EXIT_VERDICT,
    add_model_arg,
    model_source,
    non_negative_float,
    progress,
    providers_list,
)
from opwarden.cli.compare_values import compare_value, describe
from opwarden.errors import InputError, ModelError

PEERS = ("onnxruntime",)
# Operators whose outputs the spec leaves to the implementation's random generator.
RANDOM_OPS = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform",
                        "RandomUniformLike", "Multinomial", "Bernoulli"})


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add `compare` to the opwarden subcommands."""
    p = sub.add_parser("compare", help="run every intermediate value on opwarden and "
                       "onnxruntime; report the first node whose output diverges",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arg(p, required=True)
    p.add_argument("--vs", choices=PEERS, default="onnxruntime",
                   help="the runtime to compare with (default onnxruntime)")
    p.add_argument("--atol", type=non_negative_float, default=1e-3,
                   help="absolute tolerance (default 1e-3)")
    p.add_argument("--rtol", type=non_negative_float, default=1e-3,
                   help="relative tolerance (default 1e-3)")
    p.add_argument("--input", action="append", metavar="NAME=FILE.npy",
                   help="feed this input from a .npy file (repeatable; others are random)")
    p.add_argument("--dim", action="append", metavar="NAME=N",
                   help="size of a symbolic input dimension for random feeds (default 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random feeds (default 0)")
    p.add_argument("--providers", type=providers_list,
                   help="opwarden devices in priority order, e.g. edge-npu,cpu (default cpu)")
    p.add_argument("--optimization-level", type=int, choices=range(4), default=0,
                   metavar="{0..3}", help="opwarden's graph optimization level (default 0: "
                   "no fusion, so every model value exists)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(fn=cmd_compare)
    return p


# -- the instrumented model ---------------------------------------------------------------------
@dataclass
class NodeInfo:
    """One main-graph node: its label, inputs, outputs, attributes and why it is skipped."""

    index: int
    name: str
    op_type: str
    domain: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any]
    skip: str | None = None
    results: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def status(self) -> str:
        """"diverge" when an output that is read diverges; "agree" when every output agrees
        or differs only where nothing reads it ("unused"); else "skip"."""
        got = [r["status"] for r in self.results.values()]
        if "diverge" in got:
            return "diverge"
        if got and all(s in ("agree", "unused") for s in got):
            return "agree"
        return "skip"


def load_proto(arg: str) -> tuple[onnx.ModelProto, str]:
    """The model with its external data read in, and its label."""
    source, label = model_source(arg)
    try:
        if isinstance(source, bytes):
            return onnx.load_from_string(source), label
        return onnx.load(source), label
    except OSError:
        raise
    except Exception as e:  # noqa: BLE001 - onnx raises assorted errors on bad files
        raise ModelError(f"cannot read {label!r} as an ONNX model: {type(e).__name__}: {e}") \
            from None


def attr_json(a: onnx.AttributeProto) -> Any:
    """An attribute's value for the report (tensors and graphs summarized)."""
    v = onnx.helper.get_attribute_value(a)
    if isinstance(v, onnx.TensorProto):
        return f"tensor {list(v.dims)}"
    if isinstance(v, onnx.GraphProto):
        return f"graph {v.name!r} ({len(v.node)} nodes)"
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, list):
        return [x.decode("utf-8", "replace") if isinstance(x, bytes) else
                attr_json_item(x) for x in v]
    return v


def attr_json_item(x: Any) -> Any:
    if isinstance(x, (onnx.TensorProto, onnx.GraphProto)):
        return f"{type(x).__name__} {getattr(x, 'name', '')}"
    return x


def _subgraph_reads(node: onnx.NodeProto) -> list[str]:
    """Names a node's subgraphs read (they may come from the main graph)."""
    out: list[str] = []
    for a in node.attribute:
        for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
            for n in g.node:
                out.extend(n.input)
                out.extend(_subgraph_reads(n))
    return out


def toposort(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The main graph's nodes in a topological order, file order where it is free."""
    have = {v.name for v in graph.input} | {t.name for t in graph.initializer} | {""}
    have |= {s.values.name for s in graph.sparse_initializer}
    produced = {o for n in graph.node for o in n.output}
    pending = list(graph.node)
    order: list[onnx.NodeProto] = []
    while pending:
        rest = []
        for n in pending:
            needs = [x for x in [*n.input, *_subgraph_reads(n)] if x in produced]
            if all(x in have for x in needs):
                order.append(n)
                have.update(n.output)
            else:
                rest.append(n)
        if len(rest) == len(pending):  # a cycle or a dangling name: keep file order
            order.extend(rest)
            break
        pending = rest
    return order


def nodes_of(graph: onnx.GraphProto) -> list[NodeInfo]:
    """NodeInfo per node in topological order, random ops and their dependents marked."""
    infos: list[NodeInfo] = []
    tainted: dict[str, str] = {}
    for i, n in enumerate(toposort(graph)):
        info = NodeInfo(i, n.name or f"{n.op_type}#{i}", n.op_type, n.domain, list(n.input),
                        [o for o in n.output], {a.name: attr_json(a) for a in n.attribute})
        training = n.op_type == "Dropout" and len(n.input) > 2 and n.input[2]
        if n.op_type in RANDOM_OPS or training:
            info.skip = f"{n.op_type} is random: its values are the runtime's own"
        else:
            src = next((x for x in [*n.input, *_subgraph_reads(n)] if x in tainted), None)
            if src is not None:
                info.skip = f"depends on {tainted[src]}"
        if info.skip:
            origin = info.skip if info.skip.startswith("depends") else \
                f"random {n.op_type} {info.name!r}"
            for o in n.output:
                tainted[o] = origin.removeprefix("depends on ")
        infos.append(info)
    return infos


def instrument(proto: onnx.ModelProto, infos: list[NodeInfo]) -> tuple[bytes, list[str]]:
    """(a serialized copy whose graph outputs are every compared node output, their names)."""
    m = onnx.ModelProto()
    m.CopyFrom(proto)
    outs = [o.name for o in m.graph.output]
    for info in infos:
        if info.skip:
            continue
        for o in info.outputs:
            if o and o not in outs:
                vi = onnx.ValueInfoProto()
                vi.name = o  # no type: both runtimes infer it, and a wrong guess would reject
                m.graph.output.append(vi)
                outs.append(o)
    try:
        data = m.SerializeToString()
    except ValueError as e:  # protobuf's 2 GiB limit
        raise ModelError(f"the model with every value as an output cannot be serialized ({e}); "
                         "compare needs a model under 2 GiB with its weights") from None
    return data, outs


# -- the runs -----------------------------------------------------------------------------------
def named_in(message: str, names: list[str]) -> str | None:
    """The value an error message names: quoted or bracketed first, else as a whole word
    (the longest such name: "conv1_out" before "conv1")."""
    quoted = [n for n in names if any(f"{a}{n}{b}" in message
                                      for a, b in ("''", '""', "()", "[]"))]
    if quoted:
        return max(quoted, key=len)
    words = [n for n in names
             if re.search(rf"(?<![\w./:-]){re.escape(n)}(?![\w./:-])", message)]
    return max(words, key=len) if words else None


def _peer_session(data: bytes, original: bytes, extra: list[str]):
    """(onnxruntime session, {output: why skipped}) for the instrumented model; outputs ORT
    refuses to expose, named in its error, are dropped (and reported) one retry at a time."""
    try:
        import onnxruntime as ort
    except ImportError:
        from opwarden.errors import OptionsError

        raise OptionsError("--vs onnxruntime needs the onnxruntime package (pip install "
                           "onnxruntime)") from None
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3

    def make(b: bytes):
        return ort.InferenceSession(b, so, providers=["CPUExecutionProvider"])

    try:
        make(original)
    except Exception as e:  # noqa: BLE001 - ORT raises its own exception types
        raise ModelError(f"onnxruntime cannot load the model: {e}") from None
    refused: dict[str, str] = {}
    model = onnx.load_from_string(data)
    for _ in range(len(extra) + 1):
        try:
            return make(model.SerializeToString()), refused
        except Exception as e:  # noqa: BLE001 - narrowed by the names in its message
            msg = str(e).splitlines()[0][:300]
            named = named_in(str(e), [o for o in extra if o not in refused])
            if named is None:  # unnamed: keep only the model's own outputs
                for o in extra:
                    refused.setdefault(o, f"onnxruntime refused the instrumented model: {msg}")
                keep = [v for v in model.graph.output if v.name not in refused]
            else:
                refused[named] = f"onnxruntime cannot expose it: {msg}"
                keep = [v for v in model.graph.output if v.name != named]
            del model.graph.output[:]
            model.graph.output.extend(keep)
    raise ModelError("onnxruntime refuses the model with its values as outputs")


def run_peer(data: bytes, original: bytes, extra: list[str],
             feeds: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """({output: value} from onnxruntime, {output: why it was not returned})."""
    sess, refused = _peer_session(data, original, extra)
    names = [o.name for o in sess.get_outputs()]
    try:
        values = sess.run(names, feeds)
    except Exception as e:  # noqa: BLE001 - ORT raises its own exception types
        raise ModelError(f"onnxruntime failed to run the model on these feeds: {e}") from None
    return dict(zip(names, values)), refused


def our_session(data: bytes, providers: list[str] | None, level: int):
    """Our session on the instrumented model."""
    from opwarden.options import SessionOptions
    from opwarden.session import InferenceSession

    return InferenceSession(data, sess_options=SessionOptions(optimization_level=level),
                            providers=providers)


def run_ours(sess: Any, feeds: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """({output: value}, None), or ({}, the error) when a kernel of ours failed (a feed that
    does not fit the model is the user's mistake and raises)."""
    from opwarden.errors import OpwardenError

    names = [o.name for o in sess.get_outputs()]
    try:
        return dict(zip(names, sess.run(names, feeds))), None
    except InputError:
        raise
    except OpwardenError as e:
        return {}, f"{type(e).__name__}: {e}"


# -- the verdict --------------------------------------------------------------------------------
def read_values(graph: onnx.GraphProto) -> set[str]:
    """Names some node reads (subgraph bodies included) or the model outputs."""
    used = {o.name for o in graph.output}
    for n in graph.node:
        used.update(n.input)
        used.update(_subgraph_reads(n))
    return used


def judge(infos: list[NodeInfo], ours: dict[str, Any], theirs: dict[str, Any],
          refused: dict[str, str], atol: float, rtol: float, used: set[str]) -> None:
    """Fill every node's per-output results; a diverging output nothing reads (a Dropout
    mask) is "unused": reported, but neither the first divergence nor a failure."""
    for info in infos:
        if info.skip:
            continue
        for o in info.outputs:
            if not o:
                continue
            if o in refused:
                info.results[o] = {"status": "skip", "detail": refused[o]}
            elif o not in theirs or o not in ours:
                who = "onnxruntime" if o not in theirs else "opwarden"
                info.results[o] = {"status": "skip", "detail": f"{who} did not return it"}
            else:
                v = compare_value(ours[o], theirs[o], atol, rtol)
                if v["status"] == "diverge" and o not in used:
                    v["status"] = "unused"
                    v["detail"] = "differs, but nothing reads it: " + v["detail"]
                info.results[o] = v


def _input_rows(info: NodeInfo, by_value: dict[str, str], values: dict[str, Any],
                graph: onnx.GraphProto) -> list[dict[str, Any]]:
    weights = {t.name: t for t in graph.initializer}
    rows: list[dict[str, Any]] = []
    for x in info.inputs:
        if not x:
            rows.append({"name": "", "status": "absent (optional)"})
            continue
        if x in values:
            shape, dtype = describe(values[x])
        elif x in weights:
            shape, dtype = list(weights[x].dims), None
        else:
            shape, dtype = None, None
        status = by_value.get(x) or ("weight" if x in weights else "graph input"
                                     if x in values else "outer value")
        rows.append({"name": x, "shape": shape, "dtype": dtype, "status": status})
    return rows


def first_divergence(infos: list[NodeInfo], feeds: dict[str, Any], theirs: dict[str, Any],
                     graph: onnx.GraphProto) -> dict[str, Any] | None:
    """The first diverging node in topological order, with its inputs and attributes."""
    by_value: dict[str, str] = {}
    for info in infos:
        for o in info.outputs:
            by_value[o] = info.results.get(o, {}).get("status") or ("skip: " + (info.skip or ""))
    for info in infos:
        if info.status != "diverge":
            continue
        rows = _input_rows(info, by_value, {**feeds, **theirs}, graph)
        return {
            "index": info.index, "node": info.name, "op_type": info.op_type,
            "domain": info.domain,
            "outputs": [{"name": o, **r} for o, r in info.results.items()],
            "inputs": rows,
            "inputs_agree": all(r["status"] in ("agree", "weight", "graph input",
                                                "absent (optional)") for r in rows),
            "attributes": info.attrs,
        }
    return None


def compare_model(args: argparse.Namespace) -> dict[str, Any]:
    """The whole comparison as JSON-ready data."""
    from opwarden.cli.feeds import make_feeds, parse_dims

    with progress("compare", total=5) as bar:
        bar.describe("loading the model")
        proto, label = load_proto(args.model)
        infos = nodes_of(proto.graph)
        data, outs = instrument(proto, infos)
        extra = outs[len(proto.graph.output):]
        bar.advance()
        bar.describe("opwarden: preparing")
        sess = our_session(data, args.providers, args.optimization_level)
        feeds = make_feeds(sess, args.input, args.seed, dims=parse_dims(args.dim))
        bar.advance()
        bar.describe("opwarden: running")
        ours, our_error = run_ours(sess, feeds)
        bar.advance()
        bar.describe(f"{args.vs}: running")
        theirs, refused = run_peer(data, proto.SerializeToString(), extra, feeds)
        bar.advance()
        bar.describe("comparing")
        judge(infos, ours, theirs, refused, args.atol, args.rtol, read_values(proto.graph))
        bar.advance()
    first = first_divergence(infos, feeds, theirs, proto.graph)
    counts = {s: sum(i.status == s for i in infos) for s in ("agree", "diverge", "skip")}
    return {
        "model": label,
        "vs": args.vs,
        "atol": args.atol,
        "rtol": args.rtol,
        "opwarden": {"providers": sess.get_providers(),
                     "optimization_level": args.optimization_level, "error": our_error},
        "peer": {"name": args.vs, "graph_optimization_level": "ORT_DISABLE_ALL"},
        "feeds": {k: {"shape": list(np.shape(v)), "dtype": str(np.asarray(v).dtype),
                      "source": "file" if any(i.startswith(f"{k}=") for i in args.input or ())
                      else f"random (seed {args.seed})"} for k, v in feeds.items()},
        "first_divergence": first,
        "summary": {"nodes": len(infos), **counts,
                    "values": sum(len(i.results) for i in infos),
                    "unused_differences": sum(r["status"] == "unused" for i in infos
                                              for r in i.results.values())},
        "nodes": [{"index": i.index, "node": i.name, "op_type": i.op_type, "status": i.status,
                   "skip": i.skip,
                   "outputs": [{"name": o, **r} for o, r in i.results.items()]}
                  for i in infos],
    }


def cmd_compare(args: argparse.Namespace) -> int:
    """Compare; print (or --json) the report; exit 1 when a value diverges."""
    result = compare_model(args)
    if args.json:
        print(json.dumps(result, indent=1, default=str))
    else:
        print_report(result)
    bad = result["first_divergence"] is not None or result["opwarden"]["error"]
    return EXIT_VERDICT if bad else EXIT_OK


# Characters of a value's detail in the per-node table (the first divergence shows it whole).
DETAIL_CHARS = 70


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _num(x: Any) -> str:
    return "-" if x is None else f"{x:.3g}"


def print_report(r: dict[str, Any]) -> None:
    """The human report: the verdict, the first divergence, the per-node table."""
    from rich.markup import escape

    from opwarden.cli.common import console

    con = console()
    s, ow = r["summary"], r["opwarden"]
    con.print(
        f"[bold]{escape(r['model'])}[/bold]: opwarden ({','.join(ow['providers'])}, "
        f"optimization level {ow['optimization_level']}) vs {r['vs']} (ORT_DISABLE_ALL), "
        f"atol {r['atol']:g}, rtol {r['rtol']:g}: {s['nodes']} nodes, {s['agree']} agree, "
        f"{s['diverge']} diverge, {s['skip']} skipped"
        + (f"; {s['unused_differences']} unread value(s) differ" if s["unused_differences"]
           else "")
    )
    if ow["error"]:
        con.print(f"[red]opwarden failed to run the model[/red]: {escape(ow['error'])}")
    f = r["first_divergence"]
    if f is None:
        if not ow["error"]:
            con.print("[green]every compared value agrees[/green]")
    else:
        _print_first(con, f)
    con.print(node_table(r))


def _print_first(con: Any, f: dict[str, Any]) -> None:
    from rich.markup import escape

    dom = f"{f['domain']}::" if f["domain"] else ""
    con.print(f"[bold red]first divergence[/bold red]: node {escape(f['node'])!r} "
              f"({escape(dom + f['op_type'])}), #{f['index']} in topological order")
    for o in f["outputs"]:
        con.print(f"  output {escape(o['name'])!r} {o['status']}: max abs "
                  f"{_num(o.get('max_abs'))}, max rel {_num(o.get('max_rel'))}"
                  f"{'; ' + escape(o['detail']) if o.get('detail') else ''}")
    agree = "all agree" if f["inputs_agree"] else "[red]not all agree[/red]"
    con.print(f"  inputs ({agree}):")
    for i in f["inputs"]:
        shape = "" if i.get("shape") is None else f" {i.get('dtype') or ''}{i['shape']}"
        con.print(f"    {escape(i['name'] or '(none)')!r}{escape(shape)}: {escape(i['status'])}")
    if f["attributes"]:
        attrs = ", ".join(f"{k}={v}" for k, v in f["attributes"].items())
        con.print(f"  attributes: {escape(attrs)}")


def node_table(r: dict[str, Any]):
    """The per-node, per-output error table (rich)."""
    from rich.markup import escape
    from rich.table import Table

    colors = {"agree": "green", "diverge": "bold red", "skip": "yellow", "unused": "magenta"}
    t = Table(title="per node, in topological order")
    for col in ("#", "node", "op", "output", "type", "max abs", "max rel", "status", "detail"):
        t.add_column(col, justify="right" if col in ("#", "max abs", "max rel") else "left")
    first = (r["first_divergence"] or {}).get("index")
    for n in r["nodes"]:
        rows = n["outputs"] or [{"name": "", "status": "skip", "detail": n["skip"] or ""}]
        for k, o in enumerate(rows):
            st = o["status"]
            why = o.get("detail") if st != "agree" else ""
            shape = "" if o.get("shape") is None else f"{o.get('dtype') or ''}{o['shape']}"
            mark = " (first)" if n["index"] == first and k == 0 else ""
            t.add_row(str(n["index"]) if k == 0 else "", escape(n["node"]) if k == 0 else "",
                      escape(n["op_type"]) if k == 0 else "", escape(o["name"]), escape(shape),
                      _num(o.get("max_abs")), _num(o.get("max_rel")),
                      f"[{colors[st]}]{st}{mark}[/{colors[st]}]",
                      escape(_short(why or "", DETAIL_CHARS)))
    return t
