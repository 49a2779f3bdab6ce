"""Check every node of a loaded model against its operator's schema and contract."""

from __future__ import annotations

import onnx

from opwarden.errors import ModelError, UnsupportedOpError
from opwarden.ir.graph import Graph, Model, Node
from opwarden.ops import REGISTRY
from opwarden.ops.schema import Schema

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


# Window attributes ONNX defines as positive: a zero or negative one (kernel_shape -2**63)
# sends the pooling kernels' band planning into an endless loop.
_POSITIVE_INTS = frozenset({"kernel_shape", "strides", "dilations"})


def _check_attrs(node: Node, s: Schema) -> None:
    types = getattr(node, "attr_types", {})
    if node.domain == "":
        for name in _POSITIVE_INTS.intersection(node.attrs):
            vals = node.attrs[name]
            if isinstance(vals, (list, tuple)) and any(
                    isinstance(v, int) and v < 1 for v in vals):
                raise ModelError(
                    f"node {node.label}: attribute {name!r} = {list(vals)} must hold positive "
                    "values"
                )
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
        if v is not None and p is not None and v.kind in ("sequence", "map", "optional") and (
                s.allowed_dtypes(p.type_str) is not None):  # a constraint of tensor types only
            raise ModelError(
                f"node {node.label}: input {i} ({p.name!r} = {v.name!r}) is a {v.kind}, but "
                f"{node.op_type}-{s.since} takes a tensor ({p.type_str}) there"
            )
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


# Integer attributes onnx's C++ shape inference reads as axes or dimension counts: values far
# past any rank (LayerNormalization axis=2**31 and up, GatherND batch_dims=-7) make it index
# out of bounds and crash the interpreter. No model has a rank near this bound.
_INDEX_ATTRS = frozenset({"axis", "axes", "perm", "batch_dims", "batch_axis", "time_axis"})
MAX_INDEX_ATTR = 1 << 20
# Attributes that count dimensions and must not be negative.
_NON_NEGATIVE = {("GatherND", "batch_dims")}
_ELEM_TYPES = frozenset(onnx.TensorProto.DataType.values())


def sanity_before_inference(proto: onnx.ModelProto) -> None:
    """Refuse (ModelError) what crashes onnx's own shape inference rather than being
    diagnosed by it: index-like integer attributes of absurd magnitude, element types that are
    not TensorProto data types, and negative declared dims, in the main graph, every subgraph
    and every function body. Runs on the protobuf, before `onnx.shape_inference`."""
    _check_graphs(proto.graph, "graph")
    for f in proto.functions:
        where = f"function {f.domain}/{f.name}"
        for i, n in enumerate(f.node):
            _check_node_attrs(n, where, i)
            for label, sub in _attr_graphs(n, where, i):
                _check_graphs(sub, label)


def _check_graphs(graph: onnx.GraphProto, label: str) -> None:
    # Labels are built only for an error or a subgraph: this runs over every node of a load.
    for where, g in _proto_graphs(graph, label):
        for field_ in ("input", "output", "value_info"):
            for vi in getattr(g, field_):
                _check_type(vi.type, where, field_, vi.name)
        for t in g.initializer:
            if t.data_type not in _ELEM_TYPES:
                raise ModelError(
                    f"{where} initializer {t.name!r} has data_type {t.data_type}, which is "
                    "not a TensorProto data type"
                )
        for i, n in enumerate(g.node):
            _check_node_attrs(n, where, i)


def _label(n: onnx.NodeProto, where: str, i: int) -> str:
    return f"{where} node {repr(n.name) if n.name else f'#{i}'} ({n.op_type})"


_GRAPH, _GRAPHS = onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS


def _attr_graphs(n: onnx.NodeProto, where: str, i: int):
    for a in n.attribute:
        if a.type == _GRAPH:
            yield f"{_label(n, where, i)} attribute {a.name!r}", a.g
        elif a.type == _GRAPHS:
            for j, sub in enumerate(a.graphs):
                yield f"{_label(n, where, i)} attribute {a.name!r}[{j}]", sub


def _proto_graphs(g: onnx.GraphProto, where: str):
    """(description, graph) for g and every subgraph in it, iteratively (deep nesting)."""
    stack = [(where, g)]
    while stack:
        where, g = stack.pop()
        yield where, g
        for i, n in enumerate(g.node):
            stack.extend(_attr_graphs(n, where, i))


def _check_node_attrs(n: onnx.NodeProto, where: str, i: int) -> None:
    for a in n.attribute:
        if a.name not in _INDEX_ATTRS:
            continue
        vals = [a.i] if a.type == onnx.AttributeProto.INT else (
            list(a.ints) if a.type == onnx.AttributeProto.INTS else [])
        for v in vals:
            if abs(v) > MAX_INDEX_ATTR:
                raise ModelError(
                    f"{_label(n, where, i)}: attribute {a.name!r} = {v} is not a plausible "
                    f"axis or rank (|value| > {MAX_INDEX_ATTR})"
                )
            if v < 0 and (n.op_type, a.name) in _NON_NEGATIVE and n.domain in ("", "ai.onnx"):
                raise ModelError(
                    f"{_label(n, where, i)}: attribute {a.name!r} = {v} must not be negative"
                )


def _check_type(tp: onnx.TypeProto, where: str, field_: str, name: str) -> None:
    """Element types and dims of a (possibly nested) TypeProto, iteratively."""
    stack = [tp]
    while stack:
        t = stack.pop()
        which = t.WhichOneof("value")
        if which in ("tensor_type", "sparse_tensor_type"):
            tt = getattr(t, which)
            if tt.elem_type not in _ELEM_TYPES:
                raise ModelError(
                    f"{where} {field_} {name!r} has element type {tt.elem_type}, which is not "
                    "a TensorProto data type"
                )
            for k, d in enumerate(tt.shape.dim):
                if d.dim_value < 0:  # 0 when unset or a dim_param
                    raise ModelError(
                        f"{where} {field_} {name!r} declares dimension {k} as {d.dim_value}; "
                        "dims cannot be negative"
                    )
        elif which == "sequence_type":
            stack.append(t.sequence_type.elem_type)
        elif which == "optional_type":
            stack.append(t.optional_type.elem_type)
        elif which == "map_type":
            if t.map_type.key_type not in _ELEM_TYPES:
                raise ModelError(
                    f"{where} {field_} {name!r} has map key type {t.map_type.key_type}, which "
                    "is not a TensorProto data type"
                )
            stack.append(t.map_type.value_type)


def graphs_of(model: Model) -> list[Graph]:
    """The main graph and every subgraph, outermost first."""
    out = [model.graph]
    for n in model.graph.all_nodes():
        out.extend(n.subgraphs())
    return out
