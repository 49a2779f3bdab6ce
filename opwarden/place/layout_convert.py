"""The layout pass's state and building blocks: NHWC Values, conversions, new nodes.

While the pass (layout.py) rewrites a graph, every original Value keeps its NCHW meaning and an
NHWC one gets a new Value (``phys``), made on first need: by a Transpose node, or a Reshape
when the permutation moves no data, or by composing with the model's own Transpose of it (back
to back, they cancel). Conversions back to NCHW are made where a consumer or a graph output
needs one (``materialize``). Every node, value and constant made here gets a unique name, and
every conversion is recorded in the report with why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from opwarden.contract import TensorFact
from opwarden.devices import Device
from opwarden.dtypes import dtype_name
from opwarden.ir.graph import Graph, Node, Value
from opwarden.ops import REGISTRY
from opwarden.place.layout_axes import NCHW, NHWC, dims, moves_no_data, rank, to_first, to_last


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



class LayoutState:
    """One run's state over one graph, and the rewrites every step of the pass shares."""

    def __init__(
        self, graph: Graph, device_of: dict[int, Device], opset: int, quarantine: Any = None
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
        # id(head) -> (input shape, channel factors)
        self.shuffle_shapes: dict[int, tuple[tuple[Any, ...], tuple[Any, ...]]] = {}
        self.odd: set[int] = set()  # shuffle intermediates: neither NCHW nor NHWC
        self.fused_shuffles: set[int] = set()  # id(head) of shuffles emitted as one node
        self._names: set[str] = {n.name for n in graph.nodes}
        # The rewrite's state (step 3 of the pass)
        self.phys: dict[int, Value] = {}  # id(original value) -> its NHWC Value
        self.nchw_ok: set[int] = set()  # original values that exist in NCHW
        self.const_cache: dict[int, Value] = {}
        self.orig: dict[int, Value] = {}
        self.new_nodes: list[Node] = []

    def nhwc_of(self, v: Value, dev: Device | None, consumer: Node) -> Value:
        """The NHWC Value of `v` (converted on first need, for `consumer`)."""
        got = self.phys.get(id(v))
        if got is not None:
            return got
        r = rank(v)
        perm = to_last(r)
        shape = tuple(dims(v)[p] for p in perm)
        src, p = v, perm
        prod = v.producer
        u = prod.inputs[0] if prod is not None and prod.inputs else None
        if prod is not None and prod.op_type == "Transpose" and prod.domain == "" and (
            id(prod) not in self.report.inserted
        ) and u is not None:
            # Compose with the model's Transpose: Transpose(Transpose(u, p1), p2) = T(u, p1∘p2).
            p1 = prod.attrs.get("perm") or list(reversed(range(r)))
            comp = tuple(int(p1[q]) for q in perm)
            if comp == tuple(range(r)):
                self.phys[id(v)] = u
                return u
            src, p = u, comp
        nv = self.new_value(f"{v.name}__nhwc", TensorFact(v.fact.dtype, shape))
        why = f"layout: {consumer.op_type} {consumer.name!r} takes NHWC"
        self._convert(src, p, nv, dev, why)
        self.phys[id(v)] = nv
        return nv

    def materialize(self, v: Value, dev: Device | None, why: str) -> None:
        phys = self.phys[id(v)]
        self._convert(phys, to_first(rank(v)), v, dev, f"layout: {why}")
        self.nchw_ok.add(id(v))

    def _convert(
        self, src: Value, perm: tuple[int, ...], dst: Value, dev: Device | None, why: str
    ) -> None:
        if moves_no_data(src.fact.shape, perm):
            shape = self.new_const(f"{dst.name}__shape", np.array(dims(dst), dtype=np.int64))
            node = self.new_node("Reshape", [src, shape], dst, {}, f"{dst.name}/view")
            self.report.views += 1
        else:
            node = self.new_node("Transpose", [src], dst, {"perm": list(perm)},
                                 f"{dst.name}/perm")
            self.report.transposes += 1
        node.opdef, node.schema = REGISTRY.resolve(node.op_type, "", node.opset)
        self.report.inserted[id(node)] = why
        if dev is not None:
            self.device_of[id(node)] = dev
        self.kind[id(node)] = "N"
        self.layout[id(node)] = NCHW
        self.new_nodes.append(node)

    def new_node(
        self, op: str, ins: list[Value | None], out: Value, attrs: dict[str, Any], name: str
    ) -> Node:
        """A standard-domain node of the pass's opset writing `out` (its name made unique)."""
        base, k = name, 1
        while name in self._names:
            k += 1
            name = f"{base}_{k}"
        self._names.add(name)
        node = Node(op, "", name, ins, [out], attrs, self.opset, graph=self.g, origin=[])
        out.producer = node
        return node

    def new_value(self, name: str, fact: TensorFact) -> Value:
        """A new value of the graph (its name made unique)."""
        base, k = name, 1
        while name in self.g.values:
            k += 1
            name = f"{base}_{k}"
        return self.g.add_value(name, fact=fact)

    def new_const(self, name: str, arr: np.ndarray) -> Value:
        """A new initializer holding `arr` (it exists in NCHW: no conversion needed)."""
        v = self.new_value(name, TensorFact(dtype_name(arr.dtype), tuple(arr.shape)))
        v.const = arr
        self.g.initializers[v.name] = v
        self.nchw_ok.add(id(v))
        return v

    def const_nhwc(self, c: Value, r: int) -> Value:
        got = self.const_cache.get(id(c))
        if got is None:
            a = np.asarray(c.const)
            a = a.reshape((1,) * (r - a.ndim) + a.shape)
            a = np.ascontiguousarray(a.transpose(to_last(r)))
            got = self.const_cache[id(c)] = self.new_const(f"{c.name}__nhwc", a)
            got.layout = NHWC
        return got
