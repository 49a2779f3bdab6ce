"""fp16_islands at every optimization level and inside subgraph bodies.

ORT's InsertCastTransformer runs at every graph optimization level (ORT_DISABLE_ALL included)
and on If/Loop/Scan bodies, so a float16 model's rounding does not depend on the level: ours
must not either. Each model is a chain of exactly rounded ops (Mul, Add, Transpose, Sub), which
ORT computes in float32 and rounds once; rounding after every op gives other bits, so each test
also checks that without the pass the result differs (the test can fail)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import opwarden

ort = pytest.importorskip("onnxruntime")
H = TensorProto.FLOAT16
nd, vi = helper.make_node, helper.make_tensor_value_info
RNG = np.random.default_rng(11)
X = RNG.uniform(-4, 4, (16, 12)).astype(np.float16)
W = numpy_helper.from_array(RNG.uniform(0.5, 1.5, (16, 12)).astype(np.float16), "w")
WT = numpy_helper.from_array(RNG.uniform(-1, 1, (12, 16)).astype(np.float16), "wt")


def _chain(x, prefix):
    """Mul -> Add -> Transpose -> Sub -> Mul on `x`, the last output named prefix + 'y'."""
    p = prefix
    return [nd("Mul", [x, "w"], [p + "a"]), nd("Add", [p + "a", x], [p + "b"]),
            nd("Transpose", [p + "b"], [p + "t"]), nd("Sub", [p + "t", "wt"], [p + "c"]),
            nd("Mul", [p + "c", "wt"], [p + "y"])]


def _model(nodes, inputs, outputs, opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, [W, WT])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m.SerializeToString()


def _ort(m, feeds, level):
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    return ort.InferenceSession(m, so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _check(m, feeds):
    """Ours equals ORT bit for bit at every level; without the pass it does not."""
    ref = _ort(m, feeds, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    # ORT itself rounds the same at every level
    full = _ort(m, feeds, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    np.testing.assert_array_equal(ref[0], full[0])
    for level in (0, 1, 3):
        sess = opwarden.InferenceSession(m, optimization_level=level)
        got = sess.run(None, feeds)
        for a, r in zip(got, ref):
            assert a.dtype == r.dtype and a.shape == r.shape
            np.testing.assert_array_equal(a, r, err_msg=f"level {level}")
    plain = opwarden.InferenceSession(m, optimization_level=0,
                                      disabled_passes=["fp16_islands"]).run(None, feeds)
    assert not all(np.array_equal(a, r) for a, r in zip(plain, ref))
    return sess


def test_level_0_rounds_as_ort():
    m = _model(_chain("x", ""), [vi("x", H, [16, 12])], [vi("y", H, [12, 16])])
    _check(m, {"x": X})
    sess = opwarden.InferenceSession(m, optimization_level=0)
    ran = {e["pass"]: e for e in sess.pass_report}
    assert ran["fp16_islands"]["changes"] >= 4
    # level 0 still runs no optimization
    assert set(ran) == {"fp16_islands", "total"}, sorted(ran)


def test_level_0_leaves_a_float32_model_alone():
    f32 = helper.make_tensor_value_info
    nodes = [nd("Mul", ["x", "x"], ["a"]), nd("Add", ["a", "x"], ["y"])]
    g = helper.make_graph(nodes, "g", [f32("x", TensorProto.FLOAT, [4])],
                          [f32("y", TensorProto.FLOAT, [4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    sess = opwarden.InferenceSession(m.SerializeToString(), optimization_level=0)
    total = sess.pass_report[-1]
    assert total["changes"] == 0 and total["nodes_before"] == total["nodes_after"] == 2


def test_if_branches_round_as_ort():
    """Both branches of an If compute the chain on the outer float16 value."""
    then_g = helper.make_graph(_chain("x", "t_"), "then", [], [vi("t_y", H, [12, 16])])
    else_nodes = _chain("x", "e_")
    else_nodes[-1] = nd("Add", ["e_c", "wt"], ["e_y"])
    else_g = helper.make_graph(else_nodes, "else", [], [vi("e_y", H, [12, 16])])
    m = _model([nd("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)],
               [vi("x", H, [16, 12]), vi("cond", TensorProto.BOOL, [])],
               [vi("y", H, [12, 16])])
    for c in (True, False):
        _check(m, {"x": X, "cond": np.array(c)})


def test_loop_body_rounds_as_ort():
    """A Loop carrying a float16 value through Mul -> Add -> Sub -> Mul for 3 iterations."""
    body = helper.make_graph(
        [nd("Mul", ["v_in", "w"], ["a"]), nd("Add", ["a", "v_in"], ["b"]),
         nd("Sub", ["b", "w"], ["c"]), nd("Mul", ["c", "w"], ["v_out"]),
         nd("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [vi("i", TensorProto.INT64, []), vi("cond_in", TensorProto.BOOL, []),
         vi("v_in", H, [16, 12])],
        [vi("cond_out", TensorProto.BOOL, []), vi("v_out", H, [16, 12])])
    trip = numpy_helper.from_array(np.array(3, np.int64), "trip")
    g = helper.make_graph([nd("Loop", ["trip", "", "x"], ["y"], body=body)], "g",
                          [vi("x", H, [16, 12])], [vi("y", H, [16, 12])], [W, WT, trip])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    x = (X * np.float16(0.25)).astype(np.float16)
    _check(m.SerializeToString(), {"x": x})
