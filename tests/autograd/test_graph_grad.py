"""opwarden.grad over whole ONNX models, against PyTorch autograd."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import opwarden
from opwarden.autograd import grad
from opwarden.errors import InputError, UnsupportedOpError

try:  # PyTorch is an optional extra: the comparisons with its autograd skip without it
    import torch
    import torch.nn.functional as F
except ImportError:
    torch = F = None
needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch (optional extra) not installed")

rng = np.random.default_rng(0)


def _model(nodes, inputs, outputs, inits, opset=18, extra_opsets=()):
    g = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    ops = [helper.make_opsetid("", opset), *[helper.make_opsetid(d, v) for d, v in extra_opsets]]
    return helper.make_model(g, opset_imports=ops)


def _cnn():
    f = np.float32
    p = {
        "W": (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(f),
        "Wb": rng.standard_normal(4).astype(f),
        "s": rng.uniform(0.5, 1.5, 4).astype(f), "b": rng.standard_normal(4).astype(f),
        "m": rng.standard_normal(4).astype(f) * 0.1, "v": rng.uniform(0.5, 1.5, 4).astype(f),
        "W2": (rng.standard_normal((5, 64)) * 0.2).astype(f),
        "b2": rng.standard_normal(5).astype(f),
    }
    nodes = [
        helper.make_node("Conv", ["x", "W", "Wb"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["bn"], epsilon=1e-3),
        helper.make_node("Relu", ["bn"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["mp"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["mp"], ["fl"]),
        helper.make_node("Gemm", ["fl", "W2", "b2"], ["logits"], transB=1),
        helper.make_node("SoftmaxCrossEntropyLoss", ["logits", "labels"], ["loss"]),
    ]
    m = _model(nodes, [("x", TensorProto.FLOAT, [2, 3, 8, 8]), ("labels", TensorProto.INT64, [2])],
               [("loss", TensorProto.FLOAT, [])], p)
    return m, p


@needs_torch
def test_cnn_matches_torch():
    m, p = _cnn()
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    labels = np.array([1, 4], dtype=np.int64)
    wrt = ["x", "W", "Wb", "s", "b", "W2", "b2"]
    got = grad(m, {"x": x, "labels": labels}, wrt=wrt, output="loss")

    t = {k: torch.tensor(v, requires_grad=k not in ("m", "v")) for k, v in p.items()}
    tx = torch.tensor(x, requires_grad=True)
    y = F.conv2d(tx, t["W"], t["Wb"], padding=1)
    y = F.batch_norm(y, t["m"], t["v"], t["s"], t["b"], training=False, eps=1e-3)
    y = F.max_pool2d(F.relu(y), 2)
    y = F.linear(y.flatten(1), t["W2"], t["b2"])
    F.cross_entropy(y, torch.tensor(labels)).backward()
    want = {"x": tx.grad, **{k: t[k].grad for k in wrt if k != "x"}}
    assert list(got) == wrt
    for k in wrt:
        assert got[k].dtype == np.float32 and got[k].shape == want[k].shape, k
        np.testing.assert_allclose(got[k], want[k].numpy(), rtol=1e-4, atol=1e-5, err_msg=k)


@needs_torch
def test_transformer_block_matches_torch():
    d = np.float64
    p = {"Wq": rng.standard_normal((4, 4)), "Wk": rng.standard_normal((4, 4)),
         "g": rng.uniform(0.5, 1.5, 4), "beta": rng.standard_normal(4),
         "st": np.array([0], np.int64), "en": np.array([3], np.int64),
         "ax": np.array([2], np.int64), "rax": np.array([1], np.int64)}
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g", "beta"], ["ln"], stash_type=11),
        helper.make_node("MatMul", ["ln", "Wq"], ["q"]),
        helper.make_node("MatMul", ["ln", "Wk"], ["k"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["att"]),
        helper.make_node("Softmax", ["att"], ["sm"], axis=-1),
        helper.make_node("MatMul", ["sm", "ln"], ["o"]),
        helper.make_node("Concat", ["o", "x"], ["cat"], axis=2),
        helper.make_node("Slice", ["cat", "st", "en", "ax"], ["sl"]),
        helper.make_node("Tanh", ["sl"], ["th"]),
        helper.make_node("Mul", ["th", "th"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "rax"], ["red"], keepdims=0),
        helper.make_node("ReduceSum", ["red"], ["out"], keepdims=0),
    ]
    m = _model(nodes, [("x", TensorProto.DOUBLE, [2, 3, 4])], [("out", TensorProto.DOUBLE, [])], p)
    x = rng.standard_normal((2, 3, 4))
    wrt = ["x", "Wq", "Wk", "g", "beta"]
    sess = opwarden.InferenceSession(m.SerializeToString(), optimization_level=0)
    got = grad(sess, {"x": x}, wrt=wrt)

    t = {k: torch.tensor(p[k], requires_grad=True) for k in ("Wq", "Wk", "g", "beta")}
    tx = torch.tensor(x, requires_grad=True)
    ln = F.layer_norm(tx, (4,), t["g"], t["beta"], eps=1e-5)
    q, k = ln @ t["Wq"], ln @ t["Wk"]
    o = torch.softmax(q @ k.transpose(1, 2), -1) @ ln
    sl = torch.cat([o, tx], 2)[:, :, 0:3]
    (torch.tanh(sl) ** 2).mean(1).sum().backward()
    want = {"x": tx.grad, **{k: t[k].grad for k in wrt if k != "x"}}
    for k in wrt:
        assert got[k].dtype == d
        np.testing.assert_allclose(got[k], want[k].numpy(), rtol=1e-9, atol=1e-10, err_msg=k)
    # The forward agrees with the session.
    want_out = float((torch.tanh(sl) ** 2).mean(1).sum().detach())
    assert np.isclose(sess.run(None, {"x": x})[0], want_out)


def test_custom_op_in_a_graph():
    @opwarden.op("Cube", domain="test.graphgrad", inputs=["X: T"], outputs=["Y: T"],
                 types={"T": ["float32", "float64"]})
    def Cube(X):
        return X ** 3

    @Cube.grad
    def _(ctx, dY):
        return (3 * ctx.inputs[0] ** 2 * dY,)

    nodes = [helper.make_node("Cube", ["x"], ["c"], domain="test.graphgrad"),
             helper.make_node("ReduceSum", ["c"], ["y"], keepdims=0)]
    m = _model(nodes, [("x", TensorProto.DOUBLE, [3])], [("y", TensorProto.DOUBLE, [])], {},
               extra_opsets=[("test.graphgrad", 1)])
    x = np.array([1.0, -2.0, 0.5])
    np.testing.assert_allclose(grad(m, {"x": x}, wrt=["x"])["x"], 3 * x**2)


def test_shared_values_accumulate_and_unused_wrt_is_zero():
    nodes = [helper.make_node("Mul", ["x", "x"], ["y"]), helper.make_node("Add", ["y", "x"], ["z"])]
    m = _model(nodes, [("x", TensorProto.DOUBLE, [2]), ("u", TensorProto.DOUBLE, [2])],
               [("z", TensorProto.DOUBLE, [2])], {})
    g = grad(m, {"x": np.array([1.0, 3.0]), "u": np.zeros(2)}, wrt=["x", "u"])
    np.testing.assert_allclose(g["x"], [3.0, 7.0])
    np.testing.assert_array_equal(g["u"], [0.0, 0.0])


def test_errors_name_the_problem():
    nodes = [helper.make_node("Hardmax", ["x"], ["h"], name="hm"),
             helper.make_node("ReduceSum", ["h"], ["y"], keepdims=0)]
    m = _model(nodes, [("x", TensorProto.DOUBLE, [2, 3])], [("y", TensorProto.DOUBLE, [])], {})
    x = rng.standard_normal((2, 3))
    with pytest.raises(UnsupportedOpError, match="'hm' \\(Hardmax\\).*no backward rule"):
        grad(m, {"x": x}, wrt=["x"])
    with pytest.raises(InputError, match="unknown wrt name 'nope'"):
        grad(m, {"x": x}, wrt=["nope"])
    with pytest.raises(InputError, match="unknown feed 'z'"):
        grad(m, {"x": x, "z": x}, wrt=["x"])
    with pytest.raises(InputError, match="missing feed for input 'x'"):
        grad(m, {}, wrt=["x"])
    with pytest.raises(InputError, match="unknown output name"):
        grad(m, {"x": x}, wrt=["x"], output="nope")


def test_wrong_count_in_a_graph_is_a_contract_error():
    @opwarden.op("BadCount", domain="test.graphgrad2", inputs=["X: T"], outputs=["Y: T"],
                 types={"T": ["float64"]})
    def BadCount(X):
        return X * 2

    BadCount.grad(lambda ctx, dY: (dY, dY))
    nodes = [helper.make_node("BadCount", ["x"], ["y"], domain="test.graphgrad2", name="bc")]
    m = _model(nodes, [("x", TensorProto.DOUBLE, [2])], [("y", TensorProto.DOUBLE, [2])], {},
               extra_opsets=[("test.graphgrad2", 1)])
    with pytest.raises(opwarden.ContractError, match="BadCount.*'bc'.*returned 2 gradient"):
        grad(m, {"x": np.ones(2)}, wrt=["x"])


def test_initializer_overrides_and_onnx_roundtrip():
    m, p = _cnn()
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    labels = np.array([0, 2], dtype=np.int64)
    g1 = grad(m, {"x": x, "labels": labels}, wrt=["b2"])
    g2 = grad(m, {"x": x, "labels": labels, "b2": p["b2"] * 3}, wrt=["b2"])
    assert not np.allclose(g1["b2"], g2["b2"])
    assert isinstance(onnx.load_from_string(m.SerializeToString()), onnx.ModelProto)


def test_optimized_session():
    """A default (optimized) session: gradients of the model as written, or a clear error."""
    m, _ = _cnn()
    feeds = {"x": rng.standard_normal((2, 3, 8, 8)).astype(np.float32),
             "labels": np.array([1, 0], dtype=np.int64)}
    sess = opwarden.InferenceSession(m.SerializeToString())
    want = grad(m, feeds, wrt=["W"])["W"]
    if getattr(sess, "source", None) is None and any(
        e.get("changes") for e in sess.pass_report
    ):
        with pytest.raises(opwarden.ModelError, match="optimization_level=0"):
            grad(sess, feeds, wrt=["W"])
    else:
        np.testing.assert_allclose(grad(sess, feeds, wrt=["W"])["W"], want, rtol=1e-6)
