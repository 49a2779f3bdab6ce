"""What onnxruntime reports about a model before running it: ModelMetadata and NodeArg types.

`model_metadata` reads the ModelProto's own fields; `type_string` spells a graph input's or
output's type as onnxruntime does ("tensor(float)", "seq(tensor(int64))",
"map(string,tensor(float))", "optional(tensor(float))").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from opwarden.dtypes import onnx_type_name


@dataclass(frozen=True)
class ModelMetadata:
    """onnxruntime's ModelMetadata: the model's producer, graph name, domain, doc strings,
    model_version and metadata_props."""

    producer_name: str = ""
    graph_name: str = ""
    domain: str = ""
    description: str = ""
    graph_description: str = ""
    version: int = 0
    custom_metadata_map: dict[str, str] = field(default_factory=dict)


def model_metadata(proto: Any) -> ModelMetadata:
    """The ModelMetadata of a ModelProto."""
    return ModelMetadata(
        producer_name=proto.producer_name,
        graph_name=proto.graph.name,
        domain=proto.domain,
        description=proto.doc_string,
        graph_description=proto.graph.doc_string,
        version=int(proto.model_version),
        custom_metadata_map={p.key: p.value for p in proto.metadata_props},
    )


def declared_symbols(proto: Any) -> set[str]:
    """Every dim_param the main graph's inputs, outputs and value_info declare (onnxruntime
    reports those by name, and the dims only inference names as None)."""
    out: set[str] = set()
    g = proto.graph
    for vi in [*g.input, *g.output, *g.value_info]:
        t = vi.type
        if t.WhichOneof("value") == "tensor_type" and t.tensor_type.HasField("shape"):
            out.update(d.dim_param for d in t.tensor_type.shape.dim if d.dim_param)
    return out


def _elem(code: int) -> str:
    return onnx_type_name(code) if code else "undefined"


def type_string(tp: Any) -> str | None:
    """onnxruntime's spelling of a TypeProto; None when it has no type."""
    if tp is None:
        return None
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        return f"tensor({_elem(tp.tensor_type.elem_type)})"
    if kind == "sparse_tensor_type":
        return f"sparse_tensor({_elem(tp.sparse_tensor_type.elem_type)})"
    if kind == "sequence_type":
        return f"seq({type_string(tp.sequence_type.elem_type)})"
    if kind == "map_type":
        return f"map({_elem(tp.map_type.key_type)},{type_string(tp.map_type.value_type)})"
    if kind == "optional_type":
        return f"optional({type_string(tp.optional_type.elem_type)})"
    return None
