"""Channel shuffles under the layout pass: found, rewritten for channels-last data, folded.

A channel shuffle (ShuffleNet) is a Reshape -> Transpose -> Reshape chain that only permutes
the channel axis: the head Reshape splits the channels of [N, C, *S] into factors
([N, *F, *S]), the Transpose permutes only the factor axes, the tail Reshape merges them back.
On NCHW data it needs no layout; in an NHWC region the pass (layout.py) keeps it in NHWC by
splitting, permuting and merging the LAST axis instead. A two-factor shuffle on a device with a
ChannelShuffle kernel becomes that one node, and one read only by a depthwise convolution on
the same device is folded into the convolution (FusedConv's `input_shuffle`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opwarden.contract import TensorFact
from opwarden.devices import Device
from opwarden.ir.graph import Node, Value
from opwarden.ops import REGISTRY
from opwarden.place.layout_axes import NHWC, dims, static, tracked
from opwarden.place.layout_convert import LayoutState


def _only_use(v: Value | None, outs: set[int], op: str) -> Node | None:
    """The single standard-domain `op` node reading `v` as input 0 (None if anything else)."""
    if v is None or id(v) in outs or len(v.uses) != 1:
        return None
    user, idx = v.uses[0]
    return user if idx == 0 and user.op_type == op and user.domain == "" else None


def shuffle_at(head: Node, outs: set[int]) -> tuple[Node, Node, Node] | None:
    """The channel shuffle starting at `head`, or None.

    The intermediates have no other readers (`outs`: ids of the graph outputs). Shapes must be
    static (batch may be symbolic).
    """
    if head.op_type != "Reshape" or head.domain != "" or len(head.inputs) < 2:
        return None
    x, s1 = head.inputs[0], head.inputs[1]
    if not tracked(x) or x.const is not None or s1 is None or s1.const is None:
        return None
    xs = tuple(dims(x))
    y1 = head.outputs[0]
    if not static(xs[1:]) or y1 is None or y1.fact.shape is None:
        return None
    ys = tuple(y1.fact.shape)
    ns = len(xs) - 2
    k = len(ys) - 1 - ns
    if k < 2 or ys[0] != xs[0] or ys[1 + k :] != xs[2:] or not static(ys[1 : 1 + k]):
        return None
    if int(np.prod(ys[1 : 1 + k])) != xs[1]:
        return None
    mid = _only_use(y1, outs, "Transpose")
    if mid is None:
        return None
    perm = [int(q) for q in (mid.attrs.get("perm") or reversed(range(len(ys))))]
    if (
        len(perm) != len(ys)
        or perm[0] != 0
        or perm[1 + k :] != list(range(1 + k, len(ys)))
        or sorted(perm[1 : 1 + k]) != list(range(1, 1 + k))
    ):
        return None
    tail = _only_use(mid.outputs[0], outs, "Reshape")
    if tail is None or len(tail.inputs) < 2 or tail.inputs[1] is None:
        return None
    z = tail.outputs[0]
    if tail.inputs[1].const is None or z is None or z.fact.shape is None:
        return None
    if tuple(z.fact.shape) != xs:
        return None
    return head, mid, tail


def find_shuffles(p: LayoutState) -> None:
    """Mark the pass's channel shuffles: kinds CH (head), CM (Transpose), CT (tail)."""
    outs = {id(v) for v in p.g.outputs}
    for n in p.g.nodes:
        chain = shuffle_at(n, outs)
        if chain is not None and not any(id(c) in p.chain for c in chain):
            for c, k in zip(chain, ("CH", "CM", "CT"), strict=True):
                p.kind[id(c)] = k
                p.chain[id(c)] = chain
            x, y = n.inputs[0], n.outputs[0]
            assert x is not None and y is not None  # shuffle_at checked both
            xs, ys = tuple(dims(x)), tuple(dims(y))
            p.shuffle_shapes[id(n)] = (xs, ys[1 : len(ys) - len(xs) + 2])


def rewrite_shuffle(p: LayoutState, node: Node, dev: Device | None) -> None:
    """A channel shuffle on channels-last data: split, permute and merge the LAST axis.

    NCHW [N,C,*S] -> Reshape [N,*F,*S] -> Transpose(0, p(F), S) -> Reshape [N,C,*S] becomes
    [N,*S,C] -> Reshape [N,*S,*F] -> Transpose(0, S, p(F)) -> Reshape [N,*S,C]: the same
    channel permutation, with one data copy and no layout conversions.
    """
    head, mid, tail = p.chain[id(node)]
    xs, factors = p.shuffle_shapes[id(head)]
    sp = xs[2:]
    k = len(factors)
    if id(head) in p.fused_shuffles:
        return  # mid and tail are part of the ChannelShuffle emitted at the head
    if node is head and _one_shuffle(p, head, mid, tail, factors, dev):
        return
    batch = xs[0] if isinstance(xs[0], int) else 0  # 0 copies N (allowzero is dropped)
    x, o = node.inputs[0], node.outputs[0]
    assert x is not None and o is not None  # a shuffle's values (shuffle_at)
    phys: tuple[Any, ...]
    if node is head:
        node.inputs[0] = p.nhwc_of(x, dev, node)
        phys = (xs[0], *sp, *factors)
        node.inputs[1] = p.new_const(
            f"{_name(node, 1)}__nhwc", np.array([batch, *sp, *factors], dtype=np.int64)
        )
        node.attrs = {a: v for a, v in node.attrs.items() if a != "allowzero"}
    elif node is mid:
        node.inputs[0] = p.phys[id(x)]
        q = [int(a) for a in node.attrs["perm"]]
        new = [*range(1 + len(sp)), *(len(sp) + a for a in q[1 : 1 + k])]
        node.attrs = dict(node.attrs, perm=new)
        phys = (xs[0], *sp, *(factors[a - 1] for a in q[1 : 1 + k]))
    else:
        node.inputs[0] = p.phys[id(x)]
        node.inputs[1] = p.new_const(
            f"{_name(node, 1)}__nhwc", np.array([batch, *sp, xs[1]], dtype=np.int64)
        )
        node.attrs = {a: v for a, v in node.attrs.items() if a != "allowzero"}
        phys = (xs[0], *sp, xs[1])
        p.report.shuffles += 1
    nv = p.new_value(f"{o.name}__nhwc", TensorFact(o.fact.dtype, phys))
    nv.producer = node
    if node is tail:
        nv.layout = NHWC
    else:
        p.odd.add(id(nv))
    node.outputs[0] = nv
    p.phys[id(o)] = nv
    p.orig[id(o)] = o
    p.new_nodes.append(node)


def _name(node: Node, i: int) -> str:
    v = node.inputs[i]
    assert v is not None  # a Reshape's shape input (shuffle_at)
    return v.name


def _one_shuffle(
    p: LayoutState, head: Node, mid: Node, tail: Node, factors: tuple[Any, ...],
    dev: Device | None,
) -> bool:
    """A two-factor shuffle on a device with a ChannelShuffle kernel becomes that one node
    (one copy into a planned buffer, where the Reshape of the transposed view copies into a
    fresh array); False (nothing done) otherwise."""
    perm = [int(q) for q in (mid.attrs.get("perm") or ())]
    if len(factors) != 2 or perm[1:3] != [2, 1] or dev is None:
        return False
    opdef, schema = REGISTRY.resolve("ChannelShuffle", "opwarden", 1)
    if opdef is None or not any(v.device == dev.name for v in opdef.variants):
        return False
    x0, z = head.inputs[0], tail.outputs[0]
    assert x0 is not None and z is not None  # a shuffle's values (shuffle_at)
    x = p.nhwc_of(x0, dev, head)
    nv = p.new_value(f"{z.name}__nhwc", TensorFact(z.fact.dtype, tuple(dims(x))))
    node = p.new_node("ChannelShuffle", [x], nv, {"group": int(factors[0])},
                      f"{tail.name}/shuffle")
    node.domain = "opwarden"
    node.opset = 1
    node.origin = list(dict.fromkeys(head.origins + mid.origins + tail.origins))
    node.opdef, node.schema = opdef, schema
    p.device_of[id(node)] = dev
    p.kind[id(node)] = "N"
    p.layout[id(node)] = NHWC
    nv.layout = NHWC
    p.phys[id(z)] = nv
    p.orig[id(z)] = z
    p.fused_shuffles.add(id(head))
    for v in (head.outputs[0], mid.outputs[0]):  # nobody produces or reads these now
        if v is not None and p.g.values.get(v.name) is v:
            del p.g.values[v.name]
    p.report.shuffles += 1
    p.new_nodes.append(node)
    return True


def _foldable(p: LayoutState, n: Node, outs: set[int]) -> Node | None:
    """The depthwise convolution (NHWC, same device, no shuffle folded yet) that alone reads
    ChannelShuffle `n`, or None."""
    y = n.outputs[0]
    if y is None or id(y) in outs or len(y.uses) != 1:
        return None
    conv, idx = y.uses[0]
    w = conv.inputs[1] if len(conv.inputs) > 1 else None
    if (
        idx != 0
        or (conv.op_type, conv.domain) not in (("Conv", ""), ("FusedConv", "opwarden"))
        or p.device_of.get(id(conv)) is not p.device_of.get(id(n))
        or p.layout.get(id(conv)) != NHWC
        or int(conv.attrs.get("input_shuffle", 0) or 0) > 1
        or w is None
        or w.fact.shape is None
        or len(w.fact.shape) != 4
        or w.fact.shape[1] != 1
        or int(conv.attrs.get("group", 1)) != w.fact.shape[0]
    ):
        return None
    return conv


def fold_shuffles(p: LayoutState) -> int:
    """Fold each ChannelShuffle read only by a depthwise convolution on the same device
    into that convolution (FusedConv's `input_shuffle`: the shuffle then rides on the
    padding copy the depthwise kernel makes anyway). Returns how many were folded."""
    outs = {id(v) for v in p.g.outputs}
    folded: set[int] = set()
    for n in p.g.nodes:
        if n.op_type != "ChannelShuffle" or n.domain != "opwarden":
            continue
        conv = _foldable(p, n, outs)
        if conv is None:
            continue
        y = n.outputs[0]
        assert y is not None  # _foldable checked it
        if conv.op_type == "Conv":
            conv.op_type, conv.domain, conv.opset = "FusedConv", "opwarden", 1
            conv.opdef, conv.schema = REGISTRY.resolve("FusedConv", "opwarden", 1)
        conv.attrs = dict(conv.attrs, input_shuffle=int(n.attrs["group"]))
        conv.origin = list(dict.fromkeys(n.origins + conv.origins))
        conv.inputs[0] = n.inputs[0]
        folded.add(id(n))
        if p.g.values.get(y.name) is y:
            del p.g.values[y.name]
    if folded:
        p.g.nodes = [n for n in p.g.nodes if id(n) not in folded]
        p.report.shuffles_folded += len(folded)
    return len(folded)
