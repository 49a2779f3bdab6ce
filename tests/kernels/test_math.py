"""Chunked elementwise math of the fast kernels: erf's accuracy, Gelu, LeakyRelu and the fused
activations against the reference kernels, strided and chunk-boundary shapes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from opwarden.kernels.cpu import elementwise as ew
from opwarden.kernels.cpu import util
from opwarden.ops import activation as act
from opwarden.ops import elementwise as ref_ew

F32 = np.float32
CHUNK = util.EW_CHUNK


def _exact_erf(x: np.ndarray) -> np.ndarray:
    return np.array([math.erf(v) for v in x.astype(np.float64).ravel()]).reshape(x.shape)


def test_erf_within_8_ulp_on_a_dense_grid():
    x = np.concatenate([
        np.linspace(-6, 6, 400_001), np.geomspace(1e-38, 6, 40_001),
        -np.geomspace(1e-38, 6, 40_001),
    ]).astype(F32)
    got = util.erf_f32(x).astype(np.float64)
    want = _exact_erf(x)
    ulp = np.spacing(np.abs(want).astype(F32)).astype(np.float64)
    err = np.abs(got - want) / ulp
    assert err.max() <= 8, f"max {err.max():.2f} ulp at x={x[err.argmax()]}"
    assert np.abs(got - want).max() < 5e-7
    assert np.abs(got).max() <= 1.0


def test_erf_special_values_and_odd_symmetry():
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3.9, 50.0, 1e-30], F32)
    y = util.erf_f32(x)
    assert y[0] == 0 and y[1] == 0
    assert y[2] == 1.0 and y[3] == -1.0 and y[6] == 1.0
    assert np.isnan(y[4])
    assert y[7] == pytest.approx(2 / math.sqrt(math.pi) * 1e-30, rel=1e-6)
    r = np.random.default_rng(0).standard_normal(10_000).astype(F32) * 3
    np.testing.assert_array_equal(util.erf_f32(-r), -util.erf_f32(r))


@pytest.mark.parametrize("n", [1, 7, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 5])
def test_chunked_matches_unchunked_at_chunk_boundaries(n):
    x = (np.random.default_rng(n).standard_normal(n) * 3).astype(F32)
    whole = np.empty_like(x)
    t = [np.empty_like(x) for _ in range(3)]
    util._erf_chunk(x, whole, *t)
    np.testing.assert_array_equal(util.erf_f32(x), whole)
    y = x.copy()
    util.chunked(util._erf_chunk, y, y, 3)  # in place
    np.testing.assert_array_equal(y, whole)


@pytest.mark.parametrize("shape", [(3, 5, 7), (4, CHUNK // 3 + 1), (2, 2 * CHUNK + 3)])
def test_chunked_writes_strided_outputs(shape):
    """A slice of a Concat's output (strided rows) and a transposed input."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(shape) * 3).astype(F32)
    want = util.erf_f32(np.ascontiguousarray(x))
    big = np.full(shape[:-1] + (shape[-1] + 5,), 7.0, F32)
    out = big[..., 2:2 + shape[-1]]
    util.chunked(util._erf_chunk, x, out, 3)
    np.testing.assert_array_equal(out, want)
    assert np.all(big[..., :2] == 7.0) and np.all(big[..., 2 + shape[-1]:] == 7.0)
    xt = np.ascontiguousarray(np.swapaxes(x, 0, -1)).swapaxes(0, -1)  # same values, strided
    np.testing.assert_array_equal(util.erf_f32(xt, np.empty_like(x)), want)


def test_erf_kernel_matches_reference_within_float32_tolerance():
    x = (np.random.default_rng(2).standard_normal((64, 300)) * 2).astype(F32)
    want = ref_ew.Erf(x)
    got = ew.erf(x, out=np.empty_like(x))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=5e-7)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_kernel_matches_reference(approximate):
    x = (np.random.default_rng(3).standard_normal((128, 700)) * 4).astype(F32)
    x[0, :4] = [np.inf, -np.inf, np.nan, 0.0]
    want = act.Gelu(x, approximate=approximate)
    got = ew.gelu(x, approximate=approximate, out=np.empty_like(x))
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)
    assert np.isnan(got[0, 2]) and got[0, 0] == np.inf
    inplace = x.copy()
    ew.gelu(inplace, approximate=approximate, out=inplace)
    np.testing.assert_array_equal(inplace, got)


@pytest.mark.parametrize("alpha", [0.01, 0.0, 1.0, 0.3, 2.5, -0.2])
def test_leaky_relu_is_exact(alpha):
    x = (np.random.default_rng(4).standard_normal(3 * CHUNK + 11) * 3).astype(F32)
    x[:3] = [np.nan, np.inf, -np.inf]
    want = act.LeakyRelu(x, alpha=alpha)
    got = ew.leaky_relu(x, alpha=alpha, out=np.empty_like(x))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("activation,params", [
    ("LeakyRelu", [0.1]), ("LeakyRelu", [3.0]), ("Sigmoid", []), ("HardSwish", []),
    ("Gelu", []), ("Gelu", [1.0]), ("Tanh", []), ("Clip", [-1.0, 2.0]),
])
def test_fused_activations_match_the_operators(activation, params):
    x = (np.random.default_rng(5).standard_normal((2 * CHUNK + 9,)) * 4).astype(F32)
    x[:2] = [np.nan, -200.0]
    ref = {
        "LeakyRelu": lambda v: act.LeakyRelu(v, alpha=params[0]),
        "Sigmoid": act.Sigmoid,
        "HardSwish": act.HardSwish,
        "Gelu": lambda v: act.Gelu(v, approximate="tanh" if params else "none"),
        "Tanh": act.Tanh,
        "Clip": lambda v: np.clip(v, *params),
    }[activation]
    want = ref(x)
    got = util.apply_activation(x.copy(), activation, params)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)
    assert np.isnan(got[0])


def test_chunked_scratch_stays_within_the_declaration():
    """The fused activations' workspace rule covers what the chunk loop takes."""
    x = np.random.default_rng(6).standard_normal(5 * CHUNK).astype(F32)
    for activation, params in (("Gelu", []), ("Gelu", [1.0]), ("LeakyRelu", [0.2]),
                               ("HardSwish", [])):
        with util.scratch_probe() as got:
            util.apply_activation(x.copy(), activation, params)
        declared = util.activation_workspace(activation, params, x.size)
        assert sum(got.values()) <= declared <= 4 * 4 * CHUNK


@pytest.mark.parametrize("e", [2.0, 1.0, -1.0, 0.5, 3.0, -2.0])
@pytest.mark.parametrize("edtype", [np.float32, np.int64, np.float64])
def test_pow_special_exponents_equal_the_reference_exactly(e, edtype):
    x = (np.random.default_rng(7).standard_normal((64, 33)) * 5).astype(F32)
    x[0, :6] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30]
    exp = np.array(e).astype(edtype)
    if edtype is np.int64 and e != int(e):
        return
    want = ref_ew.Pow(x, exp)
    got = ew.pow_(x, exp, out=np.empty_like(x))
    np.testing.assert_array_equal(got, want)  # equal bit for bit (NaN where NaN)
    assert np.array_equal(np.signbit(got), np.signbit(want))


def test_pow_broadcasting_exponent_takes_the_reference():
    x = np.arange(6, dtype=F32).reshape(2, 3)
    e = np.full((4, 1, 1), 2.0, F32)
    np.testing.assert_array_equal(ew.pow_(x, e), ref_ew.Pow(x, e))
    assert ew.pow_(x, e).shape == (4, 2, 3)
