"""Check every node of a loaded model against its operator's schema and contract."""

from __future__ import annotations

import onnx

from ..errors import ModelError, UnsupportedOpError
from ..ops import REGISTRY
from ..ops.schema import Schema
from .graph import Graph, Model, Node

_ATTR_NAME = onnx.AttributeProto.AttributeType.Name


def validate(model: Model) -> None:
    """Resolve each node's operator and check arity, attributes and dtypes (raises ModelError)."""
    for node in model.graph.all_nodes():
        check_node(node)


def check_node(node: Node) -> None:
    """Resolve `node.opdef`/`node.schema` and check the node against them."""
    try:
        opdef, schema = REGISTRY.resolve(node.op_type, node.domain, node.opset)
    except UnsupportedOpError as e:
        raise UnsupportedOpError(f"node {node.label}: {e}") from None
    if schema.deprecated:
        raise UnsupportedOpError(
            f"node {node.label}: {node.op_type} is deprecated (removed) at opset {node.opset} "
            f"of domain {node.domain or 'ai.onnx'!r}"
        )
    node.opdef, node.schema = opdef, schema
    _check_arity(node, schema)
    _check_attrs(node, schema)
    _check_dtypes(node, schema)


def _check_arity(node: Node, s: Schema) -> None:
    n_in, n_out = len(node.inputs), len(node.outputs)
    if not s.min_inputs <= n_in <= s.max_inputs:
        raise ModelError(
            f"node {node.label}: {n_in} inputs, but {node.op_type}-{s.since} takes "
            f"{_range(s.min_inputs, s.max_inputs)}"
        )
    if not s.min_outputs <= n_out <= s.max_outputs:
        raise ModelError(
            f"node {node.label}: {n_out} outputs, but {node.op_type}-{s.since} produces "
            f"{_range(s.min_outputs, s.max_outputs)}"
        )
    for i, v in enumerate(node.inputs):
        p = s.input_param(i)
        if v is None and p is not None and p.option == "single":
            raise ModelError(f"node {node.label}: required input {i} ({p.name!r}) is missing")


def _range(lo: int, hi: int) -> str:
    if hi >= 2**31 - 1:
        return f"at least {lo}"
    return f"exactly {lo}" if lo == hi else f"{lo} to {hi}"


def _check_attrs(node: Node, s: Schema) -> None:
    types = getattr(node, "attr_types", {})
    for name in node.attrs:
        spec = s.attrs.get(name)
        if spec is None:
            known = ", ".join(sorted(s.attrs)) or "none"
            raise ModelError(
                f"node {node.label}: unknown attribute {name!r} for {node.op_type}-{s.since} "
                f"(known: {known})"
            )
        got = _ATTR_NAME(types[name]) if name in types else None
        if got is not None and got != spec.type and spec.type != "UNDEFINED":
            raise ModelError(
                f"node {node.label}: attribute {name!r} must be {spec.type}, got {got}"
            )
    for name, spec in s.attrs.items():
        if spec.required and name not in node.attrs:
            raise ModelError(f"node {node.label}: required attribute {name!r} is missing")
    contract = node.opdef.contract if node.opdef is not None else None
    if contract is None:
        return
    for name, rule in contract.allowed.items():
        if name in node.attrs and not rule.accepts(node.attrs[name]):
            raise ModelError(
                f"node {node.label}: attribute {name!r} = {node.attrs[name]!r} is not allowed; "
                f"expected {rule.describe()}"
            )


def _check_dtypes(node: Node, s: Schema) -> None:
    bound: dict[str, tuple[str, str]] = {}
    for i, v in enumerate(node.inputs):
        p = s.input_param(i)
        if v is None or p is None or v.kind != "tensor" or v.fact.dtype is None:
            continue
        allowed = s.allowed_dtypes(p.type_str)
        what = f"input {i} ({p.name!r} = {v.name!r})"
        if allowed is not None and v.fact.dtype not in allowed:
            raise ModelError(
                f"node {node.label}: {what} has dtype {v.fact.dtype}, but {node.op_type}-{s.since} "
                f"allows {p.type_str} in {{{', '.join(sorted(allowed))}}}"
            )
        if p.type_str in s.type_constraints and p.homogeneous:
            prev = bound.get(p.type_str)
            if prev is not None and prev[0] != v.fact.dtype:
                raise ModelError(
                    f"node {node.label}: {what} has dtype {v.fact.dtype}, but {prev[1]} bound "
                    f"type {p.type_str} to {prev[0]}"
                )
            bound.setdefault(p.type_str, (v.fact.dtype, what))


def graphs_of(model: Model) -> list[Graph]:
    """The main graph and every subgraph, outermost first."""
    out = [model.graph]
    for n in model.graph.all_nodes():
        out.extend(n.subgraphs())
    return out
