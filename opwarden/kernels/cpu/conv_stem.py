"""The stem NHWC convolution: few input channels (the RGB stem), patch matrix transposed.

The patch matrix is built as (kh*kw*C [+1], pixels), so each of its rows is copied in runs of OW
contiguous floats rather than gathered one float every s*C; the bias rides in the GEMM as a
row of ones. Small kernels copy each tap straight from x (_stem_taps); larger ones from
channel-major phase planes, all taps of one phase in one copy (_stem_groups).
"""

from __future__ import annotations

import numpy as np

from opwarden.kernels.cpu.blas_split import split_gemm
from opwarden.kernels.cpu.conv_common import (
    Facts,
    _band_rows,
    _bias_row,
    _epilogue,
    _hot,
    _own,
    _phase_planes,
    _phase_planes_floats,
    _plane_geometry,
)
from opwarden.kernels.cpu.util import F32, scratch, tap_range

# Patch rows of at most this many floats (kw * C, group 1) take the stem path, with bands of
# about STEM_BAND_BYTES (taps copied straight from x) or STEM_PLANES_BAND_BYTES (taps from
# phase planes: smaller bands pay there).
STEM_MAX_RUN = 24
STEM_BAND_BYTES = 8 << 20
STEM_PLANES_BAND_BYTES = 1 << 20
# Stems with at most this many taps copy them straight from the input; larger kernels, whose
# taps re-read each input float many times, go through phase planes.
STEM_DIRECT_MAX_TAPS = 16


def nhwc_stem(x, W, B, s, d, begin, end, y, bias, z, activation, params, shuffle,
              bplan) -> None:
    """Few input channels: the transposed patch matrix (see _stem_nhwc)."""
    _stem_nhwc(x, W, B, s, d, begin, end, W.shape[2:], y, bias, _own(z, y), activation, params)


def stem_floats(f: Facts) -> int:
    m, cg, kh, kw = f.w
    k = kh * kw * cg
    kb = k + f.bias
    direct = kh * kw <= STEM_DIRECT_MAX_TAPS
    budget = STEM_BAND_BYTES if direct else STEM_PLANES_BAND_BYTES
    rows = _band_rows(f.oh, budget, f.ow * kb * 4)
    planes = 0 if direct else _phase_planes_floats(f.x, f.s, f.d, (kh, kw), f.oh, f.ow)
    return f.zcopy + k * m + (kb * m if f.bias else 0) + planes + kb * rows * f.ow


def _stem_nhwc(x, W, B, s, d, begin, end, khw, y, bias, z, activation, params) -> None:
    """Convolutions with few input channels (the RGB stem): the patch matrix is built
    transposed, (kh*kw*C [+1], pixels), so each of its rows is copied in runs of OW contiguous
    floats rather than gathered one float every s*C; the bias rides in the GEMM as a row of
    ones. Small kernels copy each tap straight from x (see _stem_taps); larger ones, whose taps
    re-read each input float many times, from channel-major phase planes (see _phase_planes),
    all taps of one phase in one copy (see _stem_groups)."""
    n, oh, ow, m = y.shape
    c = x.shape[3]
    kh, kw = khw
    k = kh * kw * c
    kb = k + (bias is not None)
    direct = kh * kw <= STEM_DIRECT_MAX_TAPS
    groups = None if direct else _stem_groups(tuple(s), tuple(d), khw)
    wb = _bias_row(W, B, bias, tuple(range(kh * kw)) if direct else groups[1])
    band = STEM_BAND_BYTES if direct else STEM_PLANES_BAND_BYTES
    rows = _band_rows(oh, band, ow * kb * 4)
    for i in range(n):
        if not direct:
            planes = _phase_planes(x, i, s, d, begin, khw, oh, ow, "conv.planes", chw=True)[0]
            sp = planes.strides
        for r0 in range(0, oh, rows):
            r1 = min(oh, r0 + rows)
            rr = r1 - r0
            cols = scratch("conv.cols", (kb, rr * ow))
            if direct:
                _stem_taps(x[i], s, d, begin, khw, r0, r1, ow,
                           cols[:k].reshape(kh * kw, c, rr, ow))
            else:
                k0 = 0
                for ph, qa, sa, na, qb, sb, nb in groups[0]:
                    # Taps (qa + u*sa, qb + v*sb) of this phase: one strided view of the
                    # planes, inner runs of ow contiguous floats.
                    rows_k = na * nb * c
                    np.copyto(cols[k0:k0 + rows_k].reshape(na, nb, c, rr, ow), np.ndarray(
                        (na, nb, c, rr, ow), F32, planes,
                        ph * sp[0] + (qa + r0) * sp[2] + qb * sp[3],
                        (sa * sp[2], sb * sp[3], sp[1], sp[2], sp[3])))
                    k0 += rows_k
            if bias is not None:
                cols[k] = 1
            y2 = y[i, r0:r1].reshape(rr * ow, m)
            if not split_gemm(cols.T, wb, y2):
                np.matmul(cols.T, wb, out=y2)
            _epilogue(y2, None, None if z is None else z[i, r0:r1].reshape(y2.shape),
                      activation, params, _hot(rr * ow, m, kb))


_STEM_GROUPS: dict[tuple, tuple] = {}


def _stem_groups(s, d, khw) -> tuple:
    """The taps of a phase-plane stem grouped by plane: ([(plane, qa0, qa step, rows of taps,
    qb0, qb step, columns of taps)], tap order). A plane's taps are the product of the kernel
    rows and columns of its phase, whose plane offsets step evenly (by d / gcd(s, d)), so each
    group is one strided copy where a copy per tap would pay its call overhead 49 times a
    band for a 7x7 stem. The patch rows follow the tap order (each tap's C rows together) and
    so do the weights' rows."""
    key = (s, d, khw)
    hit = _STEM_GROUPS.get(key)
    if hit is not None:
        return hit
    kh, kw = khw
    pas, pbs = _plane_geometry(s, d, khw, 1, 1)[:2]
    groups, order = [], []
    for u, pa in enumerate(pas):
        ra = [a for a in range(kh) if (a * d[0]) % s[0] == pa]
        qa = [(a * d[0]) // s[0] for a in ra]
        for v, pb in enumerate(pbs):
            rb = [b for b in range(kw) if (b * d[1]) % s[1] == pb]
            qb = [(b * d[1]) // s[1] for b in rb]
            sa = qa[1] - qa[0] if len(qa) > 1 else 1
            sb = qb[1] - qb[0] if len(qb) > 1 else 1
            groups.append((u * len(pbs) + v, qa[0], sa, len(qa), qb[0], sb, len(qb)))
            order += [a * kw + b for a in ra for b in rb]
    hit = (tuple(groups), tuple(order))
    _STEM_GROUPS[key] = hit
    return hit


def _stem_taps(xi, s, d, begin, khw, r0, r1, ow, c4) -> None:
    """c4[t, :, r - r0, j] = xpad[r*s0 + a*d0, j*s1 + b*d1, :] for tap t = (a, b), output rows
    r0 <= r < r1, from image xi (H, W, C) without a padded copy: each tap is one strided copy
    of its in-bounds block and zero strips where it reads padding."""
    h, w, _c = xi.shape
    xc = xi.transpose(2, 0, 1)  # (C, H, W): for the NCHW graph input, rows of W floats
    kh, kw = khw
    rr = r1 - r0
    bt, bl = begin
    for a in range(kh):
        # Output rows whose source row r*s0 + a*d0 - bt lies inside x, clipped to the band.
        off = a * d[0] - bt
        lo, hi = tap_range(a * d[0], h, r1, s[0], bt)
        lo = max(r0, lo)
        hi = max(lo, hi)
        lo, hi = lo - r0, hi - r0
        for b in range(kw):
            offw = b * d[1] - bl
            j0, j1 = tap_range(b * d[1], w, ow, s[1], bl)
            ct = c4[a * kw + b]
            if lo:
                ct[:, :lo] = 0
            if hi < rr:
                ct[:, hi:] = 0
            if j0:
                ct[:, lo:hi, :j0] = 0
            if j1 < ow:
                ct[:, lo:hi, j1:] = 0
            if hi > lo and j1 > j0:
                sr, sc = (lo + r0) * s[0] + off, j0 * s[1] + offw
                np.copyto(ct[:, lo:hi, j0:j1],
                          xc[:, sr:sr + (hi - lo - 1) * s[0] + 1:s[0],
                             sc:sc + (j1 - j0 - 1) * s[1] + 1:s[1]])
