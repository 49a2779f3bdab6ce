"""Bad input gets a clear OpwardenError naming the culprit, and the session stays usable."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import opwarden as ow
from tests.models import one_node, small_cnn

X = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)


@pytest.fixture(scope="module")
def sess():
    return ow.InferenceSession(small_cnn().SerializeToString())


def test_all_errors_derive_from_opwarden_error():
    for cls in (
        ow.ModelError,
        ow.UnsupportedOpError,
        ow.InputError,
        ow.KernelError,
        ow.OptionsError,
        ow.ContractError,
    ):
        assert issubclass(cls, ow.OpwardenError)


def test_garbage_bytes():
    with pytest.raises(ow.ModelError, match="not a valid ONNX model"):
        ow.InferenceSession(b"\x00\xffthis is not a model\x13\x37" * 10)


def test_truncated_model():
    data = small_cnn().SerializeToString()
    for cut in (len(data) // 3, len(data) // 2, len(data) - 7):
        with pytest.raises(ow.ModelError):
            ow.InferenceSession(data[:cut])


def test_missing_file(tmp_path):
    with pytest.raises(ow.ModelError, match="not found"):
        ow.InferenceSession(str(tmp_path / "nope.onnx"))


def test_not_a_model_type():
    with pytest.raises(ow.ModelError, match="expected a path, bytes or onnx.ModelProto"):
        ow.InferenceSession(12345)


def test_unknown_operator_names_node_and_op():
    m = one_node("FrobnicateTensor", [("x", 1, [2])], [("y", 1, [2])])
    with pytest.raises(ow.UnsupportedOpError, match=r"'n0'.*FrobnicateTensor"):
        ow.InferenceSession(m)


def test_unknown_custom_domain_operator():
    m = one_node("Magic", [("x", 1, [2])], [("y", 1, [2])], domain="acme.ops")
    with pytest.raises(ow.UnsupportedOpError, match=r"acme.ops"):
        ow.InferenceSession(m)


def test_attribute_of_wrong_type_names_attribute():
    m = small_cnn()
    conv = m.graph.node[0]
    conv.attribute.append(helper.make_attribute("group", 1.5))
    with pytest.raises(ow.ModelError, match=r"'conv'.*'group'.*INT.*FLOAT"):
        ow.InferenceSession(m)


def test_unknown_attribute():
    m = one_node("Relu", [("x", 1, [2])], [("y", 1, [2])], alpha=0.5)
    with pytest.raises(ow.ModelError, match=r"unknown attribute 'alpha'"):
        ow.InferenceSession(m)


def test_disallowed_attribute_value():
    m = one_node("Pad", [("x", 1, [2]), ("p", 7, [2])], [("y", 1, None)], mode="mirror")
    with pytest.raises(ow.ModelError, match=r"'mode' = 'mirror' is not allowed"):
        ow.InferenceSession(m)


def test_wrong_number_of_inputs():
    m = one_node("Relu", [("x", 1, [2]), ("z", 1, [2])], [("y", 1, [2])])
    with pytest.raises(ow.ModelError, match=r"'n0'.*2 inputs.*exactly 1"):
        ow.InferenceSession(m)


def test_missing_required_attribute():
    m = one_node("Cast", [("x", 1, [2])], [("y", 7, [2])])
    with pytest.raises(ow.ModelError, match=r"required attribute 'to'"):
        ow.InferenceSession(m)


def test_input_dtype_outside_type_constraint():
    m = one_node("Relu", [("x", TensorProto.STRING, [2])], [("y", TensorProto.STRING, [2])])
    with pytest.raises(ow.ModelError, match=r"input 0.*dtype string"):
        ow.InferenceSession(m)


def test_undefined_input_value():
    m = small_cnn()
    m.graph.node[1].input[0] = "nowhere"
    with pytest.raises(ow.ModelError, match=r"'relu'.*'nowhere'"):
        ow.InferenceSession(m)


def test_missing_feed(sess):
    with pytest.raises(ow.InputError, match=r"missing feed for input 'x'"):
        sess.run(None, {})


def test_unknown_feed_name(sess):
    with pytest.raises(ow.InputError, match=r"unknown input name 'q'"):
        sess.run(None, {"x": X, "q": X})


def test_wrong_dtype(sess):
    with pytest.raises(ow.InputError, match=r"'x' expects dtype float32, got float64"):
        sess.run(None, {"x": X.astype(np.float64)})


def test_wrong_rank(sess):
    with pytest.raises(ow.InputError, match=r"'x' expects rank 4"):
        sess.run(None, {"x": X[0]})


def test_wrong_static_dimension(sess):
    with pytest.raises(ow.InputError, match=r"'x' dimension 1 must be 3, got 2"):
        sess.run(None, {"x": X[:, :2]})


def test_unknown_output_name(sess):
    with pytest.raises(ow.InputError, match=r"unknown output name 'zz'"):
        sess.run(["zz"], {"x": X})


def test_feed_not_an_array(sess):
    with pytest.raises(ow.InputError, match=r"'x' must be a numpy array"):
        sess.run(None, {"x": object()})


def test_session_usable_after_errors(sess):
    for bad in ({}, {"x": X[0]}, {"x": X.astype(np.int64)}):
        with pytest.raises(ow.InputError):
            sess.run(None, bad)
    (y,) = sess.run(None, {"x": X})
    assert y.shape == (2, 5)
    np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-5)


def test_kernel_failure_is_a_kernel_error_naming_the_node():
    m = one_node("Reshape", [("x", 1, [6]), ("s", 7, [2])], [("y", 1, None)])
    s = ow.InferenceSession(m)
    with pytest.raises(ow.KernelError, match=r"'n0' \(Reshape\)"):
        s.run(None, {"x": np.zeros(6, np.float32), "s": np.array([4, 4], np.int64)})
    (y,) = s.run(None, {"x": np.zeros(6, np.float32), "s": np.array([2, 3], np.int64)})
    assert y.shape == (2, 3)


def test_nan_in_feed_propagates(sess):
    x = X.copy()
    x[0, :, :, :] = np.nan
    (y,) = sess.run(None, {"x": x})
    assert np.isnan(y[0]).all()
    assert np.isfinite(y[1]).all()


def test_empty_batch_runs_and_returns_empty():
    s = ow.InferenceSession(small_cnn())
    (y,) = s.run(None, {"x": np.zeros((0, 3, 8, 8), np.float32)})
    assert y.shape == (0, 5) and y.dtype == np.float32


def test_symbolic_dimension_must_agree_across_inputs():
    m = one_node("Add", [("a", 1, ["N"]), ("b", 1, ["N"])], [("y", 1, ["N"])])
    s = ow.InferenceSession(m)
    with pytest.raises(ow.InputError, match=r"'N'"):
        s.run(None, {"a": np.zeros(2, np.float32), "b": np.zeros(3, np.float32)})


def test_unknown_session_option():
    with pytest.raises(ow.OptionsError, match="unknown session option 'bogus'"):
        ow.SessionOptions(bogus=1)
    o = ow.SessionOptions()
    with pytest.raises(ow.OptionsError, match="on_fault"):
        o.on_fault = "explode"


def test_unknown_provider():
    with pytest.raises(ow.OptionsError, match="unknown provider"):
        ow.InferenceSession(small_cnn(), providers=["TPUExecutionProvider"])


def test_external_data_outside_model_folder_is_refused(tmp_path):
    m = one_node("Add", [("a", 1, [2])], [("y", 1, [2])])
    t = onnx.TensorProto(name="b", data_type=1, dims=[2])
    t.data_location = onnx.TensorProto.EXTERNAL
    t.external_data.add(key="location", value="../../etc/passwd")
    m.graph.initializer.append(t)
    m.graph.node[0].input.append("b")
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    with pytest.raises(ow.ModelError, match="leaves the model's folder"):
        ow.InferenceSession(str(path))


def test_external_data_is_memory_mapped(tmp_path):
    m = one_node("Add", [("a", 1, [3])], [("y", 1, [3])])
    m.graph.node[0].input.append("b")
    m.graph.initializer.append(onnx.numpy_helper.from_array(np.arange(3, dtype=np.float32), "b"))
    path = tmp_path / "m.onnx"
    from onnx.external_data_helper import convert_model_to_external_data

    convert_model_to_external_data(m, location="weights.bin", size_threshold=0)
    onnx.save_model(m, str(path))
    s = ow.InferenceSession(str(path))
    (y,) = s.run(None, {"a": np.ones(3, np.float32)})
    np.testing.assert_array_equal(y, [1, 2, 3])
    const = s.model.graph.initializers["b"].const
    assert isinstance(const, np.memmap)
