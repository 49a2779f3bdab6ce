"""The compiled LayerNormalization rows (native.layernorm, native/layernorm.c, taken by
norm.layernorm where the extension loads): Y, Mean and InvStdDev against float64 and the NumPy
rows (whose float32 sums are the less accurate), rows with an offset, constant, NaN and
infinite rows, without scale or bias, in place, row spans and threads bit for bit, bad calls
refused; sessions against onnxruntime on either path."""

from __future__ import annotations

import os

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import opwarden as ow
from opwarden import native
from opwarden.errors import OpwardenError
from opwarden.kernels.cpu import blas_split, norm

DISABLED = os.environ.get("OPWARDEN_NATIVE", "1") == "0" or not native.available()
needs_native = pytest.mark.skipif(DISABLED, reason="compiled path off")


def _data(rows, cols, seed=0, offset=0.0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, cols)) * 3 + offset).astype(np.float32)
    return x, rng.standard_normal(cols).astype(np.float32), \
        rng.standard_normal(cols).astype(np.float32)


def _exact(x, scale, bias, eps):
    d = x.astype(np.float64)
    m = d.mean(axis=1, keepdims=True)
    inv = 1 / np.sqrt(((d - m) ** 2).mean(axis=1, keepdims=True) + eps)
    y = (d - m) * inv
    if scale is not None:
        y = y * scale
    if bias is not None:
        y = y + bias
    return y, m[:, 0], inv[:, 0]


def _native(x, scale, bias, eps, **kw):
    y = np.empty_like(x)
    mean = np.empty(x.shape[0], np.float32)
    inv = np.empty(x.shape[0], np.float32)
    native.layernorm(x, y, scale, bias, eps, mean, inv, **kw)
    return y, mean, inv


def _numpy_rows(x, scale, bias, eps):
    y = np.empty_like(x)
    mean = np.empty(x.shape[0], np.float32)
    inv = np.empty(x.shape[0], np.float32)
    norm._normalize_rows(x, y, eps, mean, inv, scale, bias)
    return y, mean, inv


def _err(got, want, scale=1.0):
    """max |got - want| over the finite entries, relative to the row's scale of values."""
    ok = np.isfinite(want)
    return float(np.max(np.abs(np.asarray(got, np.float64)[ok] - want[ok]), initial=0)) / scale


@needs_native
@pytest.mark.parametrize("rows,cols", [(1, 1), (3, 7), (50, 96), (7, 768), (4, 3000)])
@pytest.mark.parametrize("offset", [0.0, 1e3])
@pytest.mark.parametrize("affine", ["both", "scale", "bias", "none"])
def test_against_float64_and_numpy_rows(rows, cols, offset, affine):
    x, s, b = _data(rows, cols, rows + cols, offset)
    s = s if affine in ("both", "scale") else None
    b = b if affine in ("both", "bias") else None
    eps = 1e-5
    y, m, inv = _native(x, s, b, eps)
    ey, em, einv = _exact(x, s, b, eps)
    ny, nm, ninv = _numpy_rows(x, s, b, eps)
    eps32 = np.finfo(np.float32).eps
    # the mean correctly rounded (double sums), 1/std within two ulps
    assert np.max(np.abs(m - em) / np.spacing(np.abs(em).astype(np.float32))) <= 0.51
    assert np.max(np.abs(inv - einv) / np.spacing(einv.astype(np.float32))) <= 2
    # y (|y| a few units): the float32 steps' rounding (measured <= 13.4 eps at offset 0); at
    # offset 1e3 the float32 x and mean themselves are 3e-5 apart from float64's (measured
    # 320 eps; the NumPy rows 2000)
    assert _err(y, ey) <= (16 if offset == 0 else 400) * eps32
    # the NumPy rows' float32 sums are the less accurate ones
    assert _err(y, ey) <= _err(ny, ey) + 8 * eps32
    nm_ulps = np.max(np.abs(nm - em) / np.spacing(np.abs(em).astype(np.float32)))
    assert np.max(np.abs(m - em) / np.spacing(np.abs(em).astype(np.float32))) <= nm_ulps + 0.01


@needs_native
def test_special_rows():
    x, s, b = _data(6, 64, 3)
    x[1, 5] = np.nan
    x[2, 9] = np.inf
    x[3] = 2.5  # constant: y = bias (variance 0, inv = 1/sqrt(eps))
    x[4, :] = 0.0
    x[5] = np.float32(1e30) * np.sign(x[5])  # variance 1e60: inf in float32, as the NumPy rows
    y, m, inv = _native(x, s, b, 1e-5)
    ny, nm, ninv = _numpy_rows(x, s, b, 1e-5)
    assert np.isnan(y[1]).all() and np.isnan(m[1]) and np.isnan(inv[1])
    assert np.isnan(y[2]).all() and np.isnan(inv[2])
    assert np.array_equal(y[3], b) and np.array_equal(y[4], b)
    assert inv[3] == ninv[3] and m[3] == 2.5
    assert inv[5] == ninv[5] == 0 and np.array_equal(y[5], ny[5])
    np.testing.assert_array_equal(y[:1], _native(x[:1], s, b, 1e-5)[0])


@needs_native
def test_in_place_spans_and_threads():
    x, s, b = _data(700, 384, 5)
    y, m, inv = _native(x, s, b, 1e-6)
    for t in (2, 3):
        y2, m2, inv2 = _native(x, s, b, 1e-6, n_threads=t)
        assert np.array_equal(y, y2) and np.array_equal(m, m2) and np.array_equal(inv, inv2)
    z = x.copy()
    mz, iz = np.empty(700, np.float32), np.empty(700, np.float32)
    assert native.layernorm(z, z, s, b, 1e-6, mz, iz) is z
    assert np.array_equal(z, y) and np.array_equal(mz, m)
    part = np.full_like(x, 7.0)
    mp, ip = np.zeros(700, np.float32), np.zeros(700, np.float32)
    for r0, r1 in ((0, 13), (13, 400), (400, 700)):
        native.layernorm(x, part, s, b, 1e-6, mp, ip, rows=(r0, r1))
    assert np.array_equal(part, y) and np.array_equal(mp, m) and np.array_equal(ip, inv)
    only = np.full_like(x, 7.0)
    native.layernorm(x, only, s, b, 1e-6, mp, ip, rows=(10, 20))
    assert (only[:10] == 7).all() and (only[20:] == 7).all()
    assert np.array_equal(only[10:20], y[10:20])


@needs_native
def test_layernorm_kernel_threads_and_split(monkeypatch):
    x = _data(2, 50 * 384, 6)[0].reshape(2, 50, 384)
    s, b = _data(1, 384, 7)[1:]
    want = _native(x.reshape(100, 384), s, b, 1e-5)
    seen = []
    real = native.layernorm
    monkeypatch.setattr(norm.native, "layernorm",
                        lambda *a, **k: seen.append((a[7:], k)) or real(*a, **k))
    monkeypatch.setattr(blas_split, "split_threads", lambda: 1)
    monkeypatch.setattr(blas_split, "blas_thread_count", lambda: 2)
    y, m, inv = norm.layernorm(x, s, b, axis=-1, epsilon=1e-5)
    assert seen == [(((0, 100),), {"n_threads": 2})]
    assert np.array_equal(y.reshape(100, 384), want[0])
    assert np.array_equal(m.reshape(-1), want[1]) and m.shape == (2, 50, 1)
    calls = []

    def over_rows(rows, mnk, fn):
        calls.append(rows)
        fn(0, 31)
        fn(31, rows)

    monkeypatch.setattr(blas_split, "split_threads", lambda: 2)
    monkeypatch.setattr(blas_split, "over_rows", over_rows)
    y, m, inv = norm.layernorm(x, s, b, axis=-1, epsilon=1e-5)
    assert calls == [100] and np.array_equal(y.reshape(100, 384), want[0])
    # a y that overlaps x without being x: the NumPy rows
    seen.clear()
    assert not norm._native_rows(x.reshape(100, 384)[1:], x.reshape(100, 384)[:-1], 1e-5,
                                 np.empty(99, np.float32), np.empty(99, np.float32), s, b)
    assert not seen


@needs_native
def test_bad_calls_raise():
    x, s, b = _data(4, 8)
    mean, inv = np.empty(4, np.float32), np.empty(4, np.float32)
    with pytest.raises(OpwardenError, match="float32"):
        native.layernorm(x.astype(np.float64), np.empty((4, 8)), None, None, 1e-5, mean, inv)
    with pytest.raises(OpwardenError, match="scale"):
        native.layernorm(x, np.empty_like(x), s[:3], None, 1e-5, mean, inv)
    with pytest.raises(OpwardenError, match="mean"):
        native.layernorm(x, np.empty_like(x), s, b, 1e-5, mean[:2], inv)
    with pytest.raises(OpwardenError, match="overlaps"):
        native.layernorm(x[1:], x[:-1], None, None, 1e-5, mean[:3], inv[:3])
    with pytest.raises(OpwardenError, match="rows"):
        native.layernorm(x, np.empty_like(x), s, b, 1e-5, mean, inv, rows=(2, 9))
    with pytest.raises(OpwardenError, match="rows"):
        native.layernorm(x.reshape(-1), np.empty(32, np.float32), None, None, 1e-5, mean, inv)


def _ln_model(shape, axis, with_bias=True):
    rng = np.random.default_rng(8)
    tail = shape[axis:]
    inits = [numpy_helper.from_array(rng.standard_normal(tail).astype(np.float32), "s")]
    ins = ["x", "s"]
    if with_bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(tail).astype(np.float32), "b"))
        ins.append("b")
    node = helper.make_node("LayerNormalization", ins, ["y", "m", "i"], axis=axis,
                            epsilon=1e-5)
    g = helper.make_graph(
        [node], "ln", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "m", "i")],
        inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


@pytest.mark.parametrize("shape,axis,with_bias", [((2, 50, 384), -1, True),
                                                  ((3136, 96), 1, True),
                                                  ((2, 4, 6, 10), 2, False)])
def test_session_agrees_with_ort(shape, axis, with_bias):
    ort = pytest.importorskip("onnxruntime")
    data = _ln_model(shape, axis, with_bias)
    x = (np.random.default_rng(9).standard_normal(shape) * 2 + 0.5).astype(np.float32)
    sess = ow.InferenceSession(data)
    got = sess.run(None, {"x": x})
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=2e-5)
    assert "layernormalization.cpu.fast" in [r["variant"] for r in sess.explain()]

