"""softmaxattention.cpu.blocked against the SoftmaxAttention reference: head layouts as
transposed views, broadcasting biases, row blocks and grouped heads, the threaded block path
(OpenBLAS's thread count restored after it), NaN and masked rows, bad shapes."""

from __future__ import annotations

import numpy as np
import pytest

from opwarden import native
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


# The compiled softmax rows (native.softmax_rows, native/softmax.c) against the NumPy passes.

needs_native = pytest.mark.skipif(not native.available(), reason="no compiled kernels")


def _both(monkeypatch, *args, **kw):
    """(compiled result, NumPy-pass result, calls of native.softmax_rows)."""
    calls = []
    real = native.softmax_rows
    monkeypatch.setattr(native, "softmax_rows", lambda *a: calls.append(a) or real(*a))
    got = att.softmax_attention(*args, **kw)
    monkeypatch.setattr(native, "available", lambda: False)
    plain = att.softmax_attention(*args, **kw)
    monkeypatch.undo()
    return got, plain, calls


@needs_native
@pytest.mark.parametrize("layout", ["mask", "pos+mask", "per-head", "none", "keys-broadcast"])
def test_compiled_rows_match_numpy_passes(monkeypatch, layout):
    rng = np.random.default_rng(7)
    q = _heads(rng, 2, 70, 5, 16)
    kt = _heads(rng, 2, 70, 5, 16, (0, 2, 3, 1))
    v = _heads(rng, 2, 70, 5, 16)
    mask = np.where(rng.random((2, 1, 1, 70)) < 0.3, -np.inf, 0).astype(np.float32)
    pos = rng.standard_normal((1, 5, 70, 70), dtype=np.float32)
    biases = {"mask": [mask], "pos+mask": [pos, mask], "none": [],
              "per-head": [rng.standard_normal((2, 5, 1, 70), dtype=np.float32)],
              "keys-broadcast": [rng.standard_normal((2, 5, 70, 1), dtype=np.float32)]}[layout]
    got, plain, calls = _both(monkeypatch, q, kt, v, *biases, scale=4.0, divide=1)
    assert bool(calls) == (layout != "keys-broadcast")  # (keys not contiguous: NumPy passes)
    _close(got, plain)
    _close(got, SoftmaxAttention(q, kt, v, *biases, scale=4.0, divide=1))


@needs_native
def test_compiled_rows_nan_inf_and_masked(monkeypatch):
    rng = np.random.default_rng(8)
    q, kt, v = (rng.standard_normal(sh, dtype=np.float32)
                for sh in ((1, 2, 6, 4), (1, 2, 4, 37), (1, 2, 37, 4)))
    q[0, 1, 1, 0] = np.nan
    bias = np.zeros((1, 2, 6, 37), np.float32)
    bias[0, 0, 2] = -np.inf  # a fully masked row
    bias[0, 0, 3, 5] = np.inf  # +inf - +inf: NaN, as the reference
    bias[0, 1, 4, :30] = -np.inf  # masked but for 7 keys
    bias[0, 0, 5, 0] = 80.0  # e^(large) stays finite after the max is taken out
    got, plain, calls = _both(monkeypatch, q, kt, v, bias)
    assert calls
    want = SoftmaxAttention(q, kt, v, bias)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isnan(plain), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=0, atol=3e-6)


@needs_native
def test_softmax_rows_refuses_bad_operands():
    s = np.zeros((2, 3, 4), np.float32)
    inv = np.empty((2, 3, 1), np.float32)
    with pytest.raises(KernelError):
        native.softmax_rows(s[:, :, ::2], 1.0, [], inv)
    with pytest.raises(KernelError):
        native.softmax_rows(s, 1.0, [(np.zeros(4, np.float64), 0, 0, 0)], inv)
    with pytest.raises((KernelError, ValueError)):  # a bias view past its buffer's end
        native.softmax_rows(s, 1.0, [(np.zeros(4, np.float32), 0, 0, 4)], inv)
