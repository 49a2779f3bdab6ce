"""The row-tap NHWC convolution: k x k kernels with row stride 1, one GEMM per kernel row.

Each band of the padded input is copied once as rows of kw taps side by side, so kernel row a
is a plain GEMM of K = kw*C over a row range of that copy (see _rowtap_nhwc). FusedConv's
branches skip W's structural zeros here too (conv_common._branch_plan).
"""

from __future__ import annotations

import numpy as np

from opwarden.blas import sgemm
from opwarden.kernels.cpu import packed_gemm
from opwarden.kernels.cpu.blas_split import over_rows
from opwarden.kernels.cpu.conv_common import (
    Facts,
    _band_rows,
    _branch1x1_weights,
    _epilogue,
    _hot,
    _packed_nhwc_c,
    _pad_nhwc,
)
from opwarden.kernels.cpu.conv_gemm import _packed_taps, _prefill
from opwarden.kernels.cpu.util import F32, ptr, scratch

# Row-tap path: on when True, for kernel rows of at least ROWTAP_MIN_RUN floats (kw * C) over
# at least ROWTAP_MIN_PIXELS output pixels, in bands of about ROWTAP_BAND_BYTES (row copies
# plus output).
ROWTAP = True
ROWTAP_MIN_RUN = 32
ROWTAP_MIN_PIXELS = 196
ROWTAP_BAND_BYTES = 3 << 20


def nhwc_rowtap(x, W, B, s, d, begin, end, y, bias, z, activation, params, shuffle,
                bplan) -> None:
    """k x k convolution with row stride 1 (see _rowtap_nhwc); reads z before writing y."""
    _rowtap_nhwc(x, W, s, d, begin, end, W.shape[2:], y, bias, z, activation, params, bplan)


def rowtap_floats(f: Facts) -> int:
    m, cg, kh, kw = f.w
    c = f.x[3]
    rows = _band_rows(f.oh, ROWTAP_BAND_BYTES, f.ow * (kw * c + m) * 4)
    band = (rows + (kh - 1) * f.d[0]) * f.ow * kw * c
    return f.padded + band + kh * kw * cg * m + (c * m if f.bplan else 0)


def _rowtap_nhwc(x, W, s, d, begin, end, khw, y, bias, z, activation, params, bplan) -> None:
    """k x k convolution with row stride 1 as one accumulating GEMM per kernel row: each band
    of the padded input is copied once as R[r, j] = (x[r, j*s1 + b*d1, :] for b < kw), a
    (rows, OW, kw*C) matrix whose row r + a*d0 is kernel row a's patch of output row r; kernel
    row a is then a plain GEMM of K = kw*C over a row range of R. The copy is kw times the
    input where the patch matrix is kh*kw times the output, and K is kw times the shifted
    path's. Bias and residual are written first, the GEMMs accumulate.

    With FusedConv `branches` (finite inputs; see _branch_plan) a whole-kernel branch runs
    over its output columns only and a 1x1 branch as one GEMM of K = C over its tap's columns
    of the centre row, so W's structural zeros are never multiplied."""
    gemm = sgemm()
    n, oh, ow, m = y.shape
    c = x.shape[3]
    kh, kw = khw
    kc = kw * c
    e = 4
    owner = _packed_nhwc_c(W, 1)
    pw = owner[0]  # (kh*kw*C, M) rows ordered (kh, kw, c): block a = kernel row a
    xp = _pad_nhwc(x, begin, end)
    sn, sh, sw, sc = xp.strides
    rows = _band_rows(oh, ROWTAP_BAND_BYTES, ow * (kc + m) * e)
    spec = bplan or [(0, m, -1)]
    wholes = [(m0, mb) for m0, mb, tap in spec if tap < 0]
    ones = [(m0, mb, tap) for m0, mb, tap in spec if tap >= 0]
    w1s = [ptr(_branch1x1_weights(W, m0, mb, tap, c)) for m0, mb, tap in ones]
    pk = not bplan and packed_gemm.weight_takes(pw, owner)
    pwp = ptr(pw)
    for i in range(n):
        for r0 in range(0, oh, rows):
            r1 = min(oh, r0 + rows)
            rr = r1 - r0
            nr = rr + (kh - 1) * d[0]
            rt = scratch("conv.rowtap", (nr, ow, kw, c))
            np.copyto(rt, np.ndarray((nr, ow, kw, c), F32, xp, i * sn + r0 * sh,
                                     (sh, s[1] * sw, d[1] * sw, sc)))
            y2 = y[i, r0:r1].reshape(rr * ow, m)
            hot = _hot(rr * ow, m, kc)
            acc = _prefill(y2, bias, None if z is None else z[i, r0:r1].reshape(y2.shape),
                           1, always=True, hot=hot)
            base, yb = rt.ctypes.data, y2.ctypes.data

            def pixels(p0: int, p1: int, base=base, yb=yb, acc=acc) -> None:
                # Output pixels p0:p1 of the band, every kernel row: one thread accumulates.
                a0, y0 = base + p0 * kc * e, yb + p0 * m * e
                for m0, mb in wholes:
                    for a in range(kh):
                        gemm(p1 - p0, mb, kc, a0 + a * d[0] * ow * kc * e, kc,
                             pwp + (a * kc * m + m0) * e, m,
                             1.0 if acc or a else 0.0, y0 + m0 * e, m)
                for (m0, mb, tap), w1 in zip(ones, w1s):
                    a, b = divmod(tap, kw)
                    gemm(p1 - p0, mb, c, a0 + (a * d[0] * ow * kc + b * c) * e, kc,
                         w1, mb, 1.0 if acc else 0.0, y0 + m0 * e, m)

            # every kernel row in one packed GEMM (the weight packed once), onto the prefill
            if not _packed_taps(pk, rt, kc, np.arange(kh, dtype=np.int64) * (d[0] * ow * kc),
                                rr * ow, owner, y2, acc):
                over_rows(rr * ow, rr * ow * m * kc * kh, pixels)
            _epilogue(y2, None if acc else bias, None if acc or z is None
                      else z[i, r0:r1].reshape(y2.shape), activation, params, hot)
