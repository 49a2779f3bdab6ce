"""SoftmaxAttention in blocks of score rows that stay in cache: softmaxattention.cpu.blocked.

The unfused graph writes the (..., S, T) score matrix to memory once per node (MatMul, the
scale, the mask Add, Softmax, then reads it for the second MatMul): at Whisper's 1500 frames
that is 72 MB a layer, each pass memory-bound. Here a block of rows of one or more heads (about
BLOCK_FLOATS scores) goes from Q @ Kt through the scale, the bias, the row maxima and the
exponentials to its rows of the output while it is in L2. The softmax normalization is applied
to the (rows, Hv) product rather than to the (rows, T) exponentials (Hv << T): the result
differs from the reference by float32 rounding only. Blocks are shared out by blas_split's
region when it is on (each block independent, its products single-threaded), else by a small
pool of this module's own with OpenBLAS on one thread meanwhile (see _run_blocks).
"""

from __future__ import annotations

import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from opwarden import native
from opwarden.blas import blas_thread_count, compute_threads, set_blas_threads
from opwarden.errors import KernelError
from opwarden.kernels.cpu import blas_split
from opwarden.kernels.cpu.util import is_f32, output, scratch
from opwarden.ops.base import REGISTRY

# Scores per block: 128 KiB of float32 (plus its exponentials in place), within L2 alongside
# the block's Q rows and the reused Kt / V panels.
BLOCK_FLOATS = 1 << 15
# ... but at least BLOCK_MIN_ROWS query rows where a head has them: the block's products are
# (rows x H) @ (H x T) and (rows x T) @ (T x Hv), and at long T few rows starve them (Whisper's
# 1500 keys: 21-row blocks 76 GFLOP/s, 256-row blocks, 1.5 MB of scores in L3, 132); yet at
# least MIN_BLOCKS blocks where the rows allow, for the threads to share.
BLOCK_MIN_ROWS = 256
MIN_BLOCKS = 8


def _block_shape(g: int, s: int, t: int) -> tuple[int, int]:
    """(heads, rows) of a full block: whole heads grouped when a head's scores are small,
    else rows of one head."""
    if s * t >= BLOCK_FLOATS:
        rows = max(BLOCK_MIN_ROWS, BLOCK_FLOATS // t)
        return 1, max(1, min(s, rows, max(BLOCK_FLOATS // t, -(-g * s // MIN_BLOCKS))))
    return min(g, max(1, BLOCK_FLOATS // max(1, s * t))), s


def _blocks(g: int, s: int, t: int) -> list[tuple[int, int, int, int]]:
    """(j0, j1, r0, r1) blocks over `g` heads of `s` query rows each (see _block_shape)."""
    per, step = _block_shape(g, s, t)
    return [(j, min(g, j + per), r, min(s, r + step)) for j in range(0, g, per)
            for r in range(0, s, step)]


def _lead(Q, Kt, V, biases, s: int, t: int) -> tuple[tuple[int, ...], int]:
    """The broadcast batch shape of the operands and the biases against the scores, and the
    query rows (a bias may broadcast a single query row to several, as the Add would)."""
    try:
        lead = np.broadcast_shapes(Q.shape[:-2], Kt.shape[:-2], V.shape[:-2])
        for b in biases:
            full = np.broadcast_shapes((*lead, s, t), b.shape)
            if full[-1] != t:
                raise ValueError(f"bias {b.shape} widens the scores' {t} keys")
            lead, s = full[:-2], full[-2]
    except ValueError as e:
        raise KernelError(
            f"SoftmaxAttention: shapes Q {Q.shape}, Kt {Kt.shape}, V {V.shape}, bias/mask "
            f"{[b.shape for b in biases]} do not broadcast: {e}") from None
    return tuple(lead), s


def _bcast(x: np.ndarray, shape: tuple) -> np.ndarray:
    """x broadcast to `shape` (x itself when it has it: np.broadcast_to costs ~4 us a call,
    a decode step's whole attention is ~20 us of work)."""
    return x if x.shape == shape else np.broadcast_to(x, shape)


def softmax_attention(Q, Kt, V, bias=None, mask=None, *, scale=1.0, divide=0, out=None):
    """softmax(scale(Q @ Kt) + bias + mask) @ V in row blocks (see the module docstring)."""
    if Q.ndim < 2 or Kt.ndim < 2 or V.ndim < 2:
        raise KernelError(f"SoftmaxAttention needs Q, Kt, V of rank >= 2, got shapes "
                          f"{Q.shape}, {Kt.shape}, {V.shape}")
    h = Q.shape[-1]
    t = Kt.shape[-1]
    if Kt.shape[-2] != h or V.shape[-2] != t:
        raise KernelError(f"SoftmaxAttention: Q {Q.shape}, Kt {Kt.shape} and V {V.shape} do not "
                          "chain as (S, H) @ (H, T) @ (T, Hv)")
    hv = V.shape[-1]
    given = [x for x in (bias, mask) if x is not None]
    lead, s = _lead(Q, Kt, V, given, Q.shape[-2], t)
    y = output(out, (*lead, s, hv))
    if y.size == 0:
        return y
    if t == 0:
        y.fill(np.nan)  # a softmax over no keys: 0/0, as the reference
        return y
    # Views with one leading axis at least; the last one is where heads group. Broadcasting
    # views, never copies: the transposed head views BLAS reads in place.
    ld = lead or (1,)
    q = _bcast(Q, (*ld, s, h))
    kt = _bcast(Kt, (*ld, h, t))
    v = _bcast(V, (*ld, t, hv))
    y4 = y.reshape(*ld, s, hv)
    bs = [_bcast(x, (*ld, s if x.ndim >= 2 and x.shape[-2] == s else 1, t))
          for x in given]
    c = np.float32(1.0 / float(scale) if divide else float(scale))
    outer = list(np.ndindex(*ld[:-1]))
    inner = _blocks(ld[-1], s, t)
    blocks = [(o, blk) for o in outer for blk in inner]
    # The compiled softmax rows read each bias in place: its own C-contiguous float32 array
    # and, per block, the offset and (head, row) strides of the block's view into it (keys
    # contiguous; a bias broadcast along the keys stays on the NumPy passes).
    bases = None
    if native.available() and all(x.dtype == np.float32 for x in given):
        bases = [np.ascontiguousarray(x) for x in given]
        bviews = [_bcast(b, x.shape) for b, x in zip(bases, bs)]
        if not all(w.strides[-1] == 4 for w in bviews):
            bases = None

    def bias_at(k: int, o: tuple, j0: int, j1: int, r0: int, r1: int) -> tuple:
        w = bviews[k][o][j0:j1, r0:r1] if bviews[k].shape[-2] == s else bviews[k][o][j0:j1]
        base = bases[k]
        rs = w.strides[1] // 4 if w.shape[1] > 1 else 0
        return base, (w.ctypes.data - base.ctypes.data) // 4, w.strides[0] // 4, rs

    def run(i: int) -> None:
        o, (j0, j1, r0, r1) = blocks[i]
        n, m = j1 - j0, r1 - r0
        sc = scratch("attention.scores", (n, m, t))
        mx = scratch("attention.max", (n, m, 1))
        np.matmul(q[o][j0:j1, r0:r1], kt[o][j0:j1], out=sc)
        if bases is not None:
            native.softmax_rows(sc, c, [bias_at(k, o, j0, j1, r0, r1)
                                        for k in range(len(bases))], mx)
            yb = y4[o][j0:j1, r0:r1]
            np.matmul(sc, v[o][j0:j1], out=yb)
            yb *= mx
            return
        if c != 1.0:
            sc *= c
        for b in bs:
            sc += b[o][j0:j1, r0:r1] if b.shape[-2] == s else b[o][j0:j1]
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            # fmax skips NaN where maximum returns it; a NaN row still comes out NaN through
            # its sum. A row of -inf gives -inf - -inf = NaN, as the reference.
            np.fmax.reduce(sc, axis=2, keepdims=True, out=mx)
            sc -= mx
            np.exp(sc, out=sc)
            yb = y4[o][j0:j1, r0:r1]
            np.matmul(sc, v[o][j0:j1], out=yb)
            np.sum(sc, axis=2, keepdims=True, out=mx)
            np.reciprocal(mx, out=mx)
            yb *= mx

    if not blas_split.run_chunks(run, len(blocks)):
        _run_blocks(run, len(blocks), q.shape[-2] * t * (h + hv) * len(outer) * ld[-1])
    return y


# OpenBLAS's own threads split each product statically and wait for every worker: over the
# hundreds of block products of one call, a worker the scheduler has not woken holds up each
# of them (a Whisper layer went from ~0.1 s to 0.5-15 s on a busy machine). So the block
# products run single-threaded, the blocks themselves shared by `compute_threads()` threads
# (NumPy releases the GIL in matmul and the ufuncs); OpenBLAS's count is restored after.
# Below PARALLEL_MIN_MAC multiply-adds the blocks run here in turn, OpenBLAS untouched.
PARALLEL_MIN_MAC = 1 << 22
_POOL: list[tuple[int, int, ThreadPoolExecutor]] = []  # (pid, workers, pool)
_SWITCH = threading.Lock()


def _pool(workers: int) -> ThreadPoolExecutor:
    if not _POOL or _POOL[0][0] != os.getpid() or _POOL[0][1] < workers:
        _POOL[:] = [(os.getpid(), workers, ThreadPoolExecutor(workers, "opwarden-attention"))]
    return _POOL[0][2]


def _run_blocks(run, n: int, mac: int) -> None:
    threads = compute_threads()
    if mac < PARALLEL_MIN_MAC or n < 2 or not _SWITCH.acquire(blocking=False):
        for i in range(n):
            run(i)
        return
    try:
        prev = blas_thread_count()
        if prev > 1:
            set_blas_threads(1)
        try:
            claims = itertools.count()

            def work() -> None:
                for i in iter(claims.__next__, None):
                    if i >= n:
                        return
                    run(i)

            helpers = [_pool(threads - 1).submit(work) for _ in range(threads - 1)]
            work()
            for f in helpers:
                f.result()
        finally:
            if prev > 1:
                set_blas_threads(prev)
    finally:
        _SWITCH.release()


def _workspace(q, kt, v, *_, **__) -> int:
    """One block of scores and its row maxima."""
    if not q or not kt or not all(isinstance(d, int) for d in (q[-2], kt[-1])):
        return 0
    s, t = q[-2], kt[-1]
    # the heads axis the blocks run over: the broadcast of the operands' (the block grows with
    # it; unknown: as large as it gets)
    heads = [f[-3] if len(f) > 2 else 1 for f in (q, kt, v)]
    g = max(heads) if all(isinstance(d, int) for d in heads) else 1 << 20
    per, rows = _block_shape(g, s, t)
    return 4 * per * rows * (t + 1)


def _ok(q, kt, v, *rest, **attrs) -> bool:
    facts = [q, kt, v, *(f for f in rest if f is not None)]
    return (is_f32(*facts) and all(f.shape is not None and len(f.shape) >= 2
                                   for f in (q, kt, v)))


def register() -> None:
    """Register the blocked SoftmaxAttention variant."""
    opdef = REGISTRY.latest("SoftmaxAttention", "opwarden")
    assert opdef is not None  # (ops/fused_attention.py registers it on import)
    opdef.kernel(
        "cpu", dtypes=["float32"], priority=10, accepts_out=True,
        name="softmaxattention.cpu.blocked", when=_ok, workspace_bytes=_workspace,
    )(softmax_attention)
