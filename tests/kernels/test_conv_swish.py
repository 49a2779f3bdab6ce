"""FusedConv with the Swish activation (x sigmoid(alpha x); SiLU at alpha 1, what conv_fusion
makes of an exported Sigmoid + Mul) on every CPU variant: each NHWC algorithm (forced by
tests.kernels.test_conv.nhwc_path), the pointwise GEMM, the NumPy and compiled depthwise
kernels (NHWC and NCHW), the NCHW kernel, against the reference; the compiled epilogues
(conv_epilogue, depthwise) against x / (1 + e^(-alpha x)) in float64 with NaN, inf, -0.0 and
large magnitudes; the NumPy chunks where the extension is off; whole sessions on shapes that
take the pointwise, depthwise, im2col, stem, Winograd, shifted, few-pixel and row-tap
variants against the unfused graph and onnxruntime."""

from __future__ import annotations

import os

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import opwarden as ow
from opwarden import native
from opwarden.kernels.cpu import conv_common, util
from opwarden.kernels.cpu import conv_dw_native as dwn
from opwarden.kernels.cpu import fused as kfused
from opwarden.memory.constants import mark as mark_constant
from opwarden.ops.fused import FusedConv
from tests.kernels.test_conv import PATHS, nchw, nhwc, nhwc_path
from tests.kernels.test_conv_epilogue_native import pre_activation

needs_native = pytest.mark.skipif(os.environ.get("OPWARDEN_NATIVE", "1") == "0"
                                  or not native.available(), reason="compiled path off")

ALPHAS = [1.0, 1.702, -0.5]


def _swish64(v, alpha):
    v = np.asarray(v, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        return v / (1.0 + np.exp(-alpha * v))


def _close(got, want, rtol=8e-6):
    """Within rtol of want elementwise (absolute below 1e-30), NaN where want is NaN. (alpha x
    rounded to float32, as the reference rounds it, moves e^(-alpha x) by up to |alpha x|
    2^-24 relative: 5e-6 at the edge of float32's range.)"""
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=rtol, atol=1e-30)


def _specials(y: np.ndarray) -> np.ndarray:
    flat = y.reshape(-1)
    vals = np.float32([np.nan, np.inf, -np.inf, -0.0, 0.0, -100.0, 100.0, -87.0, -89.5,
                       88.9, -1.278, 1e-8])
    flat[: min(flat.size, vals.size)] = vals[: min(flat.size, vals.size)]
    return y


# -- the compiled epilogues ------------------------------------------------------------------


@needs_native
@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("has_bias,has_z", [(1, 1), (1, 0), (0, 1), (0, 0)])
@pytest.mark.parametrize("rows,cols", [(7, 13), (300, 72), (4096, 24)])
def test_conv_epilogue_swish(alpha, has_bias, has_z, rows, cols):
    rng = np.random.default_rng(rows + cols)
    y = _specials((rng.standard_normal((rows, cols)) * 8).astype(np.float32))
    b = rng.standard_normal(cols).astype(np.float32) if has_bias else None
    z = rng.standard_normal((rows, cols)).astype(np.float32) if has_z else None
    want = _swish64(pre_activation(y, b, z), alpha)
    for threads in (1, 2):
        got = native.conv_epilogue(y.copy(), b, z, "Swish", [alpha], threads)
        _close(got, want)
    # the epilogue the conv paths call takes it (no NumPy fallback)
    yy = y.copy()
    assert conv_common._native_epilogue(yy, b, z, "Swish", [alpha])
    _close(yy, want)


@needs_native
def test_epilogue_tables_hold_swish_with_default_alpha():
    assert native.epilogue_act_code("Swish", []) == (native.EPILOGUE_ACTS["Swish"], 1.0, 0.0)
    assert native.dw_act_code("Swish", [1.702])[1] == pytest.approx(1.702)
    x = np.ones((2, 8, 8, 16), np.float32)
    w = np.ones((16, 1, 3, 3), np.float32)
    assert dwn.dw_native_when(x, w, group=16, activation="Swish", activation_params=[1.0]) \
        or not native.available()


@needs_native
@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("c", [16, 24, 37])  # whole register blocks, a half block, a tail
@pytest.mark.parametrize("stride", [1, 2])
def test_native_depthwise_swish(alpha, c, stride):
    rng = np.random.default_rng(c * stride)
    x = (rng.standard_normal((2, 11, 13, c)) * 4).astype(np.float32)
    taps = rng.standard_normal((3, 3, c)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    oh, ow_ = (11 + 2 - 3) // stride + 1, (13 + 2 - 3) // stride + 1
    z = _specials(rng.standard_normal((2, oh, ow_, c)).astype(np.float32) * 30)
    plain = np.empty((2, oh, ow_, c), np.float32)
    native.depthwise_nhwc(x, taps, b, z, plain, (stride, stride), (1, 1), (1, 1))
    for threads in (1, 2):
        got = np.empty_like(plain)
        native.depthwise_nhwc(x, taps, b, z, got, (stride, stride), (1, 1), (1, 1),
                              "Swish", [alpha], n_threads=threads)
        _close(got, _swish64(plain, alpha))


# -- each variant against the reference ------------------------------------------------------


def _case(n, c, h, w, m, k, group=1, stride=1, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, c, h, w)) * 2).astype(np.float32)
    wt = (rng.standard_normal((m, c // group, k, k)) / np.sqrt(c // group * k * k)) \
        .astype(np.float32)
    mark_constant(wt)  # an initializer: Winograd only packs constant weights
    b = rng.standard_normal(m).astype(np.float32)
    attrs = dict(group=group, strides=[stride, stride], pads=[k // 2] * 4,
                 kernel_shape=[k, k])
    return x, wt, b, attrs


CASES = [(1, 16, 7, 7, 24, 1), (2, 6, 9, 9, 8, 3), (1, 3, 16, 16, 8, 3, 1, 2),
         (1, 24, 9, 9, 24, 3, 24, 2), (1, 8, 6, 6, 8, 5)]


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("alpha", [1.0, 1.702])
@pytest.mark.parametrize("residual", [False, True])
def test_every_fused_conv_path_applies_swish(case, alpha, residual):
    x, wt, b, attrs = _case(*case, seed=len(case))
    params = [alpha]
    y0 = FusedConv(x, wt, b, **attrs)
    z = np.random.default_rng(3).standard_normal(y0.shape).astype(np.float32) \
        if residual else None
    ref = FusedConv(x, wt, b, z, activation="Swish", activation_params=params, **attrs)
    # (the reference is x sigmoid(alpha x) of the convolution, not the convolution itself)
    pre = y0 if z is None else y0 + z
    _close(ref, _swish64(pre, alpha), rtol=1e-5)
    zn = None if z is None else nhwc(z)
    for path in [None, *PATHS]:
        if path is None:
            y1 = kfused.fused_conv_nhwc(nhwc(x), wt, b, zn, activation="Swish",
                                        activation_params=params, **attrs)
        else:
            with nhwc_path(path):
                y1 = kfused.fused_conv_nhwc(nhwc(x), wt, b, zn, activation="Swish",
                                            activation_params=params, **attrs)
        np.testing.assert_allclose(nchw(y1), ref, rtol=1e-4, atol=1e-4, err_msg=str(path))
    y2 = kfused.fused_conv_nchw(x, wt, b, z, activation="Swish", activation_params=params,
                                **attrs)
    np.testing.assert_allclose(y2, ref, rtol=1e-4, atol=1e-4)
    if attrs["group"] == x.shape[1] == wt.shape[0] and native.available():
        y3 = dwn.depthwise_native(nhwc(x), wt, b, zn, activation="Swish",
                                  activation_params=params, **attrs)
        np.testing.assert_allclose(nchw(y3), ref, rtol=1e-4, atol=1e-4)
        if z is None:
            y4 = dwn.depthwise_native_nchw(x, wt, b, activation="Swish",
                                           activation_params=params, **attrs)
            np.testing.assert_allclose(y4, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("alpha", ALPHAS)
def test_numpy_chunks_when_the_extension_is_off(monkeypatch, alpha):
    rng = np.random.default_rng(4)
    y = _specials((rng.standard_normal((3, 70_000)) * 10).astype(np.float32))
    want = _swish64(y, alpha)
    monkeypatch.setattr(native, "available", lambda: False)
    got = util.apply_activation(y.copy(), "Swish", [alpha])
    _close(got, want, rtol=1e-5)
    strided = y.copy()[:, ::2]  # not contiguous: the chunks, whatever the extension
    monkeypatch.undo()
    _close(util.apply_activation(strided, "Swish", [alpha]), want[:, ::2], rtol=1e-5)
    assert util.activation_workspace("Swish", [alpha], y.size) > 0


# -- sessions --------------------------------------------------------------------------------

# (N, C, H, W, M, k, group, stride) -> the FusedConv variant placement gives it
SESSION_CASES = [
    ((1, 32, 14, 14, 64, 1, 1, 1), "fusedconv.cpu.pointwise"),
    ((1, 32, 14, 14, 32, 3, 32, 1), "fusedconv.cpu.depthwise_native"),
    ((1, 48, 15, 15, 48, 5, 48, 2), "fusedconv.cpu.depthwise_native"),
    ((1, 3, 32, 32, 16, 3, 1, 2), "fusedconv.cpu.direct"),
    ((1, 3, 32, 32, 12, 3, 1, 2), "fusedconv.cpu.stem"),
    ((1, 16, 15, 15, 16, 3, 1, 2), "fusedconv.cpu.im2col"),
    ((1, 64, 28, 28, 512, 3, 1, 1), "fusedconv.cpu.winograd"),
    ((1, 16, 57, 57, 32, 3, 1, 2), "fusedconv.cpu.shifted_gemm"),
    ((1, 128, 7, 7, 256, 3, 1, 1), "fusedconv.cpu.fewpixel"),
    ((1, 16, 14, 14, 12, 3, 1, 1), "fusedconv.cpu.rowtap"),
]


def _silu_model(n, c, h, w, m, k, group, stride, order) -> tuple[bytes, np.ndarray]:
    rng = np.random.default_rng(c + m + k)
    wt = (rng.standard_normal((m, c // group, k, k)) / np.sqrt(c // group * k * k)) \
        .astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    w2 = (rng.standard_normal((8, m, 1, 1)) / np.sqrt(m)).astype(np.float32)
    mul_in = ["c", "s"] if order == 0 else ["s", "c"]
    # A second (1x1) convolution after it, so that the layout pass runs both in NHWC.
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[k // 2] * 4,
                              strides=[stride, stride], group=group),
             helper.make_node("Sigmoid", ["c"], ["s"]),
             helper.make_node("Mul", mul_in, ["y0"]),
             helper.make_node("Conv", ["y0", "w2"], ["c2"]),
             helper.make_node("Sigmoid", ["c2"], ["s2"]),
             helper.make_node("Mul", ["s2", "c2"], ["y"])]
    g = helper.make_graph(
        nodes, "silu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, h, w])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(wt, "w"), numpy_helper.from_array(b, "b"),
         numpy_helper.from_array(w2, "w2")])
    mp = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    mp.ir_version = 8
    x = (rng.standard_normal((n, c, h, w)) * 2).astype(np.float32)
    return mp.SerializeToString(), x


@pytest.mark.parametrize("case,variant", SESSION_CASES, ids=[v for _, v in SESSION_CASES])
def test_session_fuses_silu_and_agrees_with_unfused_and_ort(case, variant):
    ort = pytest.importorskip("onnxruntime")
    data, x = _silu_model(*case, order=case[1] % 2)
    sess = ow.InferenceSession(data)
    acts = [n.attrs.get("activation") for n in sess.model.graph.nodes
            if n.op_type == "FusedConv"]
    assert acts == ["Swish", "Swish"] and not any(
        n.op_type in ("Sigmoid", "Mul", "FusedElementwise") for n in sess.model.graph.nodes)
    variants = [p["variant"] for p in sess.explain() if "fusedconv" in p["variant"]]
    if native.available() or not any(k in variant for k in ("native", "direct")):
        assert variants[0] == variant, variants
    got = sess.run(None, {"x": x})[0]
    level0 = ow.InferenceSession(data, ow.SessionOptions(optimization_level=0))
    want0 = level0.run(None, {"x": x})[0]
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want0, rtol=1e-4, atol=1e-5 * scale)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * scale)
