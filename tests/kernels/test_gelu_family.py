"""Swish-24 and com.microsoft Gelu, BiasGelu, FastGelu, QuickGelu: the chunked float32 kernels
against their float64 references, across chunk boundaries, with NaN and infinities, in place
and into strided outputs; a bias that is not a row over the last axis goes to the reference,
which names the problem."""

from __future__ import annotations

import numpy as np
import pytest

from opwarden.errors import OpwardenError
from opwarden.kernels.cpu import activation as act
from opwarden.ops.base import REGISTRY

MS = "com.microsoft"


def _ref(op_type, domain=""):
    return REGISTRY.latest(op_type, domain).reference


def _x(shape, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    flat = x.reshape(-1)
    flat[:4] = [np.nan, np.inf, -np.inf, 0.0]
    flat[-3:] = [30.0, -30.0, -100.0]
    return x


# (rows, cols): one chunk, and more than one chunk (util.EW_CHUNK = 64K floats) with a ragged end
SHAPES = [(3, 37), (70, 1000)]


def _close(got, want):
    # (the existing Gelu kernel's tolerance: float32 erf within 8 ulp, the tails' cancellation)
    np.testing.assert_allclose(got, want.astype(np.float32), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("shape", SHAPES)
def test_swish_and_quick_gelu(shape):
    x = _x(shape)
    for alpha in (1.0, 1.702, 0.25):
        _close(act.swish(x, alpha=alpha), _ref("Swish")(x, alpha=alpha))
        _close(act.quick_gelu(x, alpha=alpha), _ref("QuickGelu", MS)(x, alpha=alpha))


@pytest.mark.parametrize("shape", SHAPES)
def test_ms_gelu_and_fast_gelu(shape):
    x = _x(shape, 1)
    _close(act.ms_gelu(x), _ref("Gelu", MS)(x))
    _close(act.fast_gelu(x), _ref("FastGelu", MS)(x))


@pytest.mark.parametrize("shape", SHAPES)
def test_bias_forms(shape):
    x = _x(shape, 2)
    b = np.random.default_rng(3).standard_normal(shape[-1]).astype(np.float32)
    _close(act.bias_gelu(x, b), _ref("BiasGelu", MS)(x, b))
    _close(act.fast_gelu(x, b), _ref("FastGelu", MS)(x, b))
    # In place over the input (the contract lets the output alias A) ...
    want = _ref("BiasGelu", MS)(x, b)
    y = x.copy()
    assert act.bias_gelu(y, b, out=y) is y
    _close(y, want)
    # ... and into a strided output (a slice of a Concat's buffer).
    big = np.zeros((shape[0], shape[1] + 5), np.float32)
    view = big[:, 2:2 + shape[1]]
    got = act.fast_gelu(x, b, out=view)
    assert np.shares_memory(got, big)
    _close(view, _ref("FastGelu", MS)(x, b))
    assert not big[:, :2].any() and not big[:, 2 + shape[1]:].any()


def test_bias_not_a_row_is_refused_by_the_reference():
    x = _x((4, 6))
    with pytest.raises(OpwardenError, match="bias"):
        act.bias_gelu(x, np.ones((4, 6), np.float32))
    with pytest.raises(OpwardenError, match="bias"):
        act.fast_gelu(x, np.ones(5, np.float32))


def test_registered_as_named_variants():
    for op_type, domain, name in (("Swish", "", "swish.cpu.out"),
                                  ("Gelu", MS, "gelu.ms.cpu.out"),
                                  ("BiasGelu", MS, "biasgelu.ms.cpu.out"),
                                  ("FastGelu", MS, "fastgelu.ms.cpu.out"),
                                  ("QuickGelu", MS, "quickgelu.ms.cpu.out")):
        assert name in {v.name for v in REGISTRY.latest(op_type, domain).variants}
