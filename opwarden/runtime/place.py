"""Placement: choose a device and a kernel variant for every node, and say why.

For each node, devices are tried in the session's order. On a device, the operator's variants
are filtered by device, dtype, layout and their `when` predicate, and the highest priority wins
(ties broken by name, so selection is deterministic). A node nothing can run is rewritten through
its ONNX function body (decomposition); if there is none, UnsupportedOpError names the node.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import onnx

from ..contract import TensorFact
from ..dtypes import onnx_type
from ..errors import UnsupportedOpError
from ..ir.functions import inline
from ..ir.graph import Graph, Node
from ..ir.validate import check_node
from ..ops.base import Variant
from ..ops.schema import context_function_body, onnx_function_body

MAX_DECOMPOSE_DEPTH = 16


@dataclass
class Placement:
    """Where and how one node runs, with the reasons behind the choice."""

    node: Node
    device: str
    variant: Variant
    kwargs: dict[str, Any]
    rejected: list[tuple[str, str]] = field(default_factory=list)
    decomposed_from: str | None = None

    def describe(self) -> dict[str, Any]:
        return {
            "node": self.node.name,
            "op_type": self.node.op_type,
            "domain": self.node.domain,
            "opset": self.node.opset,
            "device": self.device,
            "variant": self.variant.name,
            "rejected": [{"variant": n, "reason": r} for n, r in self.rejected],
            "decomposed_from": self.decomposed_from,
        }


def kernel_kwargs(node: Node) -> dict[str, Any]:
    """Attributes for the kernel call: the node's, plus the schema's defaults."""
    kw = {name: spec.default for name, spec in node.schema.attrs.items() if spec.has_default}
    kw.update(node.attrs)
    return kw


def _dtype_key(node: Node, dtypes: Any) -> tuple[bool, str]:
    """Does the node's dtype binding satisfy a variant's dtype declaration? (ok, why-not)."""
    if dtypes is None:
        return True, ""
    facts = [v.fact.dtype if v is not None else None for v in node.inputs]
    if isinstance(dtypes, Mapping):
        for param, allowed in dtypes.items():
            for i, dt in enumerate(facts):
                p = node.schema.input_param(i)
                if p is not None and p.type_str == param and dt is not None and dt not in allowed:
                    return False, f"{param}={dt} not in {sorted(allowed)}"
        return True, ""
    first = next((d for d in facts if d is not None), None)
    if first is None and node.outputs and node.outputs[0] is not None:
        first = node.outputs[0].fact.dtype
    if first is None:
        return False, "dtype unknown before running"
    if first not in dtypes:
        return False, f"dtype {first} not in {sorted(dtypes)}"
    return True, ""


def select(
    node: Node, device: str, layout: str = "NCHW", quarantine: Any = None
) -> tuple[Variant | None, list]:
    """The winning variant of `node` on `device` (or None) and (name, reason) for each loser."""
    rejected: list[tuple[str, str]] = []
    candidates: list[Variant] = []
    if node.opdef is None:
        return None, rejected
    kw = kernel_kwargs(node)
    facts = [v.fact if v is not None else None for v in node.inputs]
    for var in node.opdef.variants:
        if var.device != device:
            rejected.append((var.name, f"device {var.device}, not {device}"))
            continue
        if quarantine is not None and var.name in quarantine and not var.reference:
            rejected.append((var.name, f"quarantined as unstable: {quarantine.reason(var.name)}"))
            continue
        ok, why = _dtype_key(node, var.dtypes)
        if not ok:
            rejected.append((var.name, why))
            continue
        if var.layout not in ("any", layout):
            rejected.append((var.name, f"layout {var.layout}, tensor is {layout}"))
            continue
        if var.when is not None:
            try:
                passed = bool(var.when(*[f or TensorFact(None) for f in facts], **kw))
            except Exception as e:  # noqa: BLE001 - a predicate that cannot decide rejects
                rejected.append((var.name, f"when-predicate raised {type(e).__name__}: {e}"))
                continue
            if not passed:
                rejected.append((var.name, "when-predicate is false for this node"))
                continue
        candidates.append(var)
    candidates.sort(key=lambda v: (-v.priority, v.name))
    if not candidates:
        return None, rejected
    win = candidates[0]
    for lost in candidates[1:]:
        rejected.append((lost.name, f"priority {lost.priority} < {win.name} ({win.priority})"))
    return win, rejected


def _type_proto(node_value) -> onnx.TypeProto:
    tp = onnx.TypeProto()
    if node_value is not None and node_value.fact.dtype is not None:
        import numpy as np

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
    from ..ir.export import attribute_proto

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


def place_graph(
    graph: Graph, devices: list[str], opsets: dict[str, int], depth: int = 0, quarantine: Any = None
) -> list[Placement]:
    """Place every node of `graph` (rewriting unsupported ones); returns placements in order."""
    from ..ir.load import _Builder

    placements: list[Placement] = []
    new_nodes: list[Node] = []
    for node in graph.nodes:
        placed = _place_node(node, devices, quarantine)
        if placed is not None:
            new_nodes.append(node)
            placements.append(placed)
            continue
        pieces = decomposition(node) if depth < MAX_DECOMPOSE_DEPTH else None
        if pieces is None:
            raise _unsupported(node, devices)
        builder = _Builder(opsets, {}, None, False, {})
        sub_nodes = []
        for i, p in enumerate(pieces):
            # The function's intermediate values become values of this graph; its outputs
            # are the original node's output values.
            inner = builder.node(p, graph, i, {}, reuse=True)
            check_node(inner)
            sub_nodes.append(inner)
        tmp = Graph(graph.name, nodes=sub_nodes, values=graph.values, outer=graph.outer)
        tmp.captures = graph.captures
        for pl in place_graph(tmp, devices, opsets, depth + 1, quarantine):
            pl.decomposed_from = pl.decomposed_from or node.name
            placements.append(pl)
        new_nodes.extend(tmp.nodes)
    graph.nodes = new_nodes
    graph.rebuild_uses()
    return placements


def _place_node(node: Node, devices: list[str], quarantine: Any = None) -> Placement | None:
    rejected: list[tuple[str, str]] = []
    for device in devices:
        var, why = select(node, device, quarantine=quarantine)
        rejected.extend(why)
        if var is not None:
            return Placement(node, device, var, kernel_kwargs(node), rejected)
    return None


def _unsupported(node: Node, devices: list[str]) -> UnsupportedOpError:
    dts = [v.fact.dtype if v is not None else "-" for v in node.inputs]
    why = "no implementation of this version" if node.opdef is None else "no variant accepts it"
    return UnsupportedOpError(
        f"node {node.label}: cannot run {node.domain + '::' if node.domain else ''}"
        f"{node.op_type} at opset {node.opset} with input dtypes {dts} on {devices}: {why}, "
        "and ONNX defines no function body to decompose it"
    )


def place_model(
    model: Any, devices: list[str], options: Any, quarantine: Any = None
) -> list[Placement]:
    """Place every graph of `model` (main graph and subgraphs) on `devices`, in order."""
    from ..ir.validate import graphs_of

    placements: list[Placement] = []
    for g in graphs_of(model):
        placements.extend(place_graph(g, devices, model.opsets, quarantine=quarantine))
    return placements
