"""attention.attention_fusion: MatMul -> [scalar Mul/Div] -> [Add] [Add] -> Softmax -> [Cast]
-> MatMul as one SoftmaxAttention node, in the head layouts exporters write (Q and V as
transposed (B, N, S, H) views, K transposed to (B, N, H, T)); outputs against the unoptimized
session and onnxruntime, with the compiled paths on and off; the chains it must leave alone."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import opwarden as ow
from tests.passes.helpers import changes, check_same, model, op_types

B, S, N, H = 2, 24, 4, 8
D = N * H


def _weights(seed=0):
    rng = np.random.default_rng(seed)
    return [(f"w{c}", (rng.standard_normal((D, D)) * 0.3).astype(np.float32)) for c in "qkv"]


def attention_model(scale_op="Mul", scale=0.35, biases=("mask",), cast=False,
                    opset=17, softmax_axis=-1, seq=S) -> bytes:
    """x (B, S, D) -> Q/K/V projections -> heads -> attention core -> merged heads."""
    shape4 = np.array([0, 0, N, H], np.int64)
    inits = [*_weights(), ("shape4", shape4), ("shape3", np.array([0, 0, D], np.int64)),
             ("c", np.array(scale, np.float32))]
    nodes = []
    for c in "qkv":
        nodes += [helper.make_node("MatMul", ["x", f"w{c}"], [f"{c}p"]),
                  helper.make_node("Reshape", [f"{c}p", "shape4"], [f"{c}r"])]
    nodes += [
        helper.make_node("Transpose", ["qr"], ["q"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["kr"], ["kt"], perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["vr"], ["v"], perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["q", "kt"], ["s0"]),
    ]
    cur = "s0"
    if scale_op:
        nodes.append(helper.make_node(scale_op, [cur, "c"], ["s1"]))
        cur = "s1"
    inputs = [("x", ["B", seq, D])]
    for i, b in enumerate(biases):
        nodes.append(helper.make_node("Add", [cur, b], [f"sb{i}"]))
        cur = f"sb{i}"
        inputs.append((b, ["B", 1, 1, seq] if b == "mask" else [1, N, seq, seq]))
    nodes.append(helper.make_node("Softmax", [cur], ["p"], axis=softmax_axis))
    p = "p"
    if cast:
        nodes.append(helper.make_node("Cast", ["p"], ["pc"], to=TensorProto.FLOAT))
        p = "pc"
    nodes += [helper.make_node("MatMul", [p, "v"], ["o"]),
              helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ot", "shape3"], ["y"])]
    return model(nodes, inputs, [("y", None)], inits, opset=opset)


def _feeds(biases=("mask",), seed=1, seq=S):
    rng = np.random.default_rng(seed)
    f = {"x": rng.standard_normal((B, seq, D)).astype(np.float32)}
    for b in biases:
        if b == "mask":
            m = np.zeros((B, 1, 1, seq), np.float32)
            m[1, ..., seq - 5:] = -10000.0  # the second sequence padded
            f[b] = m
        else:
            f[b] = rng.standard_normal((1, N, seq, seq)).astype(np.float32)
    return f


def _ort(data, feeds):
    ort = pytest.importorskip("onnxruntime")
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.mark.parametrize("kw", [
    {"scale_op": "Mul", "biases": ("mask",)},          # BERT
    {"scale_op": "Div", "scale": 8.0 ** 0.5, "biases": ("mask",)},
    {"scale_op": "Mul", "scale": 1.0, "biases": ()},  # Whisper / ViT (Q scaled before)
    {"scale_op": "", "biases": ("pos", "mask")},       # T5: position bias, then the mask
    {"scale_op": "Mul", "biases": ("mask",), "cast": True},  # GPT-2's float32 Cast
    {"scale_op": "", "biases": (), "opset": 11, "softmax_axis": 3},
    {"scale_op": "Mul", "biases": (), "seq": 700},      # row blocks of one head
])
def test_attention_core_fuses_and_matches(kw):
    biases = kw.get("biases", ())
    seq = kw.get("seq", S)
    data = attention_model(**kw)
    feeds = _feeds(biases, seq=seq)
    sess = check_same(data, feeds, rtol=2e-5)
    assert changes(sess, "attention_fusion") >= 2
    types = op_types(sess)
    assert "SoftmaxAttention" in types and "Softmax" not in types
    got = sess.run(None, feeds)[0]
    want = _ort(data, feeds)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * float(np.abs(want).max()))


def test_numpy_only_path_matches(monkeypatch):
    """OPWARDEN_NATIVE=0 (no compiled kernels): the blocked NumPy variant is the path."""
    monkeypatch.setenv("OPWARDEN_NATIVE", "0")
    data = attention_model()
    feeds = _feeds()
    sess = ow.InferenceSession(data)
    assert "SoftmaxAttention" in op_types(sess)
    want = _ort(data, feeds)
    got = sess.run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * float(np.abs(want).max()))


def test_softmax_over_another_axis_stays():
    data = attention_model(biases=(), softmax_axis=2)
    sess = check_same(data, _feeds(()))
    assert changes(sess, "attention_fusion") == 0
    assert "Softmax" in op_types(sess)


def test_scores_read_elsewhere_stay():
    """The scores are also a graph output: the chain is not fused."""
    data = attention_model(biases=())
    import onnx

    m = onnx.load_from_string(data)
    m.graph.output.append(helper.make_tensor_value_info("s1", TensorProto.FLOAT, None))
    data = m.SerializeToString()
    sess = check_same(data, _feeds(()))
    assert changes(sess, "attention_fusion") == 0


def test_pass_can_be_disabled():
    sess = ow.InferenceSession(attention_model(),
                               ow.SessionOptions(disabled_passes=["attention_fusion"]))
    assert "SoftmaxAttention" not in op_types(sess) and "Softmax" in op_types(sess)
