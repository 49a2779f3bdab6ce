"""Slice between NHWC convolutions runs on the channels-last tensor with its axes remapped,
so the layout pass inserts no Transpose around it (GhostNet's `cat(...)[:, :c]`)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import opwarden as ow


def _model(axes, starts, ends, steps=None, opset=17, batch="N"):
    rng = np.random.default_rng(0)
    n = helper.make_node
    w1 = numpy_helper.from_array(rng.standard_normal((8, 4, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((6, 8, 1, 1)).astype(np.float32), "w2")
    inits = [w1, w2, numpy_helper.from_array(np.array(starts, np.int64), "st"),
             numpy_helper.from_array(np.array(ends, np.int64), "en")]
    ins = ["cat", "st", "en"]
    if axes is not None or steps is not None:
        inits.append(numpy_helper.from_array(np.array(axes, np.int64), "ax"))
        ins.append("ax")
    if steps is not None:
        inits.append(numpy_helper.from_array(np.array(steps, np.int64), "sp"))
        ins.append("sp")
    nodes = [n("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), n("Relu", ["c1"], ["r1"]),
             n("Concat", ["r1", "r1"], ["cat"], axis=1), n("Slice", ins, ["s"]),
             n("Conv", ["s", "w2"], ["y"])]
    g = helper.make_graph(nodes, "slice", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [batch, 4, 9, 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


CASES = {
    # (axes, starts, ends, steps): slices whose output the 8-channel 1x1 conv can read
    "channels prefix": ([1], [0], [8], None),
    "channels negative axis": ([-3], [4], [12], None),
    "channels and width": ([1, 3], [2, 1], [10, 9], None),
    "height, width stepped": ([2, 3, 1], [0, 8, 0], [9, -100, 8], [2, -2, 1]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_slice_stays_in_nhwc_and_matches_onnxruntime(case):
    axes, starts, ends, steps = CASES[case]
    m = _model(axes, starts, ends, steps).SerializeToString()
    x = np.random.default_rng(1).standard_normal((2, 4, 9, 10)).astype(np.float32)
    sess = ow.InferenceSession(m)
    ops = [r["op_type"] for r in sess.explain()]
    # one Transpose in (the graph input) and one out (the graph output), none at the Slice
    assert ops.count("Transpose") == 2, ops
    slice_row = next(r for r in sess.explain() if r["op_type"] == "Slice")
    assert slice_row["layout"] == "NHWC"
    (want,) = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    (got,) = sess.run(None, {"x": x})
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_slice_without_axes_takes_the_first_logical_axes():
    """No axes input: starts/ends apply to logical axes 0..k-1 (here batch and channels)."""
    m = _model(None, [0, 0], [1, 8]).SerializeToString()
    x = np.random.default_rng(2).standard_normal((3, 4, 9, 10)).astype(np.float32)
    (want,) = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    sess = ow.InferenceSession(m)
    (got,) = sess.run(None, {"x": x})
    assert got.shape == want.shape == (1, 6, 9, 10)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
