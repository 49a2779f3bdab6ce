"""Edge cases of the index family beyond the ONNX backend node tests."""

import numpy as np
import pytest

from opwarden.errors import KernelError
from opwarden.ops import REGISTRY


def op(name, opset=25):
    return REGISTRY.resolve(name, "", opset)[0]


@pytest.mark.parametrize(
    "call",
    [
        lambda: op("Gather")(np.zeros((3, 2)), np.array([0, 3])),
        lambda: op("GatherElements")(np.zeros((3, 2)), np.array([[-4]])),
        lambda: op("GatherND")(np.zeros((3, 2)), np.array([[0, 2]])),
        lambda: op("ScatterND")(np.zeros((3, 2)), np.array([[5]]), np.zeros((1, 2))),
        lambda: op("ScatterElements")(np.zeros((3, 2)), np.array([[5]]), np.zeros((1, 1))),
        lambda: op("TensorScatter")(
            np.zeros((2, 4, 3)), np.zeros((2, 2, 3)), np.array([1, 3]), axis=1
        ),
    ],
)
def test_out_of_range_index_is_kernel_error(call):
    with pytest.raises(KernelError, match="index|write_indices"):
        call()


def test_gather_negative_indices():
    x = np.arange(12).reshape(3, 4)
    assert op("Gather")(x, np.array([-1, 0]), axis=1).tolist() == [[3, 0], [7, 4], [11, 8]]


def test_gathernd_batch_dims_and_whole_slices():
    x = np.arange(24).reshape(2, 3, 4)
    y = op("GatherND")(x, np.array([[[1, 2]], [[0, -1]]]), batch_dims=1)
    assert y.tolist() == [[6], [15]]
    assert op("GatherND")(x, np.zeros((2, 0), np.int64)).shape == (2, 2, 3, 4)


def test_scatter_reductions_accumulate_duplicates():
    data = np.ones((3,), np.float32)
    idx = np.array([[0], [0], [2]])
    upd = np.array([2.0, 3.0, 5.0], np.float32)
    assert op("ScatterND")(data, idx, upd, reduction="add").tolist() == [6, 1, 6]
    assert op("ScatterND")(data, idx, upd, reduction="mul").tolist() == [6, 1, 5]
    assert op("ScatterElements")(
        data, np.array([0, 0]), np.array([4.0, -1.0], np.float32), reduction="min"
    ).tolist() == [-1, 1, 1]


def test_tensorscatter_circular_wraps():
    past = np.zeros((1, 4, 1), np.float32)
    upd = np.array([[[1], [2], [3]]], np.float32)
    y = op("TensorScatter")(past, upd, np.array([3]), axis=1, mode="circular")
    assert y[0, :, 0].tolist() == [2, 3, 0, 1]
    assert past.sum() == 0  # input untouched


def test_slice_negative_steps_and_clamping():
    x = np.arange(10)
    s = op("Slice")
    assert s(x, np.array([-1]), np.array([-(2**63)]), None, np.array([-3])).tolist() == [9, 6, 3, 0]
    assert s(x, np.array([20]), np.array([2]), None, np.array([-4])).tolist() == [9, 5]
    assert s(x, np.array([-20]), np.array([2**63 - 1])).tolist() == list(range(10))
    assert op("Slice", 1)(
        np.arange(12).reshape(3, 4), starts=[1], ends=[1000], axes=[-1]
    ).shape == (3, 3)


def test_unique_unsorted_with_axis():
    x = np.array([[2, 1, 2], [0, 0, 0]])
    y, first, inv, counts = op("Unique")(x, axis=1, sorted=0)
    assert y.tolist() == [[2, 1], [0, 0]]
    assert first.tolist() == [0, 1] and inv.tolist() == [0, 1, 0] and counts.tolist() == [2, 1]


def test_onehot_negative_and_out_of_range():
    y = op("OneHot")(np.array([1, -1, 7]), np.array(3), np.array([0, 5], np.int32))
    assert y.dtype == np.int32 and y.tolist() == [[0, 5, 0], [0, 0, 5], [0, 0, 0]]


def test_compress_short_condition_and_nonzero():
    x = np.arange(6).reshape(3, 2)
    assert op("Compress")(x, np.array([False, True]), axis=0).tolist() == [[2, 3]]
    assert op("Compress")(x, np.array([True, False, True])).tolist() == [0, 2]
    assert op("NonZero")(np.array([[0, 1], [2, 0]])).tolist() == [[0, 1], [1, 0]]


def test_reverse_sequence_batch_major():
    x = np.arange(6).reshape(2, 3)  # batch, time
    y = op("ReverseSequence")(x, np.array([2, 3]), batch_axis=0, time_axis=1)
    assert y.tolist() == [[1, 0, 2], [5, 4, 3]]


@pytest.mark.parametrize("op_type", ["ScatterElements", "ScatterND"])
def test_scatter_16_accepts_max_reduction_like_onnxruntime(op_type):
    # torch.onnx emits scatter_reduce(reduce="amax") as reduction="max" at opset 16/17 (the
    # spec only allows it from 18); onnxruntime runs such models, so opwarden must too.
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    import opwarden

    if op_type == "ScatterElements":
        feeds = {"D": np.ones((2, 3), np.float32), "I": np.array([[0, 0, 2], [1, 1, 1]]),
                 "U": np.array([[5, -1, 3], [0, 4, 2]], np.float32)}
        attrs = {"axis": 1}
    else:
        feeds = {"D": np.ones((3,), np.float32), "I": np.array([[0], [0], [2]]),
                 "U": np.array([5, -1, 3], np.float32)}
        attrs = {}
    node = helper.make_node(op_type, ["D", "I", "U"], ["Y"], reduction="max", **attrs)
    types = [TensorProto.FLOAT, TensorProto.INT64, TensorProto.FLOAT]
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, t, None) for n, t in zip("DIU", types)],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])
    model = model.SerializeToString()
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = opwarden.InferenceSession(model).run(None, feeds)[0]
    np.testing.assert_array_equal(got, want)
