"""`fp16_islands` (every level, subgraph bodies too): float16 models round where ONNX Runtime's
CPU provider rounds.

ORT has float16 CPU kernels for only some operators (data movement, Cast, Gather,
LayerNormalization, Clip, Min/Max, ...: `_NATIVE`, read from ORT 1.32's kernel registry). Its
InsertCastTransformer runs every other node that reads float16 in float32: a Cast to float32
on each float16 input, one back on each output, and then the Casts between two such nodes
cancel out, so a chain of them (MatMul, Add, Softmax, Erf, Conv, ...) computes in float32 and
rounds only where a float16 kernel, a graph output or a subgraph reads the chain. A node with
a float16 kernel whose float16 inputs all come from such nodes (or are initializers or graph
inputs, as long as one comes from a node) and whose float16 outputs all go to such nodes
also runs in float32 ("isolated"; not with a subgraph or a graph output). Casts a model
writes itself stay as they are (ORT 1.32 removes none of its lossy float32 -> float16 ->
float32 pairs).

This pass makes those decisions on each graph (the pass manager runs it on every subgraph body
too, whose values' types it first derives from their producers' schemas where the model
declares none), in node order as ORT makes them: such a
node gets float32 copies of its float16 inputs (Cast nodes; on initializers they fold to
float32 weights holding the float16 values) and float32 outputs, with a Cast back to
float16 only for the readers that need float16. A node that would run in float32 alone is
left as it is (its kernel computes in float32 and rounds once all the same). Without this
pass every operator rounds its result to float16, about twice ORT's error on a float16 BERT.
"""

from __future__ import annotations

from functools import cache
from typing import TypeGuard

import onnx

from opwarden.contract import TensorFact
from opwarden.ir.graph import Node, Value
from opwarden.passes.rewrite import PassResult, Rewriter

_INF = 1 << 30
# (domain, op) -> opset ranges of ORT 1.32's float16 CPU kernels (an input or output type
# constraint holding float16).
_NATIVE: dict[tuple[str, str], tuple[tuple[int, int], ...]] = {
    **{("", op): ((lo, _INF),) for op, lo in (
        ("Attention", 23), ("BitCast", 26), ("Cast", 6), ("Celu", 28), ("Clip", 12),
        ("Compress", 9), ("Concat", 4), ("ConstantOfShape", 9), ("DequantizeLinear", 19),
        ("DynamicSlice", 1), ("Expand", 8), ("Flatten", 1), ("Gather", 1),
        ("GatherElements", 11), ("GatherND", 11), ("Identity", 1), ("If", 1), ("IsInf", 20),
        ("IsNaN", 9), ("LayerNormalization", 1), ("Loop", 1), ("Max", 12), ("Min", 12),
        ("Mod", 10), ("Optional", 15), ("OptionalGetElement", 15), ("OptionalHasElement", 18),
        ("QuantizeLinear", 19), ("RMSNormalization", 23), ("RandomNormalLike", 1),
        ("RandomUniformLike", 1), ("Reshape", 1), ("ReverseSequence", 10),
        ("RotaryEmbedding", 23), ("Round", 11), ("Scan", 8), ("ScatterElements", 11),
        ("ScatterND", 11), ("SequenceAt", 11), ("SequenceConstruct", 11), ("Shape", 1),
        ("Shrink", 9), ("Sign", 9), ("SimplifiedLayerNormalization", 1), ("Slice", 1),
        ("Split", 2), ("SplitToSequence", 11), ("Squeeze", 1), ("TensorScatter", 24),
        ("Transpose", 1), ("Unsqueeze", 1))},
    ("", "Dropout"): ((7, 11),),
    ("", "Scatter"): ((9, 10),),
    **{("com.microsoft", op): ((1, _INF),) for op in (
        "ExpandDims", "GatedAdd", "GatedRMSNorm", "GatherBlockQuantized", "GatherND",
        "GatherPacked", "GroupQueryAttention", "Inverse", "MRotaryEmbedding", "MatMulNBits",
        "QMoE", "RotaryEmbedding", "SkipLayerNormalization",
        "SkipSimplifiedLayerNormalization", "SparseAttention", "UnfoldTensor")},
}
# Nodes that hold constants rather than compute (ORT makes them initializers).
_CONSTANT_OPS = frozenset({"Constant"})


@cache
def _since(op_type: str, domain: str, opset: int) -> int:
    """The version of `op_type`'s schema a node at `opset` uses (ORT matches kernels on it)."""
    try:
        return int(onnx.defs.get_schema(op_type, opset, domain).since_version)
    except Exception:  # noqa: BLE001 - a custom or unknown op: its domain version
        return opset


def native_fp16(node: Node) -> bool:
    """Does ONNX Runtime's CPU provider have a float16 kernel for this node?"""
    ranges = _NATIVE.get((node.domain or "", node.op_type))
    if not ranges:
        return False
    v = _since(node.op_type, node.domain or "", int(node.opset))
    return any(lo <= v <= hi for lo, hi in ranges)


def _half(v: Value | None) -> TypeGuard[Value]:
    return v is not None and v.kind == "tensor" and v.fact.dtype == "float16"


def _fill_body_dtypes(g) -> None:
    """Mark a subgraph's undeclared values float16 where their producer's schema ties them
    to a float16 input (the same type constraint) or fixes them to float16: the loader infers
    types for the main graph only."""
    for n in g.nodes:
        sch = n.schema
        if sch is None:
            continue
        bound: dict[str, str] = {}
        for param, v in zip(sch.inputs, n.inputs):
            if v is not None and v.kind == "tensor" and v.fact.dtype is not None:
                bound.setdefault(param.type_str, v.fact.dtype)
        outs = sch.outputs
        for k, o in enumerate(n.outputs):
            if o is None or o.fact.dtype is not None or not outs:
                continue
            ts = outs[min(k, len(outs) - 1)].type_str
            # only float16 matters here; other types stay as the loader left them
            if bound.get(ts) == "float16" or ts == "tensor(float16)":
                o.fact = TensorFact("float16", o.fact.shape)


class _Islands:
    """Which nodes run in float32 (ORT's decisions), then the rewrite."""

    def __init__(self, rw: Rewriter) -> None:
        self.rw = rw
        self.g = rw.graph
        self.wide: set[int] = set()  # ids of the nodes that run in float32
        self.twin: dict[int, Value] = {}  # id(float16 value) -> its float32 copy
        self.outputs = {id(v) for v in self.g.outputs}

    def classify(self) -> None:
        for n in self.g.nodes:
            if not native_fp16(n) and n.op_type not in _CONSTANT_OPS and any(
                    _half(v) for v in n.inputs):
                self.wide.add(id(n))
        if len(self.g.nodes) > 1:
            for n in self.g.nodes:  # in order: an earlier decision counts for later ones
                if id(n) not in self.wide and self._isolated(n):
                    self.wide.add(id(n))

    def drop_singletons(self) -> None:
        """Leave alone the float32 nodes no other float32 node reads or feeds through a float16
        value: each reference kernel already computes float16 in float32 and rounds once, so
        the Casts would change nothing but add copies."""
        linked: set[int] = set()
        for n in self.g.nodes:
            if id(n) not in self.wide:
                continue
            for v in n.inputs:
                p = v.producer if _half(v) else None
                if p is not None and id(p) in self.wide:
                    linked.update((id(p), id(n)))
        self.wide &= linked

    def _computes(self, n: Node | None) -> bool:
        return n is not None and n.graph is self.g and n.op_type not in _CONSTANT_OPS

    def _isolated(self, n: Node) -> bool:
        if n.subgraphs() or any(id(o) in self.outputs for o in n.outputs if o is not None):
            return False
        fed = [v.producer for v in n.inputs if v is not None and self._computes(v.producer)]
        if not fed:
            return False  # only graph inputs and initializers
        for v in n.inputs:
            if _half(v) and self._computes(v.producer) and id(v.producer) not in self.wide:
                return False
        readers = [(r, o) for o in n.outputs if _half(o) for r, _ in o.uses]
        if not readers:
            return False
        return all(r.graph is self.g and id(r) in self.wide for r, _ in readers)

    def rewrite(self) -> int:
        """Rebuild the node list with the float32 copies and Casts; returns the Casts made."""
        made = 0
        nodes: list[Node] = []
        for n in self.g.nodes:
            if id(n) not in self.wide:
                nodes.append(n)
                continue
            for i, v in enumerate(n.inputs):
                if _half(v):
                    wide = self.twin.get(id(v))
                    if wide is None:
                        wide = self._cast(v, "float32", nodes, n)
                        made += 1
                    n.inputs[i] = wide
            tail: list[Node] = []
            for k, o in enumerate(n.outputs):
                if not _half(o):
                    continue
                wide = self.rw.new_value(f"{o.name}_fp32", TensorFact("float32", o.fact.shape))
                n.outputs[k] = wide
                wide.producer = n
                self.twin[id(o)] = wide
                if id(o) in self.outputs or any(
                        r.graph is not self.g or id(r) not in self.wide for r, _ in o.uses):
                    self._cast(wide, "float16", tail, n, out=o)
                    made += 1
            nodes.append(n)
            nodes.extend(tail)
        self.g.nodes = nodes
        return made

    def _cast(self, v: Value, to: str, into: list[Node], near: Node,
              out: Value | None = None) -> Value:
        """Append Cast(v) -> `to` (a new value, or `out`) to `into`."""
        if out is None:
            out = self.rw.new_value(f"{v.name}_{to.replace('float', 'fp')}",
                                    TensorFact(to, v.fact.shape))
        code = onnx.TensorProto.FLOAT if to == "float32" else onnx.TensorProto.FLOAT16
        into.append(self.rw.make_node(
            "Cast", [v], [out], {"to": code}, name=f"{near.name}_{out.name}_cast", parts=[],
            domain="", opset=self.rw.model.opsets.get("", 1),
            attr_types={"to": onnx.AttributeProto.INT}))
        out.producer = into[-1]
        return out


def fp16_islands(rw: Rewriter) -> PassResult:
    """Run the float16 nodes ORT runs in float32 in float32, rounding only where ORT does."""
    res = PassResult()
    # Idempotent: once applied, the float32 nodes read no float16 and the Casts it placed
    # have float16 kernels, so a later round finds nothing to do.
    if rw.graph.outer is not None:
        _fill_body_dtypes(rw.graph)
    isl = _Islands(rw)
    isl.classify()
    isl.drop_singletons()
    if not isl.wide:
        return res
    made = isl.rewrite()
    res.changes = len(isl.wide)
    res.details["float32 nodes"] = len(isl.wide)
    res.details["Cast"] = made
    return res
