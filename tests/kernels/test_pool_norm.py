"""Fast pooling, BatchNormalization and LRN variants against the reference kernels."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opwarden.errors import KernelError
from opwarden.kernels.cpu import norm as knorm
from opwarden.kernels.cpu import pool as kpool
from opwarden.ops.base import REGISTRY


def nhwc(x):
    return np.ascontiguousarray(np.moveaxis(x, 1, -1))


def nchw(y):
    return np.moveaxis(y, -1, 1)


def ref(op_type, *args, **attrs):
    return REGISTRY.latest(op_type).reference(*args, **attrs)


@st.composite
def pool_case(draw, k=4, dil=2, stride=3, hw=10, n=2, c=5):
    """A 2-D pool: NCHW shape and attributes (kernels up to k, dilations up to dil, ...)."""
    kh, kw = draw(st.integers(1, k)), draw(st.integers(1, k))
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER",
                                     "VALID"]))
    # Pads smaller than the kernel, as ONNX Runtime requires (else windows lie wholly outside).
    pads = None
    if auto_pad == "NOTSET":
        pads = [draw(st.integers(0, kh - 1)), draw(st.integers(0, kw - 1)),
                draw(st.integers(0, kh - 1)), draw(st.integers(0, kw - 1))]
    dh, dw = draw(st.integers(1, dil)), draw(st.integers(1, dil))
    attrs = dict(kernel_shape=[kh, kw],
                 strides=[draw(st.integers(1, stride)), draw(st.integers(1, stride))],
                 dilations=[dh, dw], auto_pad=auto_pad, pads=pads,
                 ceil_mode=draw(st.integers(0, 1)))
    h = draw(st.integers((kh - 1) * dh + 1, hw))
    w = draw(st.integers((kw - 1) * dw + 1, hw))
    shape = (draw(st.integers(1, n)), draw(st.integers(1, c)), h, w)
    return shape, attrs


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(pool_case(), st.integers(0, 1))
def test_pools_nhwc_match_reference(case, include_pad):
    shape, attrs = case
    x = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
    want = ref("MaxPool", x, **attrs)
    out = np.full(nhwc(want).shape, np.nan, np.float32)
    got = kpool.maxpool_nhwc(nhwc(x), **attrs, out=out)
    assert got is out
    np.testing.assert_array_equal(nchw(got), want)
    want = ref("AveragePool", x, count_include_pad=include_pad, **attrs)
    got = kpool.averagepool_nhwc(nhwc(x), count_include_pad=include_pad, **attrs)
    np.testing.assert_allclose(nchw(got), want, rtol=1e-5, atol=1e-6)


def test_maxpool_nhwc_with_indices_uses_reference():
    x = np.random.default_rng(1).standard_normal((1, 3, 6, 6), dtype=np.float32)
    y, idx = ref("MaxPool", x, kernel_shape=[2, 2], strides=[2, 2], noutputs=2)
    gy, gidx = kpool.maxpool_nhwc(nhwc(x), kernel_shape=[2, 2], strides=[2, 2], noutputs=2)
    np.testing.assert_array_equal(nchw(gy), y)
    np.testing.assert_array_equal(gidx, idx)  # Indices keep their ONNX (NCHW) layout


def test_global_pools_match_reference():
    rng = np.random.default_rng(2)
    for shape in [(1, 7, 5, 5), (2, 3, 1, 9), (2, 4, 7)]:
        x = rng.standard_normal(shape, dtype=np.float32)
        for op_type, fnc, fnh in (("GlobalAveragePool", kpool.global_avg_nchw,
                                   kpool.global_avg_nhwc),
                                  ("GlobalMaxPool", kpool.global_max_nchw,
                                   kpool.global_max_nhwc)):
            want = ref(op_type, x)
            np.testing.assert_allclose(fnc(x), want, rtol=1e-5, atol=1e-6)
            if x.ndim == 4:
                np.testing.assert_allclose(nchw(fnh(nhwc(x))), want, rtol=1e-5, atol=1e-6)


def test_batchnorm_matches_reference_in_both_layouts():
    rng = np.random.default_rng(3)
    for shape in [(2, 5, 4, 3), (3, 5), (1, 5, 6)]:
        x = rng.standard_normal(shape, dtype=np.float32)
        s, b, m = (rng.standard_normal(5, dtype=np.float32) for _ in range(3))
        v = rng.uniform(0.5, 2, 5).astype(np.float32)
        for opdef in REGISTRY.versions("BatchNormalization"):
            want = opdef.reference(x, s, b, m, v, epsilon=1e-3)
            out = np.empty_like(x)
            got = knorm.batchnorm_nchw(x, s, b, m, v, epsilon=1e-3, out=out)
            assert got is out
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
            if x.ndim == 4:
                got = knorm.batchnorm_nhwc(nhwc(x), s, b, m, v, epsilon=1e-3)
                np.testing.assert_allclose(nchw(got), want, rtol=1e-5, atol=1e-5)


def test_batchnorm_training_falls_back_to_reference():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, 4, 4), dtype=np.float32)
    p = [rng.uniform(0.5, 1.5, 3).astype(np.float32) for _ in range(4)]
    want = ref("BatchNormalization", x, *p, training_mode=1, momentum=0.9)
    got = knorm.batchnorm_nchw(x, *p, training_mode=1, momentum=0.9)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    got = knorm.batchnorm_nhwc(nhwc(x), *p, training_mode=1, momentum=0.9)
    np.testing.assert_allclose(nchw(got[0]), want[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("beta", [0.75, 0.5, 1.0, 0.6, 0.0])
@pytest.mark.parametrize("shape", [(2, 7, 3, 4), (1, 96, 40, 30), (2, 5, 3000), (1, 3, 2, 2, 2)])
def test_lrn_matches_reference(beta, shape):
    """Every size (up to beyond C), the betas with their own root forms and pow, shapes of
    several blocks either layout (channels-first: rank 3 and 5 too), a NaN staying in its
    window, into the planned buffer."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    x.reshape(-1)[x.size // 2] = np.nan
    for size in (1, 2, 3, 5, 9):
        attrs = dict(alpha=1e-2, beta=beta, bias=2.0, size=size)
        want = ref("LRN", x, **attrs)
        got = knorm.lrn_nchw(x, **attrs)
        assert np.array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        if x.ndim == 4:
            xl = nhwc(x)
            out = np.empty_like(xl)
            assert knorm.lrn_nhwc(xl, out=out, **attrs) is out
            np.testing.assert_allclose(nchw(out), want, rtol=1e-5, atol=1e-6)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 3), c=st.integers(1, 5),
    spatial=st.lists(st.integers(1, 40), min_size=1, max_size=3),
    eps=st.sampled_from([1e-5, 1e-2, 0.0]),
)
def test_instancenorm_matches_reference(n, c, spatial, eps):
    rng = np.random.default_rng(n * 100 + c)
    x = (rng.standard_normal((n, c, *spatial)) * 3 + 1).astype(np.float32)
    scale = rng.standard_normal(c).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    with np.errstate(invalid="ignore", divide="ignore"):  # (eps 0 on a constant row: 0/0)
        want = ref("InstanceNormalization", x, scale, b, epsilon=eps)
    out = np.empty_like(x)
    got = knorm.instancenorm(x, scale, b, epsilon=eps, out=out)
    assert got is out
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_instancenorm_rows_longer_than_a_block_nan_and_errors():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 300, 400)).astype(np.float32)  # rows of 120000 floats
    x[1, 2, 5, 5] = np.nan
    scale, b = np.ones(3, np.float32) * 2, np.arange(3, dtype=np.float32)
    want = ref("InstanceNormalization", x, scale, b)
    got = knorm.instancenorm(x, scale, b)
    assert np.array_equal(np.isnan(got), np.isnan(want))  # the NaN row only
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    with pytest.raises(KernelError, match=r"scale has shape \(2,\), expected \(3,\)"):
        knorm.instancenorm(x, scale[:2], b)
    with pytest.raises(KernelError, match="rank >= 3"):
        knorm.instancenorm(x[0, 0], scale, b)
    empty = np.zeros((1, 3, 0, 4), np.float32)
    assert knorm.instancenorm(empty, scale, b).shape == empty.shape


@pytest.mark.parametrize("shape", [(1, 112, 112, 8), (3, 7, 7, 40), (2, 1, 3, 5), (1, 1, 1, 4)])
def test_global_avg_nhwc_blas_sum_matches_float64_mean(shape):
    """The BLAS-summed mean into a buffer holding NaN (an arena's old contents) equals the
    float64 mean within float32 rounding; NaN and Inf inputs propagate per channel."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    out = np.full((shape[0], 1, 1, shape[3]), np.nan, np.float32)
    assert kpool.global_avg_nhwc(x, out=out) is out
    want = x.astype(np.float64).mean(axis=(1, 2), keepdims=True)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    x[0, 0, 0, 0], x[-1, -1, -1, -1] = np.nan, np.inf
    y = kpool.global_avg_nhwc(x)
    assert np.isnan(y[0, 0, 0, 0]) and np.isposinf(y[-1, 0, 0, -1])
    assert np.isfinite(y[0, 0, 0, 1:-1]).all()
