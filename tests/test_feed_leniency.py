"""Feed validation as lenient as ONNX Runtime's where ORT runs a model, as strict where it
refuses: each case is run on ORT too, so the test pins both sides of the behaviour."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import opwarden
from opwarden.errors import InputError

ort = pytest.importorskip("onnxruntime")
vi = helper.make_tensor_value_info


def model(nodes, inputs, outputs, value_info=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, value_info=list(value_info))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def set_dims(v: onnx.ValueInfoProto, dims):
    """Write raw dim_values (helper.make_tensor_value_info would keep -1 as written too, but
    this says so)."""
    for d, n in zip(v.type.tensor_type.shape.dim, dims):
        d.dim_value = n


def relu_model(dims, out_dims=None):
    m = model([helper.make_node("Relu", ["x"], ["y"])],
              [vi("x", TensorProto.FLOAT, [1] * len(dims))],
              [vi("y", TensorProto.FLOAT, [1] * len(out_dims) if out_dims else None)])
    set_dims(m.graph.input[0], dims)
    if out_dims:
        set_dims(m.graph.output[0], out_dims)
    return m


def ort_run(m, feeds):
    return ort.InferenceSession(m.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)


def ort_runs(m, feeds) -> bool:
    try:
        ort_run(m, feeds)
    except Exception:  # noqa: BLE001 - ORT's own InvalidArgument
        return False
    return True


def x_of(*shape):
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("dims", [[-1, 3], [2, -1], [-2, 3], [-1, -1]])
def test_negative_declared_dim_is_dynamic(dims):
    m = relu_model(dims, out_dims=dims)
    sess = opwarden.InferenceSession(m.SerializeToString())
    for shape in ([5, 3], [2, 3], [2, 7], [1, 1]):
        feed = {"x": x_of(*shape)}
        fits = all(d < 0 or d == n for d, n in zip(dims, shape))
        assert ort_runs(m, feed) == fits, (dims, shape)  # ORT checks only the fixed dims
        if fits:
            np.testing.assert_array_equal(sess.run(None, feed)[0], ort_run(m, feed)[0])
        else:
            with pytest.raises(InputError, match=r"input 'x' dimension \d must be"):
                sess.run(None, feed)


def test_negative_dim_keeps_the_rank_check():
    m = relu_model([-1, 3])
    sess = opwarden.InferenceSession(m)
    for shape in ([3], [1, 2, 3]):
        assert not ort_runs(m, {"x": x_of(*shape)})
        with pytest.raises(InputError, match=r"input 'x' expects rank 2 \(shape \[None, 3\]\)"):
            sess.run(None, {"x": x_of(*shape)})
    assert sess.run(None, {"x": x_of(4, 3)})[0].shape == (4, 3)  # still usable


def test_negative_dims_in_value_info_and_subgraphs_and_the_callers_proto_is_kept():
    """-1 in a value_info, an output and If branches' outputs: loads, runs, and a
    ModelProto handed in keeps its -1 dims."""
    then_g = helper.make_graph([helper.make_node("Neg", ["t"], ["o"])], "then", [],
                               [vi("o", TensorProto.FLOAT, [1, 3])])
    else_g = helper.make_graph([helper.make_node("Identity", ["t"], ["o2"])], "else", [],
                               [vi("o2", TensorProto.FLOAT, [1, 3])])
    set_dims(then_g.output[0], [-1, 3])
    set_dims(else_g.output[0], [-1, 3])
    nodes = [helper.make_node("Relu", ["x"], ["t"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    m = model(nodes, [vi("x", TensorProto.FLOAT, [1, 3]), vi("c", TensorProto.BOOL, [])],
              [vi("y", TensorProto.FLOAT, [1, 3])], [vi("t", TensorProto.FLOAT, [1, 3])])
    for v in (m.graph.input[0], m.graph.output[0], m.graph.value_info[0]):
        set_dims(v, [-1, 3])
    before = m.SerializeToString()
    sess = opwarden.InferenceSession(m)
    assert m.SerializeToString() == before
    for c in (True, False):
        feed = {"x": x_of(4, 3), "c": np.array(c)}
        np.testing.assert_array_equal(sess.run(None, feed)[0], ort_run(m, feed)[0])


def scalar_model():
    """y = Relu(x * s) with s declared a scalar."""
    return model([helper.make_node("Mul", ["x", "s"], ["t"]),
                  helper.make_node("Relu", ["t"], ["y"])],
                 [vi("x", TensorProto.FLOAT, [2, 3]), vi("s", TensorProto.FLOAT, [])],
                 [vi("y", TensorProto.FLOAT, [2, 3])])


@pytest.mark.parametrize("shape", [(), (1,), (1, 1)])
def test_one_element_feed_for_a_scalar_input_runs_as_in_ort(shape):
    m = scalar_model()
    feed = {"x": x_of(2, 3), "s": np.full(shape, -1.5, np.float32)}
    ref = ort_run(m, feed)[0]
    got = opwarden.InferenceSession(m).run(None, feed)[0]
    assert got.shape == ref.shape
    np.testing.assert_array_equal(got, ref)


def test_scalar_input_fed_more_elements_is_refused_clearly():
    """ORT runs any shape for a scalar input unchecked; we plan from the declared scalar, so a
    feed of more than one element is a clear InputError and the session stays usable."""
    m = scalar_model()
    feed = {"x": x_of(2, 3), "s": np.full((3,), 2.0, np.float32)}
    assert ort_runs(m, feed)  # ORT broadcasts it: lenient beyond what we plan for
    sess = opwarden.InferenceSession(m)
    with pytest.raises(InputError, match=r"input 's' is declared a scalar .* got shape \[3\]"):
        sess.run(None, feed)
    with pytest.raises(InputError, match=r"got shape \[0\]"):
        sess.run(None, {"x": x_of(2, 3), "s": np.zeros((0,), np.float32)})
    assert sess.run(None, {"x": x_of(2, 3), "s": np.ones(1, np.float32)})[0].shape == (2, 3)


@pytest.mark.parametrize("declared,fed", [([1], ()), ([1], (1, 1)), ([3], (1,)), ([1, 3], (3,)),
                                          ([1, 3], (3, 1))])
def test_strict_where_ort_is_strict(declared, fed):
    """A one-element or scalar feed is not reshaped for a non-scalar input: ORT refuses
    these, and so do we, naming the input, the expected and the given shape."""
    m = relu_model(declared)
    assert not ort_runs(m, {"x": x_of(*fed)})
    with pytest.raises(InputError, match=r"input 'x' .*(rank|dimension).*got"):
        opwarden.InferenceSession(m).run(None, {"x": x_of(*fed)})
