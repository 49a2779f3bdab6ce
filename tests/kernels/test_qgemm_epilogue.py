"""The AVX-512 and AVX2 requantizing epilogues of native/qgemm.c and qgemm_avx2.c against the
NumPy variant bit for bit,
on both sides of the bound below which it adds the int32 bias without an overflow test
(65025 k + |bias| < 2**31): small biases, biases just inside and just past the bound, and
biases that make accumulator + bias overflow int32 (added in int64 by the scalar path), with
and without the zero-point terms."""

from __future__ import annotations

import os

import numpy as np
import pytest

from opwarden.kernels.cpu import quant
from opwarden.memory.constants import mark

pytestmark = pytest.mark.skipif(os.environ.get("OPWARDEN_NATIVE", "1") == "0",
                                reason="compiled path disabled (OPWARDEN_NATIVE=0)")

LIMIT = 2 ** 31 - 1


def conv_case(rng, c, m, kh):
    x = rng.integers(0, 256, (1, c, 9, 9)).astype(np.uint8)
    w = rng.integers(-127, 128, (m, c, kh, kh)).astype(np.int8)  # no -128: AVX2 takes it
    mark(w)
    return x, w


@pytest.fixture(params=[0, 2], ids=["isa", "avx2"])
def cap(request):
    from opwarden.kernels.cpu import quant_native as qn

    if qn.isa() not in qn.FAST_ISAS:
        pytest.skip("no AVX2 / AVX512-VNNI integer GEMM on this CPU")
    old = qn._PORTABLE[0]
    qn._PORTABLE[0] = request.param
    yield request.param
    qn._PORTABLE[0] = old


@pytest.mark.parametrize("xz,wz", [(0, 0), (7, 0), (0, 3), (200, -5)])
@pytest.mark.parametrize("c,m,kh", [(16, 20, 1), (8, 70, 3), (64, 9, 3)])
def test_bias_on_both_sides_of_the_bound(cap, xz, wz, c, m, kh):
    from opwarden.kernels.cpu import quant_native as qn

    rng = np.random.default_rng(c * m + kh)
    x, w = conv_case(rng, c, m, kh)
    k = -(-c * kh * kh // 4) * 4  # the kernel's K (rows padded to groups of 4)
    edge = LIMIT - 65025 * k
    for bias in (rng.integers(-3000, 3000, m),
                 np.full(m, edge - 1), np.full(m, -(edge - 1)),  # just inside: no test
                 np.full(m, edge), np.full(m, -edge),  # at the bound: the tested path
                 rng.choice([LIMIT, -LIMIT - 1, LIMIT - 5], m)):  # sums that overflow int32
        b = np.asarray(bias, np.int64).astype(np.int32)
        for scale in (np.float32(1e-9), np.float32(0.003)):  # mid-range and saturating outputs
            args = (x, np.float32(0.05), np.uint8(xz), w, np.full(m, scale, np.float32),
                    np.full(m, wz, np.int8), np.float32(0.4), np.uint8(100), b)
            kw = dict(pads=[1, 1, 1, 1] if kh == 3 else [0, 0, 0, 0])
            want = quant.qlinear_conv_im2col(*args, **kw)
            got = qn.qlinear_conv_native(*args, **kw)
            assert np.array_equal(got, want), (bias[:3], scale)
            assert cap != 2 or qn._LAST_ISA[0] == 2
