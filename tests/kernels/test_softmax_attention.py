"""softmaxattention.cpu.blocked against the SoftmaxAttention reference: head layouts as
transposed views, broadcasting biases, row blocks and grouped heads, the threaded block path
(OpenBLAS's thread count restored after it), NaN and masked rows, bad shapes."""

from __future__ import annotations

import numpy as np
import pytest

from opwarden.blas import blas_thread_count, set_blas_threads
from opwarden.errors import KernelError
from opwarden.kernels.cpu import attention as att
from opwarden.ops.fused_attention import SoftmaxAttention


def _heads(rng, b, s, n, h, perm=(0, 2, 1, 3)):
    return rng.standard_normal((b, s, n, h), dtype=np.float32).transpose(*perm)


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=0, atol=3e-6 * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("b,s,t,n,h", [(2, 7, 7, 3, 8), (1, 300, 300, 2, 16), (1, 1, 40, 4, 16),
                                       (1, 1500, 1500, 1, 16)])
def test_matches_reference_on_transposed_views(b, s, t, n, h):
    rng = np.random.default_rng(0)
    q = _heads(rng, b, s, n, h)
    kt = _heads(rng, b, t, n, h, (0, 2, 3, 1))
    v = _heads(rng, b, t, n, h)
    mask = np.where(rng.random((b, 1, 1, t)) < 0.2, -1e4, 0).astype(np.float32)
    for kw in ({"scale": 0.125}, {"scale": 8.0, "divide": 1}):
        want = SoftmaxAttention(q, kt, v, mask, **kw)
        got = att.softmax_attention(q, kt, v, mask, **kw)
        assert got.shape == want.shape
        _close(got, want)


def test_two_biases_and_broadcast_rows():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 2, 1, 8), dtype=np.float32)
    kt = rng.standard_normal((1, 2, 8, 6), dtype=np.float32)
    v = rng.standard_normal((1, 2, 6, 5), dtype=np.float32)
    pos = rng.standard_normal((3, 1, 4, 6), dtype=np.float32)  # widens batch and rows
    mask = rng.standard_normal((1, 1, 1, 6), dtype=np.float32)
    want = SoftmaxAttention(q, kt, v, pos, mask)
    got = att.softmax_attention(q, kt, v, pos, mask)
    assert got.shape == want.shape == (3, 2, 4, 5)
    _close(got, want)


def test_into_planned_buffer_and_threads_restored():
    rng = np.random.default_rng(2)
    q, kt, v = (rng.standard_normal(sh, dtype=np.float32)
                for sh in ((1, 4, 600, 32), (1, 4, 32, 600), (1, 4, 600, 32)))
    before = blas_thread_count()
    set_blas_threads(2)
    try:
        out = np.empty((1, 4, 600, 32), np.float32)
        got = att.softmax_attention(q, kt, v, scale=0.2, out=out)
        assert got is out
        assert blas_thread_count() == 2
    finally:
        set_blas_threads(before)
    _close(got, SoftmaxAttention(q, kt, v, scale=0.2))


def test_nan_and_fully_masked_rows_as_reference():
    rng = np.random.default_rng(3)
    q, kt, v = (rng.standard_normal(sh, dtype=np.float32)
                for sh in ((1, 1, 3, 4), (1, 1, 4, 5), (1, 1, 5, 4)))
    q[0, 0, 1, 0] = np.nan
    bias = np.zeros((1, 1, 3, 5), np.float32)
    bias[0, 0, 2] = -np.inf
    want = SoftmaxAttention(q, kt, v, bias)
    got = att.softmax_attention(q, kt, v, bias)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[0, 0, 1]).all() and np.isnan(got[0, 0, 2]).all()
    _close(got[0, 0, 0], want[0, 0, 0])


def test_bad_shapes_raise():
    a = np.zeros((1, 2, 3, 4), np.float32)
    with pytest.raises(KernelError, match="do not chain"):
        att.softmax_attention(a, np.zeros((1, 2, 5, 3), np.float32), a)
    with pytest.raises(KernelError, match="do not broadcast"):
        att.softmax_attention(a, np.zeros((1, 2, 4, 3), np.float32), np.zeros((1, 2, 3, 4),
                              np.float32), np.zeros((1, 2, 3, 7), np.float32))
