"""blas_split: products shared out in chunks between the caller and helper threads.

Against float64 NumPy products: 2-D, transposed views, 3-D activations on a 2-D weight (with
the bias added per column block), stacked and broadcast batches as attention's transposed
views give them; a chunk that raises, another region running, OpenBLAS's thread count
restored in every case.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from opwarden import native
from opwarden.blas import blas_thread_count, set_blas_threads
from opwarden.kernels.cpu import blas_split as bs
from opwarden.kernels.cpu import linalg


@pytest.fixture(autouse=True)
def two_threads(monkeypatch):
    """Splitting configured for two threads (OpenBLAS on one), small thresholds so small
    operands take the split path; OpenBLAS's thread count restored afterwards."""
    before = blas_thread_count()
    monkeypatch.setattr(bs, "SPLIT", True)
    monkeypatch.setattr(bs, "_THREADS", [0])
    monkeypatch.setattr(bs, "SPLIT_MIN_MNK", 1 << 10)
    monkeypatch.setattr(bs, "CHUNK_MIN_MNK", 1 << 8)
    bs.configure(2)
    yield
    assert blas_thread_count() == 1  # (never switched while configured)
    bs.configure(0)
    set_blas_threads(before)


def _rand(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


def _close(got, a, b, bias=None):
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    if bias is not None:
        want = want + bias
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(a.shape[-1]))


def test_split_gemm_2d_and_transposed_views():
    rng = np.random.default_rng(0)
    for m, k, n in ((64, 48, 200), (1, 96, 130), (33, 17, 64), (300, 40, 24), (90, 64, 90)):
        a, b = _rand(rng, (m, k)), _rand(rng, (k, n))
        for aa, bb in ((a, b), (np.ascontiguousarray(a.T).T, b), (a, np.ascontiguousarray(b.T).T)):
            y = np.full((m, n), np.nan, np.float32)
            assert bs.split_gemm(aa, bb, y)
            _close(y, a, b)


def test_split_gemm_accumulates():
    rng = np.random.default_rng(6)
    a, b, y0 = _rand(rng, (200, 32)), _rand(rng, (32, 40)), _rand(rng, (200, 40))
    y = y0.copy()
    assert bs.split_gemm(a, b, y, accumulate=True)
    _close(y - y0, a, b)


def test_split_gemm_declines_what_blas_cannot_read():
    rng = np.random.default_rng(1)
    a, b = _rand(rng, (32, 64)), _rand(rng, (64, 128))
    y = np.zeros((32, 128), np.float32)
    assert not bs.split_gemm(a[:, ::2], b[::2], y)  # (no unit stride)
    assert not bs.split_gemm(a.astype(np.float64), b, y)
    assert not bs.split_gemm(a, b, np.zeros((32, 256), np.float32)[:, ::2])
    assert not y.any()


def test_matmul_3d_activation_and_fused_bias():
    rng = np.random.default_rng(2)
    a, b, c = _rand(rng, (2, 40, 64)), _rand(rng, (64, 96)), _rand(rng, (96,))
    _close(linalg.matmul(a, b), a, b)
    out = np.empty((2, 40, 96), np.float32)
    got = linalg.fused_matmul(a, b, c, activation="Relu", out=out)
    assert got is out
    want = np.maximum(np.matmul(a.astype(np.float64), b) + c, 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
    # A bias that is not one row (per-row values) is added after the product.
    c2 = _rand(rng, (40, 1))
    _close(linalg.fused_matmul(a, b, c2), a, b, c2)


def test_attention_shaped_batches():
    rng = np.random.default_rng(3)
    bsz, s, h, d = 2, 24, 4, 16
    q = _rand(rng, (bsz, s, h * d)).reshape(bsz, s, h, d).transpose(0, 2, 1, 3)
    k = _rand(rng, (bsz, s, h * d)).reshape(bsz, s, h, d).transpose(0, 2, 3, 1)
    scores = linalg.matmul(q, k)
    _close(scores, q, k)
    p = _rand(rng, (bsz, h, s, s))
    _close(linalg.matmul(p, q), p, q)
    # Broadcast batch axes.
    a, b = _rand(rng, (3, 1, 20, 16)), _rand(rng, (1, 4, 16, 20))
    _close(linalg.matmul(a, b), a, b)


def test_gemm_transposed():
    rng = np.random.default_rng(4)
    a, b, c = _rand(rng, (64, 48)), _rand(rng, (100, 64)), _rand(rng, (100,))
    got = linalg.gemm(a, b, c, transA=1, transB=1, alpha=0.5)
    want = 0.5 * (a.T.astype(np.float64) @ b.T.astype(np.float64)) + c
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


def test_over_rows_covers_every_row_once():
    hits = np.zeros(1000, np.int64)

    def fn(r0, r1):
        hits[r0:r1] += 1

    bs.over_rows(1000, 1 << 24, fn)
    assert (hits == 1).all()
    bs.over_rows(1000, 1, fn)  # (small: one call here)
    assert (hits == 2).all()


def test_a_failing_chunk_raises_in_the_caller():
    seen = []

    def fn(i):
        seen.append(i)
        if i == 3:
            raise ValueError("chunk 3")

    with pytest.raises(ValueError, match="chunk 3"):
        bs.run_chunks(fn, 8)
    assert 3 in seen
    # The region is free again and later jobs run every chunk.
    done = []
    assert bs.run_chunks(done.append, 6)
    assert sorted(done) == list(range(6))


def test_same_bits_on_one_thread_and_behind_a_busy_region():
    rng = np.random.default_rng(9)
    a, b = _rand(rng, (300, 96)), _rand(rng, (96, 80))
    split = linalg.matmul(a, b)
    bs.configure(1)
    try:
        alone = linalg.matmul(a, b)  # (the same chunks, run here in turn)
    finally:
        bs.configure(2)
    np.testing.assert_array_equal(alone, split)
    got = {}
    with bs._REGION:  # another region running: the call waits for it
        t = threading.Thread(target=lambda: got.update(y=linalg.matmul(a, b)))
        t.start()
        t.join(0.2)
        assert t.is_alive()
    t.join()
    np.testing.assert_array_equal(got["y"], split)


def test_unconfigured_or_off_runs_whole():
    bs.configure(0)
    try:
        assert blas_thread_count() == 1 and not bs.run_chunks(lambda i: None, 4)
        set_blas_threads(2)  # (OpenBLAS's own threads: never switched under a call)
        bs._THREADS[0] = 2
        assert not bs.run_chunks(lambda i: None, 4)
        assert blas_thread_count() == 2
    finally:
        bs.configure(2)


def test_nested_regions_run_in_turn():
    inner = []

    def outer(i):
        assert bs.run_chunks(lambda j: inner.append((i, j)), 3)

    assert bs.run_chunks(outer, 4)
    assert sorted(inner) == [(i, j) for i in range(4) for j in range(3)]


def test_configure_keeps_openblas_on_one_thread():
    assert blas_thread_count() == 1 and bs.split_threads() == 2
    rng = np.random.default_rng(8)
    a, b = _rand(rng, (64, 64)), _rand(rng, (64, 256))
    seen = []
    assert bs.run_chunks(seen.append, 4)
    assert blas_thread_count() == 1
    _close(linalg.matmul(a, b), a, b)
    bs.configure(1)
    try:
        assert blas_thread_count() == 1 and bs.split_threads() == 1
        assert bs.run_chunks(seen.append, 4)  # (here, in turn)
        assert sorted(seen) == [0, 0, 1, 1, 2, 2, 3, 3]
    finally:
        bs.configure(2)


def test_concurrent_callers_get_their_own_products():
    rng = np.random.default_rng(5)
    pairs = [(_rand(rng, (32, 64)), _rand(rng, (64, 160))) for _ in range(6)]
    got: dict[int, np.ndarray] = {}

    def run(i):
        for _ in range(5):
            got[i] = linalg.matmul(*pairs[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(pairs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, (a, b) in enumerate(pairs):
        _close(got[i], a, b)


# (route, N, H, C, M, kernel, stride): shapes that take each NHWC route, small enough that
# the lowered thresholds split their GEMMs.
CONV_ROUTES = [
    ("shifted", 2, 28, 16, 24, 3, 1),
    ("rowtap", 1, 20, 8, 16, 5, 1),
    ("stem", 2, 20, 3, 12, 5, 2),  # (M not a multiple of 8: not the direct loop)
    ("direct", 2, 20, 3, 16, 5, 2),
    ("patch", 1, 6, 8, 16, 5, 2),
    ("few_pixels", 2, 6, 128, 128, 5, 1),
    ("pointwise", 2, 6, 32, 48, 1, 1),
    ("winograd", 1, 28, 128, 256, 3, 1),
]


@pytest.mark.parametrize("case", CONV_ROUTES, ids=[c[0] for c in CONV_ROUTES])
def test_conv_routes_split_match_the_reference(case, monkeypatch):
    from opwarden.kernels.cpu import conv
    from opwarden.memory.constants import mark
    from opwarden.ops.base import REGISTRY

    route, n, h, c, m, k, s = case
    if route == "direct" and not native.available():
        pytest.skip("the direct route is the compiled loop")
    rng = np.random.default_rng(len(route))
    x = _rand(rng, (n, c, h, h))
    w = mark(_rand(rng, (m, c, k, k)) / np.float32(np.sqrt(c * k * k)))
    b = mark(_rand(rng, (m,)))
    z = _rand(rng, (n, m, (h + 2 * (k // 2) - k) // s + 1, (h + 2 * (k // 2) - k) // s + 1))
    attrs = {"pads": [k // 2] * 4, "strides": [s, s]}
    assert conv.static_route((n, h, h, c), w.shape, attrs) == route
    regions = []
    run = bs.run_chunks
    monkeypatch.setattr(bs, "run_chunks", lambda fn, k: regions.append(k) or run(fn, k))
    want = REGISTRY.latest("Conv").reference(x, w, b, **attrs)
    xh, zh = x.transpose(0, 2, 3, 1), np.ascontiguousarray(z.transpose(0, 2, 3, 1))
    got = conv.nhwc_kernel(route)(xh, w, b, zh, activation="Relu", **attrs)
    assert regions  # (the split path ran)
    np.testing.assert_allclose(got.transpose(0, 3, 1, 2), np.maximum(want + z, 0),
                               rtol=1e-4, atol=1e-4)
