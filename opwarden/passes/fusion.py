"""Level-2 passes: BatchNorm folding, Conv/Gemm/MatMul fusion, transposes, elementwise chains."""

from __future__ import annotations

import math

import numpy as np
import onnx

from opwarden.contract import TensorFact
from opwarden.ir.graph import Node, Value
from opwarden.ops.select import kernel_kwargs
from opwarden.passes.rewrite import Rewriter, static_shape

_FLOAT = frozenset({"float16", "float32", "float64", "bfloat16"})
_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
_ACT_TYPES = {"activation": onnx.AttributeProto.STRING,
              "activation_params": onnx.AttributeProto.FLOATS}


def _std(node: Node | None, *types: str) -> bool:
    return node is not None and not node.domain and node.op_type in types


def _known_shape(v: Value | None) -> tuple | None:
    """v's shape when every dimension is known (an int or a symbolic name)."""
    if v is None or v.fact.shape is None or any(d is None for d in v.fact.shape):
        return None
    return tuple(v.fact.shape)


def _other(node: Node, v: Value) -> Value | None:
    """For a binary node reading v once, its other input."""
    if len(node.inputs) != 2 or sum(x is v for x in node.inputs) != 1:
        return None
    return node.inputs[1] if node.inputs[0] is v else node.inputs[0]


def _is_add(node: Node) -> bool:
    if _std(node, "Add"):
        return node.opdef is not None and node.opdef.since >= 7
    return _std(node, "Sum") and len(node.inputs) == 2


def channel_vector(k: np.ndarray, rank: int, m: int) -> np.ndarray | None:
    """k as a length-m float64 vector if it varies only along axis 1 of a rank-`rank` tensor."""
    if k.ndim > rank or k.dtype.kind != "f":
        return None
    shape = (1,) * (rank - k.ndim) + k.shape
    if rank < 2 or any(d != 1 for i, d in enumerate(shape) if i != 1) or shape[1] not in (1, m):
        return None
    return np.broadcast_to(k.astype(np.float64).reshape(-1), (m,)).copy()


# ---------------------------------------------------------------------------------------------
# Affine steps after a Conv or BatchNormalization: y -> y * scale + shift, per channel


def _bn_affine(rw: Rewriter, bn: Node, m: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(scale, shift) of an inference BatchNormalization with constant parameters."""
    if not _std(bn, "BatchNormalization") or bn.opdef is None or len(bn.outputs) != 1:
        return None
    kw = kernel_kwargs(bn)
    if kw.get("training_mode", 0):
        return None
    params = [rw.const(v) for v in bn.inputs[1:5]]
    if len(params) != 4 or any(p is None or p.shape != (m,) or p.dtype.kind != "f"
                               for p in params):
        return None
    scale, bias, mean, var = (p.astype(np.float64) for p in params)
    s = scale / np.sqrt(var + float(kw.get("epsilon", 1e-5)))
    return s, bias - mean * s


def _affine_step(rw: Rewriter, c: Node, y: Value, rank: int, m: int):
    """(scale, shift) if consumer c of y is a per-channel affine map of y, else None."""
    if c.inputs and c.inputs[0] is y and _std(c, "BatchNormalization"):
        return _bn_affine(rw, c, m)
    if not _std(c, "Mul", "Add", "Sum", "Sub", "Div") or c.opdef is None:
        return None
    if c.op_type != "Sum" and c.opdef.since < 7:
        return None  # legacy broadcast attributes
    z = _other(c, y)
    k = rw.const(z)
    if k is None or k.dtype.name != y.fact.dtype:
        return None
    vec = channel_vector(k, rank, m)
    if vec is None:
        return None
    ones, zeros = np.ones(m), np.zeros(m)
    if c.op_type == "Mul":
        return vec, zeros
    if _is_add(c):
        return ones, vec
    if c.op_type == "Sub" and c.inputs[0] is y:
        return ones, -vec
    if c.op_type == "Div" and c.inputs[0] is y:
        return 1.0 / vec, zeros
    return None


def _absorb_affine(rw: Rewriter, y: Value, rank: int, m: int, scale, shift):
    """Fold the chain of single-use affine consumers after y; (last value, scale, shift, n)."""
    n = 0
    while True:
        c = rw.single_use(y)
        if c is None or c.outputs[0] is None or len(c.outputs) != 1:
            break
        step = _affine_step(rw, c, y, rank, m)
        if step is None:
            break
        s, t = step
        scale, shift = scale * s, shift * s + t
        rw.remove(c)
        y = c.outputs[0]
        n += 1
    return y, scale, shift, n


def conv_bn_folding(rw: Rewriter) -> None:
    """Fold BatchNormalization, and Mul/Add/Sub/Div by per-channel constants, into the
    preceding Conv's weights and bias."""
    for node in rw.graph.nodes:
        if not _std(node, "Conv") or id(node) in rw.removed or node.opdef is None:
            continue
        w = rw.const(node.inputs[1])
        bv = node.inputs[2] if len(node.inputs) > 2 else None
        b = rw.const(bv) if bv is not None else None
        y = node.outputs[0]
        if w is None or w.dtype.kind != "f" or (bv is not None and b is None) or y is None:
            continue
        if y.fact.dtype is not None and y.fact.dtype != w.dtype.name:
            continue
        m = w.shape[0]
        shift = b.astype(np.float64) if b is not None else np.zeros(m)
        last, scale, shift, n = _absorb_affine(rw, y, w.ndim, m, np.ones(m), shift)
        if not n:
            continue
        # In W's own dtype: the scale is rounded once, and ResNet-50's 25M weights are not
        # converted to float64 and back at load.
        new_w = w * scale.astype(w.dtype).reshape((m,) + (1,) * (w.ndim - 1))
        wv = rw.new_const(f"{node.name}_W_folded", new_w)
        bv2 = rw.new_const(f"{node.name}_B_folded", shift.astype(w.dtype))
        rw.set_input(node, 1, wv)
        if len(node.inputs) < 3:
            node.inputs.append(None)
        rw.set_input(node, 2, bv2)
        node.outputs[0] = last
        last.producer = node
        rw.stats["folded_nodes"] += n
        rw.stats["convs"] += 1
        rw.changes += n


def bn_to_affine(rw: Rewriter) -> None:
    """An inference BatchNormalization not after a Conv (and the per-channel Mul/Add after it)
    becomes one Mul and one Add by per-channel constants, ready for elementwise fusion."""
    default = rw.model.opsets.get("", 0)
    if default < 7:
        return
    for node in rw.graph.nodes:
        if not _std(node, "BatchNormalization") or id(node) in rw.removed:
            continue
        x, y = node.inputs[0], node.outputs[0]
        if x is None or y is None or x.fact.ndim is None or x.fact.ndim < 2:
            continue
        if x.fact.dtype not in ("float32", "float64"):
            continue
        sc = rw.const(node.inputs[1]) if len(node.inputs) > 1 else None
        if sc is None:
            continue
        m, rank = sc.shape[0] if sc.ndim == 1 else -1, x.fact.ndim
        first = _bn_affine(rw, node, m)
        if first is None:
            continue
        last, scale, shift, n = _absorb_affine(rw, y, rank, m, *first)
        dt = np.dtype(x.fact.dtype)
        cshape = (m,) + (1,) * (rank - 2)
        s = rw.new_const(f"{node.name}_scale", scale.astype(dt).reshape(cshape))
        t = rw.new_const(f"{node.name}_shift", shift.astype(dt).reshape(cshape))
        mid = rw.new_value(f"{node.name}_scaled", last.fact)
        mul = rw.make_node("Mul", [x, s], [mid], {}, name=f"{node.name}_mul", domain="",
                           opset=default)
        add = rw.make_node("Add", [mid, t], [last], {}, name=f"{node.name}_add", domain="",
                           opset=default)
        rw.remove(node)
        anchor = node
        rw.place(mul, anchor)
        rw.place(add, anchor)
        rw.stats["BatchNormalization"] += 1
        rw.stats["absorbed"] += n
        rw.changes += 1


def _positive_channels(k: np.ndarray | None, rank: int, m: int) -> np.ndarray | None:
    """k as a length-m vector when it is a finite per-channel constant of an NC... tensor of
    `rank` (shape (m, 1, ..) or (1, m, 1, ..)) with every entry > 0, else None."""
    if k is None or rank < 3:
        return None
    c = channel_vector(k, rank, m)
    if c is None or not np.all(np.isfinite(c)) or not np.all(c > 0):
        return None
    return c


def scale_into_conv(rw: Rewriter) -> None:
    """relu(x * s + t) read only by group-1 convolutions with constant weights, s a positive
    per-channel constant: relu(x * s + t) = s * relu(x + t / s), and s moves into each
    convolution's weights along their input channels (zero padding commutes with it). The
    multiply pass disappears: DenseNet's BatchNorm + Relu before each 1x1 convolution, 3.5%
    of the model on the NumPy path."""
    for mul in rw.graph.nodes:
        if not _std(mul, "Mul") or id(mul) in rw.removed or mul.outputs[0] is None:
            continue
        x, sv = mul.inputs[0], mul.inputs[1]
        if rw.const(x) is not None:
            x, sv = sv, x
        rank = x.fact.ndim if x is not None else None
        if rank is None or rank < 3 or x.fact.dtype not in _FLOAT:
            continue
        m = x.fact.shape[1]
        if not isinstance(m, int) or tuple(mul.outputs[0].fact.shape or ()) != tuple(x.fact.shape):
            continue
        s = _positive_channels(rw.const(sv), rank, m)
        add = rw.single_use(mul.outputs[0])
        if s is None or not _std(add, "Add"):
            continue
        j = 0 if add.inputs[0] is mul.outputs[0] else 1
        tv = add.inputs[1 - j]
        tk = rw.const(tv)
        t = None if tk is None else channel_vector(tk, rank, m)
        relu = rw.single_use(add.outputs[0])
        if t is None or not _std(relu, "Relu") or relu.outputs[0] is None:
            continue
        y = relu.outputs[0]
        if id(y) in rw.outputs or not y.uses or not rw.local_uses(y):
            continue
        convs = [n for n, i in y.uses]
        if not all(
            i == 0 and _std(n, "Conv") and int(n.attrs.get("group", 1)) == 1
            and (w := rw.const(n.inputs[1])) is not None and w.ndim == rank and w.shape[1] == m
            for n, i in y.uses
        ):
            continue
        dt = np.dtype(x.fact.dtype)
        cshape = (m,) + (1,) * (rank - 2)
        rw.set_input(add, j, x)
        rw.set_input(add, 1 - j, rw.new_const(f"{add.name}_shift", (t / s).astype(dt)
                                              .reshape(cshape)))
        rw.remove(mul)
        wshape = (1, m) + (1,) * (rank - 2)
        for n in convs:
            w = rw.const(n.inputs[1])
            rw.set_input(n, 1, rw.new_const(f"{n.name}_W_scaled",
                                            (w * s.reshape(wshape)).astype(w.dtype)))
        rw.stats["Mul"] += 1
        rw.stats["convolutions"] += len(convs)
        rw.changes += 1


# ---------------------------------------------------------------------------------------------
# Conv / Gemm / MatMul + bias + activation


def activation_of(rw: Rewriter, c: Node | None, y: Value) -> tuple[str, list[float]] | None:
    """(activation, activation_params) if node c applies a fusable activation to y."""
    if c is None or c.domain or not c.inputs or c.inputs[0] is not y or c.opdef is None:
        return None
    if len(c.outputs) != 1:
        return None
    t = c.op_type
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


def _fuse(rw: Rewriter, op_type: str, nodes: list[Node], inputs, attrs, attr_types) -> None:
    out = nodes[-1].outputs[0]
    rw.remove_all(nodes)
    fused = rw.make_node(op_type, inputs, [out], attrs, name=f"{nodes[0].name}_fused",
                         attr_types=attr_types)
    rw.place(fused, nodes[-1])
    rw.stats[op_type] += 1
    rw.stats["+".join(n.op_type for n in nodes)] += 1
    rw.changes += len(nodes) - 1


def _with_act(rw: Rewriter, nodes: list[Node], attrs: dict) -> None:
    """Extend a chain with the activation after its last node, if there is one: an
    activation operator, or the exact Gelu spelled out in Div/Erf/Add/Mul nodes (one pass
    over the tensor instead of six; the result differs from the unfused chain by float32
    rounding only, the kernel rounding once where the chain rounded after each node)."""
    y = nodes[-1].outputs[0]
    c = rw.single_use(y)
    act = activation_of(rw, c, y)
    if act is not None:
        nodes.append(c)
        attrs["activation"], attrs["activation_params"] = act[0], act[1]
        return
    gelu = _gelu_chain(rw, y) if y.fact.dtype in _FLOAT else None
    if gelu is not None:
        nodes.extend(gelu)
        attrs["activation"], attrs["activation_params"] = "Gelu", [0.0]


def conv_fusion(rw: Rewriter) -> None:
    """Conv [+ residual Add] [+ activation] -> FusedConv (bias, Z, activation in one node)."""
    for node in rw.graph.nodes:
        if not _std(node, "Conv") or id(node) in rw.removed or node.opdef is None:
            continue
        y = node.outputs[0]
        if y is None or y.fact.dtype not in _FLOAT:
            continue
        nodes, z = [node], None
        c = rw.single_use(y)
        if c is not None and _is_add(c):
            other = _other(c, y)
            if (other is not None and other.fact.dtype == y.fact.dtype
                    and _known_shape(other) is not None and _known_shape(other) == _known_shape(y)):
                z = other
                nodes.append(c)
        attrs = {k: v for k, v in node.attrs.items() if k in _CONV_ATTRS}
        _with_act(rw, nodes, attrs)
        if len(nodes) == 1:
            continue
        b = node.inputs[2] if len(node.inputs) > 2 else None
        ins = [node.inputs[0], node.inputs[1], b, z]
        while ins and ins[-1] is None:
            ins.pop()
        types = {k: t for k, t in getattr(node, "attr_types", {}).items() if k in _CONV_ATTRS}
        _fuse(rw, "FusedConv", nodes, ins, attrs, {**types, **_ACT_TYPES})


def _const_conv(rw: Rewriter, node: Node | None) -> tuple | None:
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


def _joined_bias(biases: list, sizes: list[int]) -> np.ndarray:
    """The biases of merged convolutions end to end, zeros for those without one."""
    return np.concatenate([np.zeros(m, np.float32) if b is None else b.astype(np.float32)
                           for b, m in zip(biases, sizes, strict=True)])


def _branch_conv(rw: Rewriter, v: Value, concat: Node) -> tuple | None:
    """(conv node, W, B, (kh, kw), pads, key) when v is output 0 of a _const_conv with
    explicit pads, read only by `concat`; key holds what siblings must share (input, strides,
    dilations, activation)."""
    p = v.producer
    if p is None or p.outputs[0] is not v or rw.single_use(v) is not concat:
        return None
    c = _const_conv(rw, p)
    if c is None or c[7] != "NOTSET":
        return None
    w, b, pads, strides, dil, act, params, _ = c
    return p, w, b, w.shape[2:], pads, (id(p.inputs[0]), strides, dil, act, params)


def concat_conv_merge(rw: Rewriter) -> None:
    """Concat along the channels of sibling convolutions of one input (SqueezeNet's fire
    module: a 1x1 and a 3x3 expand) -> one FusedConv with `branches`: W holds each branch's
    kernel centred in the largest, the Concat's copies and the separate passes over X go. The
    fast kernels run it as one convolution while X is finite (a zero tap times a finite input
    is an exact zero) and branch by branch otherwise, so NaN and Inf stay where the separate
    convolutions put them. Convolutions of one kernel size concatenate exactly (no branches)."""
    for node in rw.graph.nodes:
        if not _std(node, "Concat") or id(node) in rw.removed or len(node.inputs) < 2:
            continue
        y = node.outputs[0]
        shape = _known_shape(y)
        if shape is None or len(shape) != 4 or int(node.attrs.get("axis", 1)) % 4 != 1:
            continue
        parts = [_branch_conv(rw, v, node) if v is not None else None for v in node.inputs]
        if any(q is None for q in parts) or len({id(q[0]) for q in parts}) != len(parts):
            continue
        if len({q[5] for q in parts}) != 1:
            continue
        kh = max(q[3][0] for q in parts)
        kw = max(q[3][1] for q in parts)
        big = next((q for q in parts if tuple(q[3]) == (kh, kw)), None)
        if big is None:  # (e.g. 1x3 and 3x1: no branch has the whole kernel)
            continue
        _x, strides, dil, act, params = parts[0][5]
        pads = big[4]
        ok = True
        for q in parts:
            oh, ow = kh - q[3][0], kw - q[3][1]
            if oh % 2 or ow % 2:
                ok = False
                break
            want = [pads[0] - oh // 2 * dil[0], pads[1] - ow // 2 * dil[1],
                    pads[2] - oh // 2 * dil[0], pads[3] - ow // 2 * dil[1]]
            if q[4] != want:
                ok = False
                break
        if not ok:
            continue
        ms = [int(q[1].shape[0]) for q in parts]
        c = int(parts[0][1].shape[1])
        w_all = np.zeros((sum(ms), c, kh, kw), np.float32)
        m0 = 0
        for q, m in zip(parts, ms, strict=True):
            oh, ow = (kh - q[3][0]) // 2, (kw - q[3][1]) // 2
            w_all[m0:m0 + m, :, oh:oh + q[3][0], ow:ow + q[3][1]] = q[1]
            m0 += m
        b_all = _joined_bias([q[2] for q in parts], ms)
        first = parts[0][0]
        x = first.inputs[0]
        attrs = {"kernel_shape": [kh, kw], "pads": pads, "strides": list(strides),
                 "dilations": list(dil), "group": 1}
        ints = onnx.AttributeProto.INTS
        types = {"kernel_shape": ints, "pads": ints, "strides": ints, "dilations": ints,
                 "group": onnx.AttributeProto.INT}
        if any(tuple(q[3]) != (kh, kw) for q in parts):
            attrs["branches"] = [v for q, m in zip(parts, ms, strict=True)
                                 for v in (m, int(q[3][0]), int(q[3][1]))]
            types["branches"] = ints
        if act:
            attrs.update(activation=act, activation_params=list(params))
            types.update(_ACT_TYPES)
        for q in parts:
            rw.remove(q[0])
        rw.remove(node)
        fused = rw.make_node(
            "FusedConv",
            [x, rw.new_const(f"{first.name}_concat_W", w_all),
             rw.new_const(f"{first.name}_concat_B", b_all)],
            [y], attrs, name=f"{node.name}_convs", attr_types=types)
        rw.place(fused, node)
        rw.stats["concats of convolutions merged"] += 1
        rw.stats["convolutions merged"] += len(parts)
        rw.changes += len(parts)


def _pointwise_key(rw: Rewriter, node: Node) -> tuple[tuple, tuple] | None:
    """(what sibling 1x1 convolutions must share to become one: (input, strides, activation,
    params); node's _const_conv) or None unless node is an unpadded 1x1 _const_conv with
    float32 input and output."""
    c = _const_conv(rw, node)
    if c is None or c[0].shape[2:] != (1, 1) or any(c[2]):
        return None
    x, y = node.inputs[0], node.outputs[0]
    if y.fact.dtype != "float32" or x.fact.dtype != "float32":
        return None
    return (id(x), c[3], c[5], c[6]), c


def sibling_conv_merge(rw: Rewriter) -> None:
    """Sibling 1x1 convolutions of one input with the same strides and activation (Inception's
    branch heads) -> one FusedConv producing all their output channels, then a Split back into
    the original outputs. One GEMM reads the input once and has a wider output: measured
    25-35% faster than the separate convolutions on Inception's shapes (e.g. 14x14x576 ->
    224+64+96: 782 -> 574 us), the Split's copies included in the in-model figures."""
    groups: dict[tuple, list[tuple[Node, tuple]]] = {}
    for node in rw.graph.nodes:
        found = _pointwise_key(rw, node)
        if found is not None:
            groups.setdefault(found[0], []).append((node, found[1]))
    opset = rw.model.opsets.get("", 1)
    for (_x, strides, act, params), group in groups.items():
        if len(group) < 2:
            continue
        members = [n for n, _ in group]
        convs = [c for _, c in group]
        ws = [c[0] for c in convs]
        sizes = [int(w.shape[0]) for w in ws]
        first = members[0]
        w_all = rw.new_const(f"{first.name}_siblings_W", np.concatenate(ws, axis=0))
        b_all = rw.new_const(f"{first.name}_siblings_B",
                             _joined_bias([c[1] for c in convs], sizes))
        y0 = first.outputs[0]
        shape = None
        if y0.fact.shape is not None and len(y0.fact.shape) == 4:
            shape = (y0.fact.shape[0], sum(sizes), *y0.fact.shape[2:])
        y_all = rw.new_value(f"{first.name}_siblings", TensorFact("float32", shape))
        attrs = {"strides": list(strides), "kernel_shape": [1, 1], "group": 1}
        types = {"strides": onnx.AttributeProto.INTS, "kernel_shape": onnx.AttributeProto.INTS,
                 "group": onnx.AttributeProto.INT}
        if act:
            attrs.update(activation=act, activation_params=list(params))
            types.update(_ACT_TYPES)
        x = first.inputs[0]
        outs = [n.outputs[0] for n in members]
        for n in members:
            rw.remove(n)
        merged = rw.make_node("FusedConv", [x, w_all, b_all], [y_all], attrs,
                              name=f"{first.name}_siblings", attr_types=types)
        split_ins: list[Value | None] = [y_all]
        split_attrs: dict = {"axis": 1}
        split_types = {"axis": onnx.AttributeProto.INT}
        if opset >= 13:
            split_ins.append(rw.new_const(f"{first.name}_siblings_split",
                                          np.array(sizes, np.int64)))
        else:
            split_attrs["split"] = sizes
            split_types["split"] = onnx.AttributeProto.INTS
        split = rw.make_node("Split", split_ins, outs, split_attrs,
                             name=f"{first.name}_siblings_split", domain="", opset=opset,
                             attr_types=split_types)
        rw.place(merged, first)
        rw.place(split, first)
        rw.stats["1x1 convolutions merged"] += len(members)
        rw.stats["merged groups"] += 1
        rw.changes += len(members)


# Activations that never decrease (given their parameters), so that f(max(a, b)) = max(f(a),
# f(b)): they commute with max pooling. NaN stays NaN either way (each maps NaN to NaN and no
# number to NaN), and a pool window always holds at least one input element, so padding's
# -inf never reaches an output through f.
_MONOTONE = ("Relu", "LeakyRelu", "Clip", "Sigmoid", "Tanh")


def _monotone(act: str, params: list[float]) -> bool:
    if act == "LeakyRelu":
        return (params[0] if params else 0.01) >= 0
    return act in _MONOTONE


def _activation_node(rw: Rewriter, act: str, params: list[float], x: Value, y: Value,
                     name: str) -> Node:
    """y = act(x) as a standard node (FusedConv's activation_params conventions)."""
    opset = rw.model.opsets.get("", 0)
    attrs: dict = {}
    types: dict = {}
    ins: list[Value | None] = [x]
    if act == "LeakyRelu":
        attrs["alpha"] = float(params[0] if params else 0.01)
        types["alpha"] = onnx.AttributeProto.FLOAT
    elif act == "Clip":
        lo = float(params[0]) if len(params) > 0 else -math.inf
        hi = float(params[1]) if len(params) > 1 else math.inf
        if opset >= 11:
            dt = np.dtype(y.fact.dtype)
            ins += [rw.new_const(f"{name}_min", np.array(lo, dt)),
                    rw.new_const(f"{name}_max", np.array(hi, dt))]
        else:
            attrs.update(min=lo, max=hi)
            types.update(min=onnx.AttributeProto.FLOAT, max=onnx.AttributeProto.FLOAT)
    return rw.make_node(act, ins, [y], attrs, name=name, domain="", opset=opset,
                        attr_types=types)


def _fused_activation(node: Node) -> tuple[str, list[float]] | None:
    """A FusedConv's (activation, activation_params), or None when it applies none."""
    if node.domain != "opwarden" or node.op_type != "FusedConv" or \
            not node.attrs.get("activation"):
        return None
    return (str(node.attrs["activation"]),
            [float(v) for v in node.attrs.get("activation_params") or ()])


def _conv_copy(rw: Rewriter, conv: Node, x: Value, y: Value, keep_act: bool) -> Node:
    attrs = {k: v for k, v in conv.attrs.items()
             if keep_act or k not in ("activation", "activation_params")}
    types = {k: t for k, t in getattr(conv, "attr_types", {}).items() if k in attrs}
    return rw.make_node(conv.op_type, [x, *conv.inputs[1:]], [y], attrs, name=conv.name,
                        domain=conv.domain, opset=conv.opset, attr_types=types)


def _pool_copy(rw: Rewriter, pool: Node, x: Value, y: Value) -> Node:
    return rw.make_node(pool.op_type, [x], [y], pool.attrs, name=pool.name, domain="",
                        opset=pool.opset, attr_types=getattr(pool, "attr_types", None))


def activation_after_maxpool(rw: Rewriter) -> None:
    """act then MaxPool (or GlobalMaxPool) becomes the pool then act, for an activation that
    never decreases (see _MONOTONE) applied by its own node or by a FusedConv, when the pool's
    output has fewer elements than its input: the activation then passes over the pooled
    tensor only (a quarter of it for a 3x3/2 pool), just written, instead of over the larger
    one (SqueezeNet's stem and fire modules, ResNet's and Inception's stems, VGG's block ends).
    Exact, NaN and Inf included. A moved activation can join the elementwise chain after the
    pool (elementwise_fusion runs later)."""
    if rw.model.opsets.get("", 0) < 6:  # (Clip and LeakyRelu as written here)
        return
    for node in rw.graph.nodes:
        if id(node) in rw.removed or not node.outputs or node.outputs[0] is None:
            continue
        y = node.outputs[0]
        if _std(node, *_MONOTONE):
            fused, act = False, activation_of(rw, node, node.inputs[0]) if node.inputs else None
        else:
            fused, act = True, _fused_activation(node)
        if act is None or not _monotone(*act) or y.fact.dtype not in _FLOAT:
            continue
        pool = rw.single_use(y)
        if not _std(pool, "MaxPool", "GlobalMaxPool") or pool.inputs[0] is not y:
            continue
        if any(o is not None for o in pool.outputs[1:]):  # MaxPool's Indices
            continue
        out = pool.outputs[0]
        xs, ys = static_shape(y), static_shape(out)
        if xs is None or ys is None or math.prod(ys) >= math.prod(xs) or \
                out.fact.dtype != y.fact.dtype:
            continue
        pooled = rw.new_value(f"{pool.name}_pooled", out.fact)
        rw.remove(pool)
        rw.remove(node)
        if fused:  # the convolution stays, without its activation
            rw.place(_conv_copy(rw, node, node.inputs[0], y, False), node)
        src = y if fused else node.inputs[0]
        rw.place(_pool_copy(rw, pool, src, pooled), pool)
        rw.place(_activation_node(rw, act[0], act[1], pooled, out, f"{pool.name}_{act[0]}"),
                 pool)
        rw.stats[f"{act[0]} after {pool.op_type}"] += 1
        rw.changes += 1


# Relative cost of one pooling element-op (memory-bound, one NumPy pass per tap) against one
# multiply-add of a 1x1 convolution's GEMM, measured on the zoo's shapes: a 3x3 AveragePool
# over 14x14x576 ~200 us (1M adds), the 576->128 1x1 GEMM on it ~145 us (14.5M MACs).
_POOL_OP_COST = 20


def _cheaper(now: float, new: float) -> bool:
    """Whether the reordered pair's cost `new` beats `now` (tests force every legal swap)."""
    return new < now


def _pointwise_conv(rw: Rewriter, node: Node | None) -> bool:
    """A 1x1, stride-1, unpadded convolution (Conv or FusedConv without residual, branches or
    input shuffle) with a static 4-D input and constant weights: a per-pixel linear map."""
    if node is None or id(node) in rw.removed or node.opdef is None:
        return False
    if not (_std(node, "Conv") or (node.domain == "opwarden" and node.op_type == "FusedConv")):
        return False
    a = node.attrs
    if a.get("branches") or int(a.get("input_shuffle", 0) or 0) > 1:
        return False
    if len(node.inputs) > 3 and node.inputs[3] is not None:
        return False
    if a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        return False
    x, w = node.inputs[0], node.inputs[1]
    ws = None if w is None else _known_shape(w)
    if ws is None or len(ws) != 4 or tuple(ws[2:]) != (1, 1) or rw.const(w) is None:
        return False
    if any(int(v) != 1 for v in a.get("strides") or ()) or any(int(v) for v in a.get("pads") or ()):
        return False
    return x is not None and x.fact.static and len(x.fact.shape) == 4 and \
        x.fact.dtype in _FLOAT


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


def avgpool_conv_reorder(rw: Rewriter) -> None:
    """An AveragePool next to a 1x1 convolution (both linear per pixel, see _avg_commutes)
    runs on whichever side costs less: before the convolution when it shrinks the image
    (DenseNet's transitions: the 1x1 then runs on a quarter of the pixels), after it when the
    convolution has fewer output than input channels (BN-Inception's pool projections: the
    3x3 pool over 128 channels instead of 576). A convolution's activation stays after both
    (its own node when the pool moves after the convolution). Exact but for rounding."""
    for pool in rw.graph.nodes:
        if id(pool) in rw.removed or not _std(pool, "AveragePool") or not pool.inputs:
            continue
        x, out = pool.inputs[0], pool.outputs[0]
        xs, ys = static_shape(x), static_shape(out)
        if xs is None or ys is None or len(xs) != 4 or len(ys) != 4 or \
                out.fact.dtype != x.fact.dtype:
            continue
        k = math.prod(int(v) for v in pool.attrs["kernel_shape"])
        p_in, p_out = xs[2] * xs[3], ys[2] * ys[3]
        conv = x.producer
        after = rw.single_use(x) is pool and _pointwise_conv(rw, conv) and \
            not conv.attrs.get("activation") and len(conv.outputs) == 1
        if after and _avg_commutes(rw, pool, conv):
            # conv -> pool  =>  pool -> conv, when pooling first costs less.
            c_in, c_out = conv.inputs[0].fact.shape[1], xs[1]
            now = c_in * c_out * p_in + _POOL_OP_COST * k * c_out * p_out
            new = _POOL_OP_COST * k * c_in * p_out + c_in * c_out * p_out
            if _cheaper(now, new):
                src = conv.inputs[0]
                pooled = rw.new_value(f"{pool.name}_first",
                                      TensorFact(src.fact.dtype, (xs[0], c_in, ys[2], ys[3])))
                rw.remove(pool)
                rw.remove(conv)
                rw.place(_pool_copy(rw, pool, src, pooled), pool)
                rw.place(_conv_copy(rw, conv, pooled, out, True), pool)
                rw.stats["AveragePool before a 1x1 convolution"] += 1
                rw.changes += 1
            continue
        conv = rw.single_use(out)
        if not _pointwise_conv(rw, conv) or conv.inputs[0] is not out or \
                not _avg_commutes(rw, pool, conv):
            continue
        # pool -> conv [-> act]  =>  conv -> pool [-> act], when pooling after costs less.
        y = conv.outputs[0]
        act = _fused_activation(conv)
        if act is not None and act[0] not in _MONOTONE:  # those _activation_node writes
            continue
        c_in, c_out = xs[1], _known_shape(conv.inputs[1])[0]
        extra = _POOL_OP_COST * c_out * p_out if act else 0  # the activation's own pass
        now = _POOL_OP_COST * k * c_in * p_out + c_in * c_out * p_out
        new = c_in * c_out * p_in + _POOL_OP_COST * k * c_out * p_out + extra
        if not _cheaper(now, new):
            continue
        pre = rw.new_value(f"{conv.name}_full", TensorFact(y.fact.dtype, (xs[0], c_out,
                                                                           xs[2], xs[3])))
        rw.remove(pool)
        rw.remove(conv)
        rw.place(_conv_copy(rw, conv, x, pre, False), conv)
        if act is None:
            rw.place(_pool_copy(rw, pool, pre, y), conv)
        else:
            pooled = rw.new_value(f"{pool.name}_pooled", y.fact)
            rw.place(_pool_copy(rw, pool, pre, pooled), conv)
            rw.place(_activation_node(rw, act[0], act[1], pooled, y, f"{pool.name}_{act[0]}"),
                     conv)
        rw.stats["AveragePool after a 1x1 convolution"] += 1
        rw.changes += 1


def _scalar(rw: Rewriter, v: Value | None, want: float) -> bool:
    """v is a one-element constant equal to `want` up to float32 rounding."""
    k = rw.const(v)
    if k is None or k.size != 1 or k.dtype.kind != "f":
        return False
    return abs(float(k.reshape(-1)[0]) - want) <= 1e-6 * abs(want)


def _binary(node: Node | None, op_type: str, v: Value) -> Value | None:
    """node's other input when node is the standard binary `op_type` reading v once."""
    return _other(node, v) if _std(node, op_type) and node.opdef is not None else None


def _erf_gelu(rw: Rewriter, erf: Node) -> tuple[Value, list[Node]] | None:
    """(x, nodes from the scaling to the last Mul) when `erf` is the middle of an exporter's
    exact Gelu, x * 0.5 * (1 + erf(x / sqrt 2)) in any of its usual orders:
    Div(x, sqrt2) or Mul(x, 1/sqrt2) -> Erf -> Add 1 -> then Mul x and Mul 0.5 (either
    first), or Mul with Mul(x, 0.5). Every intermediate has this chain as its only use."""
    u = erf.inputs[0] if erf.inputs else None
    scale = u.producer if u is not None else None
    if scale is None or rw.single_use(u) is not erf or id(scale) in rw.removed:
        return None
    if _std(scale, "Div") and len(scale.inputs) == 2 and _scalar(rw, scale.inputs[1],
                                                                   math.sqrt(2.0)):
        x = scale.inputs[0]
    elif _std(scale, "Mul") and len(scale.inputs) == 2:
        a, b = scale.inputs
        x = a if _scalar(rw, b, math.sqrt(0.5)) else b if _scalar(rw, a, math.sqrt(0.5)) else None
    else:
        return None
    if x is None or x is u:
        return None
    e = erf.outputs[0]
    add = rw.single_use(e)
    one = _binary(add, "Add", e)
    if one is None or not _scalar(rw, one, 1.0):
        return None
    t = add.outputs[0]
    m1 = rw.single_use(t)
    other = _binary(m1, "Mul", t)
    if other is None:
        return None
    nodes = [scale, erf, add, m1]
    if other is x:  # (x * (1 + erf)) * 0.5
        last = rw.single_use(m1.outputs[0])
        half = _binary(last, "Mul", m1.outputs[0])
        if half is None or not _scalar(rw, half, 0.5):
            return None
        nodes.append(last)
    elif _scalar(rw, other, 0.5):  # ((1 + erf) * 0.5) * x
        last = rw.single_use(m1.outputs[0])
        if _binary(last, "Mul", m1.outputs[0]) is not x:
            return None
        nodes.append(last)
    else:  # (x * 0.5) * (1 + erf)
        h = other.producer
        if (h is None or id(h) in rw.removed or rw.single_use(other) is not m1
                or not _scalar(rw, _binary(h, "Mul", x), 0.5)):
            return None
        nodes.insert(0, h)
    y = nodes[-1].outputs[0]
    if x.fact.dtype not in _FLOAT or y.fact.dtype != x.fact.dtype:
        return None
    if _known_shape(x) is None or _known_shape(x) != _known_shape(y):
        return None  # (a broadcasting constant would change the shape)
    return x, nodes


def _gelu_chain(rw: Rewriter, y: Value) -> list[Node] | None:
    """The nodes of an exporter's exact Gelu of y (see _erf_gelu) when they are all of y's
    readers (ONNX has a Gelu operator only from opset 20, so exports before it spell it out
    over 5-6 nodes); None otherwise."""
    if id(y) in rw.outputs or not rw.local_uses(y):
        return None
    for n, _ in y.uses:
        if not _std(n, "Div", "Mul") or id(n) in rw.removed:
            continue
        erf = rw.single_use(n.outputs[0])
        if not _std(erf, "Erf") or erf.opdef is None:
            continue
        found = _erf_gelu(rw, erf)
        if found is None or found[0] is not y:
            continue
        chain = found[1]
        if all(any(u is c for c in chain) for u, _ in y.uses):
            return chain
    return None


def gemm_fusion(rw: Rewriter) -> None:
    """Gemm + activation -> FusedGemm; MatMul [+ bias Add] [+ activation] -> FusedGemm (2-D)
    or FusedMatMul."""
    for node in rw.graph.nodes:
        if id(node) in rw.removed or node.opdef is None:
            continue
        y = node.outputs[0] if node.outputs else None
        if y is None or y.fact.dtype not in _FLOAT:
            continue
        if _std(node, "Gemm") and node.opdef.since >= 7:
            attrs = dict(node.attrs)
            nodes = [node]
            _with_act(rw, nodes, attrs)
            if len(nodes) > 1:
                types = dict(getattr(node, "attr_types", {}))
                _fuse(rw, "FusedGemm", nodes, list(node.inputs), attrs, {**types, **_ACT_TYPES})
            continue
        if not _std(node, "MatMul"):
            continue
        a, bm = node.inputs
        nodes, bias = [node], None
        c = rw.single_use(y)
        if c is not None and _is_add(c):
            other = _other(c, y)
            out = c.outputs[0]
            if (other is not None and other.fact.dtype == y.fact.dtype
                    and _known_shape(out) is not None and _known_shape(out) == _known_shape(y)):
                bias = other
                nodes.append(c)
        attrs: dict = {}
        _with_act(rw, nodes, attrs)
        if len(nodes) == 1:
            continue
        two_d = a.fact.ndim == 2 and bm.fact.ndim == 2
        if two_d and (bias is None or (bias.fact.ndim is not None and bias.fact.ndim <= 2)):
            ins = [a, bm] + ([bias] if bias is not None else [])
            _fuse(rw, "FusedGemm", nodes, ins, attrs, _ACT_TYPES)
        else:
            ins = [a, bm] + ([bias] if bias is not None else [])
            _fuse(rw, "FusedMatMul", nodes, ins, attrs, _ACT_TYPES)


# ---------------------------------------------------------------------------------------------
# Transposes


def _perm(node: Node) -> list[int] | None:
    perm = node.attrs.get("perm")
    if perm is not None:
        return [int(p) for p in perm]
    x = node.inputs[0]
    if x is None or x.fact.ndim is None:
        return None
    return list(range(x.fact.ndim))[::-1]


def transpose_cancellation(rw: Rewriter) -> None:
    """Transpose after Transpose: the identity (both removed) or one composed Transpose."""
    for node in rw.graph.nodes:
        if not _std(node, "Transpose") or id(node) in rw.removed:
            continue
        x = node.inputs[0]
        first = x.producer if x is not None else None
        if not _std(first, "Transpose") or first.graph is not rw.graph or id(first) in rw.removed:
            continue
        p1, p2 = _perm(first), _perm(node)
        if p1 is None or p2 is None or len(p1) != len(p2):
            continue
        q = [p1[i] for i in p2]
        src = first.inputs[0]
        if q == list(range(len(q))) and rw.bypass(node, node.outputs[0], src):
            rw.remove(node)
            rw.stats["cancelled"] += 1
        else:  # (an identity perm here writes a graph output straight from src)
            rw.set_input(node, 0, src)
            node.attrs["perm"] = q
            if hasattr(node, "attr_types"):
                node.attr_types["perm"] = onnx.AttributeProto.INTS
            rw.stats["composed"] += 1
        rw.changes += 1


# ---------------------------------------------------------------------------------------------
# Elementwise chains

_UNARY = {"Neg": "neg", "Abs": "abs", "Exp": "exp", "Log": "log", "Sqrt": "sqrt",
          "Reciprocal": "reciprocal", "Tanh": "tanh", "Relu": "relu", "Sigmoid": "sigmoid",
          "HardSwish": "hardswish"}
_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div"}
_VARIADIC = {"Sum": "add", "Max": "max", "Min": "min"}


def _ew_spec(rw: Rewriter, node: Node) -> tuple[str, list[Value], list[float]] | None:
    """(program op, tensor inputs, number params) of a fusable elementwise node."""
    if node.domain or node.opdef is None or len(node.outputs) != 1 or node.outputs[0] is None:
        return None
    y = node.outputs[0]
    if y.fact.dtype not in ("float32", "float64") or _known_shape(y) is None:
        return None
    t = node.op_type
    ins = node.inputs
    if any(v is None or v.fact.dtype != y.fact.dtype for v in ins[:1]):
        return None
    if t in _UNARY:
        return _UNARY[t], [ins[0]], []
    if t in _BINARY and node.opdef.since >= 7:
        if ins[1] is None or ins[1].fact.dtype != y.fact.dtype:
            return None
        return _BINARY[t], list(ins), []
    if t in _VARIADIC and len(ins) >= 2 and all(v is not None for v in ins):
        if any(v.fact.dtype != y.fact.dtype for v in ins):
            return None
        return _VARIADIC[t], list(ins), []
    if t == "LeakyRelu":
        return "leakyrelu", [ins[0]], [float(kernel_kwargs(node).get("alpha", 0.01))]
    if t == "HardSigmoid":
        kw = kernel_kwargs(node)
        return "hardsigmoid", [ins[0]], [float(kw.get("alpha", 0.2)), float(kw.get("beta", 0.5))]
    if t == "Clip":
        act = activation_of(rw, node, ins[0])
        if act is not None:
            return "clip", [ins[0]], act[1]
    return None


def _fmt(p: float) -> str:
    return repr(float(p))


def _ref(v: Value, group: dict, temps: dict[int, str], externals: list[Value]) -> str:
    """How a program names v: the temporary of a group member, or an external input xK."""
    if v.producer is not None and id(v.producer) in group:
        return temps[id(v)]
    for k, e in enumerate(externals):
        if e is v:
            return f"x{k}"
    externals.append(v)
    return f"x{len(externals) - 1}"


def elementwise_fusion(rw: Rewriter) -> None:
    """Trees of elementwise nodes whose intermediates have the output's shape and one reader
    -> one FusedElementwise (Add+Relu, BN-as-Mul/Add+Relu, swish, ...)."""
    nodes = rw.graph.nodes
    pos = {id(n): i for i, n in enumerate(nodes)}
    done: set[int] = set()
    for root in reversed(nodes):
        if id(root) in rw.removed or id(root) in done:
            continue
        spec = _ew_spec(rw, root)
        if spec is None:
            continue
        shape = _known_shape(root.outputs[0])
        group = {id(root): (root, spec)}
        stack = [root]
        while stack:
            n = stack.pop()
            for v in group[id(n)][1][1]:
                p = v.producer
                if p is None or id(p) in group or id(p) in rw.removed or p.graph is not rw.graph:
                    continue
                if rw.single_use(v) is not n or _known_shape(v) != shape:
                    continue
                ps = _ew_spec(rw, p)
                if ps is None or v.fact.dtype != root.outputs[0].fact.dtype:
                    continue
                group[id(p)] = (p, ps)
                stack.append(p)
        if len(group) < 2:
            continue
        members = sorted(group.values(), key=lambda e: pos[id(e[0])])
        externals: list[Value] = []
        temps: dict[int, str] = {}
        stmts: list[str] = []
        for n, (prim, ins, params) in members:
            args = [_ref(v, group, temps, externals) for v in ins]
            nums = [_fmt(p) for p in params]
            cur = args[0]
            if len(args) == 1:
                cur = f"t{len(stmts)}"
                stmts.append(f"{cur}={prim}({','.join([args[0], *nums])})")
            for a in args[1:]:
                nxt = f"t{len(stmts)}"
                stmts.append(f"{nxt}={prim}({cur},{a})")
                cur = nxt
            temps[id(n.outputs[0])] = cur
        done.update(group)
        _fuse(rw, "FusedElementwise", [n for n, _ in members], externals,
              {"program": ";".join(stmts)}, {"program": onnx.AttributeProto.STRING})
