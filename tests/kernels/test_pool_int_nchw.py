"""MaxPool's fast variants on uint8/int8 and on NCHW (opwarden.kernels.cpu.pool.maxpool_nchw,
the flat W pass) against the reference kernel, exactly: every model/edge case, bands of one row,
random geometries, planned output buffers, and a session on a uint8 NCHW MaxPool vs ORT."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opwarden.kernels.cpu import pool as kpool
from tests.kernels.test_pool_fast import CASES, SHAPES
from tests.kernels.test_pool_norm import nchw, nhwc, pool_case, ref

DTYPES = [np.float32, np.uint8, np.int8]


def sample(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)  # the extremes too: the padding identity is the dtype's minimum
    return rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)


def check(x, attrs):
    want = ref("MaxPool", x, **attrs)
    buf = np.zeros(want.shape, x.dtype)
    got = kpool.maxpool_nchw(x, out=buf, **attrs)
    assert got is buf and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    got = kpool.maxpool_nhwc(nhwc(x), **attrs)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(nchw(got), want)


@pytest.fixture
def small_bands(monkeypatch):
    monkeypatch.setattr(kpool, "BAND_BYTES", 1)
    yield
    kpool._PLANS.clear()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("attrs", CASES, ids=lambda a: "-".join(f"{v}" for v in a.values()))
def test_maxpool_int_and_nchw_match_reference(attrs, dtype):
    for i, shape in enumerate(SHAPES):
        check(sample(shape, dtype, i), attrs)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("attrs", CASES[:10], ids=lambda a: "-".join(f"{v}" for v in a.values()))
def test_maxpool_nchw_over_many_bands(attrs, dtype, small_bands):
    check(sample((2, 3, 12, 10), dtype, 1), attrs)


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(pool_case(k=5, dil=3, stride=4, hw=14, n=3, c=4), st.sampled_from(DTYPES),
       st.sampled_from([1, 300, 1 << 18]))
def test_random_maxpools_nchw_match_reference(case, dtype, band_bytes):
    shape, attrs = case
    old = kpool.BAND_BYTES
    kpool.BAND_BYTES = band_bytes
    try:
        check(sample(shape, dtype, 2), attrs)
    finally:
        kpool.BAND_BYTES = old


def test_maxpool_nchw_indices_come_from_the_reference():
    x = sample((2, 3, 7, 6), np.float32, 3)
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    y, idx = ref("MaxPool", x, noutputs=2, **attrs)
    gy, gidx = kpool.maxpool_nchw(x, noutputs=2, **attrs)
    np.testing.assert_array_equal(gy, y)
    np.testing.assert_array_equal(gidx, idx)


def test_uint8_nchw_maxpool_session_matches_ort():
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    import opwarden as ow

    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                            pads=[1, 1, 1, 1])
    g = helper.make_graph([node], "g",
                          [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 8, 17, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
    sess = ow.InferenceSession(m)
    pool = [r for r in sess.explain() if r["op_type"] == "MaxPool"][0]
    assert pool["variant"] == "maxpool.cpu.nchw"
    x = sample((1, 8, 17, 16), np.uint8, 4)
    (got,) = sess.run(None, {"x": x})
    (want,) = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, want)
