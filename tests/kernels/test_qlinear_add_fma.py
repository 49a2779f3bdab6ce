"""qlinearadd.cpu.native's float32-FMA loop (native/quantize.c) against the reference bit for
bit: it runs only where every sum the float64 emulation rounds is exact in float64 (so both
round once), and the float64 loop everywhere else. Every (a, b) pair of both 8-bit types over
random scales and zero points, the vector loop's tails, and a case built so that the float64
emulation and a float32 FMA round differently: it must take the reference's answer."""

from __future__ import annotations

import os

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(os.environ.get("OPWARDEN_NATIVE", "1") == "0",
                                reason="compiled path disabled (OPWARDEN_NATIVE=0)")

F = np.float32


def ref(*args):
    from opwarden.kernels.cpu.quant_linear import latest

    return latest("QLinearAdd", "com.microsoft").reference(*args)


def native(*args):
    from opwarden.kernels.cpu import quant_native as qn

    return qn.qlinear_add_native(*args)


def all_pairs(dt):
    a = np.repeat(np.arange(256), 256).astype(np.uint8).view(dt)
    b = np.tile(np.arange(256), 256).astype(np.uint8).view(dt)
    return a.reshape(256, 256), b.reshape(256, 256)


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
def test_every_pair_matches_reference(dt):
    rng = np.random.default_rng(11)
    a, b = all_pairs(dt)
    for t in range(150):
        # typical ratios, and (one in three) extreme output scales, whose sums need float64
        lo, hi = (-9, 3) if t % 3 == 0 else (-4, 1)
        sa, sb = F(10.0 ** rng.uniform(-4, 1)), F(10.0 ** rng.uniform(-4, 1))
        sc = F(10.0 ** rng.uniform(lo, hi))
        za, zb, zc = (np.asarray(rng.integers(0, 256), np.uint8).view(dt) for _ in range(3))
        args = (a, sa, za, b, sb, zb, sc, zc)
        with np.errstate(all="ignore"):
            want, got = ref(*args), native(*args)
        assert got.dtype == want.dtype and np.array_equal(got, want), (t, args[1:])


def test_vector_tails_match_reference():
    rng = np.random.default_rng(12)
    for n in list(range(1, 70)) + [1000, 4099]:
        a, b = (rng.integers(0, 256, n).astype(np.uint8) for _ in range(2))
        args = (a, F(0.02), np.uint8(130), b, F(0.03), np.uint8(120), F(0.04), np.uint8(5))
        assert np.array_equal(native(*args), ref(*args)), n


def test_a_sum_float64_rounds_takes_the_reference_answer():
    # 3 * sa = 101.5 - 2**-18 exactly (a float32 midpoint), and the inner term is the tiny
    # negative rounding error of 3 * sb. The float64 sum rounds to the midpoint, which then
    # ties to even (101.5 -> 102); a float32 FMA rounds the exact sum once, down (-> 101).
    sa, sb = F(8869205 * 2.0 ** -18), F(2.9108851e-10)
    a = np.array([3, 3, 0, 1, 3], np.uint8)
    b = np.array([3, 3, 3, 3, 3], np.uint8)
    args = (a, sa, np.uint8(0), b, sb, np.uint8(3), F(1.0), np.uint8(0))
    want = ref(*args)
    assert want[0] == 102
    np.testing.assert_array_equal(native(*args), want)
