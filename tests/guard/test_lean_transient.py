"""A kernel that raises once in the lean loop and then succeeds is still a recorded fault."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

import opwarden as ow
from opwarden.ops import REGISTRY


def _model():
    node = helper.make_node("Neg", ["x"], ["y"], name="neg_a")
    g = helper.make_graph([node], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_transient_lean_fault_is_recorded_and_quarantined():
    calls = []

    def flaky(x, *, out=None):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("transient failure")
        return np.negative(x, out=out)

    opdef = REGISTRY.latest("Neg", "")
    before = list(opdef.variants)
    opdef.kernel("cpu", dtypes=["float32"], priority=1000, accepts_out=True,
                       name="neg.test.flaky")(flaky)
    try:
        sess = ow.InferenceSession(_model().SerializeToString())
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        assert sess.explain()[0]["variant"] == "neg.test.flaky"
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], -x)
        faults = sess.faults
        assert [(f.node, f.variant, f.check) for f in faults] == [
            ("neg_a", "neg.test.flaky", "exception")]
        assert "transient failure" in faults[0].detail
        assert [list(s) for s in faults[0].input_shapes] == [[2, 3]]
        assert "neg.test.flaky" in sess.health()["quarantine"]
        n = len(calls)
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], -x)
        assert len(calls) == n  # quarantined: not called again
    finally:
        opdef.variants = before
