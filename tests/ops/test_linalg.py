"""Linalg family kernels (MatMul, Gemm, Einsum, Det, Softmax family) against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from opwarden.errors import KernelError
from opwarden.ops import REGISTRY
from tests.ops.ort_compare import check, ort, run_both  # noqa: F401

RNG = np.random.default_rng(0)


@pytest.mark.parametrize(
    "sa,sb",
    [
        ((3, 4), (4, 5)),
        ((4,), (4,)),
        ((4,), (2, 4, 3)),
        ((2, 1, 3, 4), (5, 4, 2)),
        ((2, 3, 4), (4,)),
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float16])
def test_matmul(sa, sb, dtype):
    a = RNG.integers(-3, 4, sa).astype(dtype)
    b = RNG.integers(-3, 4, sb).astype(dtype)
    check("MatMul", 13, [a, b], rtol=1e-3)


def test_matmul_mismatch_raises():
    op = REGISTRY.resolve("MatMul", "", 13)[0]
    with pytest.raises(KernelError):
        op(np.zeros((2, 3), np.float32), np.zeros((4, 2), np.float32))


@pytest.mark.parametrize("opset", [7, 9, 11, 13])
@pytest.mark.parametrize("cshape", [(), (1,), (5,), (3, 1), (3, 5), None])
@pytest.mark.parametrize("attrs", [{}, {"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0}])
def test_gemm(opset, cshape, attrs):
    if cshape is None and opset < 11:
        pytest.skip("C is optional from Gemm-11")
    a = RNG.normal(size=(4, 3) if attrs else (3, 4)).astype(np.float32)
    b = RNG.normal(size=(5, 4) if attrs else (4, 5)).astype(np.float32)
    c = None if cshape is None else RNG.normal(size=cshape).astype(np.float32)
    check("Gemm", opset, [a, b] + ([] if c is None else [c]), attrs)


def test_gemm_1_broadcast_attribute():
    op = REGISTRY.resolve("Gemm", "", 6)[0]
    a, b = np.ones((2, 3), np.float32), np.ones((3, 4), np.float32)
    c = np.arange(4, dtype=np.float32)
    np.testing.assert_allclose(op(a, b, c, broadcast=1), 3 + c[None, :].repeat(2, 0))
    with pytest.raises(KernelError, match="broadcast=0"):
        op(a, b, c, broadcast=0)


@pytest.mark.parametrize(
    "eq,shapes",
    [
        ("ij->ji", [(3, 4)]),
        ("ij->i", [(3, 4)]),
        ("i,i", [(5,), (5,)]),
        ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
        ("...ii->...i", [(2, 3, 3)]),
        ("ij, jk, kl -> il", [(2, 3), (3, 4), (4, 2)]),
        ("ii", [(3, 3)]),
    ],
)
def test_einsum(eq, shapes):
    xs = [RNG.normal(size=s).astype(np.float32) for s in shapes]
    check("Einsum", 12, xs, {"equation": eq}, rtol=1e-4)


@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 4)])
def test_det(shape):
    check("Det", 11, [RNG.normal(size=shape).astype(np.float32)], rtol=1e-4)


@pytest.mark.parametrize("name", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("opset", [7, 11, 13])
@pytest.mark.parametrize("axis", [None, 0, 1, 2, -1, -3])
def test_softmax_family(name, opset, axis):
    # Opsets before 13 flatten to 2-D at axis; 13 works along the single axis.
    x = RNG.normal(size=(2, 3, 4, 5)).astype(np.float32) * 3
    x[0, 0, 0, :2] = 7.0  # a tie for Hardmax
    if opset < 11 and axis is not None and axis < 0:
        pytest.skip("negative axis from opset 11")
    check(name, opset, [x], {} if axis is None else {"axis": axis})


def test_softmax_1_coerces_to_2d():
    op1 = REGISTRY.resolve("Softmax", "", 11)[0]
    x = RNG.normal(size=(2, 3, 4)).astype(np.float32)
    y = op1(x, axis=1)
    np.testing.assert_allclose(y.reshape(2, 12).sum(axis=1), 1, rtol=1e-6)
