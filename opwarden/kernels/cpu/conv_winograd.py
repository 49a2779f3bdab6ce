"""Winograd F(4x4, 3x3) for NHWC 3x3 stride-1 convolutions with constant, finite weights.

The input tiles of a band are transformed by one GEMM, multiplied by the transformed weights
(cached with W) in one batched matmul and transformed back by one GEMM (_winograd_nhwc): 4x
fewer multiplications than the direct convolution. try_winograd declines, and the caller
takes the direct path, for weights that may change between calls and for non-finite inputs.
"""

from __future__ import annotations

import os

import numpy as np

from opwarden.kernels.cpu.blas_split import split_batched, split_gemm
from opwarden.kernels.cpu.conv_common import Facts, _band_rows, _finite, _hot
from opwarden.kernels.cpu.util import F32, add_rows, apply_activation, packed, scratch
from opwarden.memory.constants import is_constant

# Winograd (see _winograd_nhwc and wino_tile): on when True. It pays where the GEMMs are large
# against the weights, whose transformed copy is 4x larger and streams from memory on every
# call: at least WINO_MIN_TILES 4x4 output tiles with C*M >= WINO_MIN_CM, or WINO_WIDE_TILES
# with C*M >= WINO_WIDE_MIN_CM; smaller maps and channel counts stay direct.
# OPWARDEN_WINOGRAD=0 in the environment turns it off (results then match the direct sums to
# float32 rounding instead of ~1e-5 relative, and the transformed weights are not held).
WINOGRAD = os.environ.get("OPWARDEN_WINOGRAD", "1").strip().lower() not in (
    "0", "false", "no", "off")
WINO_MIN_TILES = 49
WINO_MIN_CM = 1 << 15
WINO_WIDE_TILES = 784
WINO_WIDE_MIN_CM = 1 << 12
# Bands of about this many bytes per transformed buffer.
WINO_BAND_BYTES = 4 << 20
# The weight transform's float64 temporaries stay under about this many bytes.
WINO_PACK_BLOCK = 8 << 20


def try_winograd(x, W, begin, y, bias, z, activation, params) -> bool:
    """Run the convolution by Winograd into y; False (nothing written) where it declines:
    weights computed at run time, or a NaN or Inf in X, W or the bias."""
    tile = wino_tile(x.shape[3], y.shape[3], y.shape[1], y.shape[2])
    u = _winograd_weights(W, tile)
    if u is None or not _finite(x) or (bias is not None and not _finite(bias)):
        return False
    _winograd_nhwc(x, u, tile, begin, y, bias, z, activation, params)
    return True


def winograd_floats(f: Facts) -> int:
    m = f.w[0]
    c = f.x[3]
    t = wino_tile(c, m, f.oh, f.ow)
    if not t:
        return 0
    a2 = (t + 2) ** 2
    th, tw = -(-f.oh // t), -(-f.ow // t)
    rows = _band_rows(th, WINO_BAND_BYTES, a2 * tw * max(m, c) * 4)
    tiles = rows * tw
    return (th * t + 2) * (tw * t + 2) * c + tiles * (2 * a2 * c + a2 * m + t * t * m)


# Winograd F(m x m, 3x3) (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks",
# 2016): an (m+2)^2 input tile d gives an m x m output tile A^T [(G g G^T) * (B^T d B)] A, with
# (m+2)^2 multiplications per tile and channel pair instead of 9 m^2. F(4x4, 3x3): points 0,
# +-1, +-2 and infinity, 4x fewer. (F(2x2, 3x3), 2.25x fewer with smaller constants, is slower
# than the direct convolution on the zoo's shapes, so it is not offered.)
_WINO_MATS = {
    4: ([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
         [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]],
        [[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
         [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]],
        [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]),
}


def _wino_transforms(m: int):
    """(B^T (x) B^T, G, A^T (x) A^T, bias index) for F(m x m, 3x3). Both 2-D transforms as one
    matrix each (Kronecker products), so each is a single GEMM over all tiles and channels of a
    band: ((m+2)^2 x (m+2)^2) @ ((m+2)^2 x tiles*C) in, (m^2 x (m+2)^2) @ (... x tiles*M) out.
    (As fast as two separable stages with their extra pass.) A^T's column 1 is all
    ones, so a bias added to transformed element (1, 1) reaches every output of the tile
    unchanged: one small add per band."""
    bt, g, at = (np.array(a, np.float64) for a in _WINO_MATS[m])
    return np.kron(bt, bt).astype(F32), g, np.kron(at, at).astype(F32), m + 2 + 1


_WINO = {m: _wino_transforms(m) for m in _WINO_MATS}


def wino_tile(c: int, m: int, oh: int, ow: int) -> int:
    """The Winograd output tile for a 3x3 stride-1 convolution of C -> M channels onto an
    OH x OW map: 4 for F(4x4, 3x3), 0 for the direct convolution."""
    tiles = -(-oh // 4) * -(-ow // 4)
    if c * m >= WINO_MIN_CM and tiles >= WINO_MIN_TILES:
        return 4
    if c * m >= WINO_WIDE_MIN_CM and tiles >= WINO_WIDE_TILES:
        return 4
    return 0


def _winograd_weights(W, tile: int) -> np.ndarray | None:
    """U[p*a + q] = (G W[k, c] G^T)[p, q] as (a*a, C, M) float32 (a = tile + 2), computed in
    float64 and cached with W; None when W may change between calls (packing is the costly
    part) or is not finite (a NaN or Inf weight would reach every output of a tile, not just
    its own)."""
    if not is_constant(W):
        return None

    g = _WINO[tile][1]

    def build(w):
        m, c = w.shape[:2]
        u = np.empty((g.shape[0] ** 2, c, m), F32)
        # In blocks of output channels: the float64 product of a whole 512x512 layer would be
        # a 75 MB temporary next to everything else resident at the first run.
        step = max(1, WINO_PACK_BLOCK // max(1, g.shape[0] ** 2 * c * 8))
        for k0 in range(0, m, step):
            k1 = min(m, k0 + step)
            part = np.einsum("pa,kcab,qb->pqck", g, np.asarray(w[k0:k1], np.float64), g)
            u[:, :, k0:k1] = part.reshape(-1, c, k1 - k0)
        return u if np.isfinite(u).all() else u[:0]

    u = packed(W, ("wino", tile), build)
    return u if u.size else None


def _winograd_nhwc(x, u, t, begin, y, bias, z, activation, params) -> None:
    """3x3 stride-1 convolution by Winograd F(t x t, 3x3), in bands of t-row output tiles.

    Per band: the (t+2)^2 input tiles (stride t) of the zero-padded image are gathered into an
    (a*a, tiles*C) matrix (a = t+2) by one strided copy, transformed by one GEMM, multiplied by
    the transformed weights in a*a GEMMs of (tiles x C) @ (C x M) (one batched np.matmul), the
    bias added to one of the products, transformed back by one GEMM and scattered to the
    output. Those GEMMs carry 2.25x (t=2) or 4x (t=4) fewer multiplications than the direct
    convolution.

    Numerics: differences to the direct sum are of the order of float32 rounding times the
    transform's constants (measured relative error 3e-6 to 9e-6 of the largest output). The
    caller only comes here with finite inputs and weights: a NaN or Inf would spread to the whole
    tile (the transforms mix every input of a tile), where the direct convolution confines
    it to the outputs that read it."""
    n, h, w, c = x.shape
    oh, ow, m = y.shape[1:]
    bb, _g, aa, bidx = _WINO[t]
    a = t + 2
    a2 = a * a
    th, tw = -(-oh // t), -(-ow // t)
    hp, wp = th * t + 2, tw * t + 2
    bt, bl = begin
    h1, w1 = min(h, hp - bt), min(w, wp - bl)
    e = 4
    rows = _band_rows(th, WINO_BAND_BYTES, a2 * tw * max(m, c) * e)
    for i in range(n):
        xp = scratch("conv.wpad", (hp, wp, c))
        xp[:bt] = 0
        xp[bt + h1:] = 0
        xp[bt:bt + h1, :bl] = 0
        xp[bt:bt + h1, bl + w1:] = 0
        xp[bt:bt + h1, bl:bl + w1] = x[i, :h1, :w1]
        for t0 in range(0, th, rows):
            t1 = min(th, t0 + rows)
            nb = t1 - t0
            tiles = nb * tw
            d = scratch("conv.wd", (a2, tiles * c))
            np.copyto(d.reshape(a, a, nb, tw, c), np.ndarray(
                (a, a, nb, tw, c), F32, xp, t0 * t * wp * c * e,
                (wp * c * e, c * e, t * wp * c * e, t * c * e, e)))
            v = scratch("conv.wv", (a2, tiles, c))
            if not split_gemm(bb, d, v.reshape(a2, tiles * c)):
                np.matmul(bb, d, out=v.reshape(a2, tiles * c))
            prod = scratch("conv.wm", (a2, tiles, m))
            if not split_batched(v, u, prod, (a2,)):
                np.matmul(v, u, out=prod)
            if bias is not None:
                add_rows(prod[bidx], bias, _hot(tiles, m, c))
            o = scratch("conv.wo", (t * t, tiles * m))
            if not split_gemm(aa, prod.reshape(a2, tiles * m), o):
                np.matmul(aa, prod.reshape(a2, tiles * m), out=o)
            r0, r1 = t0 * t, min(oh, t1 * t)
            yb = y[i, r0:r1]
            zb = None if z is None else z[i, r0:r1]
            if zb is None:
                apply_activation(o, activation, params)  # contiguous: the fast loops
            o5 = o.reshape(t, t, nb, tw, m).transpose(2, 0, 3, 1, 4)  # (ty, p, tx, q, M)
            if r1 - r0 == nb * t and ow == tw * t:
                y5 = yb.reshape(nb, t, tw, t, m)
                if zb is None:
                    np.copyto(y5, o5)
                else:
                    np.add(o5, zb.reshape(y5.shape), out=y5)
            else:  # a partial last tile row or column: one copy per tile position
                for p in range(t):
                    rp = len(range(p, r1 - r0, t))
                    for q in range(t):
                        cq = len(range(q, ow, t))
                        if zb is None:
                            np.copyto(yb[p::t, q::t], o5[:rp, p, :cq, q])
                        else:
                            np.add(o5[:rp, p, :cq, q], zb[p::t, q::t], out=yb[p::t, q::t])
            if zb is not None:
                apply_activation(yb, activation, params)
