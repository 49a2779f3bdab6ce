"""Decomposition: a node rewritten through its ONNX function body, as nodes of its graph.

A device that refuses a node may still run it piece by piece: the spec's function body (or the
context-dependent one onnx builds for the node's input types), inlined with the node's own
input and output names (ir/functions.py), typed by ONNX shape inference over the pieces alone,
and built into the node's graph (ir/build.py; the pieces' outputs that are the node's are the
node's very values). Partitioning (partition.py) decides when a decomposition is worth it.
"""

from __future__ import annotations

import numpy as np
import onnx

from opwarden.dtypes import onnx_type
from opwarden.ir.build import NodeBuilder
from opwarden.ir.export import attribute_proto
from opwarden.ir.functions import inline
from opwarden.ir.graph import Graph, Node, Value
from opwarden.ir.validate import check_node
from opwarden.ops.schema import context_function_body, onnx_function_body

# A body may use operators that decompose again (a function of functions); past this depth the
# node is refused rather than rewritten forever.
MAX_DECOMPOSE_DEPTH = 16
# Constant inputs up to this many elements are given to shape inference as values (a shape or
# an axes tensor decides the pieces' shapes); larger ones only by type.
SMALL_CONST = 4096


def type_proto(value: Value | None) -> onnx.TypeProto:
    """The TypeProto of a value's fact (empty when its dtype is unknown)."""
    tp = onnx.TypeProto()
    if value is not None and value.fact.dtype is not None:
        tp.tensor_type.elem_type = onnx_type(
            np.dtype(value.fact.dtype) if value.fact.dtype != "string" else object
        )
        if value.fact.shape is not None:
            tp.tensor_type.shape.SetInParent()
            for d in value.fact.shape:
                dim = tp.tensor_type.shape.dim.add()
                if isinstance(d, int):
                    dim.dim_value = d
                elif d:
                    dim.dim_param = str(d)
    return tp


def node_proto(node: Node) -> onnx.NodeProto:
    """The NodeProto of an IR node (names of its values, attributes as loaded)."""
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
        types = [type_proto(v) for v in node.inputs]
        fn = context_function_body(node.op_type, node.domain, node.opset, node_proto(node), types)
    if fn is None:
        return None
    return inline(node_proto(node), fn)


def piece_types(
    node: Node, pieces: list[onnx.NodeProto], opsets: dict[str, int]
) -> dict[str, onnx.TypeProto]:
    """Inferred types of the pieces' values (so devices can check their dtypes and shapes)."""
    from onnx import helper, numpy_helper

    ins, inits = [], []
    for v in node.inputs:
        if v is None:
            continue
        ins.append(onnx.helper.make_value_info(v.name, type_proto(v)))
        if v.const is not None and v.const.size <= SMALL_CONST and v.const.dtype != object:
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


def build_pieces(
    protos: list[onnx.NodeProto], graph: Graph, opsets: dict[str, int],
    types: dict[str, onnx.TypeProto],
) -> list[Node]:
    """The pieces as checked nodes of `graph`: the function's intermediate values become values
    of the graph; its outputs are the original node's output values."""
    builder = NodeBuilder(opsets, types)
    out = []
    for i, p in enumerate(protos):
        inner = builder.node(p, graph, i, reuse=True)
        check_node(inner)
        out.append(inner)
    return out
