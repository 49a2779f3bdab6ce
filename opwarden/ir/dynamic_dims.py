"""Negative declared dims read as dynamic, as ONNX Runtime reads them.

Some exporters write ``dim_value: -1`` for a dimension whose size is only known at run time.
ONNX Runtime treats any negative declared dim as unknown: it checks the rank of a feed but not
that dim. onnx's own shape inference cannot take them, so the loader clears them (the dim then
has neither a value nor a name, an unknown dim) in every graph, subgraph and function body
before inference, and puts them back afterwards when the protobuf is the caller's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import onnx

from opwarden.ir.validate import _attr_graphs, _proto_graphs


def _typeprotos(tp: onnx.TypeProto) -> Iterator[onnx.TypeProto]:
    stack = [tp]
    while stack:
        t = stack.pop()
        which = t.WhichOneof("value")
        if which in ("tensor_type", "sparse_tensor_type"):
            yield t
        elif which == "sequence_type":
            stack.append(t.sequence_type.elem_type)
        elif which == "optional_type":
            stack.append(t.optional_type.elem_type)
        elif which == "map_type":
            stack.append(t.map_type.value_type)


def _graphs(proto: onnx.ModelProto) -> Iterator[onnx.GraphProto]:
    for _, g in _proto_graphs(proto.graph, "graph"):
        yield g
    for f in proto.functions:
        for i, n in enumerate(f.node):
            for _, sub in _attr_graphs(n, "function", i):
                for _, g in _proto_graphs(sub, "function"):
                    yield g


def _value_infos(proto: onnx.ModelProto) -> Iterator[onnx.ValueInfoProto]:
    for g in _graphs(proto):
        for field_ in ("input", "output", "value_info"):
            yield from getattr(g, field_)
    for f in proto.functions:
        yield from getattr(f, "value_info", ())


def negative_dims_dynamic(proto: onnx.ModelProto) -> Callable[[], None]:
    """Clear every negative declared dim of `proto` in place; returns the function that
    restores them (for a protobuf the caller owns: call it once loading is done)."""
    cleared: list[tuple[onnx.TensorShapeProto.Dimension, int]] = []
    for vi in _value_infos(proto):
        for t in _typeprotos(vi.type):
            tt = getattr(t, t.WhichOneof("value"))
            for d in tt.shape.dim:
                if d.HasField("dim_value") and d.dim_value < 0:
                    cleared.append((d, d.dim_value))
                    d.ClearField("dim_value")

    def restore() -> None:
        for d, v in cleared:
            if not d.HasField("dim_param"):
                d.dim_value = v
        cleared.clear()

    return restore
