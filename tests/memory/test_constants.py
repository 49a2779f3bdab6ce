"""Declared constants (memory.constants): kernels cache what they derive from a weight only when
the runtime declared it constant; computed weights are seen anew on every run."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import opwarden
from opwarden.memory.constants import is_constant, mark
from opwarden.ops import REGISTRY


def test_mark_is_per_array_and_dies_with_it():
    a = np.zeros(4, np.float32)
    assert not is_constant(a)
    assert mark(a) is a and is_constant(a) and not a.flags.writeable
    assert not is_constant(a.view()) and not is_constant(a[1:])
    b = np.zeros(4, np.float32)
    b.flags.writeable = False
    assert not is_constant(b)  # read-only is not constant
    key = id(a)
    del a
    gc.collect()
    c = np.zeros(4, np.float32)
    assert id(c) != key or not is_constant(c)
    assert mark(3.0) == 3.0 and not is_constant(3.0)


def test_session_initializers_are_constants():
    w = np.ones((4, 2, 1, 1), np.float32)
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    sess = opwarden.InferenceSession(m.SerializeToString())
    consts = [c for c in sess.program.template if isinstance(c, np.ndarray)]
    assert consts and all(is_constant(c) for c in consts)


# One shape per convolution path whose work on W is cached for constants: pointwise, k x k
# (row taps), few output pixels (transposed patch GEMM), the RGB stem, depthwise, grouped.
CASES = {
    "1x1": ((1, 16, 8, 8), (32, 16, 1, 1), {}),
    "3x3": ((1, 32, 16, 16), (32, 32, 3, 3), {"pads": [1, 1, 1, 1]}),
    "few pixels": ((1, 256, 7, 7), (128, 256, 3, 3), {"pads": [1, 1, 1, 1]}),
    "stem": ((1, 3, 32, 32), (12, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),
    "direct": ((1, 3, 32, 32), (16, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),
    "depthwise": ((1, 16, 10, 10), (16, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 16}),
    "grouped": ((1, 16, 9, 9), (16, 4, 3, 3), {"pads": [1, 1, 1, 1], "group": 4}),
}


def _computed_weights_model(xs, ws, attrs):
    """y = Conv(Relu(Conv(x, W0 * s, B0 * s)), W1): the first convolution's weights and bias
    are computed on every run (the constant 1x1 after it keeps the layout pass in NHWC)."""
    rng = np.random.default_rng(0)
    w0 = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32)
    b0 = rng.standard_normal(ws[0]).astype(np.float32)
    w1 = (rng.standard_normal((8, ws[0], 1, 1)) / np.sqrt(ws[0])).astype(np.float32)
    nodes = [
        helper.make_node("Mul", ["w0", "s"], ["w"]),
        helper.make_node("Mul", ["b0", "s"], ["b"]),
        helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Conv", ["r", "w1"], ["y"]),
    ]
    g = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(xs)),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w0, "w0"), numpy_helper.from_array(b0, "b0"),
         numpy_helper.from_array(w1, "w1")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return m.SerializeToString(), w0, b0, w1


@pytest.mark.parametrize("providers", [None, ["torch", "cpu"]], ids=["cpu", "torch"])
@pytest.mark.parametrize("case", list(CASES))
def test_computed_weights_are_read_anew_on_every_run(case, providers):
    # The bug this guards against: kernels took "read-only" for "constant", and the executor
    # hands every intermediate on read-only, in the same planned view on every run, so the
    # first run's packed weights were used for all later runs.
    if providers:
        pytest.importorskip("torch")
    xs, ws, attrs = CASES[case]
    model, w0, b0, w1 = _computed_weights_model(xs, ws, attrs)
    x = np.random.default_rng(1).standard_normal(xs).astype(np.float32)
    sess = opwarden.InferenceSession(model, providers=providers)
    ref = REGISTRY.resolve("Conv", "", 17)[0].reference
    for s in (1.0, 2.0, -0.5):
        (got,) = sess.run(None, {"x": x, "s": np.array([s], np.float32)})
        want = ref(np.maximum(ref(x, w0 * np.float32(s), b0 * np.float32(s), **attrs), 0), w1)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, abs(s)),
                                   err_msg=f"run with s={s}")
