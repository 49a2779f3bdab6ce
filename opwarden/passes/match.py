"""Pattern tests the level-2 passes share: what a node is, what it reads, what it applies.

Every test here only looks at the graph (nothing is edited): whether a node is a standard
operator of some types, a value's fully known shape, the other input of a binary node, an
addition, a per-channel constant, the activation a node (or a FusedConv) applies, the
activations that commute with max pooling, and the weights and geometry of a convolution the
convolution-merging passes can combine. Editing helpers live in `rewrite`.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from opwarden.ir.graph import Node, Value
from opwarden.ops.select import kernel_kwargs
from opwarden.passes.rewrite import Rewriter

FLOAT = frozenset({"float16", "float32", "float64", "bfloat16"})
CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
ACT_TYPES = {"activation": onnx.AttributeProto.STRING,
             "activation_params": onnx.AttributeProto.FLOATS}

# Activations that never decrease (given their parameters), so that f(max(a, b)) = max(f(a),
# f(b)): they commute with max pooling. NaN stays NaN either way (each maps NaN to NaN and no
# number to NaN), and a pool window always holds at least one input element, so padding's
# -inf never reaches an output through f.
MONOTONE = ("Relu", "LeakyRelu", "Clip", "Sigmoid", "Tanh")


def is_std(node: Node | None, *types: str) -> bool:
    """node is a standard (default-domain) operator of one of `types`."""
    return node is not None and not node.domain and node.op_type in types


def known_shape(v: Value | None) -> tuple | None:
    """v's shape when every dimension is known (an int or a symbolic name)."""
    if v is None or v.fact.shape is None or any(d is None for d in v.fact.shape):
        return None
    return tuple(v.fact.shape)


def other_input(node: Node, v: Value) -> Value | None:
    """For a binary node reading v once, its other input."""
    if len(node.inputs) != 2 or sum(x is v for x in node.inputs) != 1:
        return None
    return node.inputs[1] if node.inputs[0] is v else node.inputs[0]


def is_add(node: Node) -> bool:
    """A two-input addition with numpy broadcasting (Add from opset 7, or a binary Sum)."""
    if is_std(node, "Add"):
        return node.opdef is not None and node.opdef.since >= 7
    return is_std(node, "Sum") and len(node.inputs) == 2


def channel_vector(k: np.ndarray, rank: int, m: int) -> np.ndarray | None:
    """k as a length-m float64 vector if it varies only along axis 1 of a rank-`rank` tensor."""
    if k.ndim > rank or k.dtype.kind != "f":
        return None
    shape = (1,) * (rank - k.ndim) + k.shape
    if rank < 2 or any(d != 1 for i, d in enumerate(shape) if i != 1) or shape[1] not in (1, m):
        return None
    return np.broadcast_to(k.astype(np.float64).reshape(-1), (m,)).copy()


def activation_of(rw: Rewriter, c: Node | None, y: Value) -> tuple[str, list[float]] | None:
    """(activation, activation_params) if node c applies a fusable activation to y: an ONNX
    activation operator, or com.microsoft QuickGelu (x sigmoid(alpha x): "Swish" [alpha])."""
    if c is None or not c.inputs or c.inputs[0] is not y or c.opdef is None:
        return None
    if len(c.outputs) != 1:
        return None
    t = c.op_type
    if c.domain == "com.microsoft" and t == "QuickGelu":
        return "Swish", [float(kernel_kwargs(c).get("alpha", 1.702))]
    if c.domain:
        return None
    if t == "Swish":
        return t, [float(kernel_kwargs(c).get("alpha", 1.0))]
    if t in ("Relu", "Sigmoid", "Tanh", "HardSwish"):
        return t, []
    if t == "LeakyRelu":
        return t, [float(kernel_kwargs(c).get("alpha", 0.01))]
    if t == "Gelu":
        return t, [1.0 if kernel_kwargs(c).get("approximate", "none") == "tanh" else 0.0]
    if t == "Clip":
        if c.opdef.since < 11:
            kw = kernel_kwargs(c)
            return t, [float(kw.get("min", -math.inf)), float(kw.get("max", math.inf))]
        bounds = []
        for i, default in ((1, -math.inf), (2, math.inf)):
            v = c.inputs[i] if len(c.inputs) > i else None
            if v is None:
                bounds.append(default)
                continue
            k = rw.const(v)
            if k is None or k.size != 1:
                return None
            bounds.append(float(k.reshape(-1)[0]))
        return t, bounds
    return None


def silu_chain(rw: Rewriter, y: Value) -> list[Node] | None:
    """[Sigmoid, Mul] when y's readers are exactly Sigmoid(y) and Mul(y, Sigmoid(y)) (either
    operand order), the Sigmoid read by that Mul alone: SiLU as exporters write it, the
    activation "Swish" with params [1.0]. Float dtypes, the Mul's result of y's dtype (its
    shape is y's: both operands have it)."""
    if (id(y) in rw.outputs or len(y.uses) != 2 or not rw.local_uses(y)
            or y.fact.dtype not in FLOAT):
        return None
    for s, _ in y.uses:
        if (not is_std(s, "Sigmoid") or s.opdef is None or id(s) in rw.removed
                or len(s.inputs) != 1 or len(s.outputs) != 1):
            continue
        t = s.outputs[0]
        m = rw.single_use(t)
        if not is_std(m, "Mul") or m.opdef is None or len(m.outputs) != 1:
            continue
        if other_input(m, t) is not y or m.outputs[0] is None:
            continue
        if m.outputs[0].fact.dtype != y.fact.dtype:
            continue
        if all(n is s or n is m for n, _ in y.uses):
            return [s, m]
    return None


def fused_activation(node: Node) -> tuple[str, list[float]] | None:
    """A FusedConv's (activation, activation_params), or None when it applies none."""
    if node.domain != "opwarden" or node.op_type != "FusedConv" or \
            not node.attrs.get("activation"):
        return None
    return (str(node.attrs["activation"]),
            [float(v) for v in node.attrs.get("activation_params") or ()])


def monotone(act: str, params: list[float]) -> bool:
    """The activation never decreases with these parameters (see MONOTONE)."""
    if act == "LeakyRelu":
        return (params[0] if params else 0.01) >= 0
    return act in MONOTONE


def const_conv(rw: Rewriter, node: Node | None) -> tuple | None:
    """(W, B or None, pads, strides, dilations, activation, params, auto_pad) of a live 2-D
    group-1 Conv/FusedConv with constant float32 weights (and bias), no residual, channel
    shuffle or branches and explicit or VALID padding; None for any other node. What the
    passes merging sibling convolutions need to know of each."""
    if node is None or id(node) in rw.removed or node.opdef is None:
        return None
    if (node.op_type, node.domain) not in (("Conv", ""), ("FusedConv", "opwarden")):
        return None
    ins = node.inputs
    if ins[0] is None or node.outputs[0] is None or (len(ins) > 3 and ins[3] is not None):
        return None
    w = rw.const(ins[1])
    bv = ins[2] if len(ins) > 2 else None
    b = None if bv is None else rw.const(bv)
    if w is None or w.ndim != 4 or w.dtype != np.float32 or (bv is not None and b is None):
        return None
    a = node.attrs
    if int(a.get("group", 1)) != 1 or int(a.get("input_shuffle", 0) or 0) > 1:
        return None
    auto_pad = a.get("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if a.get("branches") or auto_pad not in ("NOTSET", "VALID"):
        return None
    pads = [int(q) for q in (a.get("pads") or (0, 0, 0, 0))]
    strides = tuple(int(q) for q in (a.get("strides") or (1, 1)))
    dil = tuple(int(q) for q in (a.get("dilations") or (1, 1)))
    act = str(a.get("activation", "") or "")
    params = tuple(float(q) for q in (a.get("activation_params") or ()))
    return w, b, pads, strides, dil, act, params, auto_pad


def joined_bias(biases: list, sizes: list[int]) -> np.ndarray:
    """The biases of merged convolutions end to end, zeros for those without one."""
    return np.concatenate([np.zeros(m, np.float32) if b is None else b.astype(np.float32)
                           for b, m in zip(biases, sizes, strict=True)])
