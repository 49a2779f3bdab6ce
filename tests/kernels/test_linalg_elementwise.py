"""Gemm/MatMul/Softmax and elementwise variants vs the reference kernels; sessions use them."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from opwarden.kernels.cpu import activation as kact
from opwarden.kernels.cpu import elementwise as kew
from opwarden.kernels.cpu import fused as kfused
from opwarden.kernels.cpu import linalg as klin
from opwarden.ops.base import REGISTRY
from opwarden.ops.fused import FusedGemm, FusedMatMul

RNG = np.random.default_rng(0)


def r(*shape):
    return RNG.standard_normal(shape, dtype=np.float32)


def ref(op_type, *args, since=None, **attrs):
    versions = REGISTRY.versions(op_type)
    opdef = versions[-1] if since is None else [v for v in versions if v.since == since][0]
    return opdef.reference(*args, **attrs)


@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("c_shape", [None, (5,), (4, 1), (4, 5), ()])
@pytest.mark.parametrize("alpha,beta", [(1.0, 1.0), (0.5, -2.0)])
def test_gemm_matches_reference(ta, tb, c_shape, alpha, beta):
    a = r(3, 4) if ta else r(4, 3)
    b = r(5, 3) if tb else r(3, 5)
    c = None if c_shape is None else r(*c_shape)
    want = ref("Gemm", a, b, c, alpha=alpha, beta=beta, transA=ta, transB=tb)
    out = np.empty((4, 5), np.float32)
    got = klin._gemm_kernel(a, b, c, alpha=alpha, beta=beta, transA=ta, transB=tb, out=out)
    assert got is out
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    want = FusedGemm(a, b, c, alpha=alpha, beta=beta, transA=ta, transB=tb, activation="Relu")
    got = kfused.fused_gemm(a, b, c, alpha=alpha, beta=beta, transA=ta, transB=tb,
                            activation="Relu")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((4,), (4, 2)), ((2, 3, 4), (4, 6)),
                                   ((2, 1, 3, 4), (5, 4, 2)), ((3, 4), (4,))])
def test_matmul_matches_reference(sa, sb):
    a, b = r(*sa), r(*sb)
    want = ref("MatMul", a, b)
    out = np.empty(want.shape, np.float32)
    assert klin.matmul(a, b, out=out) is out
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    if want.ndim:
        c = r(want.shape[-1])
        np.testing.assert_allclose(kfused.fused_matmul_kernel(a, b, c, activation="Tanh"),
                                   FusedMatMul(a, b, c, activation="Tanh"), rtol=1e-5, atol=1e-5)


def test_fused_matmul_bias_broadcasting_the_product_up():
    a, b, c = r(3, 4), r(4, 5), r(2, 3, 5)
    want = FusedMatMul(a, b, c)
    out = np.empty(want.shape, np.float32)
    got = kfused.fused_matmul_kernel(a, b, c, out=out)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,axis", [((3, 7), -1), ((2, 3, 4), 1), ((2, 3, 4), 0),
                                        ((5,), 0), ((2, 3, 4), -2)])
def test_softmax_family_matches_reference(shape, axis):
    x = r(*shape) * 10
    for op_type, f13, f1 in (("Softmax", klin.softmax_13, klin.softmax_1),
                             ("LogSoftmax", klin.log_softmax_13, klin.log_softmax_1)):
        out = np.empty(shape, np.float32)
        assert f13(x, axis=axis, out=out) is out
        np.testing.assert_allclose(out, ref(op_type, x, axis=axis), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(f1(x, axis=axis), ref(op_type, x, axis=axis, since=1),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("in_place", [False, True])
def test_elementwise_match_reference_and_may_write_over_input0(in_place):
    cases = [
        ("Relu", kew.relu, (r(3, 4),), {}),
        ("Tanh", kew.tanh, (r(3, 4),), {}),
        ("Sigmoid", kact.sigmoid, (r(3, 4) * 50,), {}),
        ("LeakyRelu", kew.leaky_relu, (r(3, 4),), {"alpha": 0.3}),
        ("Clip", kew.clip_11, (r(3, 4), np.float32(-0.5), np.float32(0.4)), {}),
        ("Clip", kew.clip_11, (r(3, 4), None, np.float32(0.4)), {}),
        ("Clip", kew.clip_11, (r(3, 4), np.float32(1), np.float32(0)), {}),
        ("Add", kew._binary(np.add), (r(3, 4), r(4)), {}),
        ("Sub", kew._binary(np.subtract), (r(3, 4), r(3, 1)), {}),
        ("Mul", kew._binary(np.multiply), (r(3, 4), r(3, 4)), {}),
        ("Div", kew.div, (r(3, 4), np.array([1, 0, 2, -1], np.float32)), {}),
        ("Sum", kew.sum_, (r(3, 4), r(4), r(3, 4)), {}),
        ("Sum", kew.sum_, (r(3, 4),), {}),
    ]
    for op_type, fn, args, attrs in cases:
        want = ref(op_type, *args, **attrs)
        x0 = args[0].copy()
        out = x0 if in_place else np.empty_like(x0)
        got = fn(x0, *args[1:], **attrs, out=out)
        assert got is out, op_type
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=op_type)
        got = fn(*args, **attrs)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=op_type)
    x = np.array([[-9.0, 0.5], [3.0, 2.0]], np.float32)  # fixed: both bounds are hit
    np.testing.assert_array_equal(kew.clip_6(x, min=-1.0, max=1.0), [[-1, 0.5], [1, 1]])


def test_a_session_runs_the_fast_conv_variant():
    import opwarden

    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 3, 8, 8])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)
    w = helper.make_tensor("W", TensorProto.FLOAT, [4, 3, 3, 3], r(4, 3, 3, 3).ravel().tolist())
    nodes = [
        helper.make_node("Conv", ["X", "W"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["Y"]),
    ]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [w]),
                              opset_imports=[helper.make_opsetid("", 13)])
    sess = opwarden.InferenceSession(model.SerializeToString())
    feed = r(1, 3, 8, 8)
    got = sess.run(None, {"X": feed})[0]
    chosen = {p.variant.name for p in sess.placements}
    assert chosen & {"conv.cpu.nchw", "conv.cpu.nhwc", "fusedconv.cpu.nchw",
                     "fusedconv.cpu.nhwc"}, chosen
    import onnxruntime as ort

    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"X": feed})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape", [(1, 7, 5, 6), (3, 4, 6), (2, 1, 3, 6)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_stacked_a_times_2d_b_is_one_gemm_with_numpys_values(shape, dtype):
    from opwarden.kernels.cpu.linalg import matmul

    rng = np.random.default_rng(3)
    a = rng.standard_normal(shape).astype(dtype)
    b = rng.standard_normal((6, 9)).astype(dtype)
    want = np.matmul(a, b)
    got = matmul(a, b)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    out = np.full(want.shape, np.nan if dtype != np.int64 else -1, dtype)
    assert matmul(a, b, out=out) is out
    np.testing.assert_allclose(out, want, rtol=1e-6)
    # a transposed (non-contiguous) A and an out of another layout take NumPy's own path
    at = np.ascontiguousarray(np.swapaxes(a, -1, -2)).swapaxes(-1, -2)
    np.testing.assert_allclose(matmul(at, b), want, rtol=1e-6)
    fortran = np.asfortranarray(np.zeros(want.shape, dtype))
    np.testing.assert_allclose(matmul(a, b, out=fortran), want, rtol=1e-6)
