"""IR -> ONNX protobuf (for decomposition, round-trips and exporting models with custom domains)."""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import onnx
from onnx import helper, numpy_helper

from opwarden.contract import declared_value
from opwarden.dtypes import onnx_type
from opwarden.ir.graph import Graph, Model, Value
from opwarden.ir.toposort import subgraphs


def attribute_proto(name: str, value: Any, attr_type: int | None = None) -> onnx.AttributeProto:
    """An AttributeProto for a Python attribute value (Graphs are exported recursively)."""
    if isinstance(value, Graph):
        return helper.make_attribute(name, graph_proto(value))
    if isinstance(value, list) and value and isinstance(value[0], Graph):
        return helper.make_attribute(name, [graph_proto(g) for g in value])
    if isinstance(value, np.ndarray):
        return helper.make_attribute(name, numpy_helper.from_array(value))
    if isinstance(value, list) and not value and attr_type is not None:
        a = onnx.AttributeProto()
        # attr_type is a type field read from an AttributeProto: a valid AttributeType
        a.name, a.type = name, cast("onnx.AttributeProto.AttributeType", attr_type)
        return a
    if attr_type == onnx.AttributeProto.FLOAT:
        value = float(value)
    if attr_type == onnx.AttributeProto.FLOATS:
        value = [float(v) for v in value]
    return helper.make_attribute(name, value)


def value_info(v: Value) -> onnx.ValueInfoProto:
    if v.kind != "tensor" or v.fact.dtype is None:
        return (
            helper.make_empty_tensor_value_info(v.name)
            if v.kind == "tensor"
            else onnx.ValueInfoProto(name=v.name)
        )
    dt = np.dtype(object) if v.fact.dtype == "string" else np.dtype(v.fact.dtype)
    # a dim only the model declares is written as declared
    shape = None if v.fact.shape is None else [declared_value(d) for d in v.fact.shape]
    return helper.make_tensor_value_info(v.name, onnx_type(dt), shape)


def graph_proto(g: Graph) -> onnx.GraphProto:
    """GraphProto for a Graph (initializers from constant values)."""
    nodes = []
    for n in g.nodes:
        p = helper.make_node(
            n.op_type,
            [v.name if v is not None else "" for v in n.inputs],
            [v.name if v is not None else "" for v in n.outputs],
            name=n.name,
            domain=n.domain,
        )
        types = getattr(n, "attr_types", {})
        p.attribute.extend(attribute_proto(k, a, types.get(k)) for k, a in n.attrs.items())
        nodes.append(p)
    inits = [numpy_helper.from_array(np.asarray(v.const), v.name) for v in g.initializers.values()]
    return helper.make_graph(
        nodes,
        g.name,
        [value_info(v) for v in g.inputs],
        [value_info(v) for v in g.outputs],
        initializer=inits,
    )


def model_proto(m: Model) -> onnx.ModelProto:
    """ModelProto with every opset the model uses recorded (custom domains included)."""
    opsets = [helper.make_opsetid(d, v) for d, v in sorted(m.opsets.items())]
    proto = helper.make_model(graph_proto(m.graph), opset_imports=opsets)
    proto.ir_version = m.ir_version
    proto.producer_name = "opwarden"
    return proto


def _used_domains(g: onnx.GraphProto) -> set[str]:
    out = {n.domain for n in g.node}
    for n in g.node:
        for sub in subgraphs(n):
            out |= _used_domains(sub)
    return out


def optimized_model_proto(m: Model, metadata: dict[str, str] | None = None,
                          doc_string: str = "") -> onnx.ModelProto:
    """The model as the passes left it, as a valid ONNX model: every domain its nodes use is
    imported (the fused operators' domain "opwarden" at version 1, where they are registered
    with their schemas), the model's metadata kept. opwarden loads it back as it is."""
    proto = model_proto(m)
    have = {imp.domain for imp in proto.opset_import}
    for d in sorted(_used_domains(proto.graph) - have - {"ai.onnx"}):
        proto.opset_import.append(helper.make_opsetid(d, 1))
    if metadata:
        helper.set_model_props(proto, dict(metadata))
    proto.doc_string = doc_string
    return proto
