"""Prepared convolution steps (kernels.cpu.conv_prepared, execute.codegen.prepared_form): the
lean loop runs an NHWC convolution step through a call prepared once from its constant
weights, attributes and planned buffer. Held here: the steps of a small CNN are prepared, the
results are bit for bit those of the generic kernels (residuals in place, activations, the
NHWC view of the graph input, batch and shape changes), and a prepared call hands anything
it was not prepared for to the generic kernel."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import opwarden as ow
from opwarden.execute import codegen
from opwarden.kernels.cpu import conv as kconv
from opwarden.kernels.cpu import fused as kfused
from opwarden.memory.constants import mark
from opwarden.ops.conv import Conv

F32 = TensorProto.FLOAT


def _cnn(batch, stem_m=16, hw=(20, 22)) -> bytes:
    """An RGB stem (3x3/2, HardSwish), a depthwise 3x3, two pointwise convolutions with a
    residual add in between, a 3x3 grouped one, a pointwise one with bias and HardSwish, and
    a 3x3 dense one."""
    rng = np.random.default_rng(3)

    def w(*shape):
        fan = int(np.prod(shape[1:]))
        return (rng.standard_normal(shape) / np.sqrt(fan)).astype(np.float32)

    inits = {"ws": w(stem_m, 3, 3, 3), "bs": w(stem_m, 1)[:, 0], "wd": w(stem_m, 1, 3, 3),
             "wp": w(32, stem_m, 1, 1), "wq": w(32, 32, 1, 1), "bq": w(32, 1)[:, 0],
             "wg": w(32, 8, 3, 3), "wr": w(32, 32, 1, 1), "br": w(32, 1)[:, 0],
             "wc": w(24, 32, 3, 3)}
    nodes = [
        helper.make_node("Conv", ["x", "ws", "bs"], ["c0"], strides=[2, 2], pads=[1] * 4),
        helper.make_node("HardSwish", ["c0"], ["a0"]),
        helper.make_node("Conv", ["a0", "wd"], ["c1"], group=stem_m, pads=[1] * 4),
        helper.make_node("Relu", ["c1"], ["a1"]),
        helper.make_node("Conv", ["a1", "wp"], ["c2"]),
        helper.make_node("Conv", ["c2", "wq", "bq"], ["c3"]),
        helper.make_node("Add", ["c3", "c2"], ["r3"]),
        helper.make_node("Relu", ["r3"], ["a3"]),
        helper.make_node("Conv", ["a3", "wg"], ["c4"], group=4, pads=[1] * 4),
        helper.make_node("Conv", ["c4", "wr", "br"], ["c5"]),
        helper.make_node("HardSwish", ["c5"], ["a5"]),
        helper.make_node("Conv", ["a5", "wc"], ["y"], pads=[1] * 4),
    ]
    g = helper.make_graph(
        nodes, "cnn", [helper.make_tensor_value_info("x", F32, [batch, 3, *hw])],
        [helper.make_tensor_value_info("y", F32, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def _prepared_steps(sess, x) -> list[str]:
    entry, token = sess.memory.lease([x])
    token.release()
    lean = entry.bound.lean[True]
    return sorted(v.__name__ for k, v in lean.__globals__.items()
                  if k.startswith("f") and getattr(v, "__name__", "").startswith("prepared_"))


@pytest.mark.parametrize("batch", [1, 2, "N"])
@pytest.mark.parametrize("stem_m", [16, 12])  # the direct route and the NumPy stem
# maps of 110 pixels (the GEMM), 16 (the transposed product) and 1 (the GEMV) after the stem
@pytest.mark.parametrize("hw", [(20, 22), (8, 8), (2, 2)], ids=["gemm", "few", "one"])
def test_session_steps_are_prepared_and_match_the_generic_kernels(batch, stem_m, hw,
                                                                   monkeypatch):
    data = _cnn(batch, stem_m, hw)
    rng = np.random.default_rng(4)
    n = 2 if batch == "N" else batch
    xs = [rng.standard_normal((n, 3, *hw)).astype(np.float32) for _ in range(3)]
    sess = ow.InferenceSession(data)
    got = [sess.run(None, {"x": x})[0] for x in xs]
    assert len(_prepared_steps(sess, xs[0])) >= 4, _prepared_steps(sess, xs[0])
    monkeypatch.setattr(codegen, "prepared_form", lambda call, consts: None)
    plain = ow.InferenceSession(data)
    for x, g in zip(xs, got, strict=True):
        np.testing.assert_array_equal(g, plain.run(None, {"x": x})[0])
    assert _prepared_steps(plain, xs[0]) == []
    ref = ow.InferenceSession(data, ow.SessionOptions(optimization_level=0))
    np.testing.assert_allclose(got[0], ref.run(None, {"x": xs[0]})[0], rtol=1e-4, atol=1e-4)
    if batch == "N":  # another batch: a new signature, its own prepared steps
        x3 = rng.standard_normal((3, 3, *hw)).astype(np.float32)
        np.testing.assert_array_equal(sess.run(None, {"x": x3})[0],
                                      plain.run(None, {"x": x3})[0])


def _fused_route(route):
    for opdef in kfused.REGISTRY.versions("FusedConv", "opwarden"):
        for v in opdef.variants:
            if v.name == f"fusedconv.cpu.{kconv.VARIANTS[route][0]}":
                return v.fn
    raise AssertionError(route)


def test_prepared_call_hands_what_it_was_not_prepared_for_to_the_kernel():
    rng = np.random.default_rng(5)
    w = mark(rng.standard_normal((16, 8, 1, 1)).astype(np.float32))
    b = mark(rng.standard_normal(16).astype(np.float32))
    fn = _fused_route("pointwise")
    out = np.empty((1, 5, 6, 16), np.float32)
    kw = {"activation": "Relu", "out": out}
    prepared = fn.prepare(kw, (..., w, b))
    assert prepared is not None
    x = rng.standard_normal((1, 5, 6, 8)).astype(np.float32)

    def want(x, w=w, b=b, z=None):
        return np.maximum(Conv(x.transpose(0, 3, 1, 2), w, b).transpose(0, 2, 3, 1)
                          + (0 if z is None else z), 0)

    assert prepared(x, w, b, out=out) is out
    np.testing.assert_allclose(out, want(x), rtol=1e-5, atol=1e-5)
    # Another shape, other weights, a float64 X, a residual: the generic kernel, same answers
    x2 = rng.standard_normal((2, 5, 6, 8)).astype(np.float32)
    np.testing.assert_allclose(prepared(x2, w, b, out=out), want(x2), rtol=1e-5, atol=1e-5)
    w2 = mark(np.array(w) * 2)
    np.testing.assert_allclose(prepared(x, w2, b, out=out), want(x, w2), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(prepared(x.astype(np.float64), w, b, out=out), want(x),
                               rtol=1e-5, atol=1e-5)
    z = rng.standard_normal(out.shape).astype(np.float32)
    np.testing.assert_allclose(prepared(x, w, b, z, out=out), want(x, z=z), rtol=1e-5,
                               atol=1e-5)
    zs = np.asfortranarray(z)  # not C-contiguous
    np.testing.assert_allclose(prepared(x, w, b, zs, out=out), want(x, z=z), rtol=1e-5,
                               atol=1e-5)


def test_not_prepared_without_constant_weights_or_a_planned_buffer():
    rng = np.random.default_rng(6)
    w = mark(rng.standard_normal((16, 8, 1, 1)).astype(np.float32))
    fn = _fused_route("pointwise")
    out = np.empty((1, 5, 6, 16), np.float32)
    assert fn.prepare({"out": out}, (..., w, None)) is not None
    assert fn.prepare({"out": out}, (..., ..., None)) is None  # computed weights
    assert fn.prepare({"out": out}, (..., np.array(w), None)) is None  # not declared constant
    assert fn.prepare({"out": out}, (..., w, ...)) is None  # a computed bias
    assert fn.prepare({"out": None}, (..., w, None)) is None
    assert fn.prepare({"out": out[:, ::2]}, (..., w, None)) is None  # strided
    assert fn.prepare({"out": out, "input_shuffle": 2}, (..., w, None)) is None


# (map, bias, activation): a small map (the epilogue adds bias and residual), one of
# PREFILL_MIN floats and more (both written first for the GEMM to accumulate on)
RESIDUAL_CASES = [((9, 10), True, "Relu"), ((9, 10), False, ""), ((64, 66), True, "HardSwish"),
                  ((64, 66), False, "")]


@pytest.mark.parametrize("hw,bias,act", RESIDUAL_CASES)
@pytest.mark.parametrize("alias", [False, True], ids=["apart", "in-place"])
def test_prepared_pointwise_residual_is_the_generic_kernels(hw, bias, act, alias):
    rng = np.random.default_rng(8)
    c, m = 24, 32
    w = mark(rng.standard_normal((m, c, 1, 1)).astype(np.float32))
    b = mark(rng.standard_normal(m).astype(np.float32)) if bias else None
    x = rng.standard_normal((1, *hw, c)).astype(np.float32)
    z0 = rng.standard_normal((1, *hw, m)).astype(np.float32)
    fn = _fused_route("pointwise")
    # The generic kernel with the same aliasing (in place, the residual is summed first)
    want = z0.copy()
    fn(x, w, b, want.view() if alias else z0.copy(), activation=act, out=want)
    out = np.empty_like(want)
    prepared = fn.prepare({"activation": act, "out": out}, (..., w, b, ...))
    assert prepared is not None
    zv = out.view() if alias else np.empty_like(out)
    for _ in range(3):  # the first call, then the bound ones
        np.copyto(out if alias else zv, z0)
        got = prepared(x, w, b, zv, out=out)
        assert got is out
        np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("shuffle", [0, 2, 4])
@pytest.mark.parametrize("stride", [1, 2])
def test_prepared_depthwise_with_its_input_shuffle_is_the_kernel(shuffle, stride):
    from opwarden import native
    from opwarden.kernels.cpu.conv_dw_native import depthwise_native

    if not native.available():
        pytest.skip("compiled path off")
    rng = np.random.default_rng(9)
    c = 24
    w = mark(rng.standard_normal((c, 1, 3, 3)).astype(np.float32))
    b = mark(rng.standard_normal(c).astype(np.float32))
    x = rng.standard_normal((1, 11, 12, c)).astype(np.float32)
    attrs = {"group": c, "pads": [1] * 4, "strides": [stride] * 2, "activation": "Relu",
             "input_shuffle": shuffle}
    want = depthwise_native(x, w, b, **attrs)
    out = np.empty_like(want)
    prepared = depthwise_native.prepare({**attrs, "out": out}, (..., w, b))
    assert prepared is not None
    for _ in range(3):
        assert prepared(x, w, b, out=out) is out
        assert out.tobytes() == want.tobytes()
