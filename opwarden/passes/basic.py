"""Level-1 passes: shape folding, constant folding, identity elimination, dead-code elimination."""

from __future__ import annotations

import math

import numpy as np

from opwarden.contract import TensorFact
from opwarden.dtypes import dtype_name
from opwarden.ir.graph import Node
from opwarden.ops.select import kernel_kwargs
from opwarden.passes.rewrite import Rewriter, static_shape

# A folded constant may be this large, or as large as the constants it replaces.
FOLD_MAX_BYTES = 1 << 24
# Ops whose output can be far larger than their inputs: folded only with a static output fact.
_GROWING = frozenset({
    "ConstantOfShape", "Expand", "Tile", "Range", "Resize", "Upsample", "Pad", "OneHot",
    "EyeLike", "ConvTranspose", "Col2Im", "CenterCropPad", "MelWeightMatrix",
    "HammingWindow", "HannWindow", "BlackmanWindow",
})


def _nbytes(fact: TensorFact) -> int | None:
    if not fact.static:
        return None
    size = math.prod(fact.shape)
    try:
        item = np.dtype(fact.dtype).itemsize if fact.dtype not in (None, "string") else 8
    except TypeError:
        item = 8
    return size * item


def _fold_target(node: Node) -> bool:
    """Could this node be evaluated now? (pure, tensors only, no subgraphs)."""
    if node.opdef is None or node.subgraphs() or not node.opdef.contract.deterministic:
        return False
    return all(v is None or v.kind == "tensor" for v in node.outputs)


def _store_const(rw: Rewriter, node: Node, arrays: list[np.ndarray | None]) -> None:
    for v, arr in zip(node.outputs, arrays):
        if v is None:
            continue
        arr = np.asarray(arr)
        arr.flags.writeable = False
        v.const = arr
        v.producer = None
        v.fact = TensorFact(dtype_name(arr.dtype), arr.shape)
        rw.graph.initializers[v.name] = v
    rw.remove(node)


def constant_folding(rw: Rewriter) -> None:
    """Evaluate nodes whose inputs are all constants with their reference kernels."""
    for node in rw.graph.nodes:
        consts = [rw.const(v) if v is not None else None for v in node.inputs]
        if any(c is None and v is not None for c, v in zip(consts, node.inputs)):
            continue
        if not _fold_target(node):
            continue
        if any(v is not None and id(v) in rw.outputs for v in node.outputs):
            continue  # a graph output stays computed: callers may mutate what run() returns
        in_bytes = sum(c.nbytes for c in consts if c is not None)
        limit = max(FOLD_MAX_BYTES, in_bytes)
        sizes = [_nbytes(v.fact) for v in node.outputs if v is not None]
        if any(s is None for s in sizes):
            if node.op_type in _GROWING:
                continue
        elif sum(sizes) > limit:
            continue
        ref = next(v for v in node.opdef.variants if v.reference)
        kw = kernel_kwargs(node)
        if ref.wants_noutputs:
            kw["noutputs"] = len(node.outputs)
        try:
            with np.errstate(all="ignore"):
                res = node.opdef.reference(*consts, **kw)
        except Exception:  # noqa: BLE001 - the node then fails (with its context) when run
            continue
        res = list(res) if isinstance(res, tuple) else [res]
        if len(res) < len(node.outputs):
            continue
        arrays = [None if v is None else np.asarray(r) for v, r in zip(node.outputs, res)]
        if sum(a.nbytes for a in arrays if a is not None) > limit:
            continue
        if not all(_agrees(v.fact, a) for v, a in zip(node.outputs, arrays) if v is not None):
            continue
        _store_const(rw, node, arrays)
        rw.stats[node.op_type] += 1
        rw.changes += 1


def _agrees(fact: TensorFact, a: np.ndarray) -> bool:
    """The computed constant matches what shape inference promised (else leave the node)."""
    if a.dtype == object:
        return fact.dtype in (None, "string")
    if fact.dtype is not None and dtype_name(a.dtype) != fact.dtype:
        return False
    if fact.shape is not None:
        if len(fact.shape) != a.ndim:
            return False
        return all(not isinstance(d, int) or d == n for d, n in zip(fact.shape, a.shape))
    return True


def shape_folding(rw: Rewriter) -> None:
    """Shape and Size of tensors with a static shape become constants."""
    for node in rw.graph.nodes:
        if node.op_type not in ("Shape", "Size") or node.domain or node.opdef is None:
            continue
        out = node.outputs[0]
        shape = static_shape(node.inputs[0])
        if shape is None or out is None or id(out) in rw.outputs:
            continue
        if node.op_type == "Size":
            arr = np.asarray(math.prod(shape), dtype=np.int64)
        else:
            start = int(node.attrs.get("start", 0))
            end = node.attrs.get("end")
            arr = np.asarray(shape[start:None if end is None else int(end)], dtype=np.int64)
        _store_const(rw, node, [arr])
        rw.stats[node.op_type] += 1
        rw.changes += 1


_SINGLE_INPUT_IDENTITY = frozenset({"Concat", "Sum", "Max", "Min", "Mean"})
_SAME_SHAPE_IDENTITY = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Expand"})


def _is_noop(rw: Rewriter, node: Node) -> bool:
    x, y = node.inputs[0] if node.inputs else None, node.outputs[0]
    if x is None or y is None or x.kind != "tensor":
        return False
    if any(v is not None and (v.uses or id(v) in rw.outputs) for v in node.outputs[1:]):
        return False  # a second output (Dropout's mask) is still read
    t = node.op_type
    if t == "Identity":
        return True
    if t == "Dropout":
        if node.opdef.since < 7:
            return bool(node.attrs.get("is_test", 0))
        if node.opdef.since < 12:
            return True
        mode = node.inputs[2] if len(node.inputs) > 2 else None
        if mode is None:
            return True
        c = rw.const(mode)
        return c is not None and c.size == 1 and not bool(c.reshape(-1)[0])
    if x.fact.dtype is None or y.fact.dtype != x.fact.dtype:
        return False
    if t == "Cast":
        return True
    if t in _SINGLE_INPUT_IDENTITY:
        return len(node.inputs) == 1
    if t in _SAME_SHAPE_IDENTITY:
        sx, sy = static_shape(x), static_shape(y)
        if sy is None and t == "Reshape":
            sy = _reshape_target(rw, node, sx)
        return sx is not None and sx == sy
    if t == "Transpose":
        perm = node.attrs.get("perm")
        if perm is None:
            return x.fact.ndim is not None and x.fact.ndim <= 1
        return list(perm) == list(range(len(perm)))
    return False


def _reshape_target(rw: Rewriter, node: Node, sx: tuple[int, ...] | None):
    """The static output shape of a Reshape with a constant shape input, if computable."""
    shape = rw.const(node.inputs[1]) if len(node.inputs) > 1 else None
    if sx is None or shape is None or shape.ndim != 1 or shape.dtype.kind not in "iu":
        return None
    allowzero = int(node.attrs.get("allowzero", 0))
    dims = [int(d) for d in shape]
    out = []
    for i, d in enumerate(dims):
        if d == 0 and not allowzero:
            if i >= len(sx):
                return None
            d = sx[i]
        out.append(d)
    if out.count(-1) > 1:
        return None
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        if known <= 0 or math.prod(sx) % known:
            return None
        out[out.index(-1)] = math.prod(sx) // known
    return tuple(out) if math.prod(out) == math.prod(sx) else None


def identity_elimination(rw: Rewriter) -> None:
    """Drop nodes that return their input: Identity, inference Dropout, Cast to the same type,
    Reshape/Flatten/Squeeze/Unsqueeze/Expand to the same shape, identity Transpose,
    single-input Concat/Sum/Max/Min/Mean."""
    for node in rw.graph.nodes:
        if node.domain or node.opdef is None or id(node) in rw.removed:
            continue
        if not _is_noop(rw, node):
            continue
        if rw.bypass(node, node.outputs[0], node.inputs[0]):
            rw.remove(node)
            rw.stats[node.op_type] += 1
            rw.changes += 1


def dead_code_elimination(rw: Rewriter) -> None:
    """Remove nodes none of whose outputs is read or is a graph output."""
    # Uses lost to removed readers are counted and the use lists filtered once at the end:
    # removing readers one by one rescans a value's uses per reader (quadratic when a value
    # that transpose cancellation left feeding thousands of dead nodes is read by all).
    dropped: dict[int, int] = {}
    dead: list[Node] = []
    for node in reversed(rw.graph.nodes):
        if id(node) in rw.removed:
            continue
        if any(v is not None and (len(v.uses) > dropped.get(id(v), 0) or id(v) in rw.outputs)
               for v in node.outputs):
            continue
        for v in node.inputs:
            if v is not None:
                dropped[id(v)] = dropped.get(id(v), 0) + 1
        dead.append(node)
        rw.stats[node.op_type] += 1
        rw.changes += 1
    rw.remove_all(dead)
