"""The CNN-family kernels: the compiled depthwise convolution (conv.cpu.depthwise_native and
fusedconv.cpu.depthwise_native over opwarden.native) against the reference Conv and the NumPy
variant on EfficientNet/MobileNet/ConvNeXt-like geometries (3x3/5x5/7x7, stride 2, dilation,
asymmetric pads, channel counts off the register block), every fused activation, bias and
residual (in place too), NaN propagation, row ranges, strided X and input shuffle, placement
on a session and agreement with onnxruntime; bad calls refused with an OpwardenError."""

from __future__ import annotations

import os

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import opwarden as ow
from opwarden import native
from opwarden.errors import KernelError, OpwardenError
from opwarden.kernels.cpu import conv_dw_native as dwn
from opwarden.kernels.cpu.conv import nhwc_kernel
from opwarden.ops.fused import FusedConv

DISABLED = os.environ.get("OPWARDEN_NATIVE", "1") == "0"
needs_native = pytest.mark.skipif(DISABLED, reason="compiled path disabled (OPWARDEN_NATIVE=0)")

# (H, W, C, kh, kw, strides, dilations, pads)
GEOMS = [
    (9, 9, 16, 3, 3, (1, 1), (1, 1), (1, 1, 1, 1)),
    (10, 11, 32, 3, 3, (2, 2), (1, 1), (0, 0, 1, 1)),    # TF-style "same" for stride 2
    (12, 12, 24, 5, 5, (2, 2), (1, 1), (2, 2, 2, 2)),    # 24: one block of 16 and a tail
    (9, 13, 40, 5, 5, (1, 1), (1, 1), (2, 2, 2, 2)),
    (14, 14, 8, 7, 7, (1, 1), (1, 1), (3, 3, 3, 3)),     # fewer channels than one block
    (8, 8, 48, 3, 3, (1, 2), (2, 2), (2, 1, 2, 3)),      # dilation, mixed strides/pads
    (6, 6, 17, 3, 3, (1, 1), (1, 1), (0, 0, 0, 0)),      # no padding, odd channels
    (3, 3, 16, 7, 7, (1, 1), (1, 1), (3, 3, 3, 3)),      # kernel larger than the image
    (16, 5, 64, 3, 3, (2, 1), (1, 1), (1, 1, 1, 1)),
]
ACTS = [("", []), ("Relu", []), ("Clip", [0.0, 6.0]), ("LeakyRelu", [0.1]), ("Sigmoid", []),
        ("HardSwish", []), ("Tanh", []), ("Gelu", [0.0]), ("Gelu", [1.0])]


def _case(geom, seed=0, n=1):
    h, w, c, kh, kw, s, d, p = geom
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, h, w, c), dtype=np.float32)
    wt = rng.standard_normal((c, 1, kh, kw), dtype=np.float32)
    b = rng.standard_normal(c, dtype=np.float32)
    attrs = dict(group=c, kernel_shape=[kh, kw], strides=list(s), dilations=list(d),
                 pads=list(p))
    return x, wt, b, attrs


def _reference(x, wt, b, z=None, activation="", params=(), **attrs):
    """FusedConv's reference (Conv, + Z, activation) in NCHW, returned in NHWC."""
    zc = None if z is None else z.transpose(0, 3, 1, 2)
    y = FusedConv(x.transpose(0, 3, 1, 2), wt, b, zc, activation=activation,
                  activation_params=list(params), **attrs)
    return np.asarray(y, np.float32).transpose(0, 2, 3, 1)


def _close(got, want):
    scale = max(1.0, float(np.abs(want[np.isfinite(want)]).max(initial=0)))
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * scale, equal_nan=True)


def test_native_path_is_active_unless_disabled():
    assert native.available() is (not DISABLED), native.status()["reason"]


@needs_native
@pytest.mark.parametrize("geom", GEOMS)
def test_depthwise_native_matches_reference(geom):
    x, wt, b, attrs = _case(geom, n=2)
    want = _reference(x, wt, b, **attrs)
    _close(dwn.depthwise_native(x, wt, b, **attrs), want)
    # without a bias, and the NumPy variant agreeing on the same call
    _close(dwn.depthwise_native(x, wt, None, **attrs), _reference(x, wt, None, **attrs))
    _close(nhwc_kernel("depthwise")(x, wt, b, **attrs), want)


@needs_native
@pytest.mark.parametrize("activation,params", ACTS)
def test_depthwise_native_epilogue(activation, params):
    x, wt, b, attrs = _case(GEOMS[2], seed=3)
    want_shape = _reference(x, wt, b, **attrs).shape
    z = np.random.default_rng(4).standard_normal(want_shape, dtype=np.float32)
    want = _reference(x, wt, b, z, activation, params, **attrs)
    got = dwn.depthwise_native(x, wt, b, z, activation=activation, activation_params=params,
                               **attrs)
    _close(got, want)
    # Y written over Z (FusedConv's alias): the residual is read before any tap is added
    y = z.copy()
    dwn.depthwise_native(x, wt, b, y, activation=activation, activation_params=params,
                         out=y, **attrs)
    _close(y, want)


@needs_native
def test_depthwise_native_nan_and_inf_propagate():
    x, wt, b, attrs = _case(GEOMS[0], seed=5)
    x[0, 4, 4, 3] = np.nan
    x[0, 0, 0, 5] = np.inf
    for act, params in ACTS:
        want = _reference(x, wt, b, activation=act, params=params, **attrs)
        got = dwn.depthwise_native(x, wt, b, activation=act, activation_params=params, **attrs)
        assert np.array_equal(np.isnan(got), np.isnan(want)), act
        _close(np.where(np.isnan(want), 0, got), np.where(np.isnan(want), 0, want))


@needs_native
def test_row_ranges_compose_to_the_whole():
    x, wt, b, attrs = _case(GEOMS[1], seed=6, n=3)
    whole = dwn.depthwise_native(x, wt, b, **attrs)
    taps = np.ascontiguousarray(wt[:, 0].transpose(1, 2, 0))
    y = np.full_like(whole, np.nan)
    rows = whole.shape[0] * whole.shape[1]
    for r0, r1 in ((0, 4), (4, 5), (5, rows)):
        native.depthwise_nhwc(x, taps, b, None, y, attrs["strides"], attrs["dilations"],
                              attrs["pads"][:2], n_threads=1, rows=(r0, r1))
    np.testing.assert_array_equal(y, whole)


@needs_native
def test_strided_input_and_input_shuffle():
    x, wt, b, attrs = _case(GEOMS[3], seed=7)
    strided = np.ascontiguousarray(x.transpose(0, 3, 1, 2)).transpose(0, 2, 3, 1)
    assert not strided.flags.c_contiguous
    _close(dwn.depthwise_native(strided, wt, b, **attrs), _reference(x, wt, b, **attrs))
    c = x.shape[3]
    shuffled = x.reshape(1, *x.shape[1:3], 2, c // 2).swapaxes(3, 4).reshape(x.shape)
    _close(dwn.depthwise_native(x, wt, b, input_shuffle=2, **attrs),
           _reference(np.ascontiguousarray(shuffled), wt, b, **attrs))


@needs_native
def test_bad_calls_raise_opwarden_errors():
    x, wt, b, attrs = _case(GEOMS[0])
    taps = np.ascontiguousarray(wt[:, 0].transpose(1, 2, 0))
    y = np.empty_like(x)
    with pytest.raises(KernelError, match="bias has"):
        native.depthwise_nhwc(x, taps, b[:3], None, y, (1, 1), (1, 1), (1, 1))
    with pytest.raises(KernelError, match="disagree"):
        native.depthwise_nhwc(x, taps[:, :, :4].copy(), b, None, y, (1, 1), (1, 1), (1, 1))
    with pytest.raises(KernelError, match="rows"):
        native.depthwise_nhwc(x, taps, b, None, y, (1, 1), (1, 1), (1, 1), rows=(0, 99))
    with pytest.raises(KernelError, match="activation"):
        native.depthwise_nhwc(x, taps, b, None, y, (1, 1), (1, 1), (1, 1), "Softplus")
    with pytest.raises(OpwardenError, match="channels"):  # the Conv prologue's check
        dwn.depthwise_native(x, wt[:8], b[:8], **{**attrs, "group": 8})


def _dw_model(c=32, k=5, stride=2, act="HardSwish") -> bytes:
    rng = np.random.default_rng(11)
    w1 = (rng.standard_normal((c, 4, 1, 1)) * 0.5).astype(np.float32)
    w2 = (rng.standard_normal((c, 1, k, k)) * 0.3).astype(np.float32)
    b2 = rng.standard_normal(c).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"]),
        helper.make_node("Conv", ["a", "w2", "b2"], ["b"], group=c, kernel_shape=[k, k],
                         strides=[stride, stride], pads=[k // 2] * 4),
        helper.make_node(act, ["b"], ["y"]),
    ]
    g = helper.make_graph(
        nodes, "dw", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 20, 20])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"),
         numpy_helper.from_array(b2, "b2")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


@needs_native
@pytest.mark.parametrize("batch", [1, 3])
def test_session_places_native_depthwise_and_agrees_with_ort(batch):
    ort = pytest.importorskip("onnxruntime")
    data = _dw_model()
    x = np.random.default_rng(batch).standard_normal((batch, 4, 20, 20)).astype(np.float32)
    sess = ow.InferenceSession(data, ow.SessionOptions(intra_op_num_threads=2))
    got = sess.run(None, {"x": x})[0]
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    _close(got, want)
    assert "fusedconv.cpu.depthwise_native" in [n["variant"] for n in sess.explain()]


def test_when_declines_without_native_or_its_activation(monkeypatch):
    x, wt, _b, attrs = _case(GEOMS[0])
    from opwarden.contract import TensorFact

    fx = TensorFact("float32", x.shape)
    fw = TensorFact("float32", wt.shape)
    if not DISABLED:
        assert dwn.dw_native_when(fx, fw, **attrs)
        assert not dwn.dw_native_when(fx, fw, activation="Softplus", **attrs)
    monkeypatch.setattr(native, "available", lambda: False)
    assert not dwn.dw_native_when(fx, fw, **attrs)



# -- SiLU (Sigmoid then Mul as exported; Swish-24) on the compiled loop ------------------------

SILU = "t0=sigmoid(x0);t1=mul(x0,t0)"


def _silu_ref(x, alpha=1.0):
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):  # (-inf / inf: NaN, as the op's)
        return (x64 / (1.0 + np.exp(-alpha * x64))).astype(np.float32)


@needs_native
@pytest.mark.parametrize("n", [1, 7, 16, 1000, 70_001])
def test_native_silu_matches_reference(n):
    from opwarden.kernels.cpu import silu_native
    from opwarden.ops.fused_elementwise import FusedElementwise

    x = (np.random.default_rng(n).standard_normal(n) * 30).astype(np.float32)
    x[:3] = [np.nan, np.inf, -np.inf][: min(3, n)]
    got = silu_native.native_silu(x, program=SILU)
    want = FusedElementwise(x, program=SILU)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-30, equal_nan=True)
    _close(got, _silu_ref(x))
    y = x.copy()  # in place, as the plan may put it
    silu_native.native_silu(y, program=SILU, out=y)
    np.testing.assert_array_equal(y, got)
    # both operand orders of the Mul; other programs and strided inputs: the NumPy kernel
    np.testing.assert_array_equal(
        silu_native.native_silu(x, program="t0=sigmoid(x0);t1=mul(t0,x0)"), got)
    x2 = np.stack([x, x], axis=1)[:, 0]
    np.testing.assert_allclose(silu_native.native_silu(x2, program=SILU), want, rtol=1e-6,
                               atol=1e-30, equal_nan=True)
    relu = silu_native.native_silu(x, program="t0=relu(x0)")
    np.testing.assert_array_equal(relu, FusedElementwise(x, program="t0=relu(x0)"))


@needs_native
@pytest.mark.parametrize("alpha", [1.0, 0.5, 1.702, -2.0])
def test_native_swish_alpha(alpha):
    from opwarden.kernels.cpu import silu_native

    x = (np.random.default_rng(2).standard_normal((3, 50, 7)) * 20).astype(np.float32)
    _close(silu_native.native_swish(x, alpha=alpha), _silu_ref(x, alpha))
    _close(silu_native.native_swish(x.transpose(2, 0, 1), alpha=alpha),
           _silu_ref(x, alpha).transpose(2, 0, 1))


@needs_native
def test_swish_bad_calls():
    x = np.zeros(8, np.float32)
    with pytest.raises(KernelError, match="values"):
        native.swish(x, np.zeros(4, np.float32))
    with pytest.raises(KernelError, match="span"):
        native.swish(x, x, 1.0, (2, 99))
    with pytest.raises(KernelError, match="float32"):
        native.swish(x.astype(np.float64), x)


@needs_native
def test_session_runs_exported_silu_natively_and_agrees_with_ort():
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(5)
    # (On a graph input: after a Conv the SiLU is the FusedConv's epilogue instead, see
    # tests/kernels/test_conv_swish.py.)
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]),
             helper.make_node("Mul", ["x", "s"], ["y"])]
    g = helper.make_graph(
        nodes, "silu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 24, 30, 30])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    data = m.SerializeToString()
    x = (rng.standard_normal((2, 24, 30, 30)) * 4).astype(np.float32)
    sess = ow.InferenceSession(data, ow.SessionOptions(intra_op_num_threads=2))
    assert "fusedelementwise.cpu.native_silu" in [n["variant"] for n in sess.explain()]
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    _close(sess.run(None, {"x": x})[0], want)


@needs_native
@pytest.mark.parametrize("geom", GEOMS[:6])
@pytest.mark.parametrize("activation,params", [("", []), ("Relu", []), ("Gelu", [0.0])])
def test_depthwise_native_nchw_matches_reference(geom, activation, params):
    x, wt, b, attrs = _case(geom, seed=9, n=2)
    xc = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    want = FusedConv(xc, wt, b, activation=activation, activation_params=params, **attrs)
    got = dwn.depthwise_native_nchw(xc, wt, b, activation=activation, activation_params=params,
                                    **attrs)
    _close(got, np.asarray(want, np.float32))
    with pytest.raises(KernelError, match="residual"):
        dwn.depthwise_native_nchw(xc, wt, b, np.zeros_like(got), **attrs)
