"""Build IR nodes from NodeProtos the runtime writes itself, into a graph already loaded.

Placement rewrites a node a device refuses through its ONNX function body (opwarden/place/
decompose.py): the body's NodeProtos become nodes of the loaded graph. They come from the ONNX
spec, not from a file, so they need none of the loader's defences (ir/load.py: external data
confined to the model's folder, model-local functions, file order, inferred-type checks): this
module reads their attributes, resolves their inputs by name, gives their outputs the facts
shape inference found for the pieces, and builds a graph attribute (the Loop body of Range's
function) the same way. The names of one build stay unique (``name__index`` on a clash).
The loader builds on two pieces of this module: `type_fact` (a TypeProto's kind and fact) and
`wire_outputs` (a graph's outputs from its GraphProto).
"""

from __future__ import annotations

from typing import Any

import onnx

from opwarden.contract import TensorFact, mark_declared
from opwarden.dtypes import dtype_name, np_dtype
from opwarden.errors import ModelError
from opwarden.ir.graph import Graph, Node, Value
from opwarden.ir.tensors import to_array
from opwarden.ops.schema import attr_value, canonical_domain


def type_fact(tp: onnx.TypeProto) -> tuple[str, TensorFact]:
    """(kind, fact) of a TypeProto."""
    which = tp.WhichOneof("value")
    if which == "tensor_type" or which == "sparse_tensor_type":
        tt = getattr(tp, which)
        dtype = None
        if tt.elem_type:
            try:
                dtype = dtype_name(np_dtype(tt.elem_type))
            except KeyError:
                dtype = None
        shape = None
        if tt.HasField("shape"):
            shape = tuple(
                d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                for d in tt.shape.dim
            )
        return ("tensor" if which == "tensor_type" else "sparse"), TensorFact(dtype, shape)
    kinds = {"sequence_type": "sequence", "optional_type": "optional", "map_type": "map"}
    return kinds.get(which or "", "unknown"), TensorFact(None, None)


def wire_outputs(g: Graph, gp: onnx.GraphProto) -> None:
    """Make `gp`'s outputs `g`'s, each a value some node produces; a dtype only the declaration
    gives is taken, its dims marked declared-only. Then the uses are rebuilt."""
    for vo in gp.output:
        v = g.lookup(vo.name)
        if v is None:
            raise ModelError(f"graph {g.name!r}: output {vo.name!r} is not produced by any node")
        kind, fact = type_fact(vo.type)
        if v.fact.dtype is None and fact.dtype is not None:
            v.fact = TensorFact(fact.dtype, mark_declared(fact.shape))
            v.kind = kind
        g.outputs.append(v)
    g.rebuild_uses()


class NodeBuilder:
    """Builds nodes of NodeProtos into graphs; `types`: the known types of their outputs."""

    def __init__(self, opsets: dict[str, int], types: dict[str, onnx.TypeProto]) -> None:
        self.opsets = opsets
        self.types = types
        self.names: set[str] = set()

    def node(
        self, n: onnx.NodeProto, g: Graph, index: int,
        local_types: dict[str, onnx.TypeProto] | None = None, reuse: bool = False,
    ) -> Node:
        """The node of `n` in `g` (the `index`-th of its list); with `reuse`, outputs already in
        `g` are these very values (a decomposition's outputs are the decomposed node's)."""
        domain = canonical_domain(n.domain)
        name = n.name or f"{n.op_type}_{index}"
        if name in self.names:
            name = f"{name}__{index}"
        self.names.add(name)
        if domain not in self.opsets:
            raise ModelError(
                f"node {name!r} ({n.op_type}) uses domain {n.domain or 'ai.onnx'!r}, "
                f"which the model does not import (opset_import has {sorted(self.opsets)})"
            )
        inputs: list[Value | None] = []
        for x in n.input:
            v = g.lookup(x) if x else None
            if x and v is None:
                raise ModelError(
                    f"node {name!r} ({n.op_type}) reads {x!r}, which is not a graph input, an "
                    "initializer or the output of an earlier node"
                )
            inputs.append(v)
        attrs: dict[str, Any] = {}
        for a in n.attribute:
            if a.name in attrs:
                raise ModelError(f"node {name!r} ({n.op_type}): attribute {a.name!r} given twice")
            val = self.attribute(a, f"node {name!r} ({n.op_type}) attribute {a.name!r}")
            if a.type == onnx.AttributeProto.GRAPH:
                val = self.graph(val, g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                val = [self.graph(sub, g) for sub in val]
            attrs[a.name] = val
        node = Node(n.op_type, domain, name, inputs, [], attrs, self.opsets[domain], graph=g)
        node.attr_types = {a.name: a.type for a in n.attribute}  # type: ignore[attr-defined]
        for o in n.output:
            node.outputs.append(self._output(o, node, g, local_types or {}, reuse) if o else None)
        return node

    def attribute(self, a: onnx.AttributeProto, held: str) -> Any:
        """The Python value of attribute `a` (`held`: how errors name it); graphs still protos."""
        return attr_value(a)

    def fact(self, name: str) -> tuple[str, TensorFact]:
        """(kind, fact) of output `name` from the known types (no local declaration)."""
        tp = self.types.get(name)
        return type_fact(tp) if tp is not None else ("tensor", TensorFact(None, None))

    def _output(
        self, name: str, node: Node, g: Graph, local_types: dict[str, onnx.TypeProto], reuse: bool
    ) -> Value:
        tp = local_types.get(name)
        if tp is not None:
            kind, fact = type_fact(tp)
            fact = TensorFact(fact.dtype, mark_declared(fact.shape))
        else:
            kind, fact = self.fact(name)
        v = g.values.get(name) if reuse else None
        if v is None:
            v = g.add_value(name, kind=kind, fact=fact)
        v.producer = node
        return v

    def graph(self, gp: onnx.GraphProto, outer: Graph | None) -> Graph:
        """A graph attribute of a piece, as a subgraph of `outer` (its nodes in body order: the
        spec writes them sorted; facts as the body declares them, dims declared-only)."""
        g = Graph(gp.name or "graph", outer=outer)
        if gp.sparse_initializer:
            raise ModelError(f"graph {g.name!r}: sparse initializers in a function body")
        for t in gp.initializer:
            arr = to_array(t, where=f"initializer {t.name!r} of graph {g.name!r}")
            g.initializers[t.name] = g.add_value(
                t.name, const=arr, fact=TensorFact(dtype_name(arr.dtype), arr.shape)
            )
        for vi in gp.input:
            if vi.name in g.values:
                g.inputs.append(g.values[vi.name])
                continue
            kind, fact = type_fact(vi.type)
            tp = None
            if kind != "tensor":  # a copy: a submessage would keep the whole body alive
                tp = onnx.TypeProto()
                tp.CopyFrom(vi.type)
            g.inputs.append(g.add_value(vi.name, kind=kind, fact=fact, type_proto=tp))
        local_types = {vi.name: vi.type for vi in gp.value_info}
        for i, n in enumerate(gp.node):
            g.nodes.append(self.node(n, g, i, local_types))
        wire_outputs(g, gp)
        return g
