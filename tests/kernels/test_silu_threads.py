"""The compiled SiLU on OpenMP threads (native.swish n_threads, used by the SiLU variants when
no split threads are set): bit-identical to one thread on every length around the block and
threshold sizes, spans included, and the same as the reference; bad thread counts refused."""

from __future__ import annotations

import os

import numpy as np
import pytest

from opwarden import native
from opwarden.errors import OpwardenError
from opwarden.kernels.cpu import blas_split, silu_native

needs_native = pytest.mark.skipif(os.environ.get("OPWARDEN_NATIVE", "1") == "0"
                                  or not native.available(), reason="compiled path off")


@needs_native
@pytest.mark.parametrize("n", [1, 1 << 14, (1 << 16) - 1, 1 << 16, (1 << 16) + 3, 300_001])
@pytest.mark.parametrize("threads", [2, 3])
def test_threads_bit_identical_to_one(n, threads):
    x = np.random.default_rng(n).standard_normal(n, dtype=np.float32) * 8
    x[:3] = [np.nan, np.inf, -np.inf][: min(3, n)]
    one = native.swish(x, np.empty_like(x), 1.0, n_threads=1)
    many = native.swish(x, np.empty_like(x), 1.0, n_threads=threads)
    assert np.array_equal(one, many, equal_nan=True)
    with np.errstate(over="ignore", invalid="ignore"):
        want = x / (1 + np.exp(-x.astype(np.float64)))
    np.testing.assert_allclose(many, want.astype(np.float32), rtol=1e-6, atol=1e-30,
                               equal_nan=True)


@needs_native
def test_threads_over_a_span_and_in_place():
    x = np.random.default_rng(1).standard_normal(200_000, dtype=np.float32)
    y = np.full_like(x, 7.0)
    native.swish(x, y, 0.5, (1000, 150_000), n_threads=2)
    ref = native.swish(x, np.empty_like(x), 0.5, n_threads=1)
    assert np.array_equal(y[1000:150_000], ref[1000:150_000])
    assert (y[:1000] == 7).all() and (y[150_000:] == 7).all()
    z = x.copy()
    native.swish(z, z, 0.5, n_threads=2)
    assert np.array_equal(z, ref)


@needs_native
def test_variant_uses_threads_without_split(monkeypatch):
    seen = []
    real = native.swish
    monkeypatch.setattr(silu_native.native, "swish",
                        lambda *a, **k: seen.append(k.get("n_threads")) or real(*a, **k))
    monkeypatch.setattr(blas_split, "split_threads", lambda: 1)
    monkeypatch.setattr(blas_split, "blas_thread_count", lambda: 2)
    x = np.random.default_rng(2).standard_normal((1, 8, 64, 64), dtype=np.float32)
    got = silu_native.native_silu(x, program="t0=sigmoid(x0);t1=mul(x0,t0)")
    assert seen == [2]
    assert np.array_equal(got, real(x, np.empty_like(x), 1.0))


@needs_native
def test_bad_thread_count_raises():
    x = np.ones(10, np.float32)
    with pytest.raises((OpwardenError, ValueError)):
        native._LIB.swish(x, np.empty_like(x), 0, 10, 1.0, 0)
