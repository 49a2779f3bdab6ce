"""Shared machinery of the graph passes: what a pass returns, constant tests, use bookkeeping,
node creation.

A pass is a function of one `Rewriter` (the editing state of one pass over the main graph)
returning a `PassResult` (what it changed). Besides the Rewriter's own edits, the node
builders several passes share live here: `fuse` (a chain of nodes as one fused node),
`activation_node` (a FusedConv activation as its own standard node) and the copies of a
convolution or pool on new values that the pool-moving passes place.

Provenance goes through here too: every node `make_node` creates names the nodes it replaces
(`parts`), and carries the union of their origins (`Node.origin`, the model nodes it
computes); a node that takes over another's work in place says so with `absorb`. `finish`
records in `Graph.removed`, under the pass's name, each model node that no node stands for any
more (constant-folded, dead, bypassed), so `explain` can account for every node of the model.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from opwarden.contract import TensorFact
from opwarden.dtypes import dtype_name
from opwarden.ir.graph import Graph, Model, Node, Value
from opwarden.ir.validate import check_node

FUSED_DOMAIN = "opwarden"
# A node built from more parts than fit in this many characters is named after its first and
# last part and how many are between (its origin still lists every one).
NAME_CHARS = 60


def merge_origins(nodes: list[Node]) -> list[str]:
    """The origins of `nodes`, in order, each name once."""
    return list(dict.fromkeys(o for n in nodes for o in n.origins))


def part_name(nodes: list[Node]) -> str:
    """A readable name for a node standing for `nodes`: the model nodes they stand for joined
    by '+' ("conv1+bn1+relu_a"), or the first and last with the count between when that is
    too long."""
    names = merge_origins(nodes) or [n.name for n in nodes]
    joined = "+".join(names)
    if len(names) <= 2 or len(joined) <= NAME_CHARS:
        return joined
    return f"{names[0]}+{len(names) - 2}_more+{names[-1]}"


@dataclass
class PassResult:
    """What one run of a pass changed.

    `changes` counts its rewrites (nodes folded, fused, removed or moved): the pass manager
    rebuilds the graph's links after a pass with changes and repeats the level-1 round while
    it has any. `details` counts them by kind (folded op types, fused chains such as
    "Conv+Relu"), the pass report's "details".
    """

    changes: int = 0
    details: Counter[str] = field(default_factory=Counter)


class Rewriter:
    """One pass over one graph: keeps `uses` current while nodes are removed or replaced.

    Removed nodes and the positions of replacements are recorded and applied to `graph.nodes`
    by `finish()`, which also drops values nothing refers to any more.
    """

    def __init__(self, model: Model, graph: Graph, name: str = "") -> None:
        self.model = model
        self.graph = graph
        self.name = name  # the pass's, recorded against the model nodes it removes
        self.absorbed: set[str] = set()  # origins taken over in place (see `absorb`)
        self.removed: set[int] = set()
        self.inserted: dict[int, list[Node]] = {}  # id(anchor node) -> nodes placed before it
        self.outputs = {id(v) for v in graph.outputs}
        self.inputs = {id(v) for v in graph.inputs}

    # -- facts ----------------------------------------------------------------------------
    def const(self, v: Value | None) -> np.ndarray | None:
        """The constant value of v, or None if it is not a constant the session cannot change.

        Initializers that are also graph inputs can be overridden by a feed, so from IR version
        4 on they are not constants (as onnxruntime treats them); before 4 every initializer had
        to be listed as an input, and they are constants.
        """
        if v is None or v.const is None or v.kind != "tensor":
            return None
        if id(v) in self.inputs and self.model.ir_version >= 4:
            return None
        return v.const

    def single_use(self, v: Value | None) -> Node | None:
        """The only consumer of v within this graph, if v is not a graph output and has one."""
        if v is None or id(v) in self.outputs or len(v.uses) != 1:
            return None
        node, _ = v.uses[0]
        if node.graph is not self.graph or id(node) in self.removed:
            return None
        return node

    def local_uses(self, v: Value) -> bool:
        """Every consumer of v is a node of this graph (none is inside a subgraph)."""
        return all(n.graph is self.graph for n, _ in v.uses)

    # -- editing --------------------------------------------------------------------------
    def set_input(self, node: Node, i: int, new: Value | None) -> None:
        """Make `node` read `new` as input i, moving the use over (a replaced weight nothing
        reads any more is freed now)."""
        old = node.inputs[i]
        if old is not None:
            _drop_use(old, node, i)
        node.inputs[i] = new
        if new is not None:
            new.uses.append((node, i))
        if old is not None and old is not new:
            self._release(old)

    def _release(self, v: Value) -> None:
        """Free a replaced weight now (not at the final clean-up), so a model's folded and
        original weights are never all in memory at once."""
        if (
            v.const is None
            or v.uses
            or id(v) in self.inputs
            or id(v) in self.outputs
            or self.graph.initializers.get(v.name) is not v
        ):
            return
        del self.graph.initializers[v.name]
        if self.graph.values.get(v.name) is v:
            del self.graph.values[v.name]
        v.const = None

    def replace_uses(self, old: Value, new: Value) -> bool:
        """Point every consumer of `old` at `new`; False (nothing done) if not possible."""
        if id(old) in self.outputs or not self.local_uses(old):
            return False
        for node, i in list(old.uses):
            node.inputs[i] = new
            new.uses.append((node, i))
        old.uses.clear()
        return True

    def remove(self, node: Node) -> None:
        """Take `node` out of the graph (at `finish`); its inputs lose their uses now."""
        for i, v in enumerate(node.inputs):
            if v is not None:
                _drop_use(v, node, i)
        self.removed.add(id(node))

    def remove_all(self, nodes: list[Node]) -> None:
        """`remove` each of `nodes`, filtering each input's uses once for all of them (removing
        a large group reading one value one by one refilters its uses per node: quadratic)."""
        gone: dict[int, tuple[Value, set[tuple[int, int]]]] = {}
        for node in nodes:
            for i, v in enumerate(node.inputs):
                if v is not None:
                    gone.setdefault(id(v), (v, set()))[1].add((id(node), i))
            self.removed.add(id(node))
        for v, pairs in gone.values():
            v.uses[:] = [(n, k) for n, k in v.uses if (id(n), k) not in pairs]

    def bypass(self, node: Node, out: Value, src: Value) -> bool:
        """Make `out` (an output of `node`, equal to `src`) disappear; False if it must stay.

        Consumers of `out` read `src` instead; if `out` is a graph output, `src`'s producer
        writes `out` directly when nothing else reads `src`.
        """
        if out.fact.dtype is not None and src.fact.dtype is not None:
            if out.fact.dtype != src.fact.dtype:
                return False
        if id(out) not in self.outputs:
            return self.replace_uses(out, src)
        prod = src.producer
        if (
            prod is None
            or prod.graph is not self.graph
            or id(prod) in self.removed
            or id(src) in self.outputs
            or id(src) in self.inputs
            or len(src.uses) != 1
            or src.uses[0][0] is not node
        ):
            return False
        k = next(j for j, o in enumerate(prod.outputs) if o is src)
        prod.outputs[k] = out
        out.producer = prod
        if out.fact.shape is None:
            out.fact = src.fact
        src.uses.clear()
        return True

    def new_const(self, base: str, array: np.ndarray) -> Value:
        """A new initializer holding `array` (made read-only, like loaded initializers: kernels
        cache repacked weights only for read-only arrays), named after `base`."""
        array.flags.writeable = False
        v = self.graph.add_value(
            self.unique(base), const=array, fact=TensorFact(dtype_name(array.dtype), array.shape)
        )
        self.graph.initializers[v.name] = v
        return v

    def new_value(self, base: str, fact: TensorFact) -> Value:
        """A new value of the graph with `fact`, named after `base`."""
        return self.graph.add_value(self.unique(base), fact=fact)

    def unique(self, base: str) -> str:
        """A value name not defined in this graph or any enclosing one."""

        def taken(name: str) -> bool:
            g: Graph | None = self.graph
            while g is not None:
                if name in g.values:
                    return True
                g = g.outer
            return False

        name, k = base, 0
        while taken(name):
            k += 1
            name = f"{base}_{k}"
        return name

    def make_node(
        self,
        op_type: str,
        inputs: list[Value | None],
        outputs: list[Value],
        attrs: dict[str, Any],
        *,
        name: str,
        parts: list[Node],
        domain: str = FUSED_DOMAIN,
        opset: int | None = None,
        attr_types: dict[str, int] | None = None,
    ) -> Node:
        """A node checked against its schema (opdef and schema resolved) but not yet placed;
        `parts`: the nodes whose work it does, whose origins it carries."""
        if domain == FUSED_DOMAIN:
            self.model.opsets.setdefault(FUSED_DOMAIN, 1)
        if any(p.name == name and id(p) in self.removed for p in parts):
            self._node_names_of().discard(name)  # a copy of a removed node keeps its name
        node = Node(
            op_type,
            domain,
            self.unique_node_name(name),
            list(inputs),
            list(outputs),
            dict(attrs),
            opset if opset is not None else self.model.opsets[domain],
            graph=self.graph,
        )
        node.attr_types = dict(attr_types or {})  # type: ignore[attr-defined]
        node.origin = merge_origins(parts)
        check_node(node)
        return node

    def absorb(self, node: Node, parts: list[Node]) -> None:
        """`node` now also does the work of `parts` (folded into its weights or attributes):
        it carries their origins, and their removal is no loss to report."""
        node.origin = merge_origins([node, *parts])
        self.absorbed.update(node.origin)

    def unique_node_name(self, base: str) -> str:
        """`base`, or `base_k` for the first k that no node of the graph (or this pass) has."""
        names = self._node_names_of()
        name, k = base, 0
        while name in names:
            k += 1
            name = f"{base}_{k}"
        names.add(name)
        return name

    def _node_names_of(self) -> set[str]:
        names = getattr(self, "_node_names", None)
        if names is None:
            names = self._node_names = {n.name for n in self.graph.nodes}
        return names

    def place(self, node: Node, anchor: Node) -> None:
        """Put `node` where `anchor` is (anchor removed); its inputs gain the new uses."""
        self.inserted.setdefault(id(anchor), []).append(node)
        self.removed.add(id(anchor))
        node.link()

    # -- finishing ------------------------------------------------------------------------
    def finish(self) -> None:
        """Apply the removals and placements to `graph.nodes`, record the model nodes that
        went without a replacement in `graph.removed`, and drop values nothing refers to."""
        if not self.removed and not self.inserted:
            return
        nodes: list[Node] = []
        gone: list[Node] = []
        for n in self.graph.nodes:
            nodes.extend(self.inserted.get(id(n), ()))
            if id(n) not in self.removed:
                nodes.append(n)
            else:
                gone.append(n)
        self._record_removed(gone)
        self.graph.nodes = nodes
        prune_values(self.graph)

    def _record_removed(self, gone: list[Node]) -> None:
        """Note each origin of the removed nodes that no placed node or absorb carries on."""
        new = [n for ns in self.inserted.values() for n in ns]
        gone = gone + [n for n in new if id(n) in self.removed]  # placed, then replaced
        carried = set(self.absorbed)
        for n in new:
            if id(n) not in self.removed:
                carried.update(n.origins)
        why = self.name or "graph optimization"
        for n in gone:
            for o in n.origins:
                if o not in carried:
                    self.graph.removed.setdefault(o, why)


def fuse(rw: Rewriter, res: PassResult, op_type: str, nodes: list[Node], inputs, attrs,
         attr_types, act_from: int | None = None) -> None:
    """Replace `nodes` (a chain or tree, the last one writing its result) by one `op_type`
    node of the fused domain writing that output, placed where the last one was;
    `nodes[act_from:]` are the activation it applies (their origins are remembered apart, so
    a pass moving the activation out again knows which model nodes go with it)."""
    out = nodes[-1].outputs[0]
    rw.remove_all(nodes)
    fused = rw.make_node(op_type, inputs, [out], attrs, name=part_name(nodes), parts=nodes,
                         attr_types=attr_types)
    if act_from is not None and act_from < len(nodes):
        fused.act_origin = merge_origins(nodes[act_from:])  # type: ignore[attr-defined]
    rw.place(fused, nodes[-1])
    res.details[op_type] += 1
    res.details["+".join(n.op_type for n in nodes)] += 1
    res.changes += len(nodes) - 1


def activation_node(rw: Rewriter, act: str, params: list[float], x: Value, y: Value,
                    name: str, parts: list[Node]) -> Node:
    """y = act(x) as a standard node (FusedConv's activation_params conventions); `parts`:
    the node that applied the activation before. It is named after the model node(s) it
    computes where those are known, else `name`."""
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
    core, act_origin = split_activation(parts[0])
    if parts[0].op_type == act and not parts[0].domain:
        name = parts[0].name  # the activation node itself, moved: it keeps its name
    elif core != act_origin:
        name = "+".join(act_origin)  # the model node(s) it is: "relu_a"
    node = rw.make_node(act, ins, [y], attrs, name=name, parts=parts, domain="", opset=opset,
                        attr_types=types)
    node.origin = act_origin
    return node


def split_activation(node: Node) -> tuple[list[str], list[str]]:
    """(origins of what `node` computes before its fused activation, origins of that
    activation); both all its origins when the split is not known (or it fuses none)."""
    act = list(getattr(node, "act_origin", None) or ())
    core = [o for o in node.origins if o not in act]
    if not act or not core:
        return node.origins, node.origins
    return core, act


def conv_copy(rw: Rewriter, conv: Node, x: Value, y: Value, keep_act: bool) -> Node:
    """`conv` reading x and writing y (its fused activation kept or dropped), not yet placed."""
    attrs = {k: v for k, v in conv.attrs.items()
             if keep_act or k not in ("activation", "activation_params")}
    types = {k: t for k, t in getattr(conv, "attr_types", {}).items() if k in attrs}
    name = conv.name
    if keep_act or not conv.attrs.get("activation"):
        node = rw.make_node(conv.op_type, [x, *conv.inputs[1:]], [y], attrs, name=name,
                            parts=[conv], domain=conv.domain, opset=conv.opset,
                            attr_types=types)
        if hasattr(conv, "act_origin"):
            node.act_origin = conv.act_origin  # type: ignore[attr-defined]
        return node
    core, act = split_activation(conv)
    if core != act:  # "conv1+relu_a" without its activation is "conv1"
        for a in reversed(act):
            name = name[: -len(a) - 1] if name.endswith(f"+{a}") else name
    node = rw.make_node(conv.op_type, [x, *conv.inputs[1:]], [y], attrs, name=name,
                        parts=[conv], domain=conv.domain, opset=conv.opset, attr_types=types)
    node.origin = core
    return node


def pool_copy(rw: Rewriter, pool: Node, x: Value, y: Value) -> Node:
    """`pool` reading x and writing y, not yet placed."""
    return rw.make_node(pool.op_type, [x], [y], pool.attrs, name=pool.name, parts=[pool],
                        domain="", opset=pool.opset,
                        attr_types=getattr(pool, "attr_types", None))


def _drop_use(v: Value, node: Node, i: int) -> None:
    """Drop (node, i) from v's uses (each (node, input position) is listed once), keeping their
    order. Passes remove the readers of a value in graph order or in reverse, so the use is
    mostly first or last and needs no scan."""
    uses = v.uses
    if uses:
        n, k = uses[-1]
        if n is node and k == i:
            uses.pop()
            return
        n, k = uses[0]
        if n is node and k == i:
            del uses[0]
            return
    uses[:] = [(n, k) for n, k in uses if not (n is node and k == i)]


def prune_values(graph: Graph) -> None:
    """Drop values and initializers that no node, graph input or output refers to any more."""
    keep = {id(v) for v in graph.inputs} | {id(v) for v in graph.outputs}
    for n in graph.nodes:
        keep.update(id(v) for v in n.inputs if v is not None)
        keep.update(id(v) for v in n.outputs if v is not None)
        stack = n.subgraphs()
        while stack:  # values read only inside a subgraph (its captures) must stay
            sub = stack.pop()
            keep.update(id(v) for v in sub.captures)
            for m in sub.nodes:
                stack.extend(m.subgraphs())
    for name in [k for k, v in graph.values.items() if id(v) not in keep]:
        del graph.values[name]
        graph.initializers.pop(name, None)


def relink(model: Model) -> None:
    """Recompute producer/uses for the main graph and every subgraph, outermost first."""
    from opwarden.ir.validate import graphs_of

    for g in graphs_of(model):
        g.rebuild_uses()


def static_shape(v: Value | None) -> tuple[int, ...] | None:
    """v's shape when it is a tensor whose every dimension is a known int, else None."""
    if v is None or v.kind != "tensor" or not v.fact.static:
        return None
    return tuple(v.fact.shape)
