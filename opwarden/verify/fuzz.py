"""Structure-aware fuzzing of the whole session (load -> run), crash- and hang-proof.

Examples are seed models whose graph STRUCTURE is edited through protobuf (ops swapped,
inputs rewired, nodes dropped or duplicated, attributes retyped, element types, shapes and
opsets changed, initializers corrupted, subgraphs nested, functions broken) plus mutated feeds.
Every example is a pure function of ``(seed, index)`` and the corpus, so any result can be
rebuilt with :func:`make_example`.

The oracle: ``InferenceSession(model_bytes)`` and ``run`` either succeed or raise an
``OpwardenError`` subclass. Anything else escapes: another exception type, malformed outputs, a
crash of the interpreter or a hang. :func:`campaign` runs the examples in a worker subprocess
(``python -m opwarden.verify.fuzz --worker``) that reports each example before it starts over a
pipe; the parent kills a worker that overruns the per-example timeout, records the example as
hung (with the worker's stack from faulthandler) or crashed, and starts a new worker on the
next example. The worker runs under ``RLIMIT_AS`` and a session memory limit, so a memory bomb
becomes a failure, not a dead machine.

Reproduce one example: ``python -m opwarden.verify.fuzz --seed S --index K [--save m.onnx]``.
"""

from __future__ import annotations

import copy
import dataclasses
import fnmatch
import functools
import importlib
import json
import math
import os
import re
import select
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# --------------------------------------------------------------------------------------------
# corpus


@dataclass
class Seed:
    """A starting model and feeds that run on it."""

    name: str
    model: Any  # onnx.ModelProto
    feeds: dict[str, Any]


@dataclass
class Example:
    seed: int
    index: int
    seed_name: str
    mutations: list[str]
    model: bytes
    feeds: dict[str, Any]
    deterministic: bool = True


# Node-suite modules whose cases join the corpus (cheap to generate; the first few cases each).
NODE_SUITE_MODULES = (
    "add", "relu", "conv", "gather", "reshape", "concat", "slice", "matmul", "softmax",
    "transpose", "where", "reducesum", "if_", "loop", "scan", "split", "pad", "expand", "tile",
    "topk", "einsum", "gemm", "batch_normalization", "unsqueeze", "squeeze", "cumsum", "onehot",
    "scatterelements", "gatherelements", "nonzero", "rangeop", "constantofshape", "resize",
    "averagepool", "lstm", "layernormalization", "argmax", "clip", "compress", "depthtospace",
    "sequenceinsert", "optionalgetelement", "trilu", "unique", "reversesequence",
)  # fmt: skip
NODE_SUITE_PER_MODULE = 3

RANDOM_OPS = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
     "Bernoulli", "Dropout"}
)  # fmt: skip


def _helpers() -> Any:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    return onnx, TensorProto, helper, numpy_helper


def _mlp() -> Any:
    onnx, TP, h, nh = _helpers()
    rng = np.random.default_rng(1)
    w1 = nh.from_array(rng.standard_normal((6, 8)).astype(np.float32), "w1")
    b1 = nh.from_array(rng.standard_normal(8).astype(np.float32), "b1")
    w2 = nh.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w2")
    shape = nh.from_array(np.array([-1, 2, 2], np.int64), "shape")
    idx = nh.from_array(np.array([0, 2], np.int64), "idx")
    starts = nh.from_array(np.array([0], np.int64), "starts")
    ends = nh.from_array(np.array([1], np.int64), "ends")
    nodes = [
        h.make_node("MatMul", ["x", "w1"], ["m1"], name="mm1"),
        h.make_node("Add", ["m1", "b1"], ["a1"], name="add1"),
        h.make_node("Relu", ["a1"], ["r1"], name="relu1"),
        h.make_node("MatMul", ["r1", "w2"], ["m2"], name="mm2"),
        h.make_node("Reshape", ["m2", "shape"], ["rs"], name="reshape"),
        h.make_node("Transpose", ["rs"], ["tr"], name="transpose", perm=[0, 2, 1]),
        h.make_node("ReduceMean", ["tr"], ["red"], name="mean", axes=[2], keepdims=0),
        h.make_node("Gather", ["m2", "idx"], ["g"], name="gather", axis=1),
        h.make_node("Slice", ["g", "starts", "ends"], ["sl"], name="slice"),
        h.make_node("Concat", ["red", "sl"], ["cat"], name="concat", axis=1),
        h.make_node("Greater", ["cat", "cat"], ["gt"], name="gt"),
        h.make_node("Where", ["gt", "cat", "cat"], ["wh"], name="where"),
        h.make_node("Cast", ["wh"], ["y"], name="cast", to=TP.DOUBLE),
    ]
    g = h.make_graph(
        nodes,
        "mlp",
        [h.make_tensor_value_info("x", TP.FLOAT, ["N", 6])],
        [h.make_tensor_value_info("y", TP.DOUBLE, ["N", 3])],
        initializer=[w1, b1, w2, shape, idx, starts, ends],
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 13)])


def _cnn() -> Any:
    onnx, TP, h, nh = _helpers()
    rng = np.random.default_rng(2)

    def t(name: str, *shape: int) -> Any:
        return nh.from_array(rng.standard_normal(shape).astype(np.float32), name)

    inits = [t("w", 4, 2, 3, 3), t("b", 4), t("s", 4), t("bb", 4), t("mu", 4),
             nh.from_array(np.abs(rng.standard_normal(4)).astype(np.float32) + 0.5, "var"),
             t("dw", 4, 1, 3, 3), t("fw", 3, 4), t("fb", 3)]  # fmt: skip
    nodes = [
        h.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        h.make_node("BatchNormalization", ["c", "s", "bb", "mu", "var"], ["bn"], name="bn"),
        h.make_node("Relu", ["bn"], ["r"], name="relu"),
        h.make_node("Conv", ["r", "dw"], ["d"], name="dw", group=4, pads=[1, 1, 1, 1]),
        h.make_node("Add", ["d", "r"], ["res"], name="residual"),
        h.make_node("MaxPool", ["res"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        h.make_node("AveragePool", ["p"], ["ap"], name="apool", kernel_shape=[2, 2]),
        h.make_node("GlobalAveragePool", ["ap"], ["gap"], name="gap"),
        h.make_node("Flatten", ["gap"], ["f"], name="flatten"),
        h.make_node("Gemm", ["f", "fw", "fb"], ["l"], name="fc", transB=1),
        h.make_node("Softmax", ["l"], ["y"], name="softmax"),
    ]
    g = h.make_graph(
        nodes,
        "cnn",
        [h.make_tensor_value_info("x", TP.FLOAT, [1, 2, 6, 6])],
        [h.make_tensor_value_info("y", TP.FLOAT, [1, 3])],
        initializer=inits,
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 13)])


def _control() -> Any:
    """If, Loop and Scan with subgraphs that capture outer values."""
    onnx, TP, h, nh = _helpers()
    vi = h.make_tensor_value_info
    then_g = h.make_graph(
        [h.make_node("Mul", ["x", "two"], ["t_out"], name="then_mul")],
        "then", [], [vi("t_out", TP.FLOAT, [2, 3])],
    )  # fmt: skip
    else_g = h.make_graph(
        [h.make_node("Neg", ["x"], ["e_out"], name="else_neg")],
        "else", [], [vi("e_out", TP.FLOAT, [2, 3])],
    )  # fmt: skip
    body = h.make_graph(
        [
            h.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond"),
            h.make_node("Add", ["acc_in", "x"], ["acc_out"], name="body_add"),
            h.make_node("Cast", ["i"], ["i_f"], name="body_cast", to=TP.FLOAT),
            h.make_node("Mul", ["acc_out", "i_f"], ["scan_out"], name="body_mul"),
        ],
        "loop_body",
        [vi("i", TP.INT64, []), vi("cond_in", TP.BOOL, []), vi("acc_in", TP.FLOAT, [2, 3])],
        [vi("cond_out", TP.BOOL, []), vi("acc_out", TP.FLOAT, [2, 3]),
         vi("scan_out", TP.FLOAT, [2, 3])],
    )  # fmt: skip
    scan_body = h.make_graph(
        [
            h.make_node("Add", ["s_in", "row"], ["s_out"], name="scan_add"),
            h.make_node("Identity", ["s_out"], ["row_out"], name="scan_id"),
        ],
        "scan_body",
        [vi("s_in", TP.FLOAT, [3]), vi("row", TP.FLOAT, [3])],
        [vi("s_out", TP.FLOAT, [3]), vi("row_out", TP.FLOAT, [3])],
    )
    inits = [
        nh.from_array(np.array(2.0, np.float32), "two"),
        nh.from_array(np.array(3, np.int64), "trip"),
        nh.from_array(np.zeros(3, np.float32), "s0"),
    ]
    nodes = [
        h.make_node("ReduceSum", ["x"], ["sum"], name="sum", keepdims=0),
        h.make_node("Greater", ["sum", "two"], ["cond"], name="cond"),
        h.make_node("If", ["cond"], ["ify"], name="if", then_branch=then_g, else_branch=else_g),
        h.make_node("Loop", ["trip", "", "ify"], ["acc", "scans"], name="loop", body=body),
        h.make_node("Scan", ["s0", "acc"], ["s_final", "rows"], name="scan", body=scan_body,
                    num_scan_inputs=1),
        h.make_node("ReduceSum", ["scans"], ["y"], name="out", keepdims=0),
    ]  # fmt: skip
    g = h.make_graph(
        nodes,
        "control",
        [vi("x", TP.FLOAT, [2, 3])],
        [vi("y", TP.FLOAT, []), vi("s_final", TP.FLOAT, [3]), vi("rows", TP.FLOAT, [2, 3])],
        initializer=inits,
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 13)])


def _function() -> Any:
    """A model-local function (with an attribute reference) called twice, plus a nested call."""
    onnx, TP, h, nh = _helpers()
    alpha = onnx.AttributeProto()
    alpha.name, alpha.ref_attr_name, alpha.type = "alpha", "slope", onnx.AttributeProto.FLOAT
    leaky = h.make_function(
        "local.fuzz", "Leaky", ["a"], ["b"],
        [h.make_node("LeakyRelu", ["a"], ["b"], name="leaky")],
        [h.make_opsetid("", 13)], attributes=["slope"],
    )  # fmt: skip
    leaky.node[0].attribute.append(alpha)
    block = h.make_function(
        "local.fuzz", "Block", ["p", "q"], ["r"],
        [
            h.make_node("Add", ["p", "q"], ["s"], name="add"),
            h.make_node("Leaky", ["s"], ["r"], name="call", domain="local.fuzz", slope=0.2),
        ],
        [h.make_opsetid("", 13), h.make_opsetid("local.fuzz", 1)],
    )  # fmt: skip
    nodes = [
        h.make_node("Leaky", ["x"], ["l1"], name="f1", domain="local.fuzz", slope=0.1),
        h.make_node("Block", ["l1", "x"], ["l2"], name="f2", domain="local.fuzz"),
        h.make_node("Leaky", ["l2"], ["y"], name="f3", domain="local.fuzz", slope=0.3),
    ]
    g = h.make_graph(
        nodes,
        "function",
        [h.make_tensor_value_info("x", TP.FLOAT, [2, 4])],
        [h.make_tensor_value_info("y", TP.FLOAT, [2, 4])],
    )
    return h.make_model(
        g,
        opset_imports=[h.make_opsetid("", 13), h.make_opsetid("local.fuzz", 1)],
        functions=[leaky, block],
    )


def _np_dtype(elem_type: int) -> Any:
    from onnx import helper

    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except Exception:  # noqa: BLE001 - unknown or unrepresentable element types
        return None


def _feed_for(vi: Any, rng: np.random.Generator) -> Any:
    """A feed that matches a graph input's declared type (capped in size)."""
    t = vi.type
    if t.WhichOneof("value") != "tensor_type":
        return None
    dt = _np_dtype(t.tensor_type.elem_type)
    if dt is None:
        return None
    shape = []
    if t.tensor_type.HasField("shape"):
        for d in t.tensor_type.shape.dim:
            shape.append(d.dim_value if d.HasField("dim_value") else 2)
    if any(s < 0 for s in shape) or math.prod(shape) > 1 << 16:
        return None
    if dt.kind == "f":
        return rng.standard_normal(shape).astype(dt)
    if dt.kind in "iu":
        return rng.integers(0, 3, shape).astype(dt)
    if dt.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if dt.kind in "US":
        return np.array(rng.choice(["a", "bc", ""], shape) if shape else "a", dtype=object)
    return np.zeros(shape, dt)


def _inputs(model: Any) -> list[Any]:
    init = {t.name for t in model.graph.initializer}
    return [v for v in model.graph.input if v.name not in init]


def _seed_from_model(name: str, model: Any, rng: np.random.Generator) -> Seed | None:
    feeds = {}
    for vi in _inputs(model):
        f = _feed_for(vi, rng)
        if f is None:
            return None
        feeds[vi.name] = f
    return Seed(name, model, feeds)


def _with_facts(model: Any) -> Any:
    """value_info from onnx's shape inference, so nesting mutations know intermediate types."""
    import onnx

    try:
        return onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - a seed onnx cannot infer is used as written
        return model


def _node_suite_seeds() -> list[Seed]:
    from onnx import numpy_helper

    out: list[Seed] = []
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        import onnx.backend.test.case.node as suite

        for mod in NODE_SUITE_MODULES:
            state = np.random.get_state()
            np.random.seed(len(out))  # the case modules draw data from the global generator
            before = len(suite._NodeTestCases)
            try:
                importlib.import_module(f"onnx.backend.test.case.node.{mod}")
            except Exception:  # noqa: BLE001 - a module this onnx lacks is skipped
                continue
            finally:
                np.random.set_state(state)
            for case in suite._NodeTestCases[before : before + NODE_SUITE_PER_MODULE]:
                if not case.data_sets:
                    continue
                names = [v.name for v in _inputs(case.model)]
                vals = [
                    numpy_helper.to_array(x) if hasattr(x, "SerializeToString") else x
                    for x in case.data_sets[0][0]
                ]
                out.append(Seed(case.name, case.model, dict(zip(names, vals))))
    return out


def load_extra_seed(spec: str) -> Any:
    """``"module:function"`` or ``"module:function(arg, ...)"`` -> the ModelProto it returns."""
    mod_name, _, call = spec.partition(":")
    fn_name, _, args = call.partition("(")
    fn = getattr(importlib.import_module(mod_name), fn_name)
    if not args:
        return fn()
    import ast

    parsed = ast.parse(f"f({args}", mode="eval").body
    pos = [ast.literal_eval(a) for a in parsed.args]  # type: ignore[attr-defined]
    kw = {k.arg: ast.literal_eval(k.value) for k in parsed.keywords}  # type: ignore[attr-defined]
    return fn(*pos, **kw)


def build_corpus(extra_seeds: Sequence[str] = (), node_suite: bool = True) -> list[Seed]:
    """The seeds, in a fixed order (the same in every process for the same arguments)."""
    rng = np.random.default_rng(12345)
    seeds: list[Seed] = []
    for name, fn in (("mlp", _mlp), ("cnn", _cnn), ("control", _control), ("function", _function)):
        s = _seed_from_model(name, _with_facts(fn()), rng)
        if s is not None:
            seeds.append(s)
    for spec in extra_seeds:
        s = _seed_from_model(spec, _with_facts(load_extra_seed(spec)), rng)
        if s is not None:
            seeds.append(s)
    if node_suite:
        seeds.extend(_node_suite_seeds())
    return seeds


# --------------------------------------------------------------------------------------------
# mutators

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
DOMAINS = ("com.bogus", "ai.onnx.ml", "opwarden", "com.microsoft", "ai.onnx", "local.fuzz", " ")

INT_SPECIALS = (0, 1, -1, 2, 3, -7, 1 << 31, (1 << 31) - 1, 1 << 40, (1 << 63) - 1, -(1 << 63))
FLOAT_SPECIALS = (0.0, -1.0, 1.0, 0.5, float("nan"), float("inf"), float("-inf"), 1e38, 1e-45)
STRING_SPECIALS = (
    b"", b"NOTSET", b"SAME_UPPER", b"SAME_LOWER", b"VALID", b"bogus", b"\xff\xfe", b"constant",
    b"reflect", b"edge", b"wrap", b"linear", b"nearest", b"cubic", b"half_pixel",
    b"tf_crop_and_resize",
    b"RIGHT", b"LEFT", b"forward", b"bidirectional", b"DCR", b"CRD", b"ij,jk->ik", b"...",
)  # fmt: skip
ATTR_NAMES = (
    "axis", "axes", "perm", "pads", "strides", "kernel_shape", "dilations", "group", "to",
    "keepdims", "mode", "alpha", "beta", "transA", "transB", "epsilon", "k", "largest",
    "sorted", "direction", "value", "split", "num_outputs", "noop_with_empty_axes", "blocksize",
    "batch_dims", "ceil_mode", "auto_pad", "exclusive", "reverse", "output_padding",
    "output_shape", "storage_order", "select_last_index", "then_branch", "body", "seed",
    "dtype", "coordinate_transformation_mode", "upper", "equation", "num_scan_inputs",
    "hidden_size", "bogus_attr",
)  # fmt: skip
# DataType 0 (undefined) .. 26 (INT2) plus values no version of ONNX defines
ELEM_TYPES = tuple(range(0, 27)) + (27, 999, -3)
DIM_SPECIALS = (0, 1, 2, 3, -1, -5, 1 << 31, 1 << 40, (1 << 62), 7)


@dataclass
class _Scope:
    """A graph, subgraph or function body that mutations edit in place."""

    where: str
    proto: Any
    is_function: bool = False
    parent: _Scope | None = None

    @property
    def nodes(self) -> Any:
        return self.proto.node

    def input_names(self) -> list[str]:
        return list(self.proto.input) if self.is_function else [v.name for v in self.proto.input]

    def output_names(self) -> list[str]:
        if self.is_function:
            return list(self.proto.output)
        return [v.name for v in self.proto.output]

    def local_values(self) -> list[str]:
        names = self.input_names()
        if not self.is_function:
            names += [t.name for t in self.proto.initializer]
        for n in self.proto.node:
            names += [o for o in n.output if o]
        return names

    def values(self) -> list[str]:
        """Values of this scope and the outer ones a subgraph may capture."""
        names: list[str] = []
        s: _Scope | None = self
        while s is not None:
            names += s.local_values()
            s = s.parent
        return names


def _scopes(model: Any) -> list[_Scope]:
    import onnx

    out: list[_Scope] = []

    def walk(g: Any, where: str, parent: _Scope | None, is_fn: bool) -> None:
        s = _Scope(where, g, is_fn, parent)
        out.append(s)
        for i, n in enumerate(g.node):
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g, f"{where}/{n.op_type}#{i}.{a.name}", s, False)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for j, sg in enumerate(a.graphs):
                        walk(sg, f"{where}/{n.op_type}#{i}.{a.name}[{j}]", s, False)

    walk(model.graph, "main", None, False)
    for f in model.functions:
        walk(f, f"function {f.domain}/{f.name}", None, True)
    return out


def _pick(rng: np.random.Generator, seq: Sequence[Any]) -> Any:
    return seq[int(rng.integers(len(seq)))]


def _node_scope(model: Any, rng: np.random.Generator) -> tuple[_Scope, int] | None:
    scopes = [s for s in _scopes(model) if len(s.nodes)]
    if not scopes:
        return None
    s = _pick(rng, scopes)
    return s, int(rng.integers(len(s.nodes)))


def _on_a_node(fn: Any) -> Any:
    """A mutator of one node, picked at random in any graph scope (None: there is none)."""

    @functools.wraps(fn)
    def mutate(model: Any, rng: np.random.Generator) -> str | None:
        got = _node_scope(model, rng)
        return None if got is None else fn(model, rng, *got)

    return mutate


def _random_ints(rng: np.random.Generator) -> list[int]:
    r = rng.random()
    if r < 0.15:
        return []
    if r < 0.2:
        return [int(rng.integers(-3, 4))] * 1000
    n = int(rng.integers(1, 9))
    return [
        int(_pick(rng, INT_SPECIALS)) if rng.random() < 0.5 else int(rng.integers(-4, 6))
        for _ in range(n)
    ]


def _tiny_graph() -> Any:
    _, TP, h, _ = _helpers()
    return h.make_graph(
        [h.make_node("Identity", ["gi"], ["go"])],
        "tiny",
        [h.make_tensor_value_info("gi", TP.FLOAT, [1])],
        [h.make_tensor_value_info("go", TP.FLOAT, [1])],
    )


def _random_attr(name: str, rng: np.random.Generator) -> Any:
    onnx, TP, h, nh = _helpers()
    kind = int(rng.integers(9))
    if kind == 0:
        return h.make_attribute(name, int(_pick(rng, INT_SPECIALS)))
    if kind == 1:
        return h.make_attribute(name, float(_pick(rng, FLOAT_SPECIALS)))
    if kind == 2:
        return h.make_attribute(name, _pick(rng, STRING_SPECIALS))
    if kind == 3:
        ints = _random_ints(rng)
        a = h.make_attribute(name, ints) if ints else onnx.AttributeProto(name=name)
        a.type = onnx.AttributeProto.INTS
        return a
    if kind == 4:
        return h.make_attribute(name, [float(_pick(rng, FLOAT_SPECIALS)) for _ in range(3)])
    if kind == 5:
        return h.make_attribute(name, [_pick(rng, STRING_SPECIALS), b"x"])
    if kind == 6:
        arr = _pick(rng, [np.array(1.5, np.float32), np.zeros((0, 3), np.int64),
                          np.array([1, 2], np.int32), np.array([True])])  # fmt: skip
        return h.make_attribute(name, nh.from_array(arr, name))
    if kind == 7:
        return h.make_attribute(name, _tiny_graph())
    a = onnx.AttributeProto(name=name)  # a type with no value, or no type at all
    a.type = int(_pick(rng, (0, onnx.AttributeProto.INT, onnx.AttributeProto.TENSOR, 99)))
    return a


@_on_a_node
def m_swap_op(model: Any, rng: np.random.Generator, s: _Scope, i: int) -> str | None:
    n = s.nodes[i]
    k = len(n.input)
    r = rng.random()
    if r < 0.1:
        new = _pick(rng, BOGUS_OPS)
    else:
        pool = UNARY if k <= 1 else BINARY if k == 2 else TERNARY
        if r < 0.2:
            pool = UNARY + BINARY + TERNARY
        new = _pick(rng, pool)
    old = n.op_type
    n.op_type = new
    if rng.random() < 0.5:  # the old op's attributes rarely fit the new one
        del n.attribute[:]
    return f"swap_op {s.where} node {i} {old!r} -> {new!r}"


@_on_a_node
def m_rewire(model: Any, rng: np.random.Generator, s: _Scope, i: int) -> str | None:
    n = s.nodes[i]
    r = rng.random()
    if r < 0.1:
        target = "fuzz_dangling"
    elif r < 0.2:
        target = ""
    elif r < 0.35 and len(n.output):
        target = n.output[0]  # a self-loop
    else:
        target = _pick(rng, s.values() or ["fuzz_dangling"])
    if len(n.input) == 0 or rng.random() < 0.15:
        n.input.append(target)
        return f"rewire {s.where} node {i} {n.op_type}: append input {target!r}"
    j = int(rng.integers(len(n.input)))
    old = n.input[j]
    n.input[j] = target
    return f"rewire {s.where} node {i} {n.op_type}: input {j} {old!r} -> {target!r}"


@_on_a_node
def m_drop_node(model: Any, rng: np.random.Generator, s: _Scope, i: int) -> str | None:
    op = s.nodes[i].op_type
    del s.nodes[i]
    return f"drop_node {s.where} node {i} {op}"


@_on_a_node
def m_dup_node(model: Any, rng: np.random.Generator, s: _Scope, i: int) -> str | None:
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
    s = _pick(rng, _scopes(model))
    nodes = list(s.nodes)
    if len(nodes) < 2:
        return None
    order = rng.permutation(len(nodes))
    del s.nodes[:]
    s.nodes.extend(nodes[int(j)] for j in order)
    return f"reorder {s.where} nodes {order.tolist()}"


@_on_a_node
def m_node_outputs(model: Any, rng: np.random.Generator, s: _Scope, i: int) -> str | None:
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
    n.output[0] = _pick(rng, s.values() or ["x"])  # a value produced twice, or an input
    return f"node_outputs {s.where} node {i} {n.op_type}: output 0 -> {n.output[0]!r}"


def m_graph_io(model: Any, rng: np.random.Generator) -> str | None:
    import onnx

    s = _pick(rng, _scopes(model))
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
        name = _pick(rng, (s.values() or ["ghost"]) + ["ghost"])
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


@_on_a_node
def m_attr(model: Any, rng: np.random.Generator, s: _Scope, i: int) -> str | None:
    n = s.nodes[i]
    r = rng.random()
    attrs = n.attribute
    if len(attrs) and r < 0.45:
        j = int(rng.integers(len(attrs)))
        a = attrs[j]
        if a.type == a.INT and rng.random() < 0.5:  # plausible values reach the kernels
            old = a.i
            a.i = int(rng.integers(-4, 5))
            return f"attr {s.where} node {i} {n.op_type}.{a.name} {old} -> {a.i}"
        if a.ints and rng.random() < 0.6:
            k = int(rng.integers(len(a.ints)))
            old = a.ints[k]
            a.ints[k] = int(_pick(rng, INT_SPECIALS))
            return f"attr {s.where} node {i} {n.op_type}.{a.name}[{k}] {old} -> {a.ints[k]}"
        new = _random_attr(a.name, rng)
        a.CopyFrom(new)
        return f"attr {s.where} node {i} {n.op_type}.{a.name} -> {_attr_str(a)}"
    if len(attrs) and r < 0.6:
        j = int(rng.integers(len(attrs)))
        name = attrs[j].name
        del attrs[j]
        return f"attr {s.where} node {i} {n.op_type}: delete {name!r}"
    if len(attrs) and r < 0.7:
        j = int(rng.integers(len(attrs)))
        attrs.add().CopyFrom(attrs[j])
        return f"attr {s.where} node {i} {n.op_type}: duplicate {attrs[j].name!r}"
    if r < 0.8:
        a = attrs.add()
        a.name = _pick(rng, ATTR_NAMES)
        a.ref_attr_name = "fuzz_ref"  # a reference outside any function
        a.type = _helpers()[0].AttributeProto.INT
        return f"attr {s.where} node {i} {n.op_type}: {a.name!r} refers to a missing attribute"
    a = _random_attr(_pick(rng, ATTR_NAMES), rng)
    attrs.add().CopyFrom(a)
    return f"attr {s.where} node {i} {n.op_type}: add {_attr_str(a)}"


def _attr_str(a: Any) -> str:
    s = str(a).replace("\n", " ")
    return s if len(s) < 120 else s[:117] + "..."


def _typed_values(model: Any) -> list[tuple[str, Any]]:
    out = []
    for s in _scopes(model):
        if s.is_function:
            continue
        for kind in ("input", "output", "value_info"):
            for v in getattr(s.proto, kind):
                out.append((f"{s.where} {kind} {v.name!r}", v))
    return out


def m_type(model: Any, rng: np.random.Generator) -> str | None:
    vals = _typed_values(model)
    if not vals:
        return None
    where, v = _pick(rng, vals)
    tt = v.type.tensor_type
    r = rng.random()
    if r < 0.3:
        old = tt.elem_type
        tt.elem_type = int(_pick(rng, ELEM_TYPES))
        return f"type {where}: elem_type {old} -> {tt.elem_type}"
    if r < 0.4:
        v.ClearField("type")
        return f"type {where}: type removed"
    if r < 0.5:
        v.type.sequence_type.elem_type.tensor_type.elem_type = 1
        return f"type {where}: a sequence type"
    dims = tt.shape.dim
    if r < 0.6 or not len(dims):
        n = int(rng.integers(0, 7))
        tt.shape.ClearField("dim")
        for _ in range(n):
            tt.shape.dim.add().dim_value = int(rng.integers(1, 5))
        return f"type {where}: rank -> {n}"
    if r < 0.65:
        tt.ClearField("shape")
        return f"type {where}: shape removed"
    k = int(rng.integers(len(dims)))
    if rng.random() < 0.2:
        dims[k].dim_param = _pick(rng, ("N", "", "x y"))
        return f"type {where}: dim {k} -> param {dims[k].dim_param!r}"
    dims[k].dim_value = int(_pick(rng, DIM_SPECIALS))
    return f"type {where}: dim {k} -> {dims[k].dim_value}"


def m_add_value_info(model: Any, rng: np.random.Generator) -> str | None:
    s = _pick(rng, [s for s in _scopes(model) if not s.is_function])
    vals = [n for n in s.values() if n]
    if not vals:
        return None
    name = _pick(rng, vals)
    v = s.proto.value_info.add()
    v.name = name
    v.type.tensor_type.elem_type = int(_pick(rng, ELEM_TYPES))
    for _ in range(int(rng.integers(0, 4))):
        v.type.tensor_type.shape.dim.add().dim_value = int(_pick(rng, DIM_SPECIALS))
    return f"value_info {s.where}: {name!r} declared {_attr_str(v.type)}"


def m_opset(model: Any, rng: np.random.Generator) -> str | None:
    imports = model.opset_import
    r = rng.random()
    if r < 0.15:
        model.ir_version = int(_pick(rng, (0, 1, 3, 4, 7, 11, 100, -1)))
        return f"opset: ir_version -> {model.ir_version}"
    if r < 0.3 and len(imports):
        j = int(rng.integers(len(imports)))
        d = imports[j].domain
        del imports[j]
        return f"opset: import of domain {d!r} removed"
    if r < 0.45:
        imp = imports.add()
        imp.domain = _pick(rng, DOMAINS + ("",))
        imp.version = int(_pick(rng, (1, 13, 1000, 0)))
        return f"opset: import {imp.domain!r} v{imp.version} added"
    if r < 0.7 and len(imports):
        j = int(rng.integers(len(imports)))
        imports[j].version = int(_pick(rng, (0, 1, 6, 7, 9, 10, 11, 12, 17, 21, 24, 1000, -1,
                                            1 << 40)))  # fmt: skip
        return f"opset: domain {imports[j].domain!r} -> v{imports[j].version}"
    got = _node_scope(model, rng)
    if got is None:
        return None
    s, i = got
    s.nodes[i].domain = _pick(rng, DOMAINS)
    return f"opset: {s.where} node {i} {s.nodes[i].op_type} domain -> {s.nodes[i].domain!r}"


def m_initializer(model: Any, rng: np.random.Generator) -> str | None:
    import onnx

    graphs = [s for s in _scopes(model) if not s.is_function and len(s.proto.initializer)]
    if not graphs:
        return None
    s = _pick(rng, graphs)
    j = int(rng.integers(len(s.proto.initializer)))
    t = s.proto.initializer[j]
    where = f"{s.where} initializer {t.name!r}"
    r = rng.random()
    if r < 0.15:
        if t.raw_data:
            t.raw_data = t.raw_data[: len(t.raw_data) // 2] if rng.random() < 0.7 else (
                t.raw_data + b"\x01\x02\x03"
            )
            return f"init {where}: raw_data length -> {len(t.raw_data)}"
        t.float_data.append(1.0)
        t.int64_data.append(1)
        return f"init {where}: typed data one element too long"
    if r < 0.3:
        del t.dims[:]
        t.dims.extend(int(_pick(rng, DIM_SPECIALS)) for _ in range(int(rng.integers(0, 4))))
        return f"init {where}: dims -> {list(t.dims)}"
    if r < 0.4:
        old = t.data_type
        t.data_type = int(_pick(rng, ELEM_TYPES))
        return f"init {where}: data_type {old} -> {t.data_type}"
    if r < 0.55:
        t.ClearField("raw_data")
        t.ClearField("float_data")
        t.ClearField("int64_data")
        t.ClearField("int32_data")
        t.ClearField("double_data")
        t.data_location = onnx.TensorProto.EXTERNAL
        loc = _pick(rng, ("missing.bin", "/etc/hostname", "/dev/zero", "../../etc/passwd", "",
                          "/proc/self/mem", "sub/../../x.bin", "a\x00b"))  # fmt: skip
        e = t.external_data.add()
        e.key, e.value = "location", loc
        if rng.random() < 0.5:
            e = t.external_data.add()
            e.key, e.value = "offset", str(_pick(rng, (0, -1, 1 << 40, 7)))
            e = t.external_data.add()
            e.key, e.value = "length", str(_pick(rng, (0, 4, -4, 1 << 50)))
        return f"init {where}: external data at {loc!r}"
    if r < 0.65:
        del s.proto.initializer[j]
        return f"init {where}: dropped"
    if r < 0.75:
        d = s.proto.initializer.add()
        d.CopyFrom(t)
        d.dims.append(1)
        return f"init {where}: duplicated with another shape"
    if r < 0.85:
        vals = [n for n in s.values() if n and n != t.name]
        if not vals:
            return None
        old, t.name = t.name, _pick(rng, vals)
        return f"init {where}: renamed to the value {t.name!r}"
    if r < 0.92:
        t.data_type = onnx.TensorProto.STRING
        t.ClearField("raw_data")
        t.string_data.extend([b"a", b"\xff"])
        return f"init {where}: string data"
    t.segment.begin, t.segment.end = 5, 1
    return f"init {where}: segment 5..1"


def _type_of(model: Any, name: str) -> int:
    for s in _scopes(model):
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
    onnx, TP, h, nh = _helpers()
    scopes = [s for s in _scopes(model) if len(s.nodes) and not s.is_function]
    if not scopes:
        return None
    s = _pick(rng, scopes)
    i = int(rng.integers(len(s.nodes)))
    node = copy.deepcopy(s.nodes[i])
    outs = [o for o in node.output if o]
    if not outs:
        return None
    types = [_type_of(model, o) for o in outs]
    tag = f"nest{i}_{int(rng.integers(1 << 20))}"
    if rng.random() < 0.6:
        depth = int(_pick(rng, (1, 1, 2, 3, 25)))  # upb parses at most 100 levels
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
    trips = int(_pick(rng, (1, 1, 0, 3)))
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
        f.domain = _pick(rng, DOMAINS)
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
        f.opset_import[0].version = int(_pick(rng, (0, 1, 1000)))
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


# -- feeds ------------------------------------------------------------------------------------


class _Odd:
    """A feed value no runtime knows."""

    def __repr__(self) -> str:
        return "<odd object>"


def mutate_feeds(feeds: dict[str, Any], rng: np.random.Generator) -> tuple[dict, str]:
    feeds = dict(feeds)
    if not feeds or rng.random() < 0.08:
        feeds[_pick(rng, ("", "xx", "x"))] = np.zeros(2, np.float32)
        return feeds, "feeds: extra feed"
    name = _pick(rng, sorted(feeds))
    v = feeds[name]
    arr = np.asarray(v) if isinstance(v, np.ndarray) else None
    kind = int(rng.integers(13))
    if kind == 0:
        del feeds[name]
        return feeds, f"feeds: {name!r} missing"
    if arr is None or arr.dtype == object:
        kind = int(_pick(rng, (5, 6, 7)))
    if kind == 1:
        dt = _pick(rng, (np.float16, np.float32, np.float64, np.int8, np.int32, np.int64,
                         np.uint8, np.bool_, np.complex64, object, np.str_))  # fmt: skip
        feeds[name] = arr.astype(dt)
        return feeds, f"feeds: {name!r} as {np.dtype(dt)}"
    if kind == 2:
        shape = list(arr.shape)
        r = rng.random()
        if r < 0.3 or not shape:
            shape.append(int(rng.integers(1, 3)))
        elif r < 0.5:
            shape.pop()
        else:
            shape[int(rng.integers(len(shape)))] = int(_pick(rng, (0, 1, 3, 17)))
        feeds[name] = np.resize(arr, shape)
        return feeds, f"feeds: {name!r} shape -> {shape}"
    if kind == 3 and arr.dtype.kind in "fc":
        fill = float(_pick(rng, (np.nan, np.inf, -np.inf, 3e38, -3e38, 1e-45)))
        out = arr.copy()
        out.flat[:: max(1, out.size // 3)] = fill
        feeds[name] = out
        return feeds, f"feeds: {name!r} with {fill}"
    if kind == 3 or kind == 4:
        if arr.dtype.kind in "iu":
            info = np.iinfo(arr.dtype)
            fill = int(_pick(rng, (info.max, info.min, -1, 1 << 20)))
            out = arr.copy()
            out.flat[:: max(1, out.size // 2)] = np.array(fill).astype(arr.dtype)
            feeds[name] = out
            return feeds, f"feeds: {name!r} with {fill}"
        feeds[name] = np.zeros((0,) * max(arr.ndim, 1), arr.dtype)
        return feeds, f"feeds: {name!r} empty"
    if kind == 5:
        feeds[name] = [[1.0, 2.0], [3.0]]
        return feeds, f"feeds: {name!r} ragged list"
    if kind == 6:
        feeds[name] = _pick(rng, (None, "abc", 3.5, _Odd(), {"a": 1}, [np.zeros(2)], b"\x00"))
        return feeds, f"feeds: {name!r} -> {feeds[name]!r}"
    if kind == 7:
        feeds[name] = v.tolist() if isinstance(v, np.ndarray) else [v]
        return feeds, f"feeds: {name!r} as a Python list"
    if kind == 8:
        big = np.empty(arr.shape[::-1] + (2,), arr.dtype)
        view = big[..., 0].T  # non-contiguous
        view[...] = arr
        feeds[name] = view
        return feeds, f"feeds: {name!r} non-contiguous"
    if kind == 9:
        ro = arr.copy()
        ro.setflags(write=False)
        feeds[name] = ro
        return feeds, f"feeds: {name!r} read-only"
    if kind == 10 and arr.size:
        shape = (1 << 20,) + arr.shape[1:] if arr.ndim else (1 << 20,)
        feeds[name] = np.broadcast_to(arr.reshape(-1)[:1].reshape((1,) * len(shape)), shape)
        return feeds, f"feeds: {name!r} broadcast view {shape}"
    if kind == 11:
        feeds[name] = np.asarray(arr.reshape(-1)[:1].reshape(())) if arr.size else arr
        return feeds, f"feeds: {name!r} 0-d"
    feeds[name] = arr.astype(arr.dtype.newbyteorder(">")) if arr.dtype.itemsize > 1 else arr
    return feeds, f"feeds: {name!r} big-endian"


def _feeds_for_model(model: Any, seed: Seed, rng: np.random.Generator) -> dict[str, Any]:
    """Seed feeds where the names still exist, fresh ones for inputs the mutations declared."""
    feeds: dict[str, Any] = {}
    for vi in _inputs(model):
        if vi.name in seed.feeds:
            feeds[vi.name] = seed.feeds[vi.name]
        else:
            f = _feed_for(vi, rng)
            if f is not None:
                feeds[vi.name] = f
    return feeds


def _dynamic_input(model: Any, feeds: dict[str, Any], rng: np.random.Generator) -> str:
    """An input declared with symbolic dims, fed an odd shape (zero-size, broadcast, rank +-1)."""
    name = _pick(rng, sorted(feeds))
    vi = next(v for v in model.graph.input if v.name == name)
    arr = feeds[name]
    rank = arr.ndim if isinstance(arr, np.ndarray) else 1
    rank = max(0, rank + int(_pick(rng, (0, 0, 0, 1, -1))))
    shape = [int(_pick(rng, (0, 1, 1, 2, 3, 4, 7))) for _ in range(rank)]
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
    count = int(_pick(rng, (0, 1, 1, 1, 2, 2, 3, 4)))
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
    det = not any(n.op_type in RANDOM_OPS for s in _scopes(model) for n in s.nodes)
    try:
        data = model.SerializeToString()
    except Exception as e:  # noqa: BLE001 - an unserializable edit falls back to the seed
        muts.append(f"serialize failed ({type(e).__name__}); seed model used")
        data = base.model.SerializeToString()
    return Example(seed, index, base.name, muts, data, feeds, det)


# --------------------------------------------------------------------------------------------
# the oracle (in the worker process)


def _well_formed(out: Any) -> bool:
    if out is None or isinstance(out, (np.ndarray, np.generic)):
        return True
    if isinstance(out, list):
        return all(_well_formed(o) for o in out)
    if isinstance(out, dict):
        return all(_well_formed(o) for o in out.values())
    return False


def _innermost(tb: Any) -> str:
    """file:function of the innermost frame inside opwarden, else the innermost frame."""
    frames = traceback.extract_tb(tb)
    ours = [f for f in frames if f"{os.sep}opwarden{os.sep}" in f.filename]
    f = (ours or frames or [None])[-1]
    if f is None:
        return "?"
    return f"{_rel(f.filename)}:{f.name}"


def _rel(path: str) -> str:
    k = path.rfind(f"{os.sep}opwarden{os.sep}")
    return path[k + 1 :] if k >= 0 else os.path.basename(path)


# Operators whose iterations the model or the feeds set (a trip count of 2**63-1, a condition
# that stays true, a scan over a 2**20-row broadcast feed): such a run may legitimately go on
# far past the per-example timeout (test_loop11 with 2**63-1 trips: ~70 us an iteration, 2M
# iterations until 256 MiB of empty scan elements), so their sessions get a run deadline, the
# documented defence (SessionOptions.run_timeout_ms), and passing it is a refusal. Other
# examples run without one: a deadline takes the guarded path, and the lean path must be
# fuzzed too.
ITERATING_OPS = frozenset({"Loop", "Scan", "SequenceMap"})
RUN_TIMEOUT_MS = 2000.0


def _iterates(model: bytes) -> bool:
    """Whether the model (any graph, subgraph or function body) holds an iterating operator."""
    import onnx

    m = onnx.ModelProto()
    try:
        m.ParseFromString(model)
    except Exception:  # noqa: BLE001 - a model that does not parse is refused at load
        return False
    stack = [m.graph, *m.functions]
    while stack:
        g = stack.pop()
        for n in g.node:
            if n.op_type in ITERATING_OPS:
                return True
            for a in n.attribute:
                if a.HasField("g"):
                    stack.append(a.g)
                stack.extend(a.graphs)
    return False


def check_example(
    ex: Example,
    memory_limit: int,
    compare_ort: bool = False,
    on_phase: Callable[[str], None] | None = None,
    run_timeout_ms: float | None = RUN_TIMEOUT_MS,
) -> dict[str, Any]:
    """Run one example in this process; a dict with status ok/refused/escape/mismatch.
    Models with iterating operators run under `run_timeout_ms` (see ITERATING_OPS)."""
    import opwarden as ow

    res: dict[str, Any] = {"status": "ok"}
    outs = None
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            opts = ow.SessionOptions(memory_limit_bytes=memory_limit, intra_op_num_threads=1)
            if run_timeout_ms is not None and _iterates(ex.model):
                opts.run_timeout_ms = run_timeout_ms
            res["phase"] = "load"
            sess = ow.InferenceSession(ex.model, opts)
            res["phase"] = "run"
            outs = sess.run(None, ex.feeds)
        if not isinstance(outs, list) or not all(_well_formed(o) for o in outs):
            kinds = sorted({type(o).__name__ for o in (outs if isinstance(outs, list) else [outs])})
            res.update(status="escape", error="BadOutput", where="session.run",
                       message=f"run returned non-array outputs: {kinds}")  # fmt: skip
    except KeyboardInterrupt:
        raise
    except ow.OpwardenError as e:
        res.update(status="refused", error=type(e).__name__, message=str(e)[:300])
    except BaseException as e:  # noqa: BLE001 - the oracle: anything else escapes
        res.update(
            status="escape",
            error=type(e).__name__,
            message=str(e)[:300],
            where=_innermost(e.__traceback__),
            traceback="".join(traceback.format_exception(type(e), e, e.__traceback__))[-3000:],
        )
    if res["status"] == "ok" and compare_ort and ex.deterministic:
        res["phase"] = "ort"
        if on_phase is not None:
            on_phase("ort")  # a crash or hang from here on is ONNX Runtime's
        diff = _compare_ort(ex, outs)
        if diff:
            res.update(status="mismatch", error="Mismatch", message=diff, where="ort")
    return res


def _compare_ort(ex: Example, ours: Any) -> str | None:
    """A description of the first difference from ONNX Runtime, where ORT also runs it."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    if not all(
        isinstance(v, np.ndarray) and v.dtype != object and v.dtype.isnative
        for v in ex.feeds.values()
    ):
        return None  # ORT reads non-native byte orders as native ones
    try:
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.log_severity_level = 4
        s = ort.InferenceSession(ex.model, so, providers=["CPUExecutionProvider"])
        theirs = s.run(None, ex.feeds)
    except Exception:  # noqa: BLE001 - where ORT refuses there is nothing to compare
        return None
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray):
            continue
        if a.shape != b.shape:
            return f"output {i}: shape {list(a.shape)} vs ORT {list(b.shape)}"
        if a.dtype != b.dtype:
            return f"output {i}: dtype {a.dtype} vs ORT {b.dtype}"
        if a.dtype.kind in "fc":
            close = np.isclose(a, b, rtol=1e-3, atol=1e-4, equal_nan=True)
            if not close.all():
                k = int(np.argmin(close.reshape(-1)))
                bad = int((~close).sum())
                return f"output {i}: {bad} values differ (e.g. {a.flat[k]} vs {b.flat[k]})"
        elif a.dtype.kind in "biu" and not np.array_equal(a, b):
            return f"output {i}: integer values differ"
    return None


def _worker(args: Any) -> int:
    """Loop over examples, announcing each on the report pipe before it starts."""
    import faulthandler
    import resource

    if args.as_limit:
        resource.setrlimit(resource.RLIMIT_AS, (args.as_limit, args.as_limit))
    faulthandler.enable(file=sys.stderr)
    os.nice(5)  # the parent, and whatever else shares the machine, comes first
    pipe = os.fdopen(args.report_fd, "w", buffering=1)
    cfg = json.loads(args.config)
    corpus = build_corpus(cfg["extra_seeds"], cfg["node_suite"])
    pipe.write(json.dumps({"ready": len(corpus)}) + "\n")
    inject = {int(k): v for k, v in cfg.get("inject", {}).items()}
    for k in range(args.start, args.stop):
        # a stack for a hang, written before the parent's kill
        faulthandler.dump_traceback_later(max(args.timeout - 1.0, 0.5), exit=False)
        try:
            ex = make_example(corpus, args.seed, k)
        except Exception as e:  # noqa: BLE001 - a generator bug is reported, not fatal
            pipe.write(json.dumps({"start": k, "seed_name": "?", "mutations": []}) + "\n")
            pipe.write(json.dumps({"done": k, "status": "generator", "error": type(e).__name__,
                                   "message": str(e)[:300]}) + "\n")  # fmt: skip
            continue
        pipe.write(
            json.dumps({"start": k, "seed_name": ex.seed_name, "mutations": ex.mutations}) + "\n"
        )
        if inject.get(k) == "crash":
            os.abort()
        if inject.get(k) == "hang":
            time.sleep(3600)
        def phase(name: str, k: int = k) -> None:
            pipe.write(json.dumps({"entering": name, "index": k}) + "\n")

        res = check_example(ex, cfg["memory_limit"], cfg["compare_ort"], phase)
        faulthandler.cancel_dump_traceback_later()
        res["done"] = k
        pipe.write(json.dumps(res, default=str) + "\n")
    return 0


# --------------------------------------------------------------------------------------------
# the parent: a watched worker subprocess


@dataclass
class Result:
    index: int
    status: str  # ok | refused | escape | mismatch | hang | crash | generator | peer
    seed_name: str = ""
    mutations: list[str] = field(default_factory=list)
    error: str = ""
    message: str = ""
    where: str = ""
    phase: str = ""
    detail: str = ""  # traceback or the worker's last stderr lines
    stack: list[str] = field(default_factory=list)  # opwarden frames of a hang or crash

    @property
    def signature(self) -> str:
        """What known-open lists match on: ``status:error@where``."""
        return f"{self.status}:{self.error}@{self.where}"

    @property
    def failed(self) -> bool:
        return self.status in ("escape", "mismatch", "hang", "crash")


@dataclass
class Report:
    seed: int
    results: list[Result]
    seconds: float
    extra_seeds: tuple[str, ...] = ()

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results:
            out[r.status] = out.get(r.status, 0) + 1
        return out

    @property
    def failures(self) -> list[Result]:
        return [r for r in self.results if r.failed]

    def format(self, results: Iterable[Result] | None = None, tracebacks: bool = False) -> str:
        lines = []
        extra = "".join(f" --extra-seed {s!r}" for s in self.extra_seeds)
        for r in self.failures if results is None else results:
            lines.append(
                f"[{self.seed}/{r.index}] {r.signature} on seed model {r.seed_name!r}"
                f" ({r.phase}): {r.message}"
            )
            for m in r.mutations:
                lines.append(f"    - {m}")
            lines.append(
                f"    reproduce: python -m opwarden.verify.fuzz --seed {self.seed} "
                f"--index {r.index}{extra}"
            )
            if tracebacks and r.detail:
                lines.append("    " + r.detail.strip().replace("\n", "\n    "))
        return "\n".join(lines)


_FRAME = re.compile(r'File "([^"]+)", line (\d+) in (\S+)')
_DUMP = re.compile(r"^(?:Timeout \(|Fatal Python error)", re.M)


def _stack(text: str) -> tuple[str, list[str]]:
    """Innermost frame and opwarden frames (innermost first) of the last faulthandler dump."""
    starts = [m.start() for m in _DUMP.finditer(text)]
    block = text[starts[-1] :] if starts else text
    block = block.split("\n\n")[0] if "Thread" in block or "thread" in block else block
    frames = _FRAME.findall(block)
    ours = [
        f"{_rel(p)}:{fn}"
        for p, _line, fn in frames
        if f"{os.sep}opwarden{os.sep}" in p and not p.endswith("verify/fuzz.py")
    ]
    where = ours[0] if ours else (f"{_rel(frames[0][0])}:{frames[0][2]}" if frames else "?")
    return where, ours


def campaign(
    seed: int = 0,
    count: int = 300,
    start: int = 0,
    *,
    timeout: float = 10.0,
    extra_seeds: Sequence[str] = (),
    node_suite: bool = True,
    memory_limit: int = 256 << 20,
    as_limit: int = 4 << 30,
    compare_ort: bool = False,
    inject: dict[int, str] | None = None,
    progress: Callable[[Result], None] | None = None,
    cwd: str | None = None,
) -> Report:
    """Examples ``start .. start+count`` of campaign ``seed``, in watched worker processes."""
    cfg = json.dumps({
        "extra_seeds": list(extra_seeds), "node_suite": node_suite, "memory_limit": memory_limit,
        "compare_ort": compare_ort, "inject": {str(k): v for k, v in (inject or {}).items()},
    })  # fmt: skip
    env = dict(os.environ)
    # one core: BLAS and OpenMP single-threaded, the worker niced below the parent
    env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (cwd or os.getcwd(), env.get("PYTHONPATH")) if p)
    results: list[Result] = []
    t0 = time.monotonic()
    k, stop = start, start + count
    while k < stop:
        k = _run_worker(seed, k, stop, timeout, cfg, as_limit, env, cwd, results, progress)
    return Report(seed, results, time.monotonic() - t0, tuple(extra_seeds))


def _run_worker(
    seed: int, k: int, stop: int, timeout: float, cfg: str, as_limit: int,
    env: dict[str, str], cwd: str | None, results: list[Result],
    progress: Callable[[Result], None] | None,
) -> int:  # fmt: skip
    """One worker from example k; returns the next example to start from."""
    rfd, wfd = os.pipe()
    err = tempfile.TemporaryFile()
    cmd = [sys.executable, "-m", "opwarden.verify.fuzz", "--worker", "--report-fd", str(wfd),
           "--seed", str(seed), "--start", str(k), "--stop", str(stop), "--timeout", str(timeout),
           "--as-limit", str(as_limit), "--config", cfg]  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, pass_fds=(wfd,),
        env=env, cwd=cwd,
    )
    os.close(wfd)
    reader = os.fdopen(rfd, "r")
    current: dict[str, Any] | None = None
    nxt: int | None = None  # the example after the last one done, once the worker is ready
    deadline = time.monotonic() + max(120.0, timeout)  # the corpus builds first
    buf = ""
    try:
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([reader], [], [], max(left, 0))
            if not ready:  # a hang: faulthandler wrote the stack to err
                proc.kill()
                proc.wait()
                if current is None and nxt is None:
                    raise RuntimeError("fuzz worker did not start: " + _tail(err))
                if current is None:  # building the example itself hung
                    current = {"start": nxt, "seed_name": "?", "mutations": ["(generator)"]}
                results.append(_lost(current, "hang", f"no answer within {timeout} s", err))
                _emit(results, progress)
                return current["start"] + 1
            chunk = os.read(reader.fileno(), 1 << 16).decode("utf-8", "replace")
            if not chunk:  # EOF: the worker died or finished
                rc = proc.wait()
                if current is None and (nxt is None or rc != 0):
                    if nxt is None:
                        raise RuntimeError(f"fuzz worker exited with {rc}: " + _tail(err))
                    current = {"start": nxt, "seed_name": "?", "mutations": ["(generator)"]}
                if current is None:
                    return stop
                results.append(_lost(current, "crash", f"worker died with exit status {rc}", err))
                _emit(results, progress)
                return current["start"] + 1
            buf += chunk
            *lines, buf = buf.split("\n")
            for line in lines:
                msg = json.loads(line)
                if "ready" in msg:
                    nxt = k
                    deadline = time.monotonic() + timeout
                elif "entering" in msg and current is not None:
                    current["phase"] = msg["entering"]
                elif "start" in msg:
                    current = msg
                    deadline = time.monotonic() + timeout
                elif "done" in msg:
                    results.append(_finished(current or {}, msg))
                    _emit(results, progress)
                    current = None
                    nxt = msg["done"] + 1
                    deadline = time.monotonic() + timeout
                    if msg["done"] + 1 >= stop:
                        proc.wait()
                        return stop
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.close()
        err.close()


def _emit(results: list[Result], progress: Callable[[Result], None] | None) -> None:
    if progress is not None:
        progress(results[-1])


def _tail(err: Any, n: int = 4000) -> str:
    err.flush()
    err.seek(0)
    return err.read().decode("utf-8", "replace")[-n:]


def _lost(current: dict[str, Any], status: str, message: str, err: Any) -> Result:
    text = _tail(err)
    where, stack = _stack(text)
    phase = current.get("phase", "ours")
    if phase == "ort":  # ONNX Runtime's crash or hang, not ours
        message = f"ONNX Runtime {status}: {message}"
        status = "peer"
    return Result(
        current["start"], status, current.get("seed_name", ""), current.get("mutations", []),
        error="Hang" if status == "hang" else "Crash", message=message,
        where=where, phase=phase, detail=text, stack=stack,
    )  # fmt: skip


def _finished(current: dict[str, Any], msg: dict[str, Any]) -> Result:
    return Result(
        msg["done"], msg["status"], current.get("seed_name", ""), current.get("mutations", []),
        error=msg.get("error", ""), message=msg.get("message", ""), where=msg.get("where", ""),
        phase=msg.get("phase", ""), detail=msg.get("traceback", ""),
    )  # fmt: skip


def matches(result: Result, patterns: Iterable[str]) -> bool:
    """Whether a result matches one of the fnmatch patterns: ``SIGNATURE`` or
    ``SIGNATURE via FRAME`` (FRAME: one of the opwarden frames of a hang's or crash's stack)."""
    for p in patterns:
        sig, _, via = p.partition(" via ")
        if not fnmatch.fnmatchcase(result.signature, sig):
            continue
        if not via or any(fnmatch.fnmatchcase(f, via) for f in result.stack):
            return True
    return False


def reproduce(
    seed: int, index: int, extra_seeds: Sequence[str] = (), node_suite: bool = True
) -> Example:
    """Rebuild one example in this process (the same bytes and feeds the worker ran)."""
    return make_example(build_corpus(extra_seeds, node_suite), seed, index)


# --------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m opwarden.verify.fuzz", description=__doc__)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--index", type=int, help="reproduce one example in this process")
    p.add_argument("--count", type=int, default=0, help="run a campaign of this many examples")
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--stop", type=int, default=0)
    p.add_argument("--timeout", type=float, default=10.0)
    p.add_argument("--extra-seed", action="append", default=[], dest="extra_seeds")
    p.add_argument("--no-node-suite", action="store_true")
    p.add_argument("--compare-ort", action="store_true")
    p.add_argument("--save", help="write the reproduced model here")
    p.add_argument("--json", help="write the campaign's failures as JSON lines here")
    p.add_argument("--all", action="store_true", help="--json gets every result, not only failures")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--report-fd", type=int, help=argparse.SUPPRESS)
    p.add_argument("--as-limit", type=int, default=4 << 30, help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return _worker(args)
    if args.index is not None:
        ex = reproduce(args.seed, args.index, args.extra_seeds, not args.no_node_suite)
        print(f"seed model {ex.seed_name!r}")
        for m in ex.mutations:
            print(f"  - {m}")
        print("feeds:", {k: _feed_str(v) for k, v in ex.feeds.items()})
        if args.save:
            with open(args.save, "wb") as f:
                f.write(ex.model)
        print(json.dumps(check_example(ex, 256 << 20, args.compare_ort), indent=1, default=str))
        return 0
    count = args.count or 300

    def show(r: Result) -> None:
        if r.failed:
            print(f"[{args.seed}/{r.index}] {r.signature}: {r.message[:160]}", flush=True)

    rep = campaign(
        args.seed, count, args.start, timeout=args.timeout, extra_seeds=args.extra_seeds,
        node_suite=not args.no_node_suite, compare_ort=args.compare_ort, progress=show,
    )  # fmt: skip
    print(f"{len(rep.results)} examples in {rep.seconds:.1f} s: {rep.counts()}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            for r in rep.results if args.all else rep.failures:
                f.write(json.dumps(dataclasses.asdict(r) | {"signature": r.signature}) + "\n")
    return 1 if rep.failures else 0


def _feed_str(v: Any) -> str:
    if isinstance(v, np.ndarray):
        return f"array{list(v.shape)} {v.dtype}"
    return repr(v)[:60]


if __name__ == "__main__":
    sys.exit(main())
