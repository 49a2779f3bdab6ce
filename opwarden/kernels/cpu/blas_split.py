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

Only where `configure` set the threads (a session's intra_op_num_threads): OpenBLAS then
stays on one thread, so that a product too small to split, or a BLAS bias add, never waits on
a sleeping worker either. Helpers: `threads - 1` daemon threads, started on first use and
again after a fork. One region runs at a time in the process (the parallel executor's
concurrent kernels take turns, each on every thread). The chunks do not depend on the thread
count, so neither do the results.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Sequence

import numpy as np

from opwarden.blas import blas_thread_count, set_blas_threads, set_split_threads, sgemm

F32 = np.dtype(np.float32)

# Opt-in (OPWARDEN_BLAS_SPLIT=1): it wins where cores are contended (a worker OpenBLAS waits
# for is descheduled) and loses on a quiet machine, where OpenBLAS's own threads are faster
# (benchmarks/NOTES.md). Off: every product is one BLAS call on OpenBLAS's threads.
SPLIT = os.environ.get("OPWARDEN_BLAS_SPLIT", "0").strip().lower() not in (
    "0", "false", "no", "off", "")
# Products below this many multiply-adds (m*n*k, ~25 us on one core) stay one call: the
# region's fixed cost (a wake-up, the claims; without configure() two thread-count switches)
# would eat what a second thread saves.
SPLIT_MIN_MNK = 1 << 21
# At most this many chunks (more: less held up by a late helper, more calls), each of at least
# CHUNK_MIN_MNK multiply-adds. Not scaled by the thread count: the same chunks, the same bits.
MAX_CHUNKS = 8
CHUNK_MIN_MNK = 1 << 20

_REGION = threading.Lock()
_LOCAL = threading.local()  # .inside: this thread runs a region's chunks
# The threads a region uses when configure() set them (OpenBLAS then stays on one thread, so
# that no product left whole waits on a worker either); 0: OpenBLAS's count, switched to one
# for the region's length.
_THREADS = [0]


def configure(threads: int) -> None:
    """Use `threads` threads (the session's intra-op count) for split products and keep
    OpenBLAS on one thread, so that every BLAS call left whole (below the split threshold,
    a bias add) runs on the calling thread rather than waiting on a worker's wake-up. One
    thread still runs the products in the same chunks, in turn: results do not depend on
    the thread count. Splitting off (OPWARDEN_BLAS_SPLIT=0) or `threads` < 1: OpenBLAS
    simply gets `threads` (at least one)."""
    if SPLIT and threads >= 1:
        _THREADS[0] = threads
        set_blas_threads(1)
    else:
        _THREADS[0] = 0
        set_blas_threads(max(1, threads))
    set_split_threads(_THREADS[0])


def split_threads() -> int:
    """Threads a split product runs on now (1: none is split)."""
    return _THREADS[0] if _configured() else 1


def _configured() -> bool:
    # (OpenBLAS back on several threads: someone set it since, e.g. a session without
    # splitting; its threads then run every product whole)
    return _THREADS[0] >= 1 and blas_thread_count() == 1


class _Job:
    """Chunks 0..n-1 of fn, claimed in order by whichever thread asks first. (Counters whose
    next() is atomic under the GIL and one lock as the done signal: an Event and a lock per
    chunk cost more than a small chunk's GEMM.)"""

    __slots__ = ("fn", "n", "claims", "finished", "done", "error")

    def __init__(self, fn: Callable[[int], None], n: int) -> None:
        self.fn, self.n = fn, n
        self.claims = itertools.count()
        self.finished = itertools.count(1)
        self.done = threading.Lock()
        self.done.acquire()  # (released by whoever finishes the last chunk)
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
                if next(self.finished) == self.n:
                    self.done.release()

    def wait(self) -> None:
        self.done.acquire()


class _Helpers:
    """Daemon threads that join each posted job. Each waits on a lock of its own that a post
    releases (cheaper than a Condition: its wait allocates a lock per call)."""

    def __init__(self, n: int) -> None:
        self.pid = os.getpid()
        self.job: _Job | None = None
        self.go = [threading.Lock() for _ in range(n)]
        for g in self.go:
            g.acquire()
        self.threads = [threading.Thread(target=self._loop, args=(g,), daemon=True,
                                         name=f"opwarden-blas-{i}")
                        for i, g in enumerate(self.go)]
        for t in self.threads:
            t.start()

    def _loop(self, go: threading.Lock) -> None:
        _LOCAL.inside = True
        while True:
            go.acquire()
            job = self.job
            if job is not None:
                job.work()

    def post(self, job: _Job) -> None:
        self.job = job
        for g in self.go:
            try:
                g.release()
            except RuntimeError:  # (still signalled from an earlier post: it reads this job)
                pass


_HELPERS: list[_Helpers] = []


def _after_fork() -> None:
    # A forked child has none of the helpers, and a region lock held by another thread of
    # the parent would never be released there.
    global _REGION
    _REGION = threading.Lock()
    _HELPERS.clear()
    _LOCAL.inside = False


os.register_at_fork(after_in_child=_after_fork)


def _helpers(n: int) -> _Helpers:
    h = _HELPERS[0] if _HELPERS else None
    if h is None or h.pid != os.getpid() or len(h.threads) < n:
        h = _Helpers(n)  # (after a fork the old threads are gone; fewer: a bigger set)
        _HELPERS[:] = [h]
    return h


def run_chunks(fn: Callable[[int], None], n: int) -> bool:
    """fn(0) .. fn(n-1), each on whichever of this thread and the helpers claims it first;
    False (nothing run) where the caller should run the work whole: splitting off or not
    configured (OpenBLAS then keeps its own threads, never switched under a call running on
    another thread: that would change its rounding, and OpenBLAS's thread count is not safe
    to change under a running call), or a single chunk. From inside a region (a chunk's own
    work) the chunks run here in turn, and a region running on another thread is waited for:
    every chunk is the same single-threaded BLAS call, so the result does not depend on the
    thread count or on concurrent callers (`opwarden check`'s concurrency check compares
    bits)."""
    threads = _THREADS[0]
    if not SPLIT or n < 2 or not _configured():
        return False
    if threads < 2 or getattr(_LOCAL, "inside", False):
        for i in range(n):
            fn(i)
        return True
    with _REGION:
        job = _Job(fn, n)
        helpers = _helpers(threads - 1)
        _LOCAL.inside = True
        try:
            helpers.post(job)
            job.work()
            job.wait()
        finally:
            _LOCAL.inside = False
    if job.error is not None:
        raise job.error
    return True


def splits(mnk: int) -> bool:
    """Whether a product of `mnk` multiply-adds would be shared out here (so OpenBLAS's own
    threads did not run it and are not left awake by it)."""
    return SPLIT and mnk >= SPLIT_MIN_MNK and _configured()


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
    return max(1, min(MAX_CHUNKS, mnk // CHUNK_MIN_MNK))


def split_gemm(a: np.ndarray, b: np.ndarray, y: np.ndarray,
               epilogue: Callable[[int, int, int, int], None] | None = None,
               accumulate: bool = False) -> bool:
    """y = a @ b (y += a @ b when `accumulate`) for 2-D float32 operands (either may be a
    transposed view) into y (unit inner stride), in blocks of y claimed by this thread and
    the helpers: blocks of rows where y has at least as many rows as columns (each block
    packs b again: the smaller operand), else of columns. After each block's product
    `epilogue(r0, r1, c0, c1)` (if given) finishes y[r0:r1, c0:c1] while it is in cache.
    False (nothing written) where it does not apply: a small product, operands BLAS cannot
    read in place, or no region (run_chunks); the caller then computes y itself."""
    if not SPLIT or a.ndim != 2 or b.ndim != 2 or y.ndim != 2:
        return False
    m, k = a.shape
    n = b.shape[1]
    if m * n * k < SPLIT_MIN_MNK or b.shape[0] != k or y.shape != (m, n):
        return False
    gemm = sgemm()
    ta, tb = _ld(a), _ld(b)
    if (gemm is None or ta is None or tb is None or a.dtype != F32 or b.dtype != F32
            or y.dtype != F32 or y.strides[1] != 4 or y.strides[0] % 4
            or (m > 1 and y.strides[0] < 4 * n)):
        return False
    ldc = y.strides[0] // 4 if m > 1 else n
    ap, bp, yp = a.ctypes.data, b.ctypes.data, y.ctypes.data
    (as0, _), (_, bs1) = a.strides, b.strides
    parts = _n_chunks(m * n * k)
    by_rows = m >= n
    beta = 1.0 if accumulate else 0.0
    # (16 floats: column blocks of whole 64-byte lines)
    blocks = _chunks(m, parts) if by_rows else _chunks(n, parts, 16)

    def block(i: int) -> None:
        r0, r1, c0, c1 = (*blocks[i], 0, n) if by_rows else (0, m, *blocks[i])
        gemm(r1 - r0, c1 - c0, k, ap + r0 * as0, ta[1], bp + c0 * bs1, tb[1], beta,
             yp + 4 * (r0 * ldc + c0), ldc, ta[0], tb[0])
        if epilogue is not None:
            epilogue(r0, r1, c0, c1)

    return run_chunks(block, len(blocks))


def over_rows(rows: int, mnk: int, fn: Callable[[int, int], None]) -> None:
    """fn(r0, r1) over blocks of range(rows) shared out by run_chunks when the work (`mnk`
    multiply-adds in all) is large enough, else fn(0, rows) here. For kernels whose GEMMs
    accumulate into the same output rows (a convolution's taps): each block runs all of its
    rows' GEMMs on one thread, so the accumulation order is the unsplit one."""
    if SPLIT and rows >= 2 and mnk >= SPLIT_MIN_MNK:
        blocks = _chunks(rows, min(rows, _n_chunks(mnk)))
        if run_chunks(lambda i: fn(*blocks[i]), len(blocks)):
            return
    fn(0, rows)


def share(n: int, block: int, mnk: int, run: Callable[[tuple[int, int], int], None]) -> None:
    """run(span, threads) over range(n) for a compiled elementwise or row kernel (SiLU, Gelu,
    LayerNorm rows): without split threads one call, OpenMP on OpenBLAS's thread count (over
    blocks of `block`, over_rows would run it all on this thread); with them, blocks of
    `block` shared out by over_rows (`mnk`: the work in multiply-adds), each call on one
    thread."""
    if split_threads() <= 1:
        run((0, n), blas_thread_count())
        return
    over_rows(-(-n // block), mnk, lambda b0, b1: run((b0 * block, min(b1 * block, n)), 1))


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

