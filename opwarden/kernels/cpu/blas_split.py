"""Large GEMMs split into chunks that the calling thread and a few helper threads claim.

OpenBLAS's own threads split a GEMM statically: the caller computes its share, then waits for
each worker's. When the machine is busy (more runnable threads than cores) a worker that is
not scheduled holds the call up for a scheduler time slice or more; a 128x768x3072 GEMM on two
threads then takes a median 5x its single-thread time, and a run of a transformer, dozens of
such calls, spreads by half its median. Here the product is cut into chunks (column blocks of
the output, or batch entries of a stacked product) that single-threaded BLAS calls compute;
the caller claims chunks until none is left, so a helper that never wakes costs at most the
chunk it already claimed, never the whole share: on a busy machine a call takes about its
single-thread time, on an idle one about OpenBLAS's two-thread time. (Each output element
is still one BLAS K-long sum; its rounding may differ from the whole call's as any two BLAS
blockings do.)

Helpers: `threads - 1` daemon threads (threads = OpenBLAS's thread count when the region
starts), started on first use and again after a fork. One region runs at a time in the
process; a call that finds another region running (the parallel executor's concurrent
kernels) computes in one BLAS call as before.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Sequence

import numpy as np

from opwarden.blas import blas_thread_count, set_blas_threads
from opwarden.kernels.cpu.util import F32, sgemm

# Off: every product is one BLAS call on OpenBLAS's threads (for measuring).
SPLIT = os.environ.get("OPWARDEN_BLAS_SPLIT", "1").strip().lower() not in (
    "0", "false", "no", "off")
# Products below this many multiply-adds (m*n*k) stay one call: the region's fixed cost (two
# thread-count switches, a wake-up, the claims: ~20 us) would eat what a second thread saves.
SPLIT_MIN_MNK = 1 << 22
# Chunks per thread (more: less held up by a late helper, more calls) and the fewest
# multiply-adds a chunk gets.
CHUNKS_PER_THREAD = 4
CHUNK_MIN_MNK = 1 << 20

_REGION = threading.Lock()


class _Job:
    """Chunks 0..n-1 of fn, claimed in order by whichever thread asks first."""

    def __init__(self, fn: Callable[[int], None], n: int) -> None:
        self.fn, self.n = fn, n
        self.claims = itertools.count()  # (next() is atomic under the GIL)
        self.lock = threading.Lock()
        self.pending = n
        self.done = threading.Event()
        self.error: BaseException | None = None

    def work(self) -> None:
        while True:
            i = next(self.claims)
            if i >= self.n:
                return
            try:
                if self.error is None:
                    self.fn(i)
            except BaseException as e:  # noqa: BLE001 - handed to the caller, re-raised there
                self.error = self.error or e
            finally:
                with self.lock:
                    self.pending -= 1
                    if not self.pending:
                        self.done.set()


class _Helpers:
    """Daemon threads that join each posted job."""

    def __init__(self, n: int) -> None:
        self.pid = os.getpid()
        self.cv = threading.Condition()
        self.job: _Job | None = None
        self.posted = 0
        self.threads = [threading.Thread(target=self._loop, name=f"opwarden-blas-{i}",
                                         daemon=True) for i in range(n)]
        for t in self.threads:
            t.start()

    def _loop(self) -> None:
        seen = 0
        while True:
            with self.cv:
                while self.posted == seen:
                    self.cv.wait()
                seen, job = self.posted, self.job
            if job is not None:
                job.work()

    def post(self, job: _Job) -> None:
        with self.cv:
            self.job = job
            self.posted += 1
            self.cv.notify_all()


_HELPERS: list[_Helpers] = []


def _helpers(n: int) -> _Helpers:
    h = _HELPERS[0] if _HELPERS else None
    if h is None or h.pid != os.getpid() or len(h.threads) < n:
        h = _Helpers(n)  # (after a fork the old threads are gone; fewer: a bigger set)
        _HELPERS[:] = [h]
    return h


def run_chunks(fn: Callable[[int], None], n: int) -> bool:
    """fn(0) .. fn(n-1), each on whichever of this thread and the helpers claims it first,
    with OpenBLAS on one thread meanwhile; True when done so, False (nothing run) where the
    caller should run the work itself: splitting off, OpenBLAS on one thread, or another
    region running."""
    if not SPLIT or n < 2 or not _REGION.acquire(blocking=False):
        return False
    try:
        threads = blas_thread_count()
        if threads < 2:
            return False
        job = _Job(fn, n)
        helpers = _helpers(threads - 1)
        set_blas_threads(1)
        try:
            helpers.post(job)
            job.work()
            job.done.wait()
        finally:
            set_blas_threads(threads)
    finally:
        _REGION.release()
    if job.error is not None:
        raise job.error
    return True


def _chunks(total: int, parts: int, align: int = 1) -> list[tuple[int, int]]:
    """[start, stop) ranges cutting range(total) into about `parts` pieces, starts aligned."""
    step = -(-total // max(1, parts))
    step = -(-step // align) * align
    return [(s, min(total, s + step)) for s in range(0, total, step)]


def _ld(a: np.ndarray) -> tuple[bool, int] | None:
    """(transposed, leading dimension) of a 2-D float32 matrix BLAS reads in place."""
    r, c = a.shape
    s0, s1 = a.strides
    if (s1 == 4 or c == 1) and s0 % 4 == 0 and s0 >= 4 * c:
        return False, max(1, s0 // 4) if r > 1 else max(1, c)
    if (s0 == 4 or r == 1) and s1 % 4 == 0 and s1 >= 4 * r:
        return True, max(1, s1 // 4) if c > 1 else max(1, r)
    return None


def _n_chunks(mnk: int) -> int:
    threads = blas_thread_count()
    return max(1, min(threads * CHUNKS_PER_THREAD, mnk // CHUNK_MIN_MNK))


def split_gemm(a: np.ndarray, b: np.ndarray, y: np.ndarray,
               epilogue: Callable[[int, int], None] | None = None) -> bool:
    """y = a @ b for 2-D float32 operands (either may be a transposed view) into y (unit
    inner stride), in column blocks of y claimed by this thread and the helpers; after each
    block's product `epilogue(c0, c1)` (if given) finishes columns c0:c1 while they are in
    cache. False (nothing written) where it does not apply: a small product, operands BLAS
    cannot read in place, or no region (run_chunks); the caller then computes y itself."""
    if not SPLIT or a.ndim != 2 or b.ndim != 2 or y.ndim != 2:
        return False
    m, k = a.shape
    n = b.shape[1]
    if m * n * k < SPLIT_MIN_MNK or n < 32 or b.shape[0] != k or y.shape != (m, n):
        return False
    gemm = sgemm()
    ta, tb = _ld(a), _ld(b)
    if (gemm is None or ta is None or tb is None or a.dtype != F32 or b.dtype != F32
            or y.dtype != F32 or y.strides[1] != 4 or y.strides[0] % 4
            or (m > 1 and y.strides[0] < 4 * n)):
        return False
    ldc = y.strides[0] // 4 if m > 1 else n
    ap, bp, yp = a.ctypes.data, b.ctypes.data, y.ctypes.data
    blocks = _chunks(n, _n_chunks(m * n * k), 16)  # (16 floats: whole 64-byte lines)
    bs1 = b.strides[1]

    def block(i: int) -> None:
        c0, c1 = blocks[i]
        gemm(m, c1 - c0, k, ap, ta[1], bp + c0 * bs1, tb[1], 0.0, yp + 4 * c0, ldc,
             ta[0], tb[0])
        if epilogue is not None:
            epilogue(c0, c1)

    return run_chunks(block, len(blocks))


def split_batched(a: np.ndarray, b: np.ndarray, y: np.ndarray,
                  batch: Sequence[int]) -> bool:
    """y = a @ b for stacked float32 operands (NumPy's broadcasting over the leading axes,
    `batch` their broadcast shape) into y, the stacked products shared out by entry. False
    (nothing written) where it does not apply (see split_gemm)."""
    if not SPLIT or a.ndim < 2 or b.ndim < 2 or y.ndim != len(batch) + 2:
        return False
    m, k = a.shape[-2:]
    n = b.shape[-1]
    entries = int(np.prod(batch, dtype=np.int64))
    mnk = m * n * k * entries
    if mnk < SPLIT_MIN_MNK or entries < 2 or a.dtype != F32 or b.dtype != F32:
        return False
    ab = np.broadcast_to(a, (*batch, m, k))
    bb = np.broadcast_to(b, (*batch, k, n))
    idx = list(np.ndindex(*batch))
    groups = _chunks(entries, _n_chunks(mnk))

    def group(i: int) -> None:
        for j in range(*groups[i]):
            np.matmul(ab[idx[j]], bb[idx[j]], out=y[idx[j]])

    return run_chunks(group, len(groups))
