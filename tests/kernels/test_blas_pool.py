"""NumPy's OpenBLAS on the extension's OpenMP threads (native/blas_pool.c): the same results as
on OpenBLAS's own threads, bit for bit; concurrent callers; a call from inside an OpenMP team
(its jobs then run on plain threads, since OpenBLAS's level-3 jobs wait on each other); a
forked child; the opt-out; and what `status()` says."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from opwarden import native
from opwarden.blas import blas_thread_count, set_blas_threads

pytestmark = pytest.mark.skipif(native.status()["blas_pool"] != "openmp",
                                reason=native.status()["blas_pool_reason"])


@pytest.fixture
def two_threads():
    before = blas_thread_count()
    set_blas_threads(2)
    yield
    set_blas_threads(before)
    native.set_blas_pool(True)


def _operands(seed: int):
    rng = np.random.default_rng(seed)
    # Large enough for OpenBLAS to thread every product: GEMM, GEMV, a level-1 axpy.
    a = rng.standard_normal((384, 640), dtype=np.float32)
    b = rng.standard_normal((640, 512), dtype=np.float32)
    v = rng.standard_normal(640).astype(np.float32)
    return a, b, v


def _products(a, b, v):
    return a @ b, a @ v, (a.astype(np.float64) @ b.astype(np.float64))


def test_same_bits_as_openblas_threads(two_threads):
    ops = _operands(0)
    team0, _ = native.blas_pool_counts()
    ours = _products(*ops)
    assert native.blas_pool_counts()[0] > team0  # (the jobs did go through the pool)
    assert native.set_blas_pool(False)
    assert native.status()["blas_pool"] == "openblas"
    theirs = _products(*ops)
    assert native.set_blas_pool(True)
    for x, y in zip(ours, theirs):
        np.testing.assert_array_equal(x, y)


def test_concurrent_callers_get_their_own_results(two_threads):
    cases = [_operands(s) for s in range(4)]
    expected = [a.astype(np.float64) @ b.astype(np.float64) for a, b, _ in cases]
    got: dict[int, list] = {i: [] for i in range(4)}

    def work(i):
        a, b, _ = cases[i]
        for _ in range(6):
            got[i].append(a @ b)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    for i in range(4):
        assert len(got[i]) == 6
        for r in got[i]:
            np.testing.assert_allclose(r, expected[i], rtol=1e-4, atol=1e-3)


def test_call_from_inside_an_openmp_team_runs_on_plain_threads(two_threads):
    a, b, _ = _operands(1)
    want = a @ b
    results: list = []
    lock = threading.Lock()

    @ctypes.CFUNCTYPE(None, ctypes.c_int)
    def body(thread_num):
        r = a @ b  # (a threaded GEMM issued from an OpenMP worker)
        with lock:
            results.append((thread_num, r))

    _, plain0 = native.blas_pool_counts()
    native._LIB.blas_pool_call_in_team(ctypes.cast(body, ctypes.c_void_p).value, 2)
    assert sorted(t for t, _ in results) == [0, 1]
    for _, r in results:
        np.testing.assert_array_equal(r, want)
    assert native.blas_pool_counts()[1] > plain0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_forked_child_multiplies(two_threads):
    a, b, _ = _operands(2)
    want = a @ b
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: OpenBLAS's own threads again, and a correct product
        try:
            ok = (native.status()["blas_pool"] == "openblas"
                  and np.array_equal(a @ b, want))
            os.write(w, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        assert f.read() == b"1"
    os.waitpid(pid, 0)
    np.testing.assert_array_equal(a @ b, want)


def test_opt_out_and_status_in_a_fresh_process():
    code = ("import numpy as np, opwarden.native as n; a = np.ones((300, 300), np.float32); "
            "a @ a; s = n.status(); print(s['blas_pool'], n.blas_pool_counts()[0] > 0)")
    env = dict(os.environ)
    env.pop("OPWARDEN_BLAS_POOL", None)
    default = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True).stdout.split()
    env["OPWARDEN_BLAS_POOL"] = "openblas"
    opted = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, check=True).stdout.split()
    assert default == ["openmp", "True"]
    assert opted == ["openblas", "False"]


def test_device_description_names_the_pool():
    from opwarden.devices import devices

    cpu = next(d for d in devices() if d.name == "cpu")
    assert "BLAS threads: OpenBLAS's jobs run on the extension's OpenMP threads" in \
        cpu.description
