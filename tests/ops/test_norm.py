"""Norm family kernels against onnxruntime across ONNX versions."""

from __future__ import annotations

import numpy as np
import pytest

from opwarden.errors import KernelError
from opwarden.ops import REGISTRY
from tests.ops.ort_compare import check, ort, run_both  # noqa: F401

RNG = np.random.default_rng(0)


def _bn_inputs(shape, dtype=np.float32):
    c = shape[1]
    x = RNG.normal(size=shape).astype(dtype)
    s, b, m = (RNG.normal(size=c).astype(dtype) for _ in range(3))
    v = RNG.uniform(0.5, 2, c).astype(dtype)
    return [x, s, b, m, v]


@pytest.mark.parametrize("opset", [7, 9, 14, 15])
@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 4), (2, 3, 4, 5)])
def test_batchnorm_inference(opset, shape):
    check("BatchNormalization", opset, _bn_inputs(shape), {"epsilon": 1e-3})


@pytest.mark.parametrize("opset", [14, 15])
def test_batchnorm_training(opset):
    check(
        "BatchNormalization",
        opset,
        _bn_inputs((2, 3, 4, 5)),
        {"training_mode": 1, "momentum": 0.8},
        n_out=3,
        rtol=1e-4,
    )


def test_batchnorm_7_not_spatial():
    op = REGISTRY.resolve("BatchNormalization", "", 7)[0]
    x = RNG.normal(size=(2, 3, 4)).astype(np.float32)
    p = np.ones((3, 4), np.float32)
    y = op(x, p, 0 * p, 0 * p, p, epsilon=0.0, spatial=0)
    np.testing.assert_allclose(y, x)
    y, rm, rv, sm, sv = op(x, p, 0 * p, 0 * p, p, spatial=0, noutputs=5)
    assert rm.shape == (3, 4)
    np.testing.assert_allclose(sm, x.mean(axis=0), rtol=1e-6)


@pytest.mark.parametrize("axis", [0, 1, -1, -2])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_layer_normalization(axis, dtype):
    x = RNG.normal(size=(2, 3, 4)).astype(dtype)
    ax = axis % 3
    s = RNG.normal(size=x.shape[ax:]).astype(dtype)
    b = RNG.normal(size=x.shape[ax:]).astype(dtype)
    check("LayerNormalization", 17, [x, s, b], {"axis": axis}, n_out=3, rtol=1e-2)
    check("LayerNormalization", 17, [x, s], {"axis": axis}, n_out=1, rtol=1e-2)


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_group_normalization_21(groups):
    x = RNG.normal(size=(2, 4, 3, 3)).astype(np.float32)
    s, b = RNG.normal(size=4).astype(np.float32), RNG.normal(size=4).astype(np.float32)
    check("GroupNormalization", 21, [x, s, b], {"num_groups": groups}, rtol=1e-4)


def test_group_normalization_18_per_group():
    op18 = REGISTRY.resolve("GroupNormalization", "", 18)[0]
    op21 = REGISTRY.resolve("GroupNormalization", "", 21)[0]
    x = RNG.normal(size=(2, 4, 5)).astype(np.float32)
    s, b = np.array([2.0, 3.0], np.float32), np.array([1.0, -1.0], np.float32)
    # Per-group parameters equal per-channel ones repeated over each group's channels.
    np.testing.assert_allclose(
        op18(x, s, b, num_groups=2), op21(x, s.repeat(2), b.repeat(2), num_groups=2), rtol=1e-6
    )


@pytest.mark.parametrize("shape", [(2, 3, 4), (2, 3, 4, 5)])
def test_instance_normalization(shape):
    check("InstanceNormalization", 6, _bn_inputs(shape)[:3], {"epsilon": 1e-3}, rtol=1e-4)


@pytest.mark.parametrize("size", [1, 3, 5])
def test_lrn(size):
    x = RNG.normal(size=(2, 6, 3, 3)).astype(np.float32)
    check("LRN", 13, [x], {"size": size, "alpha": 0.01, "beta": 0.5, "bias": 2.0}, rtol=1e-5)


@pytest.mark.parametrize("size", [2, 4])
def test_lrn_even_size_window(size):
    # onnxruntime rejects even sizes; check the spec's window [c - floor((s-1)/2),
    # c + ceil((s-1)/2)] directly.
    op = REGISTRY.resolve("LRN", "", 13)[0]
    x = RNG.normal(size=(1, 5, 2)).astype(np.float64)
    y = op(x, size=size, alpha=0.1, beta=0.75, bias=1.0)
    lo, hi = (size - 1) // 2, -(-(size - 1) // 2)
    for c in range(5):
        win = x[:, max(0, c - lo) : min(4, c + hi) + 1]
        ref = x[:, c] / (1.0 + 0.1 / size * (win**2).sum(axis=1)) ** 0.75
        np.testing.assert_allclose(y[:, c], ref, rtol=1e-12)


@pytest.mark.parametrize("axes", [None, [0, 2, 3], [1], [2, 3]])
def test_mvn(axes):
    x = RNG.normal(size=(2, 3, 4, 5)).astype(np.float32)
    check("MeanVarianceNormalization", 13, [x], {} if axes is None else {"axes": axes}, rtol=1e-4)


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [0, -1])
def test_lp_normalization(p, axis):
    x = RNG.normal(size=(3, 4)).astype(np.float32)
    check("LpNormalization", 13, [x], {"p": p, "axis": axis}, rtol=1e-5)


def test_rms_normalization():
    op = REGISTRY.resolve("RMSNormalization", "", 23)[0]
    x = RNG.normal(size=(2, 3, 4)).astype(np.float16)
    s = RNG.normal(size=(4,)).astype(np.float16)
    y = op(x, s, axis=-1, epsilon=1e-5, stash_type=1)
    xf = x.astype(np.float32)
    ref = xf / np.sqrt((xf * xf).mean(axis=-1, keepdims=True) + 1e-5) * s.astype(np.float32)
    assert y.dtype == np.float16
    np.testing.assert_allclose(y.astype(np.float32), ref, rtol=2e-3, atol=1e-3)


def test_group_normalization_bad_groups_raises():
    op = REGISTRY.resolve("GroupNormalization", "", 21)[0]
    x = np.zeros((1, 4, 2), np.float32)
    with pytest.raises(KernelError, match="num_groups"):
        op(x, np.ones(4, np.float32), np.zeros(4, np.float32), num_groups=3)


def test_lrn_nan_stays_in_its_window():
    """A NaN (or inf) in channel k reaches only the windows that hold k (ONNX: the sum over
    the window); a prefix-sum difference spread it to every later channel."""
    from opwarden.ops.norm import LRN

    x = np.ones((1, 9, 2, 2), np.float32)
    x[0, 2, 0, 0] = np.nan
    x[0, 6, 1, 1] = np.inf
    y = LRN(x, size=3)
    assert np.isnan(y[0, 1:4, 0, 0]).all() and not np.isnan(y[0, 4:, 0, 0]).any()
    assert not np.isnan(y[0, :1, 0, 0]).any()
    assert np.isfinite(y[0, :5, 1, 1]).all() and np.isfinite(y[0, 8:, 1, 1]).all()
