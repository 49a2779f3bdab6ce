"""The fuzzer's corpus: seed models with feeds that run on them, and the Example type.

Four hand-written seeds cover the structures mutations should reach: an MLP of shape and
indexing ops (``mlp``), a CNN (``cnn``), control flow with subgraphs capturing outer values
(``control``) and model-local functions with attribute references (``function``); extra seeds
come from ``"module:function(args)"`` specs and the first cases of a few ONNX node-suite modules.
``build_corpus`` gives them in a fixed order, so every process builds the same corpus.
"""

from __future__ import annotations

import importlib
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


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


def onnx_helpers() -> Any:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    return onnx, TensorProto, helper, numpy_helper


def _mlp() -> Any:
    onnx, TP, h, nh = onnx_helpers()
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
    onnx, TP, h, nh = onnx_helpers()
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
    onnx, TP, h, nh = onnx_helpers()
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
    onnx, TP, h, nh = onnx_helpers()
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


def feed_for(vi: Any, rng: np.random.Generator) -> Any:
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


def graph_inputs(model: Any) -> list[Any]:
    init = {t.name for t in model.graph.initializer}
    return [v for v in model.graph.input if v.name not in init]


def _seed_from_model(name: str, model: Any, rng: np.random.Generator) -> Seed | None:
    feeds = {}
    for vi in graph_inputs(model):
        f = feed_for(vi, rng)
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
                names = [v.name for v in graph_inputs(case.model)]
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

