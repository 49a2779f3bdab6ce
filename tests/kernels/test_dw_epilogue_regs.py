"""The compiled depthwise convolution's epilogue applied in registers (native/depthwise.c's
dw_vact: None, Relu, Clip, LeakyRelu, HardSwish on the 4-pixel x 16-channel blocks) against
the reference FusedConv, on images wide enough that most pixels take the block path, with
NaN, +-inf and values on the activations' kinks inside it; and the same model on
onnxruntime."""

from __future__ import annotations

import os

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import opwarden as ow
from opwarden import native
from opwarden.kernels.cpu import conv_dw_native as dwn
from opwarden.ops.fused import FusedConv

needs_native = pytest.mark.skipif(os.environ.get("OPWARDEN_NATIVE", "1") == "0"
                                  or not native.available(), reason="compiled path off")

ACTS = [("", []), ("Relu", []), ("Clip", [0.0, 6.0]), ("Clip", [-0.5, 0.25]),
        ("LeakyRelu", [0.1]), ("LeakyRelu", [2.0]), ("HardSwish", [])]


def _reference(x, wt, b, activation, params, **attrs):
    y = FusedConv(x.transpose(0, 3, 1, 2), wt, b, None, activation=activation,
                  activation_params=list(params), **attrs)
    return np.asarray(y, np.float32).transpose(0, 2, 3, 1)


@needs_native
@pytest.mark.parametrize("activation,params", ACTS)
@pytest.mark.parametrize("c,k,s", [(32, 3, 1), (48, 5, 2), (24, 3, 1)])
def test_block_epilogue_matches_reference(activation, params, c, k, s):
    rng = np.random.default_rng(c + k)
    x = rng.standard_normal((2, 17, 23, c), dtype=np.float32) * 4
    x[0, 5, 9, 3] = np.nan
    x[1, 8, 12, 17 % c] = np.inf
    x[1, 2, 14, 5] = -np.inf
    wt = rng.standard_normal((c, 1, k, k), dtype=np.float32)
    b = rng.standard_normal(c, dtype=np.float32)
    # a 1x1-centre-only filter for a few channels puts exact kink values (-3, 0, 3, 6, the
    # Clip bounds) through the epilogue
    wt[:4] = 0
    wt[:4, 0, k // 2, k // 2] = 1
    b[:4] = 0
    x[:, :, :, 0] = rng.choice(np.float32([-3, 0, 3, 6, -0.5, 0.25]), size=x.shape[:3])
    attrs = dict(group=c, kernel_shape=[k, k], strides=[s, s], dilations=[1, 1],
                 pads=[k // 2] * 4)
    want = _reference(x, wt, b, activation, params, **attrs)
    got = dwn.depthwise_native(x, wt, b, activation=activation, activation_params=params,
                               **attrs)
    assert np.array_equal(np.isnan(got), np.isnan(want)), activation
    fin = np.isfinite(want)
    assert np.array_equal(got[~fin & ~np.isnan(want)], want[~fin & ~np.isnan(want)])
    scale = max(1.0, float(np.abs(want[fin]).max()))
    np.testing.assert_allclose(got[fin], want[fin], rtol=0, atol=2e-5 * scale)


def _hardswish_dw_model(c=40) -> bytes:
    rng = np.random.default_rng(7)
    w = numpy_helper.from_array(rng.standard_normal((c, 1, 3, 3)).astype(np.float32), "w")
    bias = numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["t"], group=c, pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["t"], ["y"])]
    g = helper.make_graph(nodes, "dw_hs",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                         [1, c, 20, 20])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [w, bias])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)]).SerializeToString()


def test_session_hardswish_depthwise_agrees_with_ort():
    ort = pytest.importorskip("onnxruntime")
    model = _hardswish_dw_model()
    x = np.random.default_rng(8).standard_normal((1, 40, 20, 20), dtype=np.float32) * 3
    got = ow.InferenceSession(model).run(None, {"x": x})[0]
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None,
                                                                               {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


# The sliding-window blocks (dw_block_s1: kw 3, 5, 7, 8 pixels x 8 channels): wide
# rows so most pixels take them, channel counts with tails past the last 8, pads on each side.
# (h, w, c, k, pads, stride); stride 2 takes them where c is not a multiple of 16.
S1_GEOMS = [(5, 30, 8, 3, (1, 1, 1, 1), 1), (6, 33, 12, 5, (2, 2, 2, 2), 1),
            (9, 40, 72, 7, (3, 3, 3, 3), 1), (4, 27, 100, 3, (0, 1, 0, 2), 1),
            (7, 19, 24, 7, (3, 0, 3, 1), 1), (6, 16, 16, 5, (0, 0, 0, 0), 1),
            (7, 41, 40, 3, (1, 1, 1, 1), 2), (9, 50, 72, 5, (2, 2, 2, 2), 2),
            (6, 37, 24, 3, (0, 0, 1, 1), 2), (5, 45, 8, 5, (2, 1, 2, 2), 2)]


@needs_native
@pytest.mark.parametrize("h,w,c,k,pads,stride", S1_GEOMS)
@pytest.mark.parametrize("activation,params", [("", []), ("HardSwish", []), ("Sigmoid", [])])
def test_sliding_blocks_match_reference(h, w, c, k, pads, stride, activation, params):
    rng = np.random.default_rng(h * w + c)
    x = rng.standard_normal((2, h, w, c), dtype=np.float32)
    x[1, h // 2, w // 2, c - 1] = np.nan
    wt = rng.standard_normal((c, 1, k, k), dtype=np.float32)
    b = rng.standard_normal(c, dtype=np.float32)
    attrs = dict(group=c, kernel_shape=[k, k], strides=[stride, stride], dilations=[1, 1],
                 pads=pads)
    want = _reference(x, wt, b, activation, params, **attrs)
    got = dwn.depthwise_native(x, wt, b, activation=activation, activation_params=params,
                               **attrs)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    fin = ~np.isnan(want)
    scale = max(1.0, float(np.abs(want[fin]).max()))
    np.testing.assert_allclose(got[fin], want[fin], rtol=0, atol=2e-5 * scale)
    # with a residual, also written over it in place (FusedConv's alias)
    z = rng.standard_normal(want.shape, dtype=np.float32)
    zc = z.transpose(0, 3, 1, 2)
    want_z = np.asarray(FusedConv(x.transpose(0, 3, 1, 2), wt, b, zc, activation=activation,
                                  activation_params=list(params), **attrs),
                        np.float32).transpose(0, 2, 3, 1)
    y = z.copy()
    dwn.depthwise_native(x, wt, b, y, activation=activation, activation_params=params,
                         out=y, **attrs)
    fin = ~np.isnan(want_z)
    assert np.array_equal(np.isnan(y), np.isnan(want_z))
    np.testing.assert_allclose(y[fin], want_z[fin], rtol=0,
                               atol=2e-5 * max(1.0, float(np.abs(want_z[fin]).max())))
