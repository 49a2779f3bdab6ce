"""Kernel fast paths that small random cases do not reach by themselves: pointwise convs with
bias/residual written before an accumulating GEMM or computed as a transposed product, raw
BLAS on transposed operands, separable pooling over several row bands, the channel-major stem
patch matrix, and Concat into the planned buffer."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opwarden.errors import KernelError
from opwarden.kernels.cpu import conv_gemm as kconv
from opwarden.kernels.cpu import fused as kfused
from opwarden.kernels.cpu import pool as kpool
from opwarden.kernels.cpu import shape as kshape
from opwarden.kernels.cpu import util as kutil
from opwarden.kernels.cpu.util import matmul_acc, sgemm
from opwarden.ops.base import REGISTRY
from opwarden.ops.fused import FusedConv

from .test_conv import ACTS, _arrays, conv_case, nchw, nhwc


@st.composite
def pointwise_case(draw):
    """conv_case with a 1x1 kernel, unit strides and no padding (the pointwise branch)."""
    case = draw(conv_case())
    case.update(kh=1, kw=1)
    case["attrs"].update(kernel_shape=[1, 1], strides=[1, 1], pads=None, auto_pad="NOTSET",
                         dilations=[1, 1])
    return case


def ref(op_type, *args, **attrs):
    return REGISTRY.latest(op_type).reference(*args, **attrs)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(pointwise_case(), st.sampled_from(ACTS), st.booleans())
def test_pointwise_prefilled_or_transposed_match_reference(case, act, residual):
    x, w, b = _arrays(case, seed=4)
    params = {"Clip": [-0.5, 0.7], "LeakyRelu": [0.2]}.get(act, [])
    z = None
    if residual:
        shape = FusedConv(x, w, b, **case["attrs"]).shape
        z = np.random.default_rng(5).standard_normal(shape, dtype=np.float32)
    want = FusedConv(x, w, b, z, activation=act, activation_params=params, **case["attrs"])
    old = kconv.PREFILL_MIN, kconv.PW_T_MAX_PIXELS
    for prefill_min, pw_t in ((0, 0), (0, 1 << 30)):  # prefilled, or the transposed product
        kconv.PREFILL_MIN, kconv.PW_T_MAX_PIXELS = prefill_min, pw_t
        try:
            got = kfused.fused_conv_nhwc(nhwc(x), w, b, None if z is None else nhwc(z),
                                         activation=act, activation_params=params,
                                         **case["attrs"])
        finally:
            kconv.PREFILL_MIN, kconv.PW_T_MAX_PIXELS = old
        np.testing.assert_allclose(nchw(got), want, rtol=1e-4, atol=1e-4)


def test_large_pointwise_conv_with_residual_matches_reference():
    # Big enough for the prefill path at its real threshold.
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 40, 30, 30), dtype=np.float32)
    w = rng.standard_normal((160, 40, 1, 1), dtype=np.float32)
    b = rng.standard_normal(160, dtype=np.float32)
    z = rng.standard_normal((1, 160, 30, 30), dtype=np.float32)
    assert 160 * 30 * 30 >= kconv.PREFILL_MIN
    want = FusedConv(x, w, b, z, activation="Relu")
    got = kfused.fused_conv_nhwc(nhwc(x), w, b, nhwc(z), activation="Relu")
    np.testing.assert_allclose(nchw(got), want, rtol=1e-4, atol=1e-4)


def _specials(a: np.ndarray, rng) -> np.ndarray:
    """a with NaN, +-Inf and -0.0 sprinkled in (each ~1%)."""
    a = a.copy()
    flat = a.reshape(-1)
    for v in (np.nan, np.inf, -np.inf, -0.0):
        flat[rng.integers(0, flat.size, flat.size // 100 + 1)] = v
    return a


@pytest.mark.skipif(not kutil.blas_adds(), reason="NumPy's OpenBLAS axpy/ger not found")
@pytest.mark.parametrize("rows,m", [(3136, 64), (200, 300), (7, 10)])  # BLAS, BLAS, NumPy
@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
def test_blas_adds_equal_numpy_bit_for_bit(rows, m):
    rng = np.random.default_rng(12)
    y0 = _specials(rng.standard_normal((rows, m), dtype=np.float32), rng)
    v = _specials(rng.standard_normal(m, dtype=np.float32), rng)
    z = _specials(rng.standard_normal((rows, m), dtype=np.float32), rng)
    y = y0.copy()
    kutil.add_rows(y, v)
    np.testing.assert_array_equal(y, y0 + v)  # (NaN positions compared as equal)
    assert np.array_equal(np.signbit(y), np.signbit(y0 + v))
    y = y0.copy()
    kutil.add_into(y, z)
    np.testing.assert_array_equal(y, y0 + z)
    y = y0.copy()
    kutil.add_into(y, y)  # the same array twice: 2y, as NumPy's y += y
    np.testing.assert_array_equal(y, y0 + y0)


@pytest.mark.skipif(not kutil.blas_adds(), reason="NumPy's OpenBLAS axpy/ger not found")
def test_blas_adds_on_views_leave_neighbours_alone():
    rng = np.random.default_rng(13)
    wide = rng.standard_normal((2, 300, 260), dtype=np.float32)
    before = wide.copy()
    y = wide[:, :, 3:203]  # rows of 200 inside rows of 260: an NHWC band of a wider buffer
    v = rng.standard_normal(200, dtype=np.float32)
    kutil.add_rows(y, v)
    np.testing.assert_array_equal(y, before[:, :, 3:203] + v)
    np.testing.assert_array_equal(wide[:, :, :3], before[:, :, :3])
    np.testing.assert_array_equal(wide[:, :, 203:], before[:, :, 203:])
    # A strided bias, and a y whose rows are not unit-stride (NumPy's add).
    big_v = rng.standard_normal(600, dtype=np.float32)
    y = before[0].copy()
    kutil.add_rows(y, big_v[::2][:260])
    np.testing.assert_array_equal(y, before[0] + big_v[::2][:260])
    t = before[1].T.copy().T  # column-major
    kutil.add_rows(t, big_v[:260])
    np.testing.assert_array_equal(t, before[1] + big_v[:260])
    # An overlapping residual (shifted by one row): NumPy's add, which buffers the overlap.
    buf = rng.standard_normal((600, 260), dtype=np.float32)
    want = buf[1:].copy() + buf[:-1]
    kutil.add_into(buf[1:], buf[:-1])
    np.testing.assert_array_equal(buf[1:], want)


@pytest.mark.skipif(not kutil.blas_adds(), reason="NumPy's OpenBLAS axpy/ger not found")
@pytest.mark.parametrize("k,c,m,hw", [(1, 64, 160, 40), (3, 48, 128, 36), (3, 64, 192, 28)])
@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
def test_hot_gemm_epilogue_matches_reference_with_specials(k, c, m, hw):
    """Convolutions big enough for the threaded bias and residual adds after their GEMMs (the
    pointwise, row-tap and Winograd paths), NaN and Inf in the residual: as the reference, and
    as with NumPy's adds."""
    rng = np.random.default_rng(14)
    x = rng.standard_normal((1, c, hw, hw), dtype=np.float32)
    w = rng.standard_normal((m, c, k, k), dtype=np.float32)
    b = rng.standard_normal(m, dtype=np.float32)
    attrs = dict(kernel_shape=[k, k], pads=[k // 2] * 4)
    z = _specials(rng.standard_normal((1, m, hw, hw), dtype=np.float32), rng)
    assert m * hw * hw >= kutil.BLAS_AXPY_MIN
    want = FusedConv(x, w, b, z, activation="Relu", **attrs)
    got = {}
    for on in (True, False):
        kutil.BLAS_ADDS = on
        try:
            got[on] = nchw(kfused.fused_conv_nhwc(nhwc(x), w, b, nhwc(z), activation="Relu",
                                                  **attrs))
        finally:
            kutil.BLAS_ADDS = True
        np.testing.assert_allclose(got[on], want, rtol=1e-4, atol=1e-3 * k * k)
    np.testing.assert_allclose(got[True], got[False], rtol=1e-5, atol=1e-4)


@pytest.mark.skipif(sgemm() is None, reason="NumPy's OpenBLAS ILP64 interface not found")
@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("acc", [False, True])
def test_matmul_acc_on_transposed_operands(ta, tb, acc):
    rng = np.random.default_rng(7)
    a = rng.standard_normal((9, 13), dtype=np.float32)
    b = rng.standard_normal((13, 6), dtype=np.float32)
    a_in = np.ascontiguousarray(a.T).T if ta else a
    b_in = np.ascontiguousarray(b.T).T if tb else b
    big = rng.standard_normal((9, 10), dtype=np.float32)
    before = big.copy()
    y = big[:, 2:8]  # a column block of a wider matrix, as the grouped GEMMs write
    start = y.copy()
    matmul_acc(a_in, b_in, y, acc)
    want = a.astype(np.float64) @ b + (start if acc else 0)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(big[:, :2], before[:, :2])  # neighbours untouched
    np.testing.assert_array_equal(big[:, 8:], before[:, 8:])


def test_matmul_acc_falls_back_for_strided_operands():
    rng = np.random.default_rng(8)
    a = rng.standard_normal((8, 12), dtype=np.float32)[:, ::2]  # no unit stride
    b = rng.standard_normal((6, 4), dtype=np.float32)
    y = np.ones((8, 4), np.float32)
    matmul_acc(a, b, y, True)
    np.testing.assert_allclose(y, a @ b + 1, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("k,s,p,c", [(3, 2, 1, 64), (3, 1, 1, 8), (5, 2, 2, 70), (3, 2, 0, 64)])
@pytest.mark.parametrize("ceil_mode", [0, 1])
def test_separable_pools_over_several_bands(k, s, p, c, ceil_mode):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, c, 19, 17), dtype=np.float32)
    attrs = dict(kernel_shape=[k, k], strides=[s, s], pads=[p] * 4, ceil_mode=ceil_mode)
    old = kpool.BAND_BYTES
    kpool.BAND_BYTES = 2 * 9 * c * 4  # two output rows a band
    try:
        for include_pad in (0, 1):
            want = ref("AveragePool", x, count_include_pad=include_pad, **attrs)
            got = kpool.averagepool_nhwc(nhwc(x), count_include_pad=include_pad, **attrs)
            np.testing.assert_allclose(nchw(got), want, rtol=1e-5, atol=1e-5)
        want = ref("MaxPool", x, **attrs)
        out = np.full(nhwc(want).shape, np.nan, np.float32)
        got = kpool.maxpool_nhwc(nhwc(x), out=out, **attrs)
        assert got is out
        np.testing.assert_array_equal(nchw(got), want)
    finally:
        kpool.BAND_BYTES = old


def test_stem_reads_an_nhwc_view_of_an_nchw_input():
    # The layout pass hands the first convolution a transposed view of the graph input.
    rng = np.random.default_rng(10)
    x = rng.standard_normal((2, 3, 23, 21), dtype=np.float32)
    w = rng.standard_normal((8, 3, 7, 7), dtype=np.float32)
    b = rng.standard_normal(8, dtype=np.float32)
    attrs = dict(strides=[2, 2], pads=[3, 2, 1, 3], dilations=[1, 2])
    want = FusedConv(x, w, b, activation="Relu", **attrs)
    got = kfused.fused_conv_nhwc(x.transpose(0, 2, 3, 1), w, b, activation="Relu", **attrs)
    np.testing.assert_allclose(nchw(got), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("axis", [0, 1, 3, -1, -3])
def test_concat_matches_reference_into_the_planned_buffer(axis):
    rng = np.random.default_rng(11)
    shapes = [[2, 3, 4, 5], [2, 3, 4, 5], [2, 3, 4, 5]]
    for i, sh in enumerate(shapes):
        sh[axis] += i
    xs = [rng.standard_normal(sh, dtype=np.float32) for sh in shapes]
    want = ref("Concat", *xs, axis=axis)
    out = np.full(want.shape, np.nan, np.float32)
    got = kshape.concat(*xs, axis=axis, out=out)
    assert got is out
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(kshape.concat(*xs, axis=axis), want)


def test_concat_errors_name_the_input():
    a = np.zeros((1, 2, 3), np.float32)
    with pytest.raises(KernelError, match="input 1 has shape"):
        kshape.concat(a, np.zeros((1, 3, 4), np.float32), axis=1)
    with pytest.raises(KernelError, match="axis 3 is out of range"):
        kshape.concat(a, a, axis=3)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=2, max_size=5), st.data(),
       st.sampled_from([np.float32, np.int64, np.uint8]))
def test_transpose_into_out_matches_numpy(shape, data, dtype):
    # Short strided last axes copy index by index (a 3-channel image's NCHW -> NHWC); the
    # sizes go up to 9**5 elements, past the path's minimum, with last axes of 1 to 9.
    perm = data.draw(st.permutations(range(len(shape))))
    x = (np.arange(np.prod(shape)) % 251).astype(dtype).reshape(shape)
    want = np.ascontiguousarray(x.transpose(perm))
    out = np.full(want.shape, 7, dtype=dtype)
    got = kshape.transpose(x, perm=list(perm), out=out)
    assert got is out
    np.testing.assert_array_equal(got, want)


def test_transpose_rgb_image_to_nhwc():
    x = np.random.default_rng(0).standard_normal((2, 3, 64, 48)).astype(np.float32)
    out = np.empty((2, 64, 48, 3), np.float32)
    kshape.transpose(x, perm=[0, 2, 3, 1], out=out)
    np.testing.assert_array_equal(out, x.transpose(0, 2, 3, 1))


@pytest.mark.parametrize("act", ["", "Relu", "Sigmoid", "Swish", "HardSwish", "Tanh"])
@pytest.mark.parametrize("bias,residual", [(True, False), (False, True), (True, True)])
def test_one_pixel_pointwise_matches_reference(act, bias, residual):
    # A squeeze-excite gate: 1x1 image, matrix-vector product straight into y; the residual
    # also given as y itself (FusedConv's in-place alias), which must be read before y is
    # written.
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 48, 1, 1), dtype=np.float32)
    w = rng.standard_normal((96, 48, 1, 1), dtype=np.float32)
    b = rng.standard_normal(96, dtype=np.float32) if bias else None
    z = rng.standard_normal((1, 96, 1, 1), dtype=np.float32) if residual else None
    params = {"Swish": [1.0]}.get(act, [])
    want = FusedConv(x, w, b, z, activation=act, activation_params=params)
    got = kfused.fused_conv_nhwc(nhwc(x), w, b, None if z is None else nhwc(z),
                                 activation=act, activation_params=params)
    np.testing.assert_allclose(nchw(got), want, rtol=1e-5, atol=1e-6)
    if residual:
        y = np.ascontiguousarray(nhwc(z))
        got = kfused.fused_conv_nhwc(nhwc(x), w, b, y, activation=act,
                                     activation_params=params, out=y)
        assert got is y
        np.testing.assert_allclose(nchw(got), want, rtol=1e-5, atol=1e-6)
