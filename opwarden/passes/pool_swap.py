"""`avgpool_conv_reorder` (level 2): an AveragePool and a 1x1 convolution swap places when
the other order costs less.

Both are linear per pixel, so they commute when each pool window's weights sum to one or the
convolution has no bias (`_avg_commutes`). The pool goes first when it shrinks the image
(DenseNet's transitions: the 1x1 then runs on a quarter of the pixels), after the
convolution when that has fewer output than input channels (BN-Inception's pool
projections: the 3x3 pool over 128 channels instead of 576). A convolution's activation
stays after both (its own node when the pool moves after the convolution). Exact but for
rounding.
"""

from __future__ import annotations

import math

from opwarden.contract import TensorFact
from opwarden.ir.graph import Node
from opwarden.passes.match import FLOAT, MONOTONE, fused_activation, is_std, known_shape
from opwarden.passes.rewrite import (
    PassResult,
    Rewriter,
    activation_node,
    conv_copy,
    pool_copy,
    static_shape,
)

# Relative cost of one pooling element-op (memory-bound, one NumPy pass per tap) against one
# multiply-add of a 1x1 convolution's GEMM (measured on the zoo's shapes).
_POOL_OP_COST = 20


def _cheaper(now: float, new: float) -> bool:
    """Whether the reordered pair's cost `new` beats `now` (tests force every legal swap)."""
    return new < now


def _pointwise_conv(rw: Rewriter, node: Node | None) -> bool:
    """A 1x1, stride-1, unpadded convolution (Conv or FusedConv without residual, branches or
    input shuffle) with a static 4-D input and constant weights: a per-pixel linear map."""
    if node is None or id(node) in rw.removed or node.opdef is None:
        return False
    if not (is_std(node, "Conv") or (node.domain == "opwarden" and node.op_type == "FusedConv")):
        return False
    a = node.attrs
    if a.get("branches") or int(a.get("input_shuffle", 0) or 0) > 1:
        return False
    if len(node.inputs) > 3 and node.inputs[3] is not None:
        return False
    if a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        return False
    x, w = node.inputs[0], node.inputs[1]
    ws = None if w is None else known_shape(w)
    if ws is None or len(ws) != 4 or tuple(ws[2:]) != (1, 1) or rw.const(w) is None:
        return False
    if any(int(v) != 1 for v in a.get("strides") or ()) or any(int(v) for v in a.get("pads") or ()):
        return False
    return x is not None and x.fact.static and len(x.fact.shape) == 4 and \
        x.fact.dtype in FLOAT


def _avg_commutes(rw: Rewriter, pool: Node, conv: Node) -> bool:
    """AveragePool and a 1x1 convolution commute when each window's weights sum to one
    (count_include_pad off, or no padding at all) or the convolution has no bias: then
    pool(W x + b) = W pool(x) + b at every output pixel."""
    a = pool.attrs
    if len(a.get("kernel_shape") or ()) != 2 or any(int(v) != 1 for v in a.get("dilations") or ()):
        return False
    if not int(a.get("count_include_pad", 0)):
        return True
    padded = (any(int(v) for v in a.get("pads") or ()) or int(a.get("ceil_mode", 0))
              or a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"))
    if not padded:
        return True
    bias = conv.inputs[2] if len(conv.inputs) > 2 else None
    if bias is None:
        return True
    b = rw.const(bias)
    return b is not None and not b.any()


def _pool_first(rw: Rewriter, res: PassResult, pool: Node, conv: Node, xs, ys, k: int) -> None:
    """conv -> pool  =>  pool -> conv, when pooling first costs less."""
    out = pool.outputs[0]
    p_in, p_out = xs[2] * xs[3], ys[2] * ys[3]
    c_in, c_out = conv.inputs[0].fact.shape[1], xs[1]
    now = c_in * c_out * p_in + _POOL_OP_COST * k * c_out * p_out
    new = _POOL_OP_COST * k * c_in * p_out + c_in * c_out * p_out
    if not _cheaper(now, new):
        return
    src = conv.inputs[0]
    pooled = rw.new_value(f"{pool.name}_first",
                          TensorFact(src.fact.dtype, (xs[0], c_in, ys[2], ys[3])))
    rw.remove(pool)
    rw.remove(conv)
    rw.place(pool_copy(rw, pool, src, pooled), pool)
    rw.place(conv_copy(rw, conv, pooled, out, True), pool)
    res.details["AveragePool before a 1x1 convolution"] += 1
    res.changes += 1


def _pool_after(rw: Rewriter, res: PassResult, pool: Node, conv: Node, xs, ys, k: int) -> None:
    """pool -> conv [-> act]  =>  conv -> pool [-> act], when pooling after costs less."""
    x = pool.inputs[0]
    p_in, p_out = xs[2] * xs[3], ys[2] * ys[3]
    y = conv.outputs[0]
    act = fused_activation(conv)
    if act is not None and act[0] not in MONOTONE:  # those activation_node writes
        return
    c_in, c_out = xs[1], known_shape(conv.inputs[1])[0]
    extra = _POOL_OP_COST * c_out * p_out if act else 0  # the activation's own pass
    now = _POOL_OP_COST * k * c_in * p_out + c_in * c_out * p_out
    new = c_in * c_out * p_in + _POOL_OP_COST * k * c_out * p_out + extra
    if not _cheaper(now, new):
        return
    pre = rw.new_value(f"{conv.name}_full", TensorFact(y.fact.dtype, (xs[0], c_out,
                                                                       xs[2], xs[3])))
    rw.remove(pool)
    rw.remove(conv)
    rw.place(conv_copy(rw, conv, x, pre, False), conv)
    if act is None:
        rw.place(pool_copy(rw, pool, pre, y), conv)
    else:
        pooled = rw.new_value(f"{pool.name}_pooled", y.fact)
        rw.place(pool_copy(rw, pool, pre, pooled), conv)
        rw.place(activation_node(rw, act[0], act[1], pooled, y, f"{pool.name}_{act[0]}",
                                 [conv]), conv)
    res.details["AveragePool after a 1x1 convolution"] += 1
    res.changes += 1


def avgpool_conv_reorder(rw: Rewriter) -> PassResult:
    """An AveragePool next to a 1x1 convolution (both linear per pixel, see _avg_commutes)
    runs on whichever side costs less (see the module docstring)."""
    res = PassResult()
    for pool in rw.graph.nodes:
        if id(pool) in rw.removed or not is_std(pool, "AveragePool") or not pool.inputs:
            continue
        x, out = pool.inputs[0], pool.outputs[0]
        xs, ys = static_shape(x), static_shape(out)
        if xs is None or ys is None or len(xs) != 4 or len(ys) != 4 or \
                out.fact.dtype != x.fact.dtype:
            continue
        k = math.prod(int(v) for v in pool.attrs["kernel_shape"])
        conv = x.producer
        after = rw.single_use(x) is pool and _pointwise_conv(rw, conv) and \
            not conv.attrs.get("activation") and len(conv.outputs) == 1
        if after and _avg_commutes(rw, pool, conv):
            _pool_first(rw, res, pool, conv, xs, ys, k)
            continue
        conv = rw.single_use(out)
        if not _pointwise_conv(rw, conv) or conv.inputs[0] is not out or \
                not _avg_commutes(rw, pool, conv):
            continue
        _pool_after(rw, res, pool, conv, xs, ys, k)
    return res
