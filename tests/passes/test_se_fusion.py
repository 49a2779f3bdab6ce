"""se_fusion.spatial_mean_pool: the squeeze-excite ReduceMean over H and W as
GlobalAveragePool (axes as an attribute before opset 18, as a constant input from 18), the
block then staying in NHWC; outputs against the unoptimized session and onnxruntime; the
ReduceMeans it must leave alone."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import opwarden as ow
from tests.passes.helpers import changes, check_same, model, op_types

C = 16


def _weights(seed=0):
    rng = np.random.default_rng(seed)
    return [
        ("w0", (rng.standard_normal((C, 3, 3, 3)) * 0.3).astype(np.float32)),
        ("w1", (rng.standard_normal((4, C, 1, 1)) * 0.3).astype(np.float32)),
        ("b1", rng.standard_normal(4).astype(np.float32)),
        ("w2", (rng.standard_normal((C, 4, 1, 1)) * 0.3).astype(np.float32)),
        ("b2", rng.standard_normal(C).astype(np.float32)),
        ("w3", (rng.standard_normal((8, C, 1, 1)) * 0.3).astype(np.float32)),
    ]


def se_model(opset=13, axes=(2, 3), keepdims=1, gate="Sigmoid") -> bytes:
    """conv -> SiLU -> squeeze-excite (ReduceMean, conv, Relu, conv, gate, Mul) -> conv."""
    inits = _weights()
    if opset >= 18:
        inits.append(("axes", np.asarray(axes, np.int64)))
        mean = helper.make_node("ReduceMean", ["a", "axes"], ["m"], keepdims=keepdims)
    else:
        mean = helper.make_node("ReduceMean", ["a"], ["m"], axes=list(axes), keepdims=keepdims)
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c0"], ["s0"]),
        helper.make_node("Mul", ["c0", "s0"], ["a"]),
        mean,
        helper.make_node("Conv", ["m", "w1", "b1"], ["e1"]),
        helper.make_node("Relu", ["e1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["e2"]),
        helper.make_node(gate, ["e2"], ["g"]),
        helper.make_node("Mul", ["a", "g"], ["se"]),
        helper.make_node("Conv", ["se", "w3"], ["y"]),
    ]
    return model(nodes, [("x", ["N", 3, 12, 12])], [("y", None)], inits, opset=opset)


def _feeds(n=2, seed=1):
    return {"x": np.random.default_rng(seed).standard_normal((n, 3, 12, 12)).astype(np.float32)}


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("gate", ["Sigmoid", "HardSigmoid"])
def test_se_mean_becomes_pool_and_stays_nhwc(opset, gate):
    data = se_model(opset, gate=gate)
    sess = check_same(data, _feeds())
    assert changes(sess, "spatial_mean_pool") == 1
    assert "ReduceMean" not in op_types(sess) and "GlobalAveragePool" in op_types(sess)
    # The squeeze-excite block runs in NHWC: the only conversions are the model's input and
    # its output.
    assert sess.explain_summary()["transposes_inserted"] == 2
    ort = pytest.importorskip("onnxruntime")
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, _feeds())[0]
    got = sess.run(None, _feeds())[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(np.abs(want).max()))


@pytest.mark.parametrize("kw", [
    {"axes": (1, 2)},             # not the spatial axes
    {"axes": (2,)},               # one of them
    {"keepdims": 0},              # [N, C]: not the pool's shape
    {"axes": (1, 2, 3)},
])
def test_other_reductions_are_left_alone(kw):
    sess = check_same(_plain_mean(13, **kw), _feeds())
    assert changes(sess, "spatial_mean_pool") == 0
    assert "ReduceMean" in op_types(sess)


def _plain_mean(opset, axes=(2, 3), keepdims=1) -> bytes:
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("ReduceMean", ["r"], ["y"], axes=list(axes), keepdims=keepdims)]
    return model(nodes, [("x", ["N", 3, 12, 12])], [("y", None)], opset=opset)


def test_negative_axes_and_axes_fed_at_run_time():
    sess = check_same(_plain_mean(13, axes=(-1, -2)), _feeds())
    assert changes(sess, "spatial_mean_pool") == 1
    # opset 18 with the axes a graph input: not a constant, so not rewritten
    nodes = [helper.make_node("ReduceMean", ["x", "axes"], ["y"])]
    data = model(nodes, [("x", ["N", 3, 12, 12])], [("y", None)], opset=18)
    m = onnx.load_from_string(data)
    m.graph.input.append(helper.make_tensor_value_info("axes", onnx.TensorProto.INT64, [2]))
    sess = ow.InferenceSession(m.SerializeToString())
    assert changes(sess, "spatial_mean_pool") == 0
    feeds = {**_feeds(), "axes": np.array([2, 3], np.int64)}
    np.testing.assert_allclose(sess.run(None, feeds)[0],
                               feeds["x"].mean(axis=(2, 3), keepdims=True), rtol=1e-6)


def test_pass_can_be_disabled():
    sess = ow.InferenceSession(se_model(), ow.SessionOptions(disabled_passes=["spatial_mean_pool"]))
    assert "ReduceMean" in op_types(sess)
