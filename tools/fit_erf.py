"""Refit the float32 erf of opwarden.kernels.cpu.util (a development tool, not imported).

erf(x) ~ x P(t) / Q(t), t = x^2, Q(0) = 1, on [0, clamp]: linearised weighted least squares
(P - f Q, weighted by 1 / (f Q) for relative error) on a dense Chebyshev-plus-uniform grid,
reweighted by the error (Lawson) towards the minimax fit, the best iterate kept. Then P is scaled
by 1 + 2^-23 (see the comment in util) and the float32 evaluation checked against math.erf.

    python tools/fit_erf.py [--p 6] [--q 5] [--clamp 3.9]
"""

from __future__ import annotations

import argparse
import math

import numpy as np


def fit(dp: int, dq: int, clamp: float, iters: int = 60):
    x = np.concatenate([np.cos(np.linspace(0, np.pi, 6000)) * clamp / 2 + clamp / 2,
                        np.linspace(0, clamp, 6000)])
    x = np.unique(x[x > 1e-6])
    t = x * x
    f = np.array([math.erf(v) for v in x]) / x
    vp = np.vander(t, dp + 1, increasing=True)
    vq_all = np.vander(t, dq + 1, increasing=True)
    vq = vq_all[:, 1:]
    w = np.ones_like(t)
    qv = np.ones_like(t)
    best = (math.inf, None, None)
    for _ in range(iters):
        s = np.sqrt(w) / (f * qv)
        m = np.hstack([vp, -(f[:, None] * vq)]) * s[:, None]
        c, *_ = np.linalg.lstsq(m, f * s, rcond=None)
        a, b = c[:dp + 1], np.concatenate([[1.0], c[dp + 1:]])
        qv = vq_all @ b
        e = np.abs(vp @ a / qv / f - 1)
        if e.max() < best[0]:
            best = (e.max(), a.copy(), b.copy())
        w = w * (e + 1e-30)
        w /= w.sum()
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--p", type=int, default=6)
    ap.add_argument("--q", type=int, default=5)
    ap.add_argument("--clamp", type=float, default=3.9)
    a = ap.parse_args()
    err, p, q = fit(a.p, a.q, a.clamp)
    p32 = [float(np.float32(c * (1 + 2.0 ** -23))) for c in p]
    q32 = [float(np.float32(c)) for c in q]
    print(f"relative fit error {err:.3g}")
    print("P", p32)
    print("Q", q32)
    x = np.concatenate([np.linspace(-7, 7, 1_000_001), np.geomspace(1e-38, 7, 100_001)])
    x = x.astype(np.float32)
    xc = np.clip(x, -np.float32(a.clamp), np.float32(a.clamp))
    t = xc * xc
    pv = np.full_like(t, np.float32(p32[-1]))
    for c in p32[-2::-1]:
        pv = pv * t + np.float32(c)
    qv = np.full_like(t, np.float32(q32[-1]))
    for c in q32[-2::-1]:
        qv = qv * t + np.float32(c)
    y = np.clip(xc * pv / qv, -1, 1).astype(np.float64)
    want = np.array([math.erf(v) for v in x.astype(np.float64)])
    ulp = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    print(f"float32 evaluation: max {np.max(np.abs(y - want) / ulp):.2f} ulp, "
          f"max abs error {np.max(np.abs(y - want)):.3g}")


if __name__ == "__main__":
    main()
