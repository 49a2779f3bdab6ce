"""Layout unification: run convolution-like nodes in NHWC where their device wants it.

ONNX tensors are NCHW (channels second). A node whose device prefers NHWC, or has an NHWC kernel,
may run on channels-last data instead. The pass

1. classifies nodes: layout-sensitive (Conv, pools, norms, Resize, ...: activation input 0 and
   output 0 carry the layout), layout-agnostic (elementwise, Concat/Softmax with a remapped axis,
   Pad with remapped pads, DeviceCopy), model Transposes (absorbed by composing permutations),
   channel shuffles (a Reshape -> Transpose -> Reshape chain that only permutes the channel
   axis, as in ShuffleNet: it is rewritten to split, permute and merge the last axis instead;
   a two-factor one on a device with a ChannelShuffle kernel becomes that single node),
   and the rest (which need ONNX's NCHW);
2. groups sensitive and agnostic nodes that exchange 3-5-D tensors into regions and decides per
   region: NHWC when a device there requires or prefers it, or when the NHWC kernels outnumber
   the transposes the region would cost;
3. rewrites the graph in order, lazily: an NHWC tensor stays NHWC through the region and is
   converted back only where a consumer cannot take it (or it is a graph output). Each
   conversion is a Transpose node, or a Reshape when the permutation moves no data (all moved
   axes have size 1); a conversion of a Transpose's output is composed with it, so back-to-back
   transposes cancel.

Every tensor's ``fact.shape`` is its PHYSICAL shape: the pass gives each NHWC tensor a new Value
(``<name>__nhwc``) and tags values with ``value.layout`` ("NHWC", "NCHW" for other 3-5-D
tensors, None otherwise). Original Values keep their NCHW meaning, so graph outputs keep names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from opwarden.contract import TensorFact
from opwarden.ops.select import sensitive_inputs
from opwarden.ir.graph import Graph, Node, Value

NHWC, NCHW = "NHWC", "NCHW"

UNARY = {
    "Relu", "Clip", "Sigmoid", "HardSwish", "HardSigmoid", "LeakyRelu", "Tanh", "Exp", "Log",
    "Abs", "Neg", "Sqrt", "Reciprocal", "Erf", "Elu", "Selu", "Celu", "Softplus", "Softsign",
    "Gelu", "Mish", "Identity", "Dropout", "Cast", "Floor", "Ceil", "Round", "Sign", "Not",
    "IsNaN", "IsInf", "ThresholdedRelu", "Sin", "Cos", "Tan", "Shrink", "DeviceCopy",
}
BROADCAST = {
    "Add", "Sub", "Mul", "Div", "Pow", "Sum", "Max", "Min", "Mean", "PRelu", "Equal", "Less",
    "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Where", "Mod",
    "FusedElementwise",
}
AXIS_OPS = {"Concat": 0, "Softmax": 13, "LogSoftmax": 13, "Hardmax": 13}  # op -> min opset
VIEW_OPS = {"Reshape", "Flatten"}


def to_last(rank: int) -> tuple[int, ...]:
    """Physical axis j of a channels-last tensor holds logical axis to_last(rank)[j]."""
    return (0, *range(2, rank), 1)


def to_first(rank: int) -> tuple[int, ...]:
    """The permutation taking a channels-last tensor back to channels-first."""
    return (0, rank - 1, *range(1, rank - 1))


def _tracked(v: Value | None) -> bool:
    return (
        v is not None
        and v.kind == "tensor"
        and v.fact.shape is not None
        and 3 <= len(v.fact.shape) <= 5
    )


def _rank(v: Value) -> int:
    return len(v.fact.shape)  # type: ignore[arg-type]


def _size_one(v: Value) -> bool:
    s = v.fact.shape
    return s is not None and all(d == 1 for d in s)


def moves_no_data(shape: tuple | None, perm: tuple[int, ...]) -> bool:
    """Does transposing a tensor of `shape` by `perm` keep its bytes in the same order?"""
    if shape is None or not all(isinstance(d, int) and d > 0 for d in shape):
        return False
    big = [p for p in perm if shape[p] != 1]
    return big == sorted(big)


@dataclass
class LayoutReport:
    """What the pass did: counts, and the nodes it inserted (with why)."""

    transposes: int = 0
    views: int = 0
    cancelled: int = 0
    absorbed: int = 0
    nhwc_nodes: int = 0
    shuffles: int = 0
    shuffles_folded: int = 0  # ChannelShuffle nodes folded into their depthwise consumer
    regions: list[dict[str, Any]] = field(default_factory=list)
    inserted: dict[int, str] = field(default_factory=dict)  # id(node) -> reason

    def as_dict(self) -> dict[str, Any]:
        return {
            "transposes_inserted": self.transposes,
            "views_inserted": self.views,
            "transposes_cancelled": self.cancelled,
            "transposes_absorbed": self.absorbed,
            "nhwc_nodes": self.nhwc_nodes,
            "channel_shuffles_nhwc": self.shuffles,
            "channel_shuffles_folded": self.shuffles_folded,
            "regions": self.regions,
        }


class _Union:
    def __init__(self) -> None:
        self.parent: dict[int, int] = {}

    def find(self, x: int) -> int:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: int, b: int) -> None:
        self.parent[self.find(a)] = self.find(b)


class LayoutPass:
    """One run of the pass over one graph (see the module docstring)."""

    def __init__(
        self, graph: Graph, device_of: dict[int, Any], opset: int, quarantine: Any = None
    ) -> None:
        self.g = graph
        self.device_of = device_of
        self.opset = opset
        self.quarantine = quarantine
        self.report = LayoutReport()
        self.layout: dict[int, str] = {}
        self.kind: dict[int, str] = {}
        self.want: dict[int, str] = {}
        # id(node) -> (head Reshape, Transpose, tail Reshape) of a channel shuffle it belongs to
        self.chain: dict[int, tuple[Node, Node, Node]] = {}
        self.shuffle_shapes: dict[int, tuple[tuple, tuple]] = {}  # id(head) -> (x, factors)
        self._odd: set[int] = set()  # shuffle intermediates: neither NCHW nor NHWC
        self.fused_shuffles: set[int] = set()  # id(head) of shuffles emitted as one node
        self._names: set[str] = {n.name for n in graph.nodes}

    # -- 1. classify ---------------------------------------------------------------------------
    def layout_inputs(self, node: Node) -> tuple[int, ...]:
        """Indices of the inputs whose layout follows the node's (for S/A nodes)."""
        k = self.kind.get(id(node))
        if k == "S":
            return tuple(i for i in sensitive_inputs(node) if i < len(node.inputs))
        if k == "A":
            return tuple(i for i, v in enumerate(node.inputs) if _tracked(v) and v.const is None)
        if k == "CH":
            return (0,)
        return ()

    def layout_outputs(self, node: Node) -> tuple[int, ...]:
        k = self.kind.get(id(node))
        if k == "S":
            return (0,)
        if k == "A":
            r = _rank(node.outputs[0])
            return tuple(
                i for i, o in enumerate(node.outputs) if _tracked(o) and _rank(o) == r
            )
        if k == "CT":
            return (0,)
        return ()

    def classify(self, node: Node) -> str:
        dev = self.device_of.get(id(node))
        outs = node.outputs
        if not outs or not _tracked(outs[0]) or node.subgraphs():
            return "N"
        r = _rank(outs[0])
        sens = sensitive_inputs(node)
        if sens:
            ins = [node.inputs[i] for i in sens if i < len(node.inputs)]
            if not ins or not _tracked(ins[0]) or any(
                v is not None and (not _tracked(v) or _rank(v) != r) for v in ins
            ):
                return "N"
            lays = dev.layouts_for(node, self.quarantine) if dev is not None else (NCHW,)
            if NHWC not in lays:
                return "N"
            if NCHW not in lays:
                self.want[id(node)] = "must"
            elif dev.kind == "profile" and dev.preferred_layout == NHWC:
                self.want[id(node)] = "strong"
            else:
                self.want[id(node)] = "weak"
            return "S"
        if node.domain not in ("", "opwarden"):
            return "N"
        op = node.op_type
        ins = node.inputs
        if op == "Transpose" and _tracked(ins[0]):
            return "T"
        if op in UNARY:
            if not _tracked(ins[0]) or _rank(ins[0]) != r:
                return "N"
            rest = [v for v in ins[1:] if v is not None]
            return "A" if all(v.const is not None or _size_one(v) for v in rest) else "N"
        if op in BROADCAST:
            if not any(_tracked(v) and v.const is None for v in ins if v is not None):
                return "N"
            for v in ins:
                if v is None:
                    continue
                if _tracked(v) and v.const is None and _rank(v) == r:
                    continue
                if v.const is not None and v.const.ndim <= r:
                    continue
                if _size_one(v):
                    continue
                return "N"
            return "A"
        if op in AXIS_OPS and node.opset >= AXIS_OPS[op]:
            if all(
                v is not None and (_tracked(v) or v.const is not None) and len(v.fact.shape) == r
                for v in ins
            ) and any(v.const is None for v in ins):
                return "A"
            return "N"
        if op == "Split" and _tracked(ins[0]) and _rank(ins[0]) == r and all(
            v is None or v.const is not None for v in ins[1:]
        ) and all(o is not None and _tracked(o) and _rank(o) == r for o in outs):
            return "A"  # every output carries the layout; the axis is remapped
        if op == "Pad" and _tracked(ins[0]) and _rank(ins[0]) == r:
            if node.opset < 11:
                return "A"
            others = [v for i, v in enumerate(ins) if i in (1, 3) and v is not None]
            return "A" if all(v.const is not None for v in others) else "N"
        return "N"

    def find_shuffles(self) -> None:
        """Mark Reshape -> Transpose -> Reshape chains that only permute the channel axis."""
        outs = {id(v) for v in self.g.outputs}
        for n in self.g.nodes:
            chain = _shuffle_at(n, outs)
            if chain is not None and not any(id(c) in self.chain for c in chain):
                for c, k in zip(chain, ("CH", "CM", "CT"), strict=True):
                    self.kind[id(c)] = k
                    self.chain[id(c)] = chain
                xs = tuple(n.inputs[0].fact.shape)  # type: ignore[union-attr, arg-type]
                ys = tuple(n.outputs[0].fact.shape)  # type: ignore[union-attr, arg-type]
                self.shuffle_shapes[id(n)] = (xs, ys[1 : len(ys) - len(xs) + 2])

    # -- 2. regions ----------------------------------------------------------------------------
    def regions(self) -> dict[int, list[Node]]:
        uf = _Union()
        members = [n for n in self.g.nodes if self.kind[id(n)] in ("S", "A", "CH", "CM", "CT")]
        for n in members:
            uf.find(id(n))
        for head, mid, tail in self.chain.values():
            uf.union(id(head), id(mid))
            uf.union(id(mid), id(tail))
        readers: dict[int, list[Node]] = {}
        for n in members:
            for i in self.layout_inputs(n):
                v = n.inputs[i]
                if v is not None:
                    readers.setdefault(id(v), []).append(n)
        for n in members:
            for k in self.layout_outputs(n):
                for r in readers.get(id(n.outputs[k]), []):
                    uf.union(id(n), id(r))
        for rs in readers.values():
            for r in rs[1:]:
                uf.union(id(rs[0]), id(r))
        out: dict[int, list[Node]] = {}
        for n in members:
            out.setdefault(uf.find(id(n)), []).append(n)
        return out

    def _cost(self, nodes: list[Node]) -> int:
        """Transposes a region in NHWC would need at its boundary."""
        inside = {id(n) for n in nodes}
        entries: set[int] = set()
        exits: set[int] = set()
        outputs = {id(v) for v in self.g.outputs}
        for n in nodes:
            for i in self.layout_inputs(n):
                v = n.inputs[i]
                if v is None or (v.producer is not None and id(v.producer) in inside):
                    continue
                if not moves_no_data(v.fact.shape, to_last(_rank(v))):
                    entries.add(id(v))
            for k in self.layout_outputs(n):
                o = n.outputs[k]
                if o is None:
                    continue
                phys = tuple(o.fact.shape[p] for p in to_last(_rank(o)))
                trivial = moves_no_data(phys, to_first(_rank(o)))
                if trivial:
                    continue
                if id(o) in outputs:
                    exits.add(id(o))
                for user, idx in o.uses:
                    if id(user) in inside and idx in self.layout_inputs(user):
                        continue
                    if self.kind.get(id(user)) == "T":
                        continue
                    exits.add(id(o))
        return len(entries) + len(exits)

    # -- 3. rewrite ----------------------------------------------------------------------------
    def run(self) -> LayoutReport:
        g = self.g
        for n in g.nodes:
            self.kind[id(n)] = self.classify(n)
        self.find_shuffles()
        nhwc_nodes: set[int] = set()
        for nodes in self.regions().values():
            wants = [self.want.get(id(n)) for n in nodes if self.kind[id(n)] == "S"]
            if not wants:
                continue
            cost = self._cost(nodes)
            forced = any(w in ("must", "strong") for w in wants)
            choose = forced or len(wants) >= max(cost, 1)
            self.report.regions.append(
                {
                    "nodes": len(nodes),
                    "layout_sensitive": len(wants),
                    "boundary_transposes": cost,
                    "layout": NHWC if choose else NCHW,
                    "first": nodes[0].name,
                }
            )
            if choose:
                nhwc_nodes.update(id(n) for n in nodes)
        if not nhwc_nodes:
            for n in g.nodes:
                self.layout[id(n)] = NCHW
            self._tag(set())
            return self.report
        self.phys: dict[int, Value] = {}  # id(original value) -> its NHWC Value
        self.nchw_ok: set[int] = set()  # original values that exist in NCHW
        self.const_cache: dict[int, Value] = {}
        self.orig: dict[int, Value] = {}
        self.new_nodes: list[Node] = []
        for v in g.inputs:
            self.nchw_ok.add(id(v))
        for v in g.initializers.values():
            self.nchw_ok.add(id(v))
        for v in g.captures:
            self.nchw_ok.add(id(v))
        for node in list(g.nodes):
            dev = self.device_of.get(id(node))
            if id(node) in nhwc_nodes:
                self._rewrite_nhwc(node, dev)
                self.layout[id(node)] = NHWC
                self.report.nhwc_nodes += 1
            else:
                self.layout[id(node)] = NCHW
                if self.kind[id(node)] == "T" and self._absorb(node):
                    pass
                else:
                    self._need_nchw(node, dev)
                self.new_nodes.append(node)
                for o in node.outputs:
                    if o is not None:
                        self.nchw_ok.add(id(o))
        for v in g.outputs:
            if id(v) in self.phys and id(v) not in self.nchw_ok:
                prod = self.phys[id(v)].producer
                dev = self.device_of.get(id(prod)) if prod is not None else None
                if dev is None:
                    from opwarden.devices import get_device

                    dev = get_device("cpu")
                self._materialize(v, dev, "graph output")
        g.nodes = self.new_nodes
        for key, o in self.orig.items():
            # An NCHW original nobody needed does not exist: only its NHWC Value does.
            if key not in self.nchw_ok and g.values.get(o.name) is o:
                del g.values[o.name]
        g.rebuild_uses()
        if self._fold_shuffles():
            g.rebuild_uses()
        self._sweep()
        self._tag({id(v) for v in self.phys.values() if id(v) not in self._odd})
        for v in self.phys.values():
            if id(v) in self._odd:
                v.layout = None  # type: ignore[attr-defined]
        return self.report

    def _rewrite_nhwc(self, node: Node, dev: Any) -> None:
        kind = self.kind[id(node)]
        if kind in ("CH", "CM", "CT"):
            self._rewrite_shuffle(node, dev)
            return
        r = _rank(node.outputs[0])
        for i in self.layout_inputs(node):
            v = node.inputs[i]
            if v is not None:
                node.inputs[i] = self._nhwc(v, dev, node)
        if kind == "A":
            for i, v in enumerate(node.inputs):
                if v is not None and v.const is not None and not _size_one(v):
                    if node.op_type in AXIS_OPS or node.op_type in BROADCAST or i == 0:
                        node.inputs[i] = self._const_nhwc(v, r)
            self._remap_attrs(node, r)
        for k in self.layout_outputs(node):
            o = node.outputs[k]
            shape = tuple(o.fact.shape[p] for p in to_last(r))
            nv = self._value(f"{o.name}__nhwc", TensorFact(o.fact.dtype, shape))
            nv.layout = NHWC  # type: ignore[attr-defined]
            nv.producer = node
            node.outputs[k] = nv
            self.phys[id(o)] = nv
            self.orig[id(o)] = o
        self.new_nodes.append(node)

    def _rewrite_shuffle(self, node: Node, dev: Any) -> None:
        """A channel shuffle on channels-last data: split, permute and merge the LAST axis.

        NCHW [N,C,*S] -> Reshape [N,*F,*S] -> Transpose(0, p(F), S) -> Reshape [N,C,*S] becomes
        [N,*S,C] -> Reshape [N,*S,*F] -> Transpose(0, S, p(F)) -> Reshape [N,*S,C]: the same
        channel permutation, with one data copy and no layout conversions.
        """
        head, mid, tail = self.chain[id(node)]
        xs, factors = self.shuffle_shapes[id(head)]
        sp = xs[2:]
        k = len(factors)
        if id(head) in self.fused_shuffles:
            return  # mid and tail are part of the ChannelShuffle emitted at the head
        if node is head and self._one_shuffle(head, mid, tail, factors, dev):
            return
        batch = xs[0] if isinstance(xs[0], int) else 0  # 0 copies N (allowzero is dropped)
        o = node.outputs[0]
        if node is head:
            node.inputs[0] = self._nhwc(node.inputs[0], dev, node)
            phys: tuple = (xs[0], *sp, *factors)
            node.inputs[1] = self._const(
                f"{node.inputs[1].name}__nhwc", np.array([batch, *sp, *factors], dtype=np.int64)
            )
            node.attrs = {a: v for a, v in node.attrs.items() if a != "allowzero"}
        elif node is mid:
            node.inputs[0] = self.phys[id(node.inputs[0])]
            p = [int(q) for q in node.attrs["perm"]]
            new = [*range(1 + len(sp)), *(len(sp) + q for q in p[1 : 1 + k])]
            node.attrs = dict(node.attrs, perm=new)
            phys = (xs[0], *sp, *(factors[q - 1] for q in p[1 : 1 + k]))
        else:
            node.inputs[0] = self.phys[id(node.inputs[0])]
            node.inputs[1] = self._const(
                f"{node.inputs[1].name}__nhwc", np.array([batch, *sp, xs[1]], dtype=np.int64)
            )
            node.attrs = {a: v for a, v in node.attrs.items() if a != "allowzero"}
            phys = (xs[0], *sp, xs[1])
            self.report.shuffles += 1
        nv = self._value(f"{o.name}__nhwc", TensorFact(o.fact.dtype, phys))
        nv.producer = node
        if node is tail:
            nv.layout = NHWC  # type: ignore[attr-defined]
        else:
            self._odd.add(id(nv))
        node.outputs[0] = nv
        self.phys[id(o)] = nv
        self.orig[id(o)] = o
        self.new_nodes.append(node)

    def _one_shuffle(self, head: Node, mid: Node, tail: Node, factors: tuple, dev: Any) -> bool:
        """A two-factor shuffle on a device with a ChannelShuffle kernel becomes that one node
        (one copy into a planned buffer, where the Reshape of the transposed view copies into a
        fresh array); False (nothing done) otherwise."""
        perm = [int(q) for q in (mid.attrs.get("perm") or ())]
        if len(factors) != 2 or perm[1:3] != [2, 1] or dev is None:
            return False
        from opwarden.ops import REGISTRY

        opdef, schema = REGISTRY.resolve("ChannelShuffle", "opwarden", 1)
        if opdef is None or not any(v.device == dev.name for v in opdef.variants):
            return False
        z = tail.outputs[0]
        x = self._nhwc(head.inputs[0], dev, head)
        nv = self._value(f"{z.name}__nhwc", TensorFact(z.fact.dtype, tuple(x.fact.shape)))
        node = self._node("ChannelShuffle", [x], nv, {"group": int(factors[0])},
                          f"{tail.name}/shuffle")
        node.domain = "opwarden"
        node.opset = 1
        node.opdef, node.schema = opdef, schema
        self.device_of[id(node)] = dev
        self.kind[id(node)] = "N"
        self.layout[id(node)] = NHWC
        nv.layout = NHWC  # type: ignore[attr-defined]
        self.phys[id(z)] = nv
        self.orig[id(z)] = z
        self.fused_shuffles.add(id(head))
        for v in (head.outputs[0], mid.outputs[0]):  # nobody produces or reads these now
            if v is not None and self.g.values.get(v.name) is v:
                del self.g.values[v.name]
        self.report.shuffles += 1
        self.new_nodes.append(node)
        return True

    def _fold_shuffles(self) -> int:
        """Fold each ChannelShuffle read only by a depthwise convolution on the same device
        into that convolution (FusedConv's `input_shuffle`: the shuffle then rides on the
        padding copy the depthwise kernel makes anyway). Returns how many were folded."""
        from opwarden.ops import REGISTRY

        outs = {id(v) for v in self.g.outputs}
        folded: set[int] = set()
        for n in self.g.nodes:
            if n.op_type != "ChannelShuffle" or n.domain != "opwarden":
                continue
            y = n.outputs[0]
            if y is None or id(y) in outs or len(y.uses) != 1:
                continue
            conv, idx = y.uses[0]
            w = conv.inputs[1] if len(conv.inputs) > 1 else None
            if (
                idx != 0
                or (conv.op_type, conv.domain) not in (("Conv", ""), ("FusedConv", "opwarden"))
                or self.device_of.get(id(conv)) is not self.device_of.get(id(n))
                or self.layout.get(id(conv)) != NHWC
                or int(conv.attrs.get("input_shuffle", 0) or 0) > 1
                or w is None
                or w.fact.shape is None
                or len(w.fact.shape) != 4
                or w.fact.shape[1] != 1
                or int(conv.attrs.get("group", 1)) != w.fact.shape[0]
            ):
                continue
            if conv.op_type == "Conv":
                conv.op_type, conv.domain, conv.opset = "FusedConv", "opwarden", 1
                conv.opdef, conv.schema = REGISTRY.resolve("FusedConv", "opwarden", 1)
            conv.attrs = dict(conv.attrs, input_shuffle=int(n.attrs["group"]))
            conv.inputs[0] = n.inputs[0]
            folded.add(id(n))
            if self.g.values.get(y.name) is y:
                del self.g.values[y.name]
        if folded:
            self.g.nodes = [n for n in self.g.nodes if id(n) not in folded]
            self.report.shuffles_folded += len(folded)
        return len(folded)

    def _remap_attrs(self, node: Node, r: int) -> None:
        perm = to_last(r)
        op = node.op_type
        if op in AXIS_OPS or op == "Split":
            default = {"Concat": 1, "Split": 0}.get(op, -1)
            axis = int(node.attrs.get("axis", default)) % r
            node.attrs = dict(node.attrs, axis=perm.index(axis))
        elif op == "Pad":
            if node.opset < 11:
                key = "pads" if "pads" in node.attrs else "paddings"
                p = list(node.attrs.get(key, [0] * 2 * r))
                node.attrs = dict(node.attrs, **{key: _perm_pads(p, perm)})
                return
            axes = node.inputs[3] if len(node.inputs) > 3 else None
            if axes is not None:
                new = np.array([perm.index(int(a) % r) for a in axes.const], dtype=axes.const.dtype)
                node.inputs[3] = self._const(f"{axes.name}__nhwc", new)
            elif node.inputs[1] is not None:
                pads = node.inputs[1]
                new = np.array(_perm_pads(list(pads.const), perm), dtype=pads.const.dtype)
                node.inputs[1] = self._const(f"{pads.name}__nhwc", new)

    def _absorb(self, node: Node) -> bool:
        """A model Transpose of an NHWC-only tensor reads the NHWC tensor with a composed perm."""
        v = node.inputs[0]
        if id(v) not in self.phys or id(v) in self.nchw_ok:
            return False
        r = _rank(v)
        perm = node.attrs.get("perm") or list(reversed(range(r)))
        phys = to_last(r)
        node.inputs[0] = self.phys[id(v)]
        node.attrs = dict(node.attrs, perm=[phys.index(int(p)) for p in perm])
        self.report.absorbed += 1
        return True

    def _need_nchw(self, node: Node, dev: Any) -> None:
        for i, v in enumerate(node.inputs):
            if v is None or id(v) not in self.phys or id(v) in self.nchw_ok:
                continue
            phys = self.phys[id(v)]
            if i == 0 and node.op_type in VIEW_OPS and self._view_safe(node, v, phys):
                node.inputs[0] = phys
                continue
            self._materialize(v, dev, f"{node.op_type} {node.name!r} needs NCHW")

    def _view_safe(self, node: Node, v: Value, phys: Value) -> bool:
        """Can a Reshape/Flatten read the NHWC tensor as if it were NCHW (same byte order)?"""
        if not moves_no_data(phys.fact.shape, to_first(_rank(v))):
            return False
        if node.op_type == "Flatten":
            axis = int(node.attrs.get("axis", 1)) % (_rank(v) + 1)
            lo = int(np.prod(v.fact.shape[:axis]))
            return lo == int(np.prod(phys.fact.shape[:axis]))
        shape = node.inputs[1] if len(node.inputs) > 1 else None
        if shape is None or shape.const is None:
            return False
        return bool(node.attrs.get("allowzero", 0)) or not np.any(shape.const == 0)

    # -- conversions ---------------------------------------------------------------------------
    def _nhwc(self, v: Value, dev: Any, consumer: Node) -> Value:
        got = self.phys.get(id(v))
        if got is not None:
            return got
        r = _rank(v)
        perm = to_last(r)
        shape = tuple(v.fact.shape[p] for p in perm)
        src, p = v, perm
        prod = v.producer
        if prod is not None and prod.op_type == "Transpose" and prod.domain == "" and (
            id(prod) not in self.report.inserted
        ):
            # Compose with the model's Transpose: Transpose(Transpose(u, p1), p2) = T(u, p1∘p2).
            u = prod.inputs[0]
            p1 = prod.attrs.get("perm") or list(reversed(range(r)))
            comp = tuple(int(p1[q]) for q in perm)
            if comp == tuple(range(r)):
                self.phys[id(v)] = u
                return u
            src, p = u, comp
        nv = self._value(f"{v.name}__nhwc", TensorFact(v.fact.dtype, shape))
        why = f"layout: {consumer.op_type} {consumer.name!r} takes NHWC"
        self._convert(src, p, nv, dev, why)
        self.phys[id(v)] = nv
        return nv

    def _materialize(self, v: Value, dev: Any, why: str) -> None:
        phys = self.phys[id(v)]
        self._convert(phys, to_first(_rank(v)), v, dev, f"layout: {why}")
        self.nchw_ok.add(id(v))

    def _convert(self, src: Value, perm: tuple[int, ...], dst: Value, dev: Any, why: str) -> None:
        from opwarden.ops import REGISTRY

        if moves_no_data(src.fact.shape, perm):
            shape = self._const(
                f"{dst.name}__shape", np.array(dst.fact.shape, dtype=np.int64)
            )
            node = self._node("Reshape", [src, shape], dst, {}, f"{dst.name}/view")
            self.report.views += 1
        else:
            node = self._node("Transpose", [src], dst, {"perm": list(perm)}, f"{dst.name}/perm")
            self.report.transposes += 1
        node.opdef, node.schema = REGISTRY.resolve(node.op_type, "", node.opset)
        self.report.inserted[id(node)] = why
        self.device_of[id(node)] = dev
        self.kind[id(node)] = "N"
        self.layout[id(node)] = NCHW
        self.new_nodes.append(node)

    def _node(self, op: str, ins: list[Value], out: Value, attrs: dict, name: str) -> Node:
        base, k = name, 1
        while name in self._names:
            k += 1
            name = f"{base}_{k}"
        self._names.add(name)
        node = Node(op, "", name, ins, [out], attrs, self.opset, graph=self.g)
        out.producer = node
        return node

    def _value(self, name: str, fact: TensorFact) -> Value:
        base, k = name, 1
        while name in self.g.values:
            k += 1
            name = f"{base}_{k}"
        return self.g.add_value(name, fact=fact)

    def _const(self, name: str, arr: np.ndarray) -> Value:
        from opwarden.dtypes import dtype_name

        v = self._value(name, TensorFact(dtype_name(arr.dtype), tuple(arr.shape)))
        v.const = arr
        self.g.initializers[v.name] = v
        self.nchw_ok.add(id(v))
        return v

    def _const_nhwc(self, c: Value, r: int) -> Value:
        got = self.const_cache.get(id(c))
        if got is None:
            a = np.asarray(c.const)
            a = a.reshape((1,) * (r - a.ndim) + a.shape)
            a = np.ascontiguousarray(a.transpose(to_last(r)))
            got = self.const_cache[id(c)] = self._const(f"{c.name}__nhwc", a)
            got.layout = NHWC  # type: ignore[attr-defined]
        return got

    # -- cleanup -------------------------------------------------------------------------------
    def _sweep(self) -> None:
        """Drop layout-only nodes (inserted or model Transposes) whose outputs nobody reads."""
        outs = {id(v) for v in self.g.outputs}
        changed = True
        while changed:
            changed = False
            keep = []
            for n in self.g.nodes:
                pure = n.op_type in ("Transpose", "Reshape") and n.domain == ""
                dead = all(o is None or (not o.uses and id(o) not in outs) for o in n.outputs)
                if pure and dead and (id(n) in self.report.inserted or n.op_type == "Transpose"):
                    changed = True
                    if id(n) not in self.report.inserted:
                        self.report.cancelled += 1
                    else:
                        if n.op_type == "Transpose":
                            self.report.transposes -= 1
                        else:
                            self.report.views -= 1
                        del self.report.inserted[id(n)]
                    for v in n.inputs:
                        if v is not None:
                            v.uses[:] = [(u, i) for u, i in v.uses if u is not n]
                    continue
                keep.append(n)
            self.g.nodes = keep
        self.g.rebuild_uses()

    def _tag(self, nhwc: set[int]) -> None:
        for v in self.g.values.values():
            if id(v) in nhwc or getattr(v, "layout", None) == NHWC:
                v.layout = NHWC  # type: ignore[attr-defined]
            else:
                v.layout = NCHW if _tracked(v) else None  # type: ignore[attr-defined]


def _static(shape: Any) -> bool:
    return shape is not None and all(isinstance(d, int) and d > 0 for d in shape)


def _only_use(v: Value | None, outs: set[int], op: str) -> Node | None:
    """The single standard-domain `op` node reading `v` as input 0 (None if anything else)."""
    if v is None or id(v) in outs or len(v.uses) != 1:
        return None
    user, idx = v.uses[0]
    return user if idx == 0 and user.op_type == op and user.domain == "" else None


def _shuffle_at(head: Node, outs: set[int]) -> tuple[Node, Node, Node] | None:
    """The channel shuffle starting at `head`, or None.

    Head Reshape splits the channel axis of [N, C, *S] into factors ([N, *F, *S]), a Transpose
    permutes only the factor axes, and the tail Reshape merges them back to [N, C, *S]; the
    intermediates have no other readers. Shapes must be static (batch may be symbolic).
    """
    if head.op_type != "Reshape" or head.domain != "" or len(head.inputs) < 2:
        return None
    x, s1 = head.inputs[0], head.inputs[1]
    if not _tracked(x) or x.const is not None or s1 is None or s1.const is None:
        return None
    xs = tuple(x.fact.shape)  # type: ignore[arg-type]
    y1 = head.outputs[0]
    if not _static(xs[1:]) or y1 is None or y1.fact.shape is None:
        return None
    ys = tuple(y1.fact.shape)
    ns = len(xs) - 2
    k = len(ys) - 1 - ns
    if k < 2 or ys[0] != xs[0] or ys[1 + k :] != xs[2:] or not _static(ys[1 : 1 + k]):
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


def _perm_pads(pads: list[int], perm: tuple[int, ...]) -> list[int]:
    r = len(perm)
    begins, ends = pads[:r], pads[r:]
    return [int(begins[p]) for p in perm] + [int(ends[p]) for p in perm]


def unify(
    graph: Graph, device_of: dict[int, Any], opset: int, quarantine: Any = None
) -> tuple[dict[int, str], LayoutReport]:
    """Run the pass; returns (layout per node id, report). `device_of` gains inserted nodes."""
    p = LayoutPass(graph, device_of, opset, quarantine)
    report = p.run()
    return p.layout, report
