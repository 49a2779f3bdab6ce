"""Level-1 folding passes: `constant_folding` and `shape_folding`.

A node whose inputs are all constants is evaluated now with its reference kernel, and the
Shape or Size of a tensor with a static shape becomes a constant; either way the result is a
new initializer and the node goes. Folding stops where the result would be large (see
FOLD_MAX_BYTES) or disagree with what shape inference promised, and graph outputs stay
computed. The other level-1 passes: `identity` and `dead_code`.
"""

from __future__ import annotations

import math

import numpy as np

from opwarden.contract import TensorFact
from opwarden.dtypes import dtype_name
from opwarden.ir.graph import Node
from opwarden.ops.select import kernel_kwargs
from opwarden.passes.rewrite import PassResult, Rewriter, static_shape

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


def constant_folding(rw: Rewriter) -> PassResult:
    """Evaluate nodes whose inputs are all constants with their reference kernels."""
    res = PassResult()
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
                got = node.opdef.reference(*consts, **kw)
        except Exception:  # noqa: BLE001 - the node then fails (with its context) when run
            continue
        got = list(got) if isinstance(got, tuple) else [got]
        if len(got) < len(node.outputs):
            continue
        arrays = [None if v is None else np.asarray(r) for v, r in zip(node.outputs, got)]
        if sum(a.nbytes for a in arrays if a is not None) > limit:
            continue
        if not all(_agrees(v.fact, a) for v, a in zip(node.outputs, arrays) if v is not None):
            continue
        _store_const(rw, node, arrays)
        res.details[node.op_type] += 1
        res.changes += 1
    return res


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


def shape_folding(rw: Rewriter) -> PassResult:
    """Shape and Size of tensors with a static shape become constants."""
    res = PassResult()
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
        res.details[node.op_type] += 1
        res.changes += 1
    return res
