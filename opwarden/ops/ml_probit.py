"""PROBIT, the inverse of the standard normal CDF, for the ml operators' post transforms."""

from __future__ import annotations

from math import erf, pi, sqrt

import numpy as np


def probit(p: np.ndarray) -> np.ndarray:
    """sqrt(2) * erfinv(2p - 1), the inverse of the standard normal CDF."""
    return np.sqrt(2.0) * erfinv(2.0 * p - 1.0)


def erfinv(y: np.ndarray) -> np.ndarray:
    """Inverse error function: Giles' single-precision approximation refined by Newton steps."""
    y = np.asarray(y, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return erfinv_in_domain(y)


def erfinv_in_domain(y: np.ndarray) -> np.ndarray:
    """erfinv for |y| < 1; |y| = 1 gives +-inf and |y| > 1 gives NaN (PROBIT can make NaN)."""
    w = -np.log((1.0 - y) * (1.0 + y))
    small = w < 5.0
    ws = w - 2.5
    wl = np.sqrt(np.where(small, 5.0, w)) - 3.0
    ps = np.polyval([2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06,
                     0.00021858087, -0.00125372503, -0.00417768164, 0.246640727,
                     1.50140941], ws)
    pl = np.polyval([-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844,
                     0.00573950773, -0.0076224613, 0.00943887047, 1.00167406,
                     2.83297682], wl)
    x = np.where(small, ps, pl) * y
    verf = np.vectorize(erf, otypes=[np.float64])
    for _ in range(2):
        x = x - (verf(x) - y) / (2.0 / sqrt(pi) * np.exp(-x * x))
    return x
