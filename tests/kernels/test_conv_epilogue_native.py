"""The compiled convolution epilogue (native.conv_epilogue, taken by conv_common._epilogue):
bit for bit the NumPy path's y + bias + z and activations (None, Relu, Clip, LeakyRelu,
HardSwish) with NaN, +-inf, -0.0 and kink values, on 1 and 2 threads; Sigmoid within 4e-7 of
float64; the
operands it declines (pre-shaped bias, strided, overlapping, other activations) take the
NumPy path; whole convolutions on it agree with onnxruntime; bad calls raise."""

from __future__ import annotations

import os

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import opwarden as ow
from opwarden import native
from opwarden.errors import OpwardenError
from opwarden.kernels.cpu import conv_common

needs_native = pytest.mark.skipif(os.environ.get("OPWARDEN_NATIVE", "1") == "0"
                                  or not native.available(), reason="compiled path off")

ACTS = [("", []), ("Relu", []), ("Clip", [0.0, 6.0]), ("Clip", [-1.0, 0.5]),
        ("LeakyRelu", [0.1]), ("LeakyRelu", [1.7]), ("HardSwish", [])]


def _numpy_epilogue(y, bias, z, activation, params):
    from opwarden.kernels.cpu.util import add_into, add_rows, apply_activation
    if bias is not None:
        add_rows(y, bias, False)
    if z is not None:
        add_into(y, z, False)
    if activation:
        apply_activation(y, activation, params)
    return y


def pre_activation(y, bias, z):
    """y + bias + z in float32, the terms in the epilogue's order (either may be None)."""
    pre = y.copy()
    with np.errstate(invalid="ignore", over="ignore"):
        if bias is not None:
            pre += bias
        if z is not None:
            pre += z
    return pre


def _data(rows, cols, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.standard_normal((rows, cols), dtype=np.float32) * 5
    flat = y.reshape(-1)
    specials = np.float32([np.nan, np.inf, -np.inf, -0.0, 0.0, -3, 3, 6, -1, 0.5])
    flat[: min(flat.size, 40)] = np.resize(specials, min(flat.size, 40))
    return y, rng.standard_normal(cols, dtype=np.float32), \
        rng.standard_normal((rows, cols), dtype=np.float32)


@needs_native
@pytest.mark.parametrize("activation,params", ACTS)
@pytest.mark.parametrize("has_bias,has_z", [(1, 1), (1, 0), (0, 1), (0, 0)])
@pytest.mark.parametrize("rows,cols", [(7, 13), (300, 72), (1, 1280), (4096, 24)])
def test_bit_identical_to_numpy_path(activation, params, has_bias, has_z, rows, cols):
    y, b, z = _data(rows, cols, seed=rows + cols)
    b = b if has_bias else None
    z = z if has_z else None
    with np.errstate(invalid="ignore", over="ignore"):
        want = _numpy_epilogue(y.copy(), b, z, activation, params)
    for threads in (1, 2):
        got = native.conv_epilogue(y.copy(), b, z, activation, params, threads)
        assert np.array_equal(got.view(np.int32), want.view(np.int32)) or \
            np.array_equal(got, want, equal_nan=True), (activation, threads)


@needs_native
def test_in_place_over_residual_and_nhwc_shape():
    y, b, _ = _data(2 * 9 * 11, 40, seed=3)
    y4 = y.reshape(2, 9, 11, 40)
    z = np.random.default_rng(4).standard_normal(y4.shape, dtype=np.float32)
    with np.errstate(invalid="ignore"):
        want = _numpy_epilogue(y4.copy(), b, z, "HardSwish", [])
    yy = y4.copy()
    assert conv_common._native_epilogue(yy, b, z, "HardSwish", [])
    assert np.array_equal(yy, want, equal_nan=True)
    # z in y's memory is left to the NumPy path (its order of reads decides the result)
    same = y4.copy()
    assert not conv_common._native_epilogue(same, b, same, "Relu", [])


@needs_native
def test_declines_what_it_does_not_take():
    y, b, z = _data(8, 16, seed=5)
    assert not conv_common._native_epilogue(y, b.reshape(16, 1)[:8], None, "", [])
    assert not conv_common._native_epilogue(y, b, None, "Tanh", [])
    assert not conv_common._native_epilogue(y, b, None, "Gelu", [0.0])
    assert not conv_common._native_epilogue(y[:, ::2], None, None, "Relu", [])
    assert not conv_common._native_epilogue(y, None, z[:, ::-1], "Relu", [])
    assert not conv_common._native_epilogue(y[1:], None, y[:-1], "Relu", [])  # overlapping
    assert not conv_common._native_epilogue(y.astype(np.float64), None, None, "Relu", [])


@needs_native
@pytest.mark.parametrize("has_bias,has_z", [(1, 1), (1, 0), (0, 0)])
@pytest.mark.parametrize("rows,cols", [(1, 1152), (300, 72), (4096, 24)])
def test_sigmoid_within_4e7_of_float64(has_bias, has_z, rows, cols):
    # Sigmoid is 1 / (1 + e^-v) on native.h's exponential (as Swish): not NumPy's bits, within
    # 4e-7 relative (the exponential's 2e-7 and two roundings) of the float64 value of the
    # float32 pre-activation; NaN stays NaN, +-inf give 1 and 0, |v| past float32's exp range
    # saturates as NumPy's does.
    y, b, z = _data(rows, cols, seed=rows)
    flat = y.reshape(-1)
    flat[40:46] = np.float32([100.0, -100.0, 88.5, -88.5, 1e-8, -87.0])[: max(0, flat.size - 40)]
    b = b if has_bias else None
    z = z if has_z else None
    pre = pre_activation(y, b, z)
    with np.errstate(invalid="ignore", over="ignore"):
        want = 1.0 / (1.0 + np.exp(-pre.astype(np.float64)))
        numpy_path = _numpy_epilogue(y.copy(), b, z, "Sigmoid", [])
    for threads in (1, 2):
        got = native.conv_epilogue(y.copy(), b, z, "Sigmoid", [], threads).astype(np.float64)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        ok = ~np.isnan(want)
        np.testing.assert_allclose(got[ok], want[ok], rtol=4e-7, atol=1e-38)
        np.testing.assert_allclose(got[ok], numpy_path[ok], rtol=6e-7, atol=1e-38)
    yy = y.copy()
    assert conv_common._native_epilogue(yy, b, z, "Sigmoid", [])


@needs_native
def test_bad_calls_raise():
    y, b, z = _data(4, 8)
    with pytest.raises(OpwardenError):
        native.conv_epilogue(y, b[:3], None)
    with pytest.raises(OpwardenError):
        native.conv_epilogue(y, None, z[:2])
    with pytest.raises(OpwardenError):
        native.conv_epilogue(y, None, None, "Tanh")
    with pytest.raises(OpwardenError):
        native.conv_epilogue(y[1:], None, y[:-1])


def _pw_model(c=24, m=72, act="HardSwish") -> bytes:
    rng = np.random.default_rng(9)
    w = numpy_helper.from_array(rng.standard_normal((m, c, 1, 1)).astype(np.float32) * 0.3,
                                "w")
    bias = numpy_helper.from_array(rng.standard_normal(m).astype(np.float32), "b")
    w2 = numpy_helper.from_array(rng.standard_normal((c, m, 1, 1)).astype(np.float32) * 0.2,
                                 "w2")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["t"]),
             helper.make_node(act, ["t"], ["u"]),
             helper.make_node("Conv", ["u", "w2"], ["v"]),
             helper.make_node("Add", ["v", "x"], ["y"])]
    g = helper.make_graph(nodes, "pw",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                         [1, c, 28, 28])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [w, bias, w2])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)]).SerializeToString()


@pytest.mark.parametrize("act", ["HardSwish", "Relu"])
def test_session_agrees_with_ort(act):
    ort = pytest.importorskip("onnxruntime")
    model = _pw_model(act=act)
    x = np.random.default_rng(10).standard_normal((1, 24, 28, 28), dtype=np.float32)
    got = ow.InferenceSession(model).run(None, {"x": x})[0]
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None,
                                                                               {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
