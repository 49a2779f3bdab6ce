"""The planned, separable NHWC pools (opwarden.kernels.cpu.pool) against the reference kernels:
banding over images and rows, H/W padding that leaves no tap covering a band, dilations,
ceil_mode, auto_pad, the count maps of AveragePool, strided inputs and outputs, plan caching."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opwarden import native
from opwarden.kernels.cpu import pool as kpool
from tests.kernels.test_pool_norm import nchw, nhwc, pool_case, ref


def check(x, attrs, include_pad=0, out=False):
    """Both pools on NCHW `x` (given as NCHW) against the reference."""
    want = ref("MaxPool", x, **attrs)
    buf = np.full(nhwc(want).shape, np.nan, np.float32) if out else None
    got = kpool.maxpool_nhwc(nhwc(x), out=buf, **attrs)
    if out:
        assert got is buf
    np.testing.assert_array_equal(nchw(got), want)
    if native.available():
        buf = np.full(nhwc(want).shape, np.nan, np.float32) if out else None
        got = kpool.maxpool_nhwc_native(nhwc(x), out=buf, **attrs)
        assert not out or got is buf
        np.testing.assert_array_equal(nchw(got), want)
    want = ref("AveragePool", x, count_include_pad=include_pad, **attrs)
    buf = np.full(nhwc(want).shape, np.nan, np.float32) if out else None
    got = kpool.averagepool_nhwc(nhwc(x), count_include_pad=include_pad, out=buf, **attrs)
    np.testing.assert_allclose(nchw(got), want, rtol=1e-5, atol=1e-6)


@pytest.fixture
def small_bands(monkeypatch):
    """Bands of one or two output rows, so every shape runs several bands."""
    monkeypatch.setattr(kpool, "BAND_BYTES", 1)
    yield
    kpool._PLANS.clear()


# The model pools (SqueezeNet, ShuffleNet, DenseNet, Inception, VGG) at small sizes, plus edges.
CASES = [
    dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 0, 0]),
    dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1]),
    dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]),
    dict(kernel_shape=[2, 2], strides=[2, 2]),
    dict(kernel_shape=[7, 7], strides=[1, 1]),
    dict(kernel_shape=[5, 6], strides=[1, 1], pads=[4, 5, 3, 2]),  # many border columns
    dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
    dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1),
    dict(kernel_shape=[2, 2], strides=[1, 1], pads=[1, 1, 1, 1]),  # no tap covers all rows
    dict(kernel_shape=[1, 1], strides=[2, 3]),  # one tap: the band is a view of x
    dict(kernel_shape=[1, 3], strides=[2, 2], pads=[0, 1, 0, 1]),
    dict(kernel_shape=[3, 1], strides=[1, 2], pads=[1, 0, 2, 0]),
    dict(kernel_shape=[2, 3], strides=[3, 2], dilations=[2, 3], pads=[1, 2, 0, 1]),
    dict(kernel_shape=[3, 3], strides=[3, 3], dilations=[2, 2], ceil_mode=1, pads=[1, 1, 1, 1]),
    dict(kernel_shape=[3, 3], strides=[2, 1], auto_pad="SAME_UPPER"),
    dict(kernel_shape=[4, 2], strides=[2, 3], auto_pad="SAME_LOWER"),
    dict(kernel_shape=[3, 2], strides=[1, 2], auto_pad="VALID"),
]
SHAPES = [(1, 5, 7, 7), (3, 4, 9, 8), (2, 24, 11, 13)]


@pytest.mark.parametrize("attrs", CASES, ids=lambda a: "-".join(f"{v}" for v in a.values()))
def test_model_and_edge_pools_match_reference(attrs):
    rng = np.random.default_rng(0)
    for shape, include_pad in itertools.product(SHAPES, (0, 1)):
        x = rng.standard_normal(shape, dtype=np.float32)
        check(x, attrs, include_pad, out=include_pad == 1)


@pytest.mark.parametrize("attrs", CASES[:10], ids=lambda a: "-".join(f"{v}" for v in a.values()))
def test_pools_over_many_bands_match_reference(attrs, small_bands):
    x = np.random.default_rng(1).standard_normal((2, 6, 12, 10), dtype=np.float32)
    for include_pad in (0, 1):
        check(x, attrs, include_pad)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(pool_case(k=5, dil=3, stride=4, hw=14, n=3, c=9), st.integers(0, 1),
       st.sampled_from([1, 300, 1 << 18]))
def test_random_pools_match_reference(case, include_pad, band_bytes):
    shape, attrs = case
    old = kpool.BAND_BYTES
    kpool.BAND_BYTES = band_bytes
    try:
        x = np.random.default_rng(2).standard_normal(shape, dtype=np.float32)
        check(x, attrs, include_pad)
    finally:
        kpool.BAND_BYTES = old


def test_strided_input_and_output_views():
    # x: an NHWC view with a contiguous last axis but padded rows; y: a strided view into a
    # wider buffer (how a planned Concat output would look), written through the plan.
    rng = np.random.default_rng(3)
    big = rng.standard_normal((2, 15, 13, 8), dtype=np.float32)
    x = big[:, 1:14, 2:12]
    for kind, attrs in (("max", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
                        ("avg", dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]))):
        op_type = "MaxPool" if kind == "max" else "AveragePool"
        want = nhwc(ref(op_type, np.ascontiguousarray(nchw(x)), **attrs))
        fn = kpool.maxpool_nhwc if kind == "max" else kpool.averagepool_nhwc
        np.testing.assert_allclose(fn(x, **attrs), want, rtol=1e-5, atol=1e-6)
        wide = np.full(want.shape[:3] + (20,), np.nan, np.float32)
        y = wide[..., 4:12]
        plan = kpool._cached_plan(kind, x, attrs["kernel_shape"], attrs["strides"], None,
                                  attrs["pads"], "NOTSET", 0, 0)
        ufunc, ident = (np.maximum, -np.inf) if kind == "max" else (np.add, 0.0)
        kpool._run(plan, x, y, ufunc, ident)
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
        assert np.isnan(wide[..., :4]).all() and np.isnan(wide[..., 12:]).all()


def test_non_float32_and_transposed_inputs_are_converted():
    x = np.random.default_rng(4).standard_normal((1, 3, 8, 8))
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    want = ref("MaxPool", x.astype(np.float32), **attrs)
    got = kpool.maxpool_nhwc(np.moveaxis(x, 1, -1), **attrs)  # float64, C not contiguous
    assert got.dtype == np.float32
    np.testing.assert_array_equal(nchw(got), want)


def test_plans_are_per_shape_and_attributes():
    # Same input shape, different attributes (and the reverse) must not share a cached plan.
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 4, 9, 9), dtype=np.float32)
    for attrs in (dict(kernel_shape=[3, 3], strides=[2, 2]),
                  dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
                  dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
                  dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])):
        for include_pad in (1, 0, 1):
            check(x, attrs, include_pad)
    check(rng.standard_normal((1, 4, 10, 9), dtype=np.float32), dict(kernel_shape=[3, 3]))


def test_maxpool_indices_keep_nchw_order():
    x = np.random.default_rng(6).standard_normal((2, 3, 7, 6), dtype=np.float32)
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    y, idx = ref("MaxPool", x, noutputs=2, **attrs)
    gy, gidx = kpool.maxpool_nhwc(nhwc(x), noutputs=2, **attrs)
    np.testing.assert_array_equal(nchw(gy), y)
    np.testing.assert_array_equal(gidx, idx)


def test_average_pool_with_pads_as_large_as_the_window_takes_the_reference():
    """A window wholly in the padding averages nothing: the reference's NaN. The fast NHWC
    variant's predicate leaves such pads (ORT refuses them) to the reference."""
    from onnx import TensorProto, helper

    import opwarden as ow

    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1]),
             helper.make_node("AveragePool", ["c"], ["p"], kernel_shape=[3, 1], strides=[2, 1],
                              pads=[3, 0, 0, 0]),
             helper.make_node("Conv", ["p", "w"], ["y"], kernel_shape=[1, 1])]
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 4, 1, 1], np.eye(4, dtype=np.float32)
                           .reshape(-1).tolist())
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     [1, 4, 6, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    sess = ow.InferenceSession(m.SerializeToString())
    pool = [r for r in sess.explain() if r["op_type"] == "AveragePool"][0]
    assert pool["variant"] != "averagepool.cpu.nhwc"
    x = np.random.default_rng(0).standard_normal((1, 4, 6, 5)).astype(np.float32)
    ref = ow.InferenceSession(m.SerializeToString(), providers=["cpu"], optimization_level=0)
    (got,), (want,) = sess.run(None, {"x": x}), ref.run(None, {"x": x})
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[:, :, 0]).all()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(not native.available(), reason="compiled kernels not built")
@pytest.mark.parametrize("c", [1, 31, 32, 70])
def test_native_maxpool_channel_blocks_nan_and_inf(c):
    # Channel counts below, at and past the 32-channel register block; NaN anywhere in a
    # window makes that output NaN (np.maximum's rule); -inf and +inf stay what they are.
    rng = np.random.default_rng(c)
    x = rng.standard_normal((2, c, 9, 8), dtype=np.float32)
    x.flat[rng.choice(x.size, max(1, x.size // 40), replace=False)] = np.nan
    x.flat[rng.choice(x.size, max(1, x.size // 40), replace=False)] = np.inf
    x.flat[rng.choice(x.size, max(1, x.size // 40), replace=False)] = -np.inf
    for attrs in CASES[:4] + [CASES[-5]]:
        want = kpool.maxpool_nhwc(nhwc(x), **attrs)
        got = kpool.maxpool_nhwc_native(nhwc(x), **attrs)
        np.testing.assert_array_equal(got, want)
        assert np.isnan(got).any() and np.isnan(want).sum() == np.isnan(got).sum()


def test_native_maxpool_other_dtypes_and_indices_take_the_numpy_path():
    x = np.arange(2 * 6 * 6 * 3, dtype=np.uint8).reshape(2, 6, 6, 3)
    got = kpool.maxpool_nhwc_native(x, kernel_shape=[2, 2], strides=[2, 2])
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, kpool.maxpool_nhwc(x, kernel_shape=[2, 2],
                                                          strides=[2, 2]))
