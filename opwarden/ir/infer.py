"""What the loader knows of a model's values beyond their declarations: facts from inference.

`infer` runs onnx's shape inference on a light copy of the model (big weights given as typed
inputs), with the declared value_info and output shapes cleared so that what it returns is
verified, then compares the declarations with it (`Inferred`: the types, declared-only hints,
notes on contradictions). Pools with ceil_mode get the kernels' output shape (onnx keeps a last
window the spec drops), first by rerunning inference with the true shapes, then per node as
the graph is built (`pool_ceil_facts`). Custom-domain operators fill their outputs' facts from
their own shape rule (`custom_infer`), and a negative inferred dimension is refused
(`check_dims`) before memory is planned from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import onnx

from opwarden.contract import TensorFact, declared_value, has_declared, mark_declared
from opwarden.errors import ModelError
from opwarden.ir.graph import Node
from opwarden.ops.schema import attr_value, canonical_domain

SMALL_INITIALIZER = 4096  # elements; larger weights are given to shape inference as typed inputs


def _light_copy(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The model without big weight payloads, for shape inference (which serializes it)."""
    light = onnx.ModelProto()
    light.ir_version = max(proto.ir_version, 4)
    light.opset_import.extend(proto.opset_import)
    light.functions.extend(proto.functions)
    src, g = proto.graph, light.graph
    g.name = src.name
    g.node.extend(src.node)
    g.output.extend(src.output)
    g.value_info.extend(src.value_info)
    declared = {i.name for i in src.input}
    g.input.extend(src.input)
    for t in src.initializer:
        n = 1
        for d in t.dims:
            n *= d
        if n <= SMALL_INITIALIZER and t.data_location != onnx.TensorProto.EXTERNAL:
            g.initializer.append(t)
        elif t.name not in declared:
            g.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return light


@dataclass
class Inferred:
    """What shape inference tells about a model's values, and how its declarations fared.

    `types`: the verified types by name: inferred from the graph inputs, initializers and each
    operator's shape rule, with the declared value_info and graph-output shapes left out
    (declared element types kept). `hints`: the facts planning and the passes see where the
    declarations say more than inference could check (a custom operator without a rule, a dim
    inference left unknown), those dims marked declared-only (DeclaredDim). `notes`: one line
    per declaration that contradicts inference (the inferred fact wins, as in ONNX Runtime's
    lenient merge). `declared`: graph outputs whose declared shape is more than was verified."""

    types: dict[str, onnx.TypeProto]
    hints: dict[str, tuple] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    declared: dict[str, tuple] = field(default_factory=dict)


def _tensor_shape(tp: onnx.TypeProto | None) -> tuple | None:
    """A tensor type's shape as type_fact reads it (None: not a tensor, or no shape)."""
    which = tp.WhichOneof("value") if tp is not None else None
    if which not in ("tensor_type", "sparse_tensor_type"):
        return None
    tt = getattr(tp, which)
    if not tt.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                 for d in tt.shape.dim)


def _strip_declared(g: onnx.GraphProto) -> dict[str, tuple | None]:
    """Clear the shapes of `g`'s value_info and outputs (element types stay: inference needs
    them where it cannot tell, custom operators); returns the declared shapes by name."""
    declared: dict[str, tuple | None] = {}
    for vi in list(g.value_info) + list(g.output):
        which = vi.type.WhichOneof("value")
        if which not in ("tensor_type", "sparse_tensor_type"):
            continue
        tt = getattr(vi.type, which)
        if tt.HasField("shape"):
            declared.setdefault(vi.name, _tensor_shape(vi.type))
            tt.ClearField("shape")
    return declared


def _set_shape(g: onnx.GraphProto, name: str, elem: int, shape) -> None:
    """Give inference `shape` for `name` (a graph output's type, else a value_info entry)."""
    vi = onnx.helper.make_tensor_value_info(name, elem, list(shape))
    outs = [vo for vo in g.output if vo.name == name]
    if outs:
        outs[0].CopyFrom(vi)
        return
    kept = [v for v in g.value_info if v.name != name]
    del g.value_info[:]
    g.value_info.extend(kept)
    g.value_info.append(vi)


def _run_inference(light: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    return _types(onnx.shape_inference.infer_shapes(
        light, check_type=False, strict_mode=False).graph)


def _merge_declared(decl: tuple, inf: tuple | None) -> tuple[str, tuple | None]:
    """How a declared shape compares with the inferred one: ("conflict", None) when they
    cannot both hold; ("adds", merged) when the declaration gives dims inference left
    unknown (merged: inferred dims, declared ones where inference knows none); ("refines",
    None) when it only pins inferred symbols ('N' -> 7: the symbol, bound from the feeds, is
    the checked fact); ("agrees", None) otherwise."""
    if inf is None:
        return "adds", decl
    if len(decl) != len(inf):
        return "conflict", None
    merged: list[Any] = []
    adds, refines = False, False
    for d, i in zip(decl, inf):
        if isinstance(i, int):
            if isinstance(d, int) and d != i:
                return "conflict", None
            merged.append(i)
        elif isinstance(i, str):
            refines = refines or isinstance(d, int)
            merged.append(i)
        else:
            adds = adds or d is not None
            merged.append(d)
    if adds:
        return "adds", tuple(merged)
    return ("refines" if refines else "agrees"), None


def infer(proto: onnx.ModelProto) -> Inferred:
    """Types of every value shape inference can tell (failures leave facts unknown), checked
    against the model's declarations (see Inferred)."""
    try:
        light = _light_copy(proto)
        declared = _strip_declared(light.graph)
        types = _run_inference(light)
    except Exception:  # noqa: BLE001 - onnx's inference raises on many malformed models
        # Nothing verified: every declaration stands, as a hint only.
        types = _types(proto.graph)
        hints = {vi.name: mark_declared(_tensor_shape(vi.type))
                 for vi in list(proto.graph.value_info) + list(proto.graph.output)
                 if _tensor_shape(vi.type) is not None}
        return Inferred(types, hints)
    fixes = _ceil_pool_fixes(light.graph, types)
    if fixes:
        # Inference again with the pools' true shapes given: everything after them follows.
        for name, (elem, shape) in fixes.items():
            _set_shape(light.graph, name, elem, shape)
        try:
            types = _run_inference(light)
        except Exception:  # noqa: BLE001 - keep the first answer; the builder corrects the pools
            pass
    return _check_declared(types, declared, {o.name for o in proto.graph.output})


def _check_declared(types: dict[str, onnx.TypeProto], declared: dict[str, tuple | None],
                    outputs: set[str]) -> Inferred:
    """Compare the declarations with the verified `types`. Declared dims inference left
    unknown become hints (not propagated by a second inference: nothing plans from a hint,
    and exporters declare the values that follow too)."""
    out = Inferred(types)
    adds: dict[str, tuple | None] = {}
    for name, decl in declared.items():
        if decl is None:
            continue
        inf = _tensor_shape(types.get(name))
        verdict, merged = _merge_declared(decl, inf)
        if verdict == "conflict":
            assert inf is not None  # only an inferred shape can contradict a declaration
            what = "graph output" if name in outputs else "value"
            out.notes.append(
                f"{what} {name!r}: the model declares shape {list(decl)}, but shape inference "
                f"gives {list(inf)}; the inferred shape is used")
            continue
        if verdict == "adds":
            adds[name] = merged
        if name in outputs and verdict in ("adds", "refines"):
            out.declared[name] = decl
    for name, shape in adds.items():
        inf = _tensor_shape(types.get(name))
        axes = None if inf is None else {k for k, i in enumerate(inf) if i is None}
        out.hints[name] = mark_declared(shape, axes)
    return out


def _types(g: onnx.GraphProto) -> dict[str, onnx.TypeProto]:
    return {vi.name: vi.type for vi in list(g.input) + list(g.value_info) + list(g.output)
            if vi.HasField("type")}


# The attribute types pool geometry reads; others (tensors, which could name external files)
# are left for the builder and validation.
_GEOMETRY_ATTRS = (onnx.AttributeProto.INT, onnx.AttributeProto.INTS, onnx.AttributeProto.STRING)


def _ceil_pool_fixes(g: onnx.GraphProto, types: dict) -> dict[str, tuple[int, list[int]]]:
    """Outputs of ceil_mode pools whose inferred shape is not the kernels' (see
    pool_ceil_facts): name -> (element type, shape)."""
    fixes: dict[str, tuple[int, list[int]]] = {}
    for n in g.node:
        if canonical_domain(n.domain) != "" or n.op_type not in _POOLS or not n.input:
            continue
        t = types.get(n.input[0])
        if t is None or not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
            continue
        dims = t.tensor_type.shape.dim
        if any(not d.HasField("dim_value") for d in dims):
            continue
        a = {at.name: attr_value(at) for at in n.attribute if at.type in _GEOMETRY_ATTRS}
        shape = _ceil_pool_shape(a, [d.dim_value for d in dims])
        if shape is None:
            continue
        want = list(shape)
        for k, o in enumerate(n.output):
            ot = types.get(o) if o else None
            if ot is None or not ot.HasField("tensor_type"):
                continue
            have = [d.dim_value if d.HasField("dim_value") else None
                    for d in ot.tensor_type.shape.dim]
            if have != want:
                elem = int(ot.tensor_type.elem_type or (
                    onnx.TensorProto.INT64 if k else t.tensor_type.elem_type))
                fixes[o] = (elem, want)
    return fixes


_POOLS = ("MaxPool", "AveragePool", "LpPool")


def _ceil_pool_shape(attrs: dict, xs) -> tuple[int, ...] | None:
    """The output shape the pooling kernels give a ceil_mode pool over a static input of shape
    `xs` (ops.pool's own geometry); None without ceil_mode or with invalid attributes, which
    validation reports."""
    from opwarden.ops.pool import pool_geometry

    if not int(attrs.get("ceil_mode", 0)):
        return None
    try:
        out = pool_geometry(tuple(xs), attrs.get("kernel_shape"), attrs.get("strides"),
                     attrs.get("dilations"), attrs.get("pads"),
                     attrs.get("auto_pad", "NOTSET"), 1)[5]
    except Exception:  # noqa: BLE001 - invalid attributes are validation's to report
        return None
    return tuple(xs[:2]) + tuple(out)


def pool_ceil_facts(node: Node, corrected: set[int]) -> None:
    """Correct onnx's shape inference for pools with ceil_mode (onnx 1.23 keeps a last window
    that starts inside the end padding; the spec's reference, ORT and our kernels drop it):
    planned buffers are sized from these facts, and an elementwise kernel would broadcast a
    smaller result into the larger buffer. `infer` already reran inference with the true shapes
    (main graph); this is the net for what that missed (subgraphs, a failed second run): values
    downstream of a pool corrected here get unknown shapes (sized at run time) unless a custom
    operator's own rule fills them in."""
    if any(v is not None and id(v) in corrected for v in node.inputs):
        for v in node.outputs:
            if v is not None and v.fact.shape is not None:
                v.fact = TensorFact(v.fact.dtype, None)
                corrected.add(id(v))
        return
    if node.domain or node.op_type not in _POOLS:
        return
    x = node.inputs[0] if node.inputs else None
    shape = None if x is None or not x.fact.static else _ceil_pool_shape(node.attrs,
                                                                         x.fact.shape)
    if shape is None:
        return
    for v in node.outputs:
        if v is not None and v.fact.shape is not None and tuple(v.fact.shape) != shape:
            v.fact = TensorFact(v.fact.dtype, shape)
            corrected.add(id(v))


def custom_infer(node: Node, notes: list[str] | None = None) -> None:
    """Fill unknown output facts of a custom-domain node from its operator's `.infer` rule; a
    rule's shape also replaces one only the declaration gave (a conflict is noted). Dims the
    rule derives from declared-only input dims stay declared-only."""
    from opwarden.errors import OpwardenError
    from opwarden.ops import REGISTRY
    from opwarden.ops.schema import STANDARD_DOMAINS

    if node.domain in STANDARD_DOMAINS:
        return
    try:
        opdef, schema = REGISTRY.resolve(node.op_type, node.domain, node.opset)
    except OpwardenError:
        return  # unknown operators are reported by validation
    if opdef is None or opdef.infer_fn is None:
        return
    facts = [v.fact if v is not None else None for v in node.inputs]
    kw = {k: a.default for k, a in schema.attrs.items() if a.has_default}
    kw.update(node.attrs)
    try:
        res = opdef.infer_fn(*facts, **kw)
    except OpwardenError as e:
        raise ModelError(f"node {node.label}: shape rule of {opdef.qualname}: {e}") from None
    except Exception:  # noqa: BLE001 - a rule that cannot decide leaves the facts unknown
        return
    res = list(res) if isinstance(res, (tuple, list)) else [res]
    tainted = any(v is not None and has_declared(v.fact.shape) for v in node.inputs)
    for v, fact in zip(node.outputs, res):
        if v is None or not isinstance(fact, TensorFact):
            continue
        cur, ruled = v.fact.shape, fact.shape
        if ruled is not None and tainted:
            ruled = mark_declared(ruled)
        if ruled is not None and cur is not None and has_declared(cur):
            if notes is not None and _contradicts(cur, ruled):
                notes.append(
                    f"value {v.name!r}: the model declares shape {list(cur)}, but the shape "
                    f"rule of {opdef.qualname} gives {list(ruled)}; the rule's shape is used")
            cur = None
        if v.fact.dtype is None or cur is None:
            v.fact = TensorFact(v.fact.dtype or fact.dtype, cur if cur is not None else ruled)


def _contradicts(a: tuple, b: tuple) -> bool:
    """Can no tensor have both shapes (rank, or a static dim, differs)?"""
    xs, ys = [declared_value(d) for d in a], [declared_value(d) for d in b]
    return len(xs) != len(ys) or any(
        isinstance(x, int) and isinstance(y, int) and x != y for x, y in zip(xs, ys))


def check_dims(node: Node) -> None:
    """A negative dimension in an output's fact (shape inference's answer for, say, a Conv
    kernel larger than its static input) is a model no feed can run; refused here, before
    memory is planned from it."""
    for k, v in enumerate(node.outputs):
        if v is None or not v.fact.shape:
            continue
        shape = v.fact.shape
        for axis, d in enumerate(shape):
            if isinstance(d, int) and d < 0:
                raise ModelError(
                    f"node {node.label}: output {k} ({v.name!r}) has inferred shape "
                    f"{list(shape)}, dimension {axis} is {d}; the node cannot produce it from "
                    "its inputs' shapes"
                )
