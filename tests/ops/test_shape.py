"""Edge cases of the shape family beyond the ONNX backend node tests."""

import numpy as np
import pytest
from onnx import helper, numpy_helper

from opwarden.errors import KernelError
from opwarden.ops import REGISTRY


def op(name, opset=25):
    return REGISTRY.resolve(name, "", opset)[0]


def test_reshape_zero_copies_and_allowzero():
    x = np.zeros((2, 3, 4), np.float32)
    assert op("Reshape", 13)(x, np.array([0, -1])).shape == (2, 12)
    assert op("Reshape")(np.zeros((0, 3)), np.array([3, 0]), allowzero=1).shape == (3, 0)
    with pytest.raises(KernelError):
        op("Reshape")(x, np.array([5, -1]))
    with pytest.raises(KernelError):
        op("Reshape")(x, np.array([-1, -1]))


def test_squeeze_unsqueeze_axes():
    x = np.zeros((1, 3, 1, 2))
    assert op("Squeeze")(x).shape == (3, 2)
    assert op("Squeeze")(x, np.array([-2])).shape == (1, 3, 2)
    assert op("Squeeze", 11)(x, axes=[0]).shape == (3, 1, 2)
    with pytest.raises(KernelError):
        op("Squeeze")(x, np.array([1]))
    # Axes refer to the output, in any order.
    assert op("Unsqueeze")(x, np.array([5, 1])).shape == (1, 1, 3, 1, 2, 1)
    assert op("Unsqueeze", 11)(x, axes=[-1]).shape == (1, 3, 1, 2, 1)


def test_split_18_uneven_and_13_input():
    x = np.arange(7)
    parts = op("Split")(x, num_outputs=3, noutputs=3)
    assert [p.tolist() for p in parts] == [[0, 1, 2], [3, 4, 5], [6]]
    parts = op("Split", 13)(x, np.array([2, 5]), noutputs=2)
    assert [len(p) for p in parts] == [2, 5]
    with pytest.raises(KernelError):
        op("Split", 13)(x, noutputs=2)


def test_shape_start_end_clamped():
    x = np.zeros((2, 3, 4))
    assert op("Shape")(x, start=-2).tolist() == [3, 4]
    assert op("Shape")(x, start=-10, end=10).tolist() == [2, 3, 4]
    assert op("Shape")(x, start=2, end=1).dtype == np.int64


def test_identity_passes_sequences_through():
    seq = [np.zeros(2), np.ones(3)]
    assert op("Identity")(seq) is seq


def test_dropout_inference_and_training():
    x = np.ones((4, 4), np.float16)
    y, mask = op("Dropout")(x)
    assert y is x and mask.dtype == np.bool_ and mask.all()
    y, mask = op("Dropout")(x, np.array(0.5, np.float32), np.array(True), seed=0)
    assert y.dtype == np.float16 and set(np.unique(y).tolist()) <= {0.0, 2.0}
    assert (y[mask] == 2).all() and (y[~mask] == 0).all()
    assert op("Dropout", 7)(x)[1].dtype == np.float16


def test_constant_value_attributes():
    c = op("Constant")
    assert c(value_float=1.5).dtype == np.float32
    assert c(value_ints=[1, 2]).dtype == np.int64
    assert c(value_strings=["a", "b"]).tolist() == ["a", "b"]
    sp = helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([1.0, 2.0], np.float32)),
        numpy_helper.from_array(np.array([1, 5], np.int64)),
        [2, 3],
    )
    assert c(sparse_value=sp).tolist() == [[0, 1, 0], [0, 0, 2]]


def test_constant_of_shape_defaults_to_float_zero():
    y = op("ConstantOfShape")(np.array([2, 0], np.int64))
    assert y.shape == (2, 0) and y.dtype == np.float32
    assert op("ConstantOfShape")(np.zeros(0, np.int64), value=np.array([3], np.int8)).shape == ()


def test_range_counts_and_types():
    r = op("Range")
    assert r(np.int32(10), np.int32(4), np.int32(-2)).tolist() == [10, 8, 6]
    assert r(np.int64(0), np.int64(0), np.int64(1)).shape == (0,)
    y = r(np.float16(2000), np.float16(2010), np.float16(1))
    assert y.dtype == np.float16 and y.tolist() == list(range(2000, 2010))


def test_pad_negative_and_modes():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    y = op("Pad")(x, np.array([0, -1, 0, 1]), np.array(9, np.float32))
    assert y.tolist() == [[1, 2, 9], [4, 5, 9]]
    assert op("Pad")(x, np.array([2, 2]), None, np.array([-1]), mode="wrap").tolist()[0] == [
        1,
        2,
        0,
        1,
        2,
        0,
        1,
    ]
    assert op("Pad")(x, np.array([1, 1]), None, np.array([1]), mode="reflect")[0].tolist() == [
        1,
        0,
        1,
        2,
        1,
    ]
    assert op("Pad", 2)(x, pads=[1, 0, 0, 0], value=7.0)[0].tolist() == [7, 7, 7]


def test_center_crop_pad_rounding():
    x = np.arange(5)
    assert op("CenterCropPad")(x, np.array([2])).tolist() == [1, 2]
    # One pad before, two after: the odd pixel goes to the end.
    y = op("CenterCropPad")(x, np.array([8]))
    assert y.tolist() == [0, 0, 1, 2, 3, 4, 0, 0]
