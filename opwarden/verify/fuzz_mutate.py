"""The fuzzer's graph mutations and the making of one example.

Structure mutators (``m_*``: an op swapped, inputs rewired, nodes dropped, duplicated or
reordered, outputs renamed, graph inputs and outputs edited, subgraphs nested up to 25 deep,
functions broken) edit a model in place; ``MUTATORS`` names them all, the value mutators of
fuzz_values.py included, and ``WEIGHTS`` sets how often each is drawn. ``make_example`` builds
example ``index`` of campaign ``seed`` from the corpus: a pure function of its arguments.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from opwarden.verify.fuzz_corpus import Example, Seed, feed_for, graph_inputs, onnx_helpers
from opwarden.verify.fuzz_scope import Scope, on_a_node, pick, scopes_of
from opwarden.verify.fuzz_values import (
    DOMAINS,
    m_add_value_info,
    m_attr,
    m_initializer,
    m_opset,
    m_type,
    mutate_feeds,
)

RANDOM_OPS = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
     "Bernoulli", "Dropout"}
)  # fmt: skip

UNARY = (
    "Relu", "Abs", "Neg", "Exp", "Log", "Sqrt", "Sigmoid", "Tanh", "Identity", "Not", "Floor",
    "Ceil", "Softmax", "LogSoftmax", "Flatten", "Shape", "Size", "NonZero", "IsNaN", "IsInf",
    "Reciprocal", "Erf", "Sign", "Transpose", "ReduceSum", "ReduceMean", "ReduceMax",
    "ReduceProd", "ReduceL2", "ArgMax", "GlobalAveragePool", "GlobalMaxPool", "Squeeze",
    "Cast", "Round", "HardSigmoid", "LeakyRelu", "Elu", "Selu", "Softplus", "Softsign", "Sin",
    "Acos", "Atanh", "Gelu", "Mish", "Hardmax", "BitwiseNot", "LRN", "MaxPool", "AveragePool",
    "LpPool", "EyeLike", "Dropout", "Trilu", "Unique", "ConstantOfShape", "SpaceToDepth",
    "DepthToSpace", "MeanVarianceNormalization", "OptionalHasElement", "SequenceConstruct",
    "SplitToSequence", "ConcatFromSequence", "SequenceLength", "Optional", "Det",
    "HardSwish", "Shrink", "ThresholdedRelu", "Celu", "Bernoulli", "RandomNormalLike",
    "DynamicQuantizeLinear", "CastLike", "Split", "Mean", "Sum", "Max", "Concat",
)  # fmt: skip
BINARY = (
    "Add", "Sub", "Mul", "Div", "Pow", "MatMul", "Equal", "Less", "Greater", "And", "Or", "Xor",
    "Max", "Min", "Mod", "Reshape", "Expand", "Gather", "GatherElements", "GatherND", "Tile",
    "Concat", "PRelu", "BitShift", "Unsqueeze", "Squeeze", "CumSum", "Sum", "Mean", "TopK",
    "Compress", "Split", "Einsum", "MatMulInteger", "CastLike", "ReduceSum", "Trilu",
    "SequenceAt", "SequenceInsert", "BitwiseAnd", "LessOrEqual", "ReduceMin", "Pad",
    "Upsample", "DequantizeLinear", "QuantizeLinear", "Dropout", "MaxUnpool",
)  # fmt: skip
TERNARY = (
    "Where", "Clip", "Gemm", "Conv", "Slice", "Range", "Pad", "Resize", "ScatterElements",
    "ScatterND", "OneHot", "InstanceNormalization", "LayerNormalization", "ConvTranspose",
    "Concat", "Sum", "Max", "Min", "Mean", "QuantizeLinear", "DequantizeLinear",
    "NonMaxSuppression",
    "Einsum", "GroupNormalization", "Attention", "RNN", "GRU", "LSTM", "ConvInteger",
    "RoiAlign", "TopK", "Trilu", "SequenceInsert", "If", "Loop", "Scan", "BatchNormalization",
)  # fmt: skip
BOGUS_OPS = ("NoSuchOp", "relu", "", "FusedConv", "ChannelShuffle", "Constant", "Loop")


@on_a_node
def m_swap_op(model: Any, rng: np.random.Generator, s: Scope, i: int) -> str | None:
    n = s.nodes[i]
    k = len(n.input)
    r = rng.random()
    if r < 0.1:
        new = pick(rng, BOGUS_OPS)
    else:
        pool = UNARY if k <= 1 else BINARY if k == 2 else TERNARY
        if r < 0.2:
            pool = UNARY + BINARY + TERNARY
        new = pick(rng, pool)
    old = n.op_type
    n.op_type = new
    if rng.random() < 0.5:  # the old op's attributes rarely fit the new one
        del n.attribute[:]
    return f"swap_op {s.where} node {i} {old!r} -> {new!r}"


@on_a_node
def m_rewire(model: Any, rng: np.random.Generator, s: Scope, i: int) -> str | None:
    n = s.nodes[i]
    r = rng.random()
    if r < 0.1:
        target = "fuzz_dangling"
    elif r < 0.2:
        target = ""
    elif r < 0.35 and len(n.output):
        target = n.output[0]  # a self-loop
    else:
        target = pick(rng, s.values() or ["fuzz_dangling"])
    if len(n.input) == 0 or rng.random() < 0.15:
        n.input.append(target)
        return f"rewire {s.where} node {i} {n.op_type}: append input {target!r}"
    j = int(rng.integers(len(n.input)))
    old = n.input[j]
    n.input[j] = target
    return f"rewire {s.where} node {i} {n.op_type}: input {j} {old!r} -> {target!r}"


@on_a_node
def m_drop_node(model: Any, rng: np.random.Generator, s: Scope, i: int) -> str | None:
    op = s.nodes[i].op_type
    del s.nodes[i]
    return f"drop_node {s.where} node {i} {op}"


@on_a_node
def m_dup_node(model: Any, rng: np.random.Generator, s: Scope, i: int) -> str | None:
    n = copy.deepcopy(s.nodes[i])
    renamed = rng.random() < 0.5
    if renamed:  # a dead copy with fresh outputs, else a second producer of the same values
        for j, o in enumerate(n.output):
            n.output[j] = f"{o}__dup" if o else o
        n.name = f"{n.name}__dup"
    pos = int(rng.integers(len(s.nodes) + 1))
    s.nodes.insert(pos, n)
    return f"dup_node {s.where} node {i} {n.op_type} at {pos} renamed={renamed}"


def m_reorder(model: Any, rng: np.random.Generator) -> str | None:
    s = pick(rng, scopes_of(model))
    nodes = list(s.nodes)
    if len(nodes) < 2:
        return None
    order = rng.permutation(len(nodes))
    del s.nodes[:]
    s.nodes.extend(nodes[int(j)] for j in order)
    return f"reorder {s.where} nodes {order.tolist()}"


@on_a_node
def m_node_outputs(model: Any, rng: np.random.Generator, s: Scope, i: int) -> str | None:
    n = s.nodes[i]
    r = rng.random()
    if r < 0.35 or not len(n.output):
        n.output.append(f"extra_{i}")
        return f"node_outputs {s.where} node {i} {n.op_type}: add output"
    if r < 0.6:
        old = n.output.pop()
        return f"node_outputs {s.where} node {i} {n.op_type}: drop output {old!r}"
    if r < 0.8:
        n.output[0] = ""
        return f"node_outputs {s.where} node {i} {n.op_type}: output 0 omitted"
    n.output[0] = pick(rng, s.values() or ["x"])  # a value produced twice, or an input
    return f"node_outputs {s.where} node {i} {n.op_type}: output 0 -> {n.output[0]!r}"


def m_graph_io(model: Any, rng: np.random.Generator) -> str | None:
    import onnx

    s = pick(rng, scopes_of(model))
    outs = s.proto.output
    ins = s.proto.input
    r = rng.random()
    if r < 0.2 and len(outs):
        j = int(rng.integers(len(outs)))
        name = outs[j] if s.is_function else outs[j].name
        del outs[j]
        return f"graph_io {s.where}: drop output {name!r}"
    if r < 0.4 and len(outs):
        j = int(rng.integers(len(outs)))
        outs.append(outs[j]) if s.is_function else outs.add().CopyFrom(outs[j])
        return f"graph_io {s.where}: duplicate output {j}"
    if r < 0.6:
        name = pick(rng, (s.values() or ["ghost"]) + ["ghost"])
        if s.is_function:
            outs.append(name)
        else:
            v = outs.add()
            v.name = name
            if rng.random() < 0.5:
                v.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
        return f"graph_io {s.where}: add output {name!r}"
    if r < 0.8 and len(ins):
        j = int(rng.integers(len(ins)))
        name = ins[j] if s.is_function else ins[j].name
        del ins[j]
        return f"graph_io {s.where}: drop input {name!r}"
    if len(ins):
        j = int(rng.integers(len(ins)))
        ins.append(ins[j]) if s.is_function else ins.add().CopyFrom(ins[j])
        return f"graph_io {s.where}: duplicate input {j}"
    return None


def _type_of(model: Any, name: str) -> int:
    for s in scopes_of(model):
        if s.is_function:
            continue
        for kind in ("input", "output", "value_info"):
            for v in getattr(s.proto, kind):
                if v.name == name and v.type.tensor_type.elem_type:
                    return v.type.tensor_type.elem_type
        for t in s.proto.initializer:
            if t.name == name:
                return t.data_type
    return 1


def m_nest(model: Any, rng: np.random.Generator) -> str | None:
    """Move a node into an If (nested `depth` deep) or a one-trip Loop."""
    onnx, TP, h, nh = onnx_helpers()
    scopes = [s for s in scopes_of(model) if len(s.nodes) and not s.is_function]
    if not scopes:
        return None
    s = pick(rng, scopes)
    i = int(rng.integers(len(s.nodes)))
    node = copy.deepcopy(s.nodes[i])
    outs = [o for o in node.output if o]
    if not outs:
        return None
    types = [_type_of(model, o) for o in outs]
    tag = f"nest{i}_{int(rng.integers(1 << 20))}"
    if rng.random() < 0.6:
        depth = int(pick(rng, (1, 1, 2, 3, 25)))  # upb parses at most 100 levels
        cond = f"{tag}_cond"
        inner = node
        for d in range(depth):
            branches = {}
            for b in ("then", "else"):
                # the deeper nest on one side only: two would double the model per level
                body = copy.deepcopy(inner if b == "then" else node)
                for k, o in enumerate(body.output):
                    if o:
                        body.output[k] = f"{o}__{tag}{d}{b}"
                branches[b] = h.make_graph(
                    [body], f"{tag}_{d}_{b}", [],
                    [h.make_tensor_value_info(o, t, None)
                     for o, t in zip([x for x in body.output if x], types)],
                )  # fmt: skip
            inner = h.make_node(
                "If", [cond], list(node.output), name=f"{tag}_if{d}",
                then_branch=branches["then"], else_branch=branches["else"],
            )  # fmt: skip
        value = bool(rng.random() < 0.5)
        const = h.make_node("Constant", [], [cond], value=nh.from_array(np.array(value)))
        del s.nodes[i]
        s.nodes.insert(i, inner)
        s.nodes.insert(i, const)
        return f"nest {s.where} node {i} {node.op_type} in If (cond {value}) depth {depth}"
    trips = int(pick(rng, (1, 1, 0, 3)))
    body = copy.deepcopy(node)
    for k, o in enumerate(body.output):
        if o:
            body.output[k] = f"{o}__{tag}b"
    vi = h.make_tensor_value_info
    g = h.make_graph(
        [h.make_node("Identity", [f"{tag}_c"], [f"{tag}_co"]), body],
        f"{tag}_body",
        [vi(f"{tag}_i", TP.INT64, []), vi(f"{tag}_c", TP.BOOL, [])],
        [vi(f"{tag}_co", TP.BOOL, [])]
        + [vi(o, t, None) for o, t in zip([x for x in body.output if x], types)],
    )
    m = nh.from_array(np.array(trips, np.int64), f"{tag}_m")
    axes = nh.from_array(np.array([0], np.int64), f"{tag}_axes")
    new = [
        h.make_node("Constant", [], [f"{tag}_M"], value=m),
        h.make_node("Constant", [], [f"{tag}_A"], value=axes),
        h.make_node("Loop", [f"{tag}_M", ""], [f"{o}__{tag}s" for o in outs], body=g),
    ] + [h.make_node("Squeeze", [f"{o}__{tag}s", f"{tag}_A"], [o]) for o in outs]
    del s.nodes[i]
    for n in reversed(new):
        s.nodes.insert(i, n)
    return f"nest {s.where} node {i} {node.op_type} in Loop of {trips} trips"


def m_function(model: Any, rng: np.random.Generator) -> str | None:
    if not len(model.functions):
        return None
    j = int(rng.integers(len(model.functions)))
    f = model.functions[j]
    r = rng.random()
    if r < 0.25 and len(f.node):  # a call to itself: endless inlining
        k = int(rng.integers(len(f.node)))
        f.node[k].op_type, f.node[k].domain = f.name, f.domain
        return f"function {f.name}: node {k} calls the function itself"
    if r < 0.4:
        f.domain = pick(rng, DOMAINS)
        return f"function {f.name}: domain -> {f.domain!r}"
    if r < 0.55:
        d = model.functions.add()
        d.CopyFrom(f)
        del d.node[:]
        return f"function {f.name}: duplicate definition with an empty body"
    if r < 0.7:
        del f.attribute[:]
        return f"function {f.name}: attribute list cleared"
    if r < 0.85 and len(f.opset_import):
        f.opset_import[0].version = int(pick(rng, (0, 1, 1000)))
        imp = f.opset_import[0]
        return f"function {f.name}: opset {imp.domain!r} -> {imp.version}"
    f.name = "Relu"
    f.domain = ""
    return f"function {f.name}: renamed to shadow the built-in Relu"


MUTATORS: dict[str, Callable[[Any, np.random.Generator], str | None]] = {
    "swap_op": m_swap_op,
    "rewire": m_rewire,
    "drop_node": m_drop_node,
    "dup_node": m_dup_node,
    "reorder": m_reorder,
    "node_outputs": m_node_outputs,
    "graph_io": m_graph_io,
    "attr": m_attr,
    "type": m_type,
    "value_info": m_add_value_info,
    "opset": m_opset,
    "initializer": m_initializer,
    "nest": m_nest,
    "function": m_function,
}
WEIGHTS = {
    "swap_op": 3, "rewire": 3, "drop_node": 1, "dup_node": 1, "reorder": 1, "node_outputs": 1,
    "graph_io": 1, "attr": 4, "type": 2, "value_info": 1, "opset": 1, "initializer": 2,
    "nest": 2, "function": 1,
}  # fmt: skip


def _feeds_for_model(model: Any, seed: Seed, rng: np.random.Generator) -> dict[str, Any]:
    """Seed feeds where the names still exist, fresh ones for inputs the mutations declared."""
    feeds: dict[str, Any] = {}
    for vi in graph_inputs(model):
        if vi.name in seed.feeds:
            feeds[vi.name] = seed.feeds[vi.name]
        else:
            f = feed_for(vi, rng)
            if f is not None:
                feeds[vi.name] = f
    return feeds


def _dynamic_input(model: Any, feeds: dict[str, Any], rng: np.random.Generator) -> str:
    """An input declared with symbolic dims, fed an odd shape (zero-size, broadcast, rank +-1)."""
    name = pick(rng, sorted(feeds))
    vi = next(v for v in model.graph.input if v.name == name)
    arr = feeds[name]
    rank = arr.ndim if isinstance(arr, np.ndarray) else 1
    rank = max(0, rank + int(pick(rng, (0, 0, 0, 1, -1))))
    shape = [int(pick(rng, (0, 1, 1, 2, 3, 4, 7))) for _ in range(rank)]
    tt = vi.type.tensor_type
    if vi.type.WhichOneof("value") == "tensor_type":
        tt.shape.ClearField("dim")
        for k in range(rank):
            tt.shape.dim.add().dim_param = f"fuzz_d{k}"
    dt = arr.dtype if isinstance(arr, np.ndarray) else np.dtype(np.float32)
    if dt.kind == "f":
        feeds[name] = rng.standard_normal(shape).astype(dt)
    elif dt.kind in "iub":
        feeds[name] = rng.integers(-2, 4, shape).astype(dt)
    else:
        feeds[name] = np.resize(arr, shape)
    return f"dynamic input {name!r}: dims symbolic, fed shape {shape}"


def make_example(corpus: Sequence[Seed], seed: int, index: int) -> Example:
    """Example ``index`` of campaign ``seed``: a seed model, 0-4 structure mutations, feeds."""
    rng = np.random.default_rng([seed, index])
    base = corpus[int(rng.integers(len(corpus)))]
    model = copy.deepcopy(base.model)
    muts: list[str] = []
    names = list(MUTATORS)
    p = np.array([WEIGHTS[n] for n in names], float)
    p /= p.sum()
    count = int(pick(rng, (0, 1, 1, 1, 2, 2, 3, 4)))
    for _ in range(count):
        name = names[int(rng.choice(len(names), p=p))]
        try:
            desc = MUTATORS[name](model, rng)
        except Exception as e:  # noqa: BLE001 - protobuf refused the edit (a value out of range)
            desc = f"{name}: not applied ({type(e).__name__})"
        if desc:
            muts.append(desc)
    feeds = _feeds_for_model(model, base, rng)
    if feeds and rng.random() < 0.2:
        muts.append(_dynamic_input(model, feeds, rng))
    if count == 0 or rng.random() < 0.25:
        feeds, d = mutate_feeds(feeds, rng)
        muts.append(d)
    det = not any(n.op_type in RANDOM_OPS for s in scopes_of(model) for n in s.nodes)
    try:
        data = model.SerializeToString()
    except Exception as e:  # noqa: BLE001 - an unserializable edit falls back to the seed
        muts.append(f"serialize failed ({type(e).__name__}); seed model used")
        data = base.model.SerializeToString()
    return Example(seed, index, base.name, muts, data, feeds, det)

