"""Layout unification: run convolution-like nodes in NHWC where their device wants it.

ONNX tensors are NCHW (channels second). A node whose device prefers NHWC, or has an NHWC kernel,
may run on channels-last data instead. The pass

1. classifies nodes: layout-sensitive (Conv, pools, norms, Resize, ...: activation input 0 and
   output 0 carry the layout), layout-agnostic (elementwise, Concat/Softmax with a remapped axis,
   Pad with remapped pads, Slice with remapped axes, DeviceCopy), model Transposes (absorbed
   by composing permutations),
   channel shuffles (a Reshape -> Transpose -> Reshape chain that only permutes the channel
   axis, as in ShuffleNet: it is rewritten to split, permute and merge the last axis instead;
   a two-factor one on a device with a ChannelShuffle kernel becomes that single node; see
   layout_shuffle.py), and the rest (which need ONNX's NCHW);
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
Step 1 is layout_classify.py, the channel shuffles layout_shuffle.py, the conversions and the
pass's state layout_convert.py, the vocabulary (permutations, which tensors carry a layout)
layout_axes.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opwarden.contract import TensorFact
from opwarden.devices import Device, get_device
from opwarden.ir.graph import Graph, Node, Value
from opwarden.ops.select import sensitive_inputs
from opwarden.place import layout_shuffle
from opwarden.place.layout_axes import (
    NCHW,
    NHWC,
    dims,
    moves_no_data,
    perm_pads,
    rank,
    size_one,
    to_first,
    to_last,
    tracked,
)
from opwarden.place.layout_classify import AXIS_OPS, BROADCAST, node_kind
from opwarden.place.layout_convert import LayoutReport, LayoutState

VIEW_OPS = {"Reshape", "Flatten"}


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


def _output0(node: Node) -> Value:
    """Output 0 of a node the pass classified S or A (it carries the layout)."""
    o = node.outputs[0]
    assert o is not None, node.label
    return o


class LayoutPass(LayoutState):
    """One run of the pass over one graph (see the module docstring)."""

    by_cost = True  # may a region go NHWC because its kernels outnumber the transposes?

    # -- 1. classify ---------------------------------------------------------------------------
    def layout_inputs(self, node: Node) -> tuple[int, ...]:
        """Indices of the inputs whose layout follows the node's (for S/A nodes)."""
        k = self.kind.get(id(node))
        if k == "S":
            return tuple(i for i in sensitive_inputs(node) if i < len(node.inputs))
        if k == "A":
            return tuple(
                i for i, v in enumerate(node.inputs) if tracked(v) and v.const is None
            )
        if k == "CH":
            return (0,)
        return ()

    def layout_outputs(self, node: Node) -> tuple[int, ...]:
        k = self.kind.get(id(node))
        if k == "S":
            return (0,)
        if k == "A":
            r = rank(_output0(node))
            return tuple(
                i for i, o in enumerate(node.outputs) if tracked(o) and rank(o) == r
            )
        if k == "CT":
            return (0,)
        return ()

    def classify(self, node: Node) -> str:
        """The node's kind (S, A, T or N; see layout_classify.py), recording what an S node's
        device wants."""
        kind, want = node_kind(node, self.device_of.get(id(node)), self.quarantine)
        if want is not None:
            self.want[id(node)] = want
        return kind

    def find_shuffles(self) -> None:
        """Mark Reshape -> Transpose -> Reshape chains that only permute the channel axis."""
        layout_shuffle.find_shuffles(self)

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
                if not moves_no_data(v.fact.shape, to_last(rank(v))):
                    entries.add(id(v))
            for k in self.layout_outputs(n):
                o = n.outputs[k]
                if o is None:
                    continue
                shape = dims(o)
                phys = tuple(shape[p] for p in to_last(len(shape)))
                trivial = moves_no_data(phys, to_first(len(shape)))
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

    def _decide(self) -> set[int]:
        """The ids of the nodes of the regions that go NHWC (each region's numbers reported)."""
        nhwc_nodes: set[int] = set()
        for nodes in self.regions().values():
            wants = [self.want.get(id(n)) for n in nodes if self.kind[id(n)] == "S"]
            if not wants:
                continue
            cost = self._cost(nodes)
            forced = any(w in ("must", "strong") for w in wants)
            # below optimization level 3 only a layout a device requires or strongly prefers
            choose = forced or (self.by_cost and len(wants) >= max(cost, 1))
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
        return nhwc_nodes

    # -- 3. rewrite ----------------------------------------------------------------------------
    def run(self) -> LayoutReport:
        g = self.g
        for n in g.nodes:
            self.kind[id(n)] = self.classify(n)
        self.find_shuffles()
        nhwc_nodes = self._decide()
        if not nhwc_nodes:
            for n in g.nodes:
                self.layout[id(n)] = NCHW
            self._tag(set())
            return self.report
        self._rewrite(nhwc_nodes)
        g.nodes = self.new_nodes
        for key, o in self.orig.items():
            # An NCHW original nobody needed does not exist: only its NHWC Value does.
            if key not in self.nchw_ok and g.values.get(o.name) is o:
                del g.values[o.name]
        g.rebuild_uses()
        if layout_shuffle.fold_shuffles(self):
            g.rebuild_uses()
        self._sweep()
        self._tag({id(v) for v in self.phys.values() if id(v) not in self.odd})
        for v in self.phys.values():
            if id(v) in self.odd:
                v.layout = None
        return self.report

    def _rewrite(self, nhwc_nodes: set[int]) -> None:
        """The graph's nodes, in order, into `new_nodes`: those of NHWC regions on NHWC data,
        the rest on NCHW data, with the conversions between; graph outputs back in NCHW."""
        g = self.g
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
                self.materialize(v, dev if dev is not None else get_device("cpu"),
                                  "graph output")

    def _rewrite_nhwc(self, node: Node, dev: Device | None) -> None:
        kind = self.kind[id(node)]
        if kind in ("CH", "CM", "CT"):
            layout_shuffle.rewrite_shuffle(self, node, dev)
            return
        r = rank(_output0(node))
        for i in self.layout_inputs(node):
            v = node.inputs[i]
            if v is not None:
                node.inputs[i] = self.nhwc_of(v, dev, node)
        if kind == "A":
            for i, v in enumerate(node.inputs):
                if v is not None and v.const is not None and not size_one(v):
                    if node.op_type in AXIS_OPS or node.op_type in BROADCAST or i == 0:
                        node.inputs[i] = self.const_nhwc(v, r)
            self._remap_attrs(node, r)
        for k in self.layout_outputs(node):
            o = node.outputs[k]
            assert o is not None  # layout_outputs lists tracked outputs only
            shape = tuple(dims(o)[p] for p in to_last(r))
            nv = self.new_value(f"{o.name}__nhwc", TensorFact(o.fact.dtype, shape))
            nv.layout = NHWC
            nv.producer = node
            node.outputs[k] = nv
            self.phys[id(o)] = nv
            self.orig[id(o)] = o
        self.new_nodes.append(node)

    def _remap_attrs(self, node: Node, r: int) -> None:
        perm = to_last(r)
        op = node.op_type
        if op in AXIS_OPS or op == "Split":
            default = {"Concat": 1, "Split": 0}.get(op, -1)
            axis = int(node.attrs.get("axis", default)) % r
            node.attrs = dict(node.attrs, axis=perm.index(axis))
        elif op == "Slice":
            # classify made Slice agnostic only with constant starts, ends, axes and steps;
            # without axes they are the first len(starts) logical axes
            starts = node.inputs[1]
            axes = node.inputs[3] if len(node.inputs) > 3 else None
            assert starts is not None and starts.const is not None
            logical = (np.arange(starts.const.size, dtype=np.int64) if axes is None
                       else np.asarray(axes.const).reshape(-1))
            new = np.array([perm.index(int(a) % r) for a in logical], dtype=logical.dtype)
            name = f"{axes.name}__nhwc" if axes is not None else f"{node.name}__axes_nhwc"
            ins = list(node.inputs) + [None] * (4 - len(node.inputs))
            ins[3] = self.new_const(name, new)
            node.inputs = ins
        elif op == "Pad":
            if node.opset < 11:
                key = "pads" if "pads" in node.attrs else "paddings"
                p = list(node.attrs.get(key, [0] * 2 * r))
                node.attrs = dict(node.attrs, **{key: perm_pads(p, perm)})
                return
            axes = node.inputs[3] if len(node.inputs) > 3 else None
            pads = node.inputs[1]
            # classify made Pad agnostic only with constant pads and axes
            if axes is not None and axes.const is not None:
                a = axes.const
                new = np.array([perm.index(int(x) % r) for x in a], dtype=a.dtype)
                node.inputs[3] = self.new_const(f"{axes.name}__nhwc", new)
            elif pads is not None and pads.const is not None:
                c = pads.const
                new = np.array(perm_pads(list(c), perm), dtype=c.dtype)
                node.inputs[1] = self.new_const(f"{pads.name}__nhwc", new)

    def _absorb(self, node: Node) -> bool:
        """A model Transpose of an NHWC-only tensor reads the NHWC tensor with a composed perm."""
        v = node.inputs[0]
        if v is None or id(v) not in self.phys or id(v) in self.nchw_ok:
            return False
        r = rank(v)
        perm = node.attrs.get("perm") or list(reversed(range(r)))
        phys = to_last(r)
        node.inputs[0] = self.phys[id(v)]
        node.attrs = dict(node.attrs, perm=[phys.index(int(p)) for p in perm])
        self.report.absorbed += 1
        return True

    def _need_nchw(self, node: Node, dev: Device | None) -> None:
        for i, v in enumerate(node.inputs):
            if v is None or id(v) not in self.phys or id(v) in self.nchw_ok:
                continue
            phys = self.phys[id(v)]
            if i == 0 and node.op_type in VIEW_OPS and self._view_safe(node, v, phys):
                node.inputs[0] = phys
                continue
            self.materialize(v, dev, f"{node.op_type} {node.name!r} needs NCHW")

    def _view_safe(self, node: Node, v: Value, phys: Value) -> bool:
        """Can a Reshape/Flatten read the NHWC tensor as if it were NCHW (same byte order)?"""
        if not moves_no_data(phys.fact.shape, to_first(rank(v))):
            return False
        if node.op_type == "Flatten":
            axis = int(node.attrs.get("axis", 1)) % (rank(v) + 1)
            lo = int(np.prod(dims(v)[:axis]))
            return lo == int(np.prod(dims(phys)[:axis]))
        shape = node.inputs[1] if len(node.inputs) > 1 else None
        if shape is None or shape.const is None:
            return False
        return bool(node.attrs.get("allowzero", 0)) or not np.any(shape.const == 0)

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
                    self._drop(n)
                    continue
                keep.append(n)
            self.g.nodes = keep
        self.g.rebuild_uses()

    def _drop(self, n: Node) -> None:
        """Forget dead layout-only node `n` (counted as cancelled when the model wrote it)."""
        if id(n) not in self.report.inserted:
            self.report.cancelled += 1
            for o in n.origins:
                self.g.removed.setdefault(o, "layout (transpose cancelled)")
        else:
            if n.op_type == "Transpose":
                self.report.transposes -= 1
            else:
                self.report.views -= 1
            del self.report.inserted[id(n)]
        for v in n.inputs:
            if v is not None:
                v.uses[:] = [(u, i) for u, i in v.uses if u is not n]

    def _tag(self, nhwc: set[int]) -> None:
        for v in self.g.values.values():
            if id(v) in nhwc or v.layout == NHWC:
                v.layout = NHWC
            else:
                v.layout = NCHW if tracked(v) else None


def unify(
    graph: Graph, device_of: dict[int, Device], opset: int, quarantine: Any = None,
    by_cost: bool = True,
) -> tuple[dict[int, str], LayoutReport]:
    """Run the pass; returns (layout per node id, report). `device_of` gains inserted nodes.
    `by_cost` False (optimization levels below 3): NHWC only where a device wants it."""
    p = LayoutPass(graph, device_of, opset, quarantine)
    p.by_cost = by_cost
    report = p.run()
    return p.layout, report
