"""Operator schemas: read from `onnx.defs` for standard ops, declared in Python for custom ones."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import onnx
import onnx.defs

from opwarden.dtypes import typestr_to_dtype_name
from opwarden.errors import ModelError

STANDARD_DOMAINS = ("", "ai.onnx.ml", "ai.onnx.preview.training")


def canonical_domain(domain: str) -> str:
    """'ai.onnx' is the default domain ''."""
    return "" if domain in ("", "ai.onnx") else domain


@dataclass(frozen=True)
class Param:
    """A formal input or output: its name and type (a constraint like 'T' or 'tensor(int64)')."""

    name: str
    type_str: str
    option: str = "single"  # "single" | "optional" | "variadic"
    homogeneous: bool = True
    min_arity: int = 1


@dataclass(frozen=True)
class AttrSpec:
    """One attribute: ONNX type name ('INT', 'FLOATS', 'GRAPH', ...), required, default."""

    name: str
    type: str
    required: bool = False
    default: Any = None
    has_default: bool = False


@dataclass
class Schema:
    """Everything a loader needs to check a node against its operator."""

    op_type: str
    domain: str
    since: int
    inputs: tuple[Param, ...]
    outputs: tuple[Param, ...]
    type_constraints: dict[str, frozenset[str] | None]  # None: any type (incl. sequences)
    attrs: dict[str, AttrSpec]
    min_inputs: int
    max_inputs: int
    min_outputs: int
    max_outputs: int
    deprecated: bool = False
    doc: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def allowed_dtypes(self, type_str: str) -> frozenset[str] | None:
        """Dtype names allowed for a parameter's type string (None: not restricted)."""
        if type_str in self.type_constraints:
            return self.type_constraints[type_str]
        name = typestr_to_dtype_name(type_str)
        return frozenset({name}) if name else None

    def input_param(self, index: int) -> Param | None:
        """The formal parameter that node input `index` binds to (variadic absorbs the rest)."""
        if not self.inputs:
            return None
        if index < len(self.inputs):
            return self.inputs[index]
        last = self.inputs[-1]
        return last if last.option == "variadic" else None

    def output_param(self, index: int) -> Param | None:
        if not self.outputs:
            return None
        if index < len(self.outputs):
            return self.outputs[index]
        last = self.outputs[-1]
        return last if last.option == "variadic" else None


_OPTION = {
    onnx.defs.OpSchema.FormalParameterOption.Single: "single",
    onnx.defs.OpSchema.FormalParameterOption.Optional: "optional",
    onnx.defs.OpSchema.FormalParameterOption.Variadic: "variadic",
}


def _tensor_without_files(t: onnx.TensorProto) -> Any:
    """A tensor attribute's array; external data is refused, since only the loader knows the
    model's folder (onnx would read the location relative to the current directory)."""
    from onnx import numpy_helper

    if t.data_location == onnx.TensorProto.EXTERNAL:
        raise ModelError(
            f"tensor {t.name!r} stores its data in an external file, but no model folder is "
            "known here to read it from"
        )
    return numpy_helper.to_array(t)


def attr_value(attr: onnx.AttributeProto, tensor: Any = None) -> Any:
    """Python value of an AttributeProto: str for strings, list for repeated, ndarray for tensors.

    GRAPH attributes come back as the GraphProto; the IR loader converts them to Graphs.
    `tensor` converts TENSOR/TENSORS payloads (the loader passes one that reads external data
    from the model's folder only); by default external data is refused.
    """
    tensor = tensor or _tensor_without_files
    t = attr.type
    A = onnx.AttributeProto
    if t == A.INT:
        return int(attr.i)
    if t == A.FLOAT:
        return float(attr.f)
    if t == A.STRING:
        return attr.s.decode("utf-8", errors="replace")
    if t == A.TENSOR:
        return tensor(attr.t)
    if t == A.GRAPH:
        return attr.g
    if t == A.INTS:
        return [int(v) for v in attr.ints]
    if t == A.FLOATS:
        return [float(v) for v in attr.floats]
    if t == A.STRINGS:
        return [s.decode("utf-8", errors="replace") for s in attr.strings]
    if t == A.TENSORS:
        return [tensor(x) for x in attr.tensors]
    if t == A.GRAPHS:
        return list(attr.graphs)
    if t == A.SPARSE_TENSOR:
        return attr.sparse_tensor
    if t == A.TYPE_PROTO:
        return attr.tp
    if t == A.TYPE_PROTOS:
        return list(attr.type_protos)
    return None


def attr_type_name(attr: onnx.AttributeProto) -> str:
    return onnx.AttributeProto.AttributeType.Name(attr.type)


def _type_constraint(allowed: list[str]) -> frozenset[str] | None:
    names = [typestr_to_dtype_name(s) for s in allowed]
    if any(n is None for n in names):
        # sequences / optionals / maps: checked by kind elsewhere, not by dtype.
        return None
    return frozenset(names)  # type: ignore[arg-type]


@functools.cache
def from_onnx(op_type: str, domain: str, version: int) -> Schema | None:
    """Schema of `op_type` as the model's opset `version` of `domain` defines it (None: unknown)."""
    try:
        s = onnx.defs.get_schema(op_type, version, domain)
    except onnx.defs.SchemaError:
        return None
    inputs = tuple(
        Param(p.name, p.type_str, _OPTION[p.option], p.is_homogeneous, getattr(p, "min_arity", 1))
        for p in s.inputs
    )
    outputs = tuple(
        Param(p.name, p.type_str, _OPTION[p.option], p.is_homogeneous, getattr(p, "min_arity", 1))
        for p in s.outputs
    )
    attrs = {}
    for name, a in s.attributes.items():
        dv = a.default_value
        has_default = dv is not None and dv.type != onnx.AttributeProto.UNDEFINED
        attrs[name] = AttrSpec(
            name,
            onnx.AttributeProto.AttributeType.Name(int(a.type)),
            bool(a.required),
            attr_value(dv) if has_default else None,
            has_default,
        )
    tcs = {
        tc.type_param_str: _type_constraint(list(tc.allowed_type_strs)) for tc in s.type_constraints
    }
    return Schema(
        op_type=op_type,
        domain=domain,
        since=s.since_version,
        inputs=inputs,
        outputs=outputs,
        type_constraints=tcs,
        attrs=attrs,
        min_inputs=s.min_input,
        max_inputs=s.max_input,
        min_outputs=s.min_output,
        max_outputs=s.max_output,
        deprecated=bool(s.deprecated),
        doc=(s.doc or "").strip().split("\n")[0],
    )


@functools.cache
def onnx_function_body(op_type: str, domain: str, version: int) -> onnx.FunctionProto | None:
    """The ONNX function body that defines `op_type` at this opset, if the spec gives one."""
    try:
        s = onnx.defs.get_schema(op_type, version, domain)
    except onnx.defs.SchemaError:
        return None
    if not s.has_function:
        return None
    fn = s.function_body
    try:
        raw = s.get_function_with_opset_version(version)
    except Exception:  # noqa: BLE001 - older onnx builds lack the versioned accessor
        raw = None
    if raw:
        fn = raw if isinstance(raw, onnx.FunctionProto) else onnx.FunctionProto.FromString(raw)
    return fn


def context_function_body(
    op_type: str, domain: str, version: int, node: onnx.NodeProto, input_types: list[onnx.TypeProto]
) -> onnx.FunctionProto | None:
    """A context-dependent ONNX function body (one that depends on the input types)."""
    try:
        s = onnx.defs.get_schema(op_type, version, domain)
    except onnx.defs.SchemaError:
        return None
    if not s.has_context_dependent_function:
        return None
    try:
        raw = s.get_context_dependent_function_with_opset_version(
            version, node.SerializeToString(), [t.SerializeToString() for t in input_types]
        )
    except Exception:  # noqa: BLE001 - onnx raises a bare error when types are insufficient
        return None
    if not raw:
        return None
    return onnx.FunctionProto.FromString(raw)
