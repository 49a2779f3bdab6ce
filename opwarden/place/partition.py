"""Placement: partition the graph over devices, unify layouts, choose a kernel per node; say why.

For each node, devices are tried in the session's order (``providers``): the first whose
capability accepts it (operator, dtype, attributes; see opwarden/devices) gets it. A device that
refuses a node may still run it through its ONNX function body when it accepts every piece
(decomposition); otherwise the node falls back to the next device, and each refusal is recorded
in plain words. A device with limited activation memory refuses a partition (a run of its nodes)
whose peak of live activation bytes would not fit. With ``fallback="forbid"`` one error lists
every node that would leave the first device. Edges between devices get explicit DeviceCopy
nodes (converting to the device's compute dtype on the way in), except where both sides hold
host arrays (the torch device on the CPU and the host: nothing moves). Then the layout pass
(runtime/layout.py) puts convolution-like nodes in NHWC where their device wants it, and each
node gets its kernel variant: on its device, filtered by dtype, layout and `when` predicate,
highest priority first (ties by name). Profile devices run their host's variant wrapped to
emulate their numerics (fp16 rounding) and, when the host has no NHWC kernel, an NHWC adapter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from opwarden.contract import TensorFact, declared_value
from opwarden.devices import Device, get_device, sensitive_inputs
from opwarden.devices.copy import clamp_range, round_to
from opwarden.dtypes import onnx_type
from opwarden.errors import UnsupportedOpError
from opwarden.ir.functions import inline
from opwarden.ir.graph import Graph, Node, Value
from opwarden.ir.validate import check_node
from opwarden.ops.base import Variant
from opwarden.ops.schema import context_function_body, onnx_function_body
from opwarden.ops.select import kernel_kwargs, select
from opwarden.place import layout as _layout

MAX_DECOMPOSE_DEPTH = 16
HOST = "cpu"
# Operators whose outputs only rearrange or select their inputs: on a device whose values are
# already rounded to its compute dtype they need no rounding.
EXACT_OPS = {
    "Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Concat", "Identity", "Dropout",
    "MaxPool", "GlobalMaxPool", "Relu", "Split", "Slice", "DepthToSpace", "SpaceToDepth",
    "DeviceCopy", "Gather", "Expand", "Tile",
}


@dataclass
class Placement:
    """Where and how one node runs, with the reasons behind the choice.

    ``rejected``: (variant or device, reason) for every candidate that lost; ``reason``: the
    plain-words reason this node is not on the first device, was decomposed, or was inserted;
    ``inserted``: "copy", "transpose" or "view" for nodes placement added; ``layout``: the
    layout of its activation tensor; ``ref_variant``: what a guard falls back to (the reference
    kernel, adapted to this node's layout and device numerics).
    """

    node: Node
    device: str
    variant: Variant
    kwargs: dict[str, Any]
    rejected: list[tuple[str, str]] = field(default_factory=list)
    decomposed_from: str | None = None
    reason: str | None = None
    inserted: str | None = None
    layout: str = "NCHW"
    simulated: bool = False
    ref_variant: Variant | None = None

    def describe(self) -> dict[str, Any]:
        return {
            "node": self.node.name,
            "name": self.node.name,
            "op_type": self.node.op_type,
            "domain": self.node.domain,
            "opset": self.node.opset,
            "device": self.device,
            "variant": self.variant.name,
            "reason": self.reason,
            "layout": self.layout,
            "inserted": self.inserted,
            "simulated": self.simulated,
            "rejected": [{"variant": n, "reason": r} for n, r in self.rejected],
            "decomposed_from": self.decomposed_from,
        }


class Placements(list):
    """The placements of a model, in order, plus ``report`` (partition, layout, copies)."""

    report: dict[str, Any]


# -- decomposition ------------------------------------------------------------------------------


def _type_proto(node_value) -> onnx.TypeProto:
    tp = onnx.TypeProto()
    if node_value is not None and node_value.fact.dtype is not None:
        tp.tensor_type.elem_type = onnx_type(
            np.dtype(node_value.fact.dtype) if node_value.fact.dtype != "string" else object
        )
        if node_value.fact.shape is not None:
            tp.tensor_type.shape.SetInParent()
            for d in node_value.fact.shape:
                dim = tp.tensor_type.shape.dim.add()
                if isinstance(d, int):
                    dim.dim_value = d
                elif d:
                    dim.dim_param = str(d)
    return tp


def _node_proto(node: Node) -> onnx.NodeProto:
    from opwarden.ir.export import attribute_proto

    n = onnx.NodeProto()
    n.op_type, n.domain, n.name = node.op_type, node.domain, node.name
    n.input.extend(v.name if v is not None else "" for v in node.inputs)
    n.output.extend(v.name if v is not None else "" for v in node.outputs)
    for k, val in node.attrs.items():
        n.attribute.append(attribute_proto(k, val, getattr(node, "attr_types", {}).get(k)))
    return n


def decomposition(node: Node) -> list[onnx.NodeProto] | None:
    """The node rewritten through its ONNX function body, or None if the spec gives none."""
    fn = onnx_function_body(node.op_type, node.domain, node.opset)
    known = all(v is None or (v.kind == "tensor" and v.fact.dtype) for v in node.inputs)
    if fn is None and known:
        # onnx's builder crashes on missing or non-tensor types, so only ask with full facts.
        types = [_type_proto(v) for v in node.inputs]
        fn = context_function_body(node.op_type, node.domain, node.opset, _node_proto(node), types)
    if fn is None:
        return None
    return inline(_node_proto(node), fn)


def _piece_types(node: Node, pieces: list[onnx.NodeProto], opsets: dict[str, int]) -> dict:
    """Inferred types of the pieces' values (so devices can check their dtypes and shapes)."""
    from onnx import helper, numpy_helper

    ins, inits = [], []
    for v in node.inputs:
        if v is None:
            continue
        ins.append(onnx.helper.make_value_info(v.name, _type_proto(v)))
        if v.const is not None and v.const.size <= 4096 and v.const.dtype != object:
            inits.append(numpy_helper.from_array(np.asarray(v.const), v.name))
    outs = [onnx.ValueInfoProto(name=v.name) for v in node.outputs if v is not None]
    try:
        g = helper.make_graph(pieces, "pieces", ins, outs, initializer=inits)
        m = helper.make_model(
            g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()]
        )
        m = onnx.shape_inference.infer_shapes(m)
    except Exception:  # noqa: BLE001 - without inferred types the pieces keep unknown facts
        return {}
    out = {vi.name: vi.type for vi in m.graph.value_info}
    out.update({vi.name: vi.type for vi in m.graph.output if vi.type.HasField("tensor_type")})
    return out


def complete_facts(graph: Graph, opsets: dict[str, int]) -> None:
    """Fill output facts ONNX shape inference left unknown (function ops such as
    GroupNormalization-21) from the operator's `.infer` rule or its function body, so devices
    can check dtypes, layouts and memory."""
    from opwarden.ir.load import type_fact

    for node in graph.nodes:
        missing = [
            v for v in node.outputs
            if v is not None
            and v.kind == "tensor"
            and (v.fact.dtype is None or v.fact.shape is None)
        ]
        if not missing or node.subgraphs():
            continue
        if not all(v is None or v.fact.dtype is not None for v in node.inputs):
            continue
        facts: dict[str, TensorFact] = {}
        if node.opdef is not None and node.opdef.infer_fn is not None:
            try:
                res = node.opdef.infer_fn(
                    *[v.fact if v is not None else None for v in node.inputs], **kernel_kwargs(node)
                )
                res = list(res) if isinstance(res, (tuple, list)) else [res]
                facts = {
                    v.name: f for v, f in zip(node.outputs, res)
                    if v is not None and isinstance(f, TensorFact)
                }
            except Exception:  # noqa: BLE001 - a rule that cannot decide leaves facts unknown
                facts = {}
        for attempt in ("node", "body"):
            if facts:
                break
            try:
                protos = [_node_proto(node)] if attempt == "node" else decomposition(node)
            except Exception:  # noqa: BLE001 - no body: the facts stay unknown
                protos = None
            if protos:
                types = _piece_types(node, protos, opsets)
                for v in missing:
                    if v.name in types:
                        f = type_fact(types[v.name])[1]
                        if f.dtype is not None:
                            facts[v.name] = f
        for v in missing:
            f = facts.get(v.name)
            if f is not None:
                v.fact = TensorFact(
                    v.fact.dtype or f.dtype, v.fact.shape if v.fact.shape is not None else f.shape
                )


def _build_pieces(
    node: Node, protos: list[onnx.NodeProto], graph: Graph, opsets: dict[str, int], types: dict
) -> list[Node]:
    from opwarden.ir.load import GraphBuilder

    builder = GraphBuilder(opsets, {}, None, False, types)
    out = []
    for i, p in enumerate(protos):
        # The function's intermediate values become values of this graph; its outputs
        # are the original node's output values.
        inner = builder.node(p, graph, i, {}, reuse=True)
        check_node(inner)
        out.append(inner)
    return out


# -- partitioning -------------------------------------------------------------------------------


@dataclass
class _Assign:
    device: Device
    rejected: list[tuple[str, str]] = field(default_factory=list)
    decomposed_from: str | None = None
    decomposed_why: str | None = None


class _Partitioner:
    """Assigns every node of one graph to a device, decomposing where that lets a device run it."""

    def __init__(self, devs: list[Device], opsets: dict[str, int], quarantine: Any) -> None:
        self.devs = devs
        self.opsets = opsets
        self.quarantine = quarantine
        self.assign: dict[int, _Assign] = {}

    def graph(self, graph: Graph) -> None:
        new_nodes: list[Node] = []
        for node in graph.nodes:
            new_nodes.extend(self.node(node, graph, 0))
        graph.nodes = new_nodes
        graph.rebuild_uses()

    def node(self, node: Node, graph: Graph, depth: int) -> list[Node]:
        rejected: list[tuple[str, str]] = []
        protos: list[onnx.NodeProto] | None | bool = False  # False: not computed yet
        trial: list[Node] | None = None
        for k, dev in enumerate(self.devs):
            ok, why = dev.accepts(node, self.quarantine)
            if ok:
                deferred = self._deferred_to(node, k)
                if deferred is not None:
                    host, reason = deferred
                    rejected.append((dev.name, f"deferred to {host.name}: {reason}"))
                    dev = host
                self.assign[id(node)] = _Assign(dev, rejected)
                return [node]
            rejected.append((dev.name, why))
            if depth >= MAX_DECOMPOSE_DEPTH:
                continue
            if protos is False:
                protos = decomposition(node)
                if protos:
                    types = _piece_types(node, protos, self.opsets)
                    scratch = Graph(graph.name, values=dict(graph.values), outer=graph.outer)
                    try:
                        trial = _build_pieces(node, protos, scratch, self.opsets, types)
                    except Exception:  # noqa: BLE001 - a body we cannot build is no option
                        trial = None
            if trial and all(dev.accepts(p, self.quarantine)[0] for p in trial):
                return self._expand(node, protos, graph, depth, rejected, dev)  # type: ignore
        if protos is False and depth < MAX_DECOMPOSE_DEPTH:
            protos = decomposition(node)
        if not protos:
            raise _unsupported(node, self.devs, rejected)
        return self._expand(node, protos, graph, depth, rejected, None)  # type: ignore[arg-type]

    def _deferred_to(self, node: Node, k: int) -> tuple[Device, str] | None:
        """(the host device after devs[k] in the list that takes `node`, devs[k]'s reason) when
        devs[k] defers it (see Device.defers), else None."""
        reason = self.devs[k].deferral(node)
        if reason is None:
            return None
        for host in self.devs[k + 1:]:
            if host.kind == "host" and host.accepts(node, self.quarantine)[0]:
                return host, reason
        return None

    def _expand(self, node, protos, graph, depth, rejected, dev) -> list[Node]:
        types = _piece_types(node, protos, self.opsets)
        pieces = _build_pieces(node, protos, graph, self.opsets, types)
        if dev is not None:
            why = (
                f"{rejected[-1][1]}; decomposed through its ONNX function body, "
                f"which {dev.name} runs"
            )
        else:
            refused = "; ".join(f"{d}: {r}" for d, r in rejected)
            why = f"no device runs it whole ({refused}); decomposed through its ONNX function body"
        out: list[Node] = []
        for p in pieces:
            for q in self.node(p, graph, depth + 1):
                a = self.assign[id(q)]
                a.decomposed_from = a.decomposed_from or node.name
                a.decomposed_why = a.decomposed_why or why
                out.append(q)
        return out


def _unsupported(node: Node, devs: list[Device], rejected: list) -> UnsupportedOpError:
    dts = [v.fact.dtype if v is not None else "-" for v in node.inputs]
    names = [d.name for d in devs]
    why = "; ".join(f"{d}: {r}" for d, r in rejected) or "no variant accepts it"
    if node.opdef is None and not rejected:
        why = "no implementation of this version"
    return UnsupportedOpError(
        f"node {node.label}: cannot run {node.domain + '::' if node.domain else ''}"
        f"{node.op_type} at opset {node.opset} with input dtypes {dts} on {names}: {why}; "
        "and ONNX defines no function body to decompose it"
    )


# -- memory -------------------------------------------------------------------------------------


def _nbytes(v: Value, compute_dtype: str | None) -> int:
    shape = v.fact.shape
    if v.kind != "tensor" or shape is None or v.fact.dtype in (None, "string"):
        return 0
    n = 1
    for d in shape:
        d = declared_value(d)  # an estimate: a declaration counts as what it says
        n *= d if isinstance(d, int) else 1  # symbolic dims count as 1: a lower bound
    if compute_dtype is not None and v.fact.dtype in ("float32", "float64"):
        item = np.dtype(np.float16).itemsize if compute_dtype != "float32" else 4
    else:
        from opwarden.dtypes import np_dtype_of

        try:
            item = np_dtype_of(v.fact.dtype).itemsize
        except Exception:  # noqa: BLE001 - exotic dtypes count one byte
            item = 1
    return n * item


def activation_bytes(
    nodes: list[Node], compute_dtype: str | None = None, outputs: set[int] | None = None
) -> tuple[int, str]:
    """Peak of live activation bytes while `nodes` run in order, and the node at the peak.

    An activation is live from the first of these nodes that touches it to the last that reads
    it (to the end when the graph outputs it or a node outside reads it); weights (constants)
    are not activations. The memory planner may later give a tighter number; this is the one
    place it is estimated.
    """
    inside = {id(n) for n in nodes}
    outputs = outputs or set()
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    size: dict[int, int] = {}
    for i, n in enumerate(nodes):
        for v in list(n.inputs) + list(n.outputs):
            if v is None or v.const is not None:
                continue
            first.setdefault(id(v), i)
            last[id(v)] = i
            size[id(v)] = _nbytes(v, compute_dtype)
            if id(v) in outputs or any(id(u) not in inside for u, _ in v.uses):
                last[id(v)] = len(nodes) - 1
    delta = [0] * (len(nodes) + 1)
    for k, b in size.items():
        delta[first[k]] += b
        delta[last[k] + 1] -= b
    peak, at, live = 0, "", 0
    for i, n in enumerate(nodes):
        live += delta[i]
        if live > peak:
            peak, at = live, n.name
    return peak, at


def _fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f}".rstrip("0").rstrip(".") + f" {unit}"
    return f"{n} bytes"


def _runs(graph: Graph, assign: dict[int, _Assign]) -> list[tuple[Device, list[Node]]]:
    runs: list[tuple[Device, list[Node]]] = []
    for n in graph.nodes:
        dev = assign[id(n)].device
        if runs and runs[-1][0] is dev:
            runs[-1][1].append(n)
        else:
            runs.append((dev, [n]))
    return runs


def _check_memory(graph: Graph, p: _Partitioner) -> None:
    """Move every partition that would not fit its device's memory to the next device."""
    outs = {id(v) for v in graph.outputs}
    for _ in range(len(p.devs) + 1):
        moved = False
        for dev, nodes in _runs(graph, p.assign):
            if dev.memory_bytes is None:
                continue
            peak, at = activation_bytes(nodes, dev.compute_dtype, outs)
            if peak <= dev.memory_bytes:
                continue
            why = (
                f"{dev.name}: its partition of {len(nodes)} nodes ({nodes[0].name} .. "
                f"{nodes[-1].name}) needs {_fmt_bytes(peak)} of activation memory at its "
                f"peak (node {at}), more than its {_fmt_bytes(dev.memory_bytes)}"
            )
            for n in nodes:
                a = p.assign[id(n)]
                a.rejected.append((dev.name, why))
                later = p.devs[p.devs.index(dev) + 1 :]
                for d in later:
                    ok, w = d.accepts(n, p.quarantine)
                    if ok:
                        a.device = d
                        break
                    a.rejected.append((d.name, w))
                else:
                    raise UnsupportedOpError(
                        f"node {n.label}: no device can run it: "
                        + "; ".join(f"{d}: {r}" for d, r in a.rejected)
                    )
            moved = True
        if not moved:
            return


# -- copies -------------------------------------------------------------------------------------


def _copy_device(src: str, dst: str) -> str:
    """The device that performs a copy: the accelerator side of a host <-> device edge."""
    return src if dst == HOST else dst


def _insert_copies(graph: Graph, assign: dict[int, _Assign]) -> dict[int, str]:
    """DeviceCopy nodes on every edge between devices; returns {id(copy node): reason}."""
    from opwarden.ops import REGISTRY

    home: dict[int, str] = {}
    copies: dict[tuple[int, str], Value] = {}
    uploads: dict[tuple[int, str], Value] = {}
    inserted: dict[int, str] = {}
    new_nodes: list[Node] = []
    opdef, schema = REGISTRY.resolve("DeviceCopy", "opwarden", 1)

    def copy(v: Value, src: str, dst: Device, out: Value | None = None) -> Value:
        if out is None:
            out = graph.add_value(_fresh(graph, f"{v.name}@{dst.name}"), fact=v.fact, kind=v.kind)
        srcdev = get_device(src)
        convert = ""
        if dst.rounds("inputs"):
            convert = dst.compute_dtype or ""
        elif srcdev.rounds("exit"):
            convert = srcdev.compute_dtype or ""
        attrs = {"src": src, "dst": dst.name, "convert": convert or ""}
        node = Node("DeviceCopy", "opwarden", _fresh_node(graph, f"{v.name}/to_{dst.name}"),
                    [v], [out], attrs, 1, graph=graph, opdef=opdef, schema=schema)
        out.producer = node
        dev = get_device(_copy_device(src, dst.name))
        assign[id(node)] = _Assign(dev)
        conv = f", rounding floats to {convert}" if convert else ""
        inserted[id(node)] = f"copy: {v.name!r} moves from {src} to {dst.name}{conv}"
        new_nodes.append(node)
        return out

    for node in graph.nodes:
        dev = assign[id(node)].device
        for i, v in enumerate(node.inputs):
            if v is None:
                continue
            src = home.get(id(v), HOST)
            if src == dev.name:
                continue
            if v.const is not None and v.producer is None:
                if dev.rounds("weights") and _is_data(node, i) and v.fact.dtype in ("float32",
                                                                                  "float64"):
                    key = (id(v), dev.name)
                    if key not in uploads:
                        # Weights are uploaded once, in the device's compute dtype.
                        up = graph.add_value(_fresh(graph, f"{v.name}@{dev.name}"), fact=v.fact)
                        up.const = round_to(np.asarray(v.const), dev.compute_dtype or "float16")
                        graph.initializers[up.name] = up
                        uploads[key] = up
                    node.inputs[i] = uploads[key]
                continue
            if dev.shares_memory_with(get_device(src)):
                continue  # host arrays on both sides: nothing moves
            key = (id(v), dev.name)
            if key not in copies:
                copies[key] = copy(v, src, dev)
            node.inputs[i] = copies[key]
        new_nodes.append(node)
        for o in node.outputs:
            if o is not None:
                home[id(o)] = dev.name
    host = get_device(HOST)
    for v in list(graph.outputs):
        src = home.get(id(v), HOST)
        if src == HOST or v.producer is None or host.shares_memory_with(get_device(src)):
            continue
        # The graph output keeps its name and is produced on the host by a copy.
        nv = graph.add_value(_fresh(graph, f"{v.name}@{src}"), fact=v.fact, kind=v.kind)
        for n in new_nodes:
            n.inputs = [nv if x is v else x for x in n.inputs]
            n.outputs = [nv if x is v else x for x in n.outputs]
        copy(nv, src, host, out=v)
    graph.nodes = new_nodes
    graph.rebuild_uses()
    return inserted


def _is_data(node: Node, i: int) -> bool:
    """Is input i of the node's compute type (input 0's type), as opposed to a parameter?"""
    if i == 0 or node.schema is None:
        return True
    p0, p = node.schema.input_param(0), node.schema.input_param(i)
    return p0 is None or p is None or p.type_str == p0.type_str


def _fresh(graph: Graph, name: str) -> str:
    base, k = name, 1
    while name in graph.values:
        k += 1
        name = f"{base}_{k}"
    return name


def _fresh_node(graph: Graph, name: str) -> str:
    taken = {n.name for n in graph.nodes}
    base, k = name, 1
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    return name


# -- variants -----------------------------------------------------------------------------------


def _emulated(var: Variant, node: Node, dev: Device, adapt: bool, layout: str) -> Variant:
    """`var` run for device `dev`: NHWC adapter (when the host kernel is NCHW) and rounding."""
    sens = sensitive_inputs(node) if adapt else ()
    exact = node.op_type in EXACT_OPS and dev.rounds("inputs") and dev.rounds("weights")
    rounding = dev.compute_dtype if dev.rounds("outputs") and not exact else ""
    ranged = (
        dev.compute_dtype
        if dev.rounds("range") and not rounding and node.op_type not in EXACT_OPS
        else ""
    )
    fn = var.fn
    if not sens and not rounding and not ranged:
        return var

    def run(*args: Any, **kw: Any) -> Any:
        if sens:
            args = tuple(
                np.transpose(a, _layout.to_first(a.ndim))
                if k in sens and isinstance(a, np.ndarray)
                else a
                for k, a in enumerate(args)
            )
        res = fn(*args, **kw)
        if sens:
            if isinstance(res, tuple):
                y = res[0]
                res = (np.ascontiguousarray(np.transpose(y, _layout.to_last(y.ndim))), *res[1:])
            else:
                res = np.ascontiguousarray(np.transpose(res, _layout.to_last(res.ndim)))
        if rounding:
            if isinstance(res, tuple):
                res = tuple(round_to(r, rounding) for r in res)
            else:
                res = round_to(res, rounding)
        elif ranged:
            if isinstance(res, tuple):
                res = tuple(clamp_range(r, ranged) for r in res)
            else:
                res = clamp_range(res, ranged)
        return res

    suffix = f"@{dev.name}" if dev.kind == "profile" else "@nhwc"
    return Variant(
        name=f"{var.name}{suffix}",
        op=var.op,
        fn=run,
        device=dev.name,
        dtypes=var.dtypes,
        layout=layout if sens else var.layout,
        priority=var.priority,
        when=var.when,
        reference=var.reference,
        accepts_out=False,
        wants_noutputs=var.wants_noutputs,
    )


def _choose(
    node: Node, dev: Device, layout: str, quarantine: Any, inserted: bool = False
) -> tuple[Variant, Variant, list]:
    """(variant, reference fallback, rejected) for a node on its device in its layout."""
    ref = next(v for v in node.opdef.variants if v.reference)
    if inserted and dev.kind != "profile":
        # Copies and layout conversions a device lacks a kernel for run on the host.
        var, rej = select(node, dev.name, layout, quarantine)
        return (var or ref), ref, rej
    if dev.kind == "profile":
        host = get_device(dev.host or HOST)
        var, rej = select(node, host.name, layout, quarantine)
        adapt = False
        if var is None and layout == "NHWC":
            var, rej2 = select(node, host.name, "NCHW", quarantine)
            rej = rej + rej2
            adapt = True
        if var is None:
            raise _unsupported(node, [dev], [(v, r) for v, r in rej])
        emu = _emulated(var, node, dev, adapt, layout)
        if quarantine is not None and emu.name in quarantine and var is not ref:
            rej.append((emu.name, f"quarantined as unstable: {quarantine.reason(emu.name)}"))
            emu, adapt = _emulated(ref, node, dev, layout == "NHWC", layout), layout == "NHWC"
        return emu, _emulated(ref, node, dev, layout == "NHWC", layout), rej
    var, rej = select(node, dev.name, layout, quarantine)
    if var is None:
        raise _unsupported(node, [dev], rej)
    fallback = ref
    if layout == "NHWC" and sensitive_inputs(node):
        fallback = _emulated(ref, node, dev, True, layout)
    return var, fallback, rej


# -- the entry point ----------------------------------------------------------------------------


def place_graph(
    graph: Graph, devices: list[str], opsets: dict[str, int], depth: int = 0, quarantine: Any = None
) -> list[Placement]:
    """Place every node of `graph` on host devices in NCHW (subgraphs); placements in order."""
    devs = [get_device(d) for d in devices]
    devs = [d for d in devs if d.kind != "profile"] or [get_device(HOST)]
    part = _Partitioner(devs, opsets, quarantine)
    part.graph(graph)
    out = []
    for node in graph.nodes:
        a = part.assign[id(node)]
        var, ref, rej = _choose(node, a.device, "NCHW", quarantine)
        out.append(
            Placement(node, a.device.name, var, kernel_kwargs(node), a.rejected + rej,
                      a.decomposed_from, _reason(a), ref_variant=ref)
        )
    return out


def _reason(a: _Assign) -> str | None:
    parts = []
    if a.rejected:
        parts.append("; ".join(r for _, r in a.rejected))
    if a.decomposed_why:
        parts.append(f"part of {a.decomposed_from}: {a.decomposed_why}")
    return " | ".join(parts) or None


def place_model(
    model: Any, devices: list[str], options: Any, quarantine: Any = None
) -> Placements:
    """Partition, copy, lay out and choose kernels for every graph of `model`, in order."""
    from opwarden.ir.validate import graphs_of

    devs = [get_device(d) for d in devices]
    g = model.graph
    if any(d.kind == "profile" for d in devs):
        complete_facts(g, model.opsets)
    part = _Partitioner(devs, model.opsets, quarantine)
    part.graph(g)
    _check_memory(g, part)
    if getattr(options, "fallback", "allow") == "forbid":
        _forbid(g, devs, part.assign)
    copies = _insert_copies(g, part.assign)
    device_of = {k: a.device for k, a in part.assign.items()}
    layouts, lrep = _layout.unify(g, device_of, model.opsets.get("", 13), quarantine)
    out = Placements()
    for node in g.nodes:
        dev = device_of[id(node)]
        lay = layouts.get(id(node), "NCHW")
        var, ref, rej = _choose(
            node, dev, lay, quarantine, id(node) in copies or id(node) in lrep.inserted
        )
        a = part.assign.get(id(node))
        if id(node) in copies:
            inserted, reason = "copy", copies[id(node)]
        elif id(node) in lrep.inserted:
            inserted = "transpose" if node.op_type == "Transpose" else "view"
            reason = lrep.inserted[id(node)]
        else:
            inserted, reason = None, _reason(a) if a is not None else None
        out.append(
            Placement(
                node, dev.name, var, kernel_kwargs(node),
                (a.rejected if a is not None else []) + rej,
                a.decomposed_from if a is not None else None,
                reason, inserted, lay, dev.simulated, ref,
            )
        )
    for sub in graphs_of(model)[1:]:
        out.extend(place_graph(sub, devices, model.opsets, quarantine=quarantine))
    out.report = {
        "devices": [d.name for d in devs],
        "simulated": [d.name for d in devs if d.simulated],
        "copies_inserted": len(copies),
        **lrep.as_dict(),
    }
    return out


def _forbid(graph: Graph, devs: list[Device], assign: dict[int, _Assign]) -> None:
    first = devs[0].name
    off = [n for n in graph.nodes if assign[id(n)].device.name != first]
    if not off:
        return
    lines = []
    for n in off:
        a = assign[id(n)]
        why = "; ".join(r for d, r in a.rejected if d == first) or _reason(a) or "?"
        if a.decomposed_from:
            why = f"(piece of {a.decomposed_from}) {why}"
        lines.append(f"  - {n.label} -> {a.device.name}: {why}")
    raise UnsupportedOpError(
        f"fallback='forbid': {len(off)} of {len(graph.nodes)} nodes cannot run on {first}:\n"
        + "\n".join(lines)
    )
