"""Reduce family kernels against onnxruntime across ONNX versions (attribute vs input axes)."""

from __future__ import annotations

import numpy as np
import pytest

from opwarden.errors import KernelError
from opwarden.ops import REGISTRY
from tests.ops.ort_compare import check, ort, run_both  # noqa: F401

RNG = np.random.default_rng(0)


REDUCES = [
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceSumSquare",
]


@pytest.mark.parametrize("name", REDUCES)
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("attrs", [{}, {"axes": [1]}, {"axes": [-1, 0], "keepdims": 0}])
def test_reduce_attribute_axes(name, opset, attrs):
    if name == "ReduceSum" and opset == 13:
        pytest.skip("ReduceSum-13 takes axes as an input")
    x = RNG.uniform(0.5, 2.0, (2, 3, 4)).astype(np.float32)
    check(name, opset, [x], attrs)


@pytest.mark.parametrize("name", REDUCES)
@pytest.mark.parametrize("axes", [None, [1], [0, -1], []])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("noop", [0, 1])
def test_reduce_input_axes(name, axes, keepdims, noop):
    x = RNG.uniform(0.5, 2.0, (2, 3, 4)).astype(np.float32)
    a = None if axes is None else np.array(axes, dtype=np.int64)
    check(name, 18, [x, a], {"keepdims": keepdims, "noop_with_empty_axes": noop})


@pytest.mark.parametrize(
    "name", ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare", "ReduceMean"]
)
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float16, np.float64])
def test_reduce_types_keep_dtype(name, dtype):
    x = RNG.integers(-5, 6, (3, 4)).astype(dtype)
    check(name, 18, [x, np.array([1], np.int64)], rtol=1e-3)


def test_reduce_empty_set_values():
    op = REGISTRY.resolve("ReduceMax", "", 18)[0]
    e = np.zeros((0, 2), np.float32)
    assert np.all(op(e, np.array([0])) == -np.inf)
    assert op(np.zeros((0, 2), np.int32), np.array([0]))[0, 0] == np.iinfo(np.int32).min
    assert not op(np.zeros((2, 0), bool), np.array([1])).any()
    prod = REGISTRY.resolve("ReduceProd", "", 18)[0]
    assert np.all(prod(e, np.array([0])) == 1)


def test_reduce_bad_axis_raises():
    op = REGISTRY.resolve("ReduceSum", "", 13)[0]
    with pytest.raises(KernelError, match="out of range"):
        op(np.zeros((2, 3), np.float32), np.array([2]))


@pytest.mark.parametrize("name", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("attrs", [{}, {"axis": 1, "keepdims": 0}, {"axis": -1}])
def test_arg(name, opset, attrs):
    x = RNG.integers(0, 3, (3, 4, 5)).astype(np.float32)  # many ties
    if opset >= 12:
        attrs = dict(attrs, select_last_index=1)
    check(name, opset, [x], attrs)


@pytest.mark.parametrize("opset,largest", [(9, 1), (10, 1), (11, 1), (11, 0)])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_topk_versions(opset, largest, dtype):
    if opset < 11 and dtype != np.float32:
        pytest.skip("TopK-1/10 take floating-point inputs only")
    x = RNG.integers(0, 4, (5, 7)).astype(dtype)  # many ties: index order decides
    if opset < 10:
        check("TopK", opset, [x], {"k": 4, "axis": 1}, n_out=2)
    elif opset == 10:
        check("TopK", opset, [x, np.array([4], np.int64)], {"axis": 1}, n_out=2)
    else:
        check(
            "TopK",
            opset,
            [x, np.array([4], np.int64)],
            {"axis": 0 if largest else -1, "largest": largest},
            n_out=2,
        )


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_cumsum(exclusive, reverse, dtype):
    x = RNG.integers(-3, 4, (3, 5)).astype(dtype)
    check("CumSum", 14, [x, np.array(1, np.int64)], {"exclusive": exclusive, "reverse": reverse})


def test_cumprod_exclusive_reverse():
    op = REGISTRY.resolve("CumProd", "", 26)[0]
    x = np.array([1, 2, 3], np.int64)
    assert op(x, np.array(0), exclusive=1, reverse=1).tolist() == [6, 3, 1]
    assert op(x, np.array(0)).tolist() == [1, 2, 6]
