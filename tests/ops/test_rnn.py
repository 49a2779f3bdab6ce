"""RNN/GRU/LSTM against onnxruntime: sequence_lens, directions, activations, clip, peepholes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from opwarden.dtypes import onnx_type
from opwarden.errors import KernelError
from opwarden.ops import REGISTRY

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(0)
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def ours(op_type, opset, inputs, attrs):
    opdef, sch = REGISTRY.resolve(op_type, "", opset)
    kw = {k: a.default for k, a in sch.attrs.items() if a.has_default}
    kw.update(attrs)
    while inputs and inputs[-1] is None:
        inputs = inputs[:-1]
    return list(opdef.reference(*inputs, **kw))


def theirs(op_type, opset, inputs, attrs, n_out):
    names = [f"i{k}" if x is not None else "" for k, x in enumerate(inputs)]
    while names and not names[-1]:
        names.pop()
    outs = [f"o{k}" for k in range(n_out)]
    node = helper.make_node(op_type, names, outs, **attrs)
    g = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, onnx_type(x.dtype), x.shape)
         for n, x in zip(names, inputs) if x is not None and n],
        [onnx.ValueInfoProto(name=o) for o in outs],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    feeds = {n: x for n, x in zip(names, inputs) if n}
    return ort.InferenceSession(model.SerializeToString()).run(None, feeds)


def make(op_type, T=5, B=3, I=4, H=3, D=1, seq=False, init=False, peep=False):
    g = GATES[op_type]
    X = RNG.standard_normal((T, B, I)).astype(np.float32)
    W = RNG.standard_normal((D, g * H, I)).astype(np.float32) * 0.5
    R = RNG.standard_normal((D, g * H, H)).astype(np.float32) * 0.5
    Bi = RNG.standard_normal((D, 2 * g * H)).astype(np.float32) * 0.3
    lens = np.array([T, 2, T - 1][:B], np.int32) if seq else None
    h0 = RNG.standard_normal((D, B, H)).astype(np.float32) if init else None
    ins = [X, W, R, Bi, lens, h0]
    if op_type == "LSTM":
        c0 = RNG.standard_normal((D, B, H)).astype(np.float32) if init else None
        P = RNG.standard_normal((D, 3 * H)).astype(np.float32) * 0.3 if peep else None
        ins += [c0, P]
    return ins


def check(op_type, ins, attrs, opset=14):
    n_out = 3 if op_type == "LSTM" else 2
    a = ours(op_type, opset, ins, attrs)
    b = theirs(op_type, opset, ins, attrs, n_out)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape, (x.shape, y.shape)
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op_type", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("seq", [False, True])
def test_directions_and_sequence_lens(op_type, direction, seq):
    D = 2 if direction == "bidirectional" else 1
    ins = make(op_type, D=D, seq=seq, init=True, peep=True)
    check(op_type, ins, {"hidden_size": 3, "direction": direction})


@pytest.mark.parametrize("opset", [7, 14, 22])
def test_gru_linear_before_reset(opset):
    ins = make("GRU", D=2, seq=True, init=True)
    check("GRU", ins, {"hidden_size": 3, "direction": "bidirectional",
                       "linear_before_reset": 1}, opset)


def test_lstm_input_forget_and_clip():
    ins = make("LSTM", D=1, init=True, peep=True)
    check("LSTM", ins, {"hidden_size": 3, "input_forget": 1, "clip": 0.7})


@pytest.mark.parametrize("op_type,acts", [
    ("RNN", ["LeakyRelu", "HardSigmoid"]),
    ("GRU", ["HardSigmoid", "LeakyRelu", "Sigmoid", "Elu"]),
    ("LSTM", ["HardSigmoid", "Tanh", "Softsign", "Sigmoid", "ScaledTanh", "Relu"]),
])
def test_activations_with_alpha_beta(op_type, acts):
    ins = make(op_type, D=2, init=True)
    attrs = {"hidden_size": 3, "direction": "bidirectional", "activations": acts,
             "activation_alpha": [0.3, 0.4, 0.6], "activation_beta": [0.2, 0.7]}
    check(op_type, ins, attrs)


@pytest.mark.parametrize("op_type", ["RNN", "GRU", "LSTM"])
def test_layout_1_is_transposed_layout_0(op_type):
    ins = make(op_type, D=2, seq=True, init=True)
    attrs = {"hidden_size": 3, "direction": "bidirectional"}
    base = ours(op_type, 14, ins, attrs)
    t = list(ins)
    t[0] = np.swapaxes(ins[0], 0, 1)
    for k in (5, 6):
        if k < len(t) and t[k] is not None:
            t[k] = np.swapaxes(t[k], 0, 1)
    got = ours(op_type, 14, t, {**attrs, "layout": 1})
    np.testing.assert_allclose(got[0], np.transpose(base[0], (2, 0, 1, 3)), rtol=1e-6)
    for g, b in zip(got[1:], base[1:]):
        np.testing.assert_allclose(g, np.swapaxes(b, 0, 1), rtol=1e-6)


def test_float16_and_old_opsets():
    ins = make("LSTM", init=True)
    h = [x.astype(np.float16) if x is not None and x.dtype == np.float32 else x for x in ins]
    out = ours("LSTM", 7, h, {"hidden_size": 3})
    assert all(o.dtype == np.float16 for o in out)
    ref = ours("LSTM", 14, ins, {"hidden_size": 3})
    np.testing.assert_allclose(out[0].astype(np.float32), ref[0], atol=1e-2)
    g = make("GRU")
    ours("GRU", 1, g, {"hidden_size": 3})  # GRU-1's default direction is spelt "foward"
    ours("RNN", 1, make("RNN"), {"hidden_size": 3, "output_sequence": 1})


def test_bad_shapes_raise_kernel_error():
    X, W, R, B, _, _ = make("RNN")
    with pytest.raises(KernelError, match="W has shape"):
        ours("RNN", 14, [X, W[:, :, :2], R], {"hidden_size": 3})
    with pytest.raises(KernelError, match="sequence_lens"):
        ours("RNN", 14, [X, W, R, B, np.array([9, 1, 1], np.int32)], {"hidden_size": 3})
