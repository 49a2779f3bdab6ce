"""The fast quantized variants (kernels/cpu/quant.py, quant_linear.py) against the reference
kernels bit for bit, and against onnxruntime on single-node models.

The integer products run on float32 BLAS in chunks of the inner dimension short enough to
stay exact; the cases here cross those bounds (K well past 514 for uint8 x int8) with zero
points at the ends of their ranges, so a chunking or centering slip shows as a wrong integer.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from opwarden.kernels.cpu.quant import (
    dynamic_quantize_matmul_blas,
    qgemm_blas,
    qlinear_conv_im2col,
    qlinear_matmul_blas,
)
from opwarden.kernels.cpu.quant_linear import (
    dequantize_fast,
    dynamic_quantize_fast,
    exact_matmul,
    matmul_integer_blas,
    quantize_fast,
)
from opwarden.ops.base import REGISTRY
from tests import ort_int8

F32 = np.float32


def ref(op: str, domain: str = ""):
    return REGISTRY.latest(op, domain).reference


def q8(rng, dtype, shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, int(info.max) + 1, size=shape).astype(dtype)


def test_exact_matmul_is_exact_past_the_float32_bound():
    rng = np.random.default_rng(0)
    k = 3000
    a = np.full((4, k), 255, F32)
    b = np.full((k, 3), -128, F32)
    a[1] = rng.integers(0, 256, k)
    b[:, 1] = rng.integers(-128, 128, k)
    got = exact_matmul(a, b, 255, 128)
    want = a.astype(np.int64) @ b.astype(np.int64)
    assert np.array_equal(got.astype(np.int64), want)
    # One float32 GEMM of the same operands is not exact: the chunks are what makes it so.
    assert abs(float(want[0, 0])) > 1 << 24


CONV_CASES = [
    # (x shape, w shape, attrs)
    ((2, 4, 9, 8), (6, 2, 3, 3), {"group": 2, "pads": [1, 0, 2, 1], "strides": [2, 1]}),
    ((1, 8, 7, 7), (8, 1, 3, 3), {"group": 8, "pads": [1, 1, 1, 1]}),  # depthwise
    ((2, 6, 10, 10), (6, 1, 5, 5), {"group": 6, "strides": [2, 2], "dilations": [1, 2],
                                     "pads": [2, 3, 2, 3]}),  # depthwise, strided, dilated
    ((1, 64, 6, 6), (16, 64, 3, 3), {"pads": [1, 1, 1, 1]}),  # K = 576: two chunks
    ((1, 300, 4, 4), (5, 300, 1, 1), {}),  # pointwise, K = 300
    ((2, 3, 11), (4, 3, 3), {"pads": [1, 2], "strides": [2]}),  # 1-D
    ((1, 6, 12), (6, 1, 3), {"group": 6, "dilations": [2], "auto_pad": "SAME_UPPER"}),
]


@pytest.mark.parametrize("types", [(np.uint8, np.int8), (np.uint8, np.uint8),
                                   (np.int8, np.int8)])
@pytest.mark.parametrize("xs,ws,attrs", CONV_CASES)
def test_qlinear_conv_matches_reference(xs, ws, attrs, types):
    xt, wt = types
    rng = np.random.default_rng(len(xs) * 100 + ws[0])
    x, w = q8(rng, xt, xs), q8(rng, wt, ws)
    m = ws[0]
    lo = int(np.iinfo(xt).min)
    args = [x, np.asarray(0.02, F32), np.asarray(lo, xt), w,
            rng.uniform(0.001, 0.01, m).astype(F32), np.asarray(np.iinfo(wt).max, wt),
            np.asarray(0.2, F32), np.asarray(lo + 7, xt),
            rng.integers(-5000, 5000, m).astype(np.int32)]
    want = ref("QLinearConv")(*args, **attrs)
    got = qlinear_conv_im2col(*args, **attrs)
    assert got.dtype == want.dtype and np.array_equal(got, want)
    # into a caller's buffer, without a bias
    out = np.empty(want.shape, want.dtype)
    got = qlinear_conv_im2col(*args[:8], **attrs, out=out)
    assert np.array_equal(got, ref("QLinearConv")(*args[:8], **attrs))


@pytest.mark.parametrize("ashape,bshape", [((5, 700), (700, 9)), ((2, 3, 8, 40), (40, 6)),
                                           ((2, 1, 8, 33), (3, 33, 7)), ((0, 4), (4, 3))])
@pytest.mark.parametrize("per_column", [False, True])
def test_qlinear_matmul_batched_matches_reference(ashape, bshape, per_column):
    rng = np.random.default_rng(sum(ashape))
    a, b = q8(rng, np.uint8, ashape), q8(rng, np.int8, bshape)
    n = bshape[-1]
    if per_column and len(bshape) != 2:
        pytest.skip("per-column b is 2-D")
    bs = rng.uniform(0.01, 0.02, n).astype(F32) if per_column else np.asarray(0.015, F32)
    bz = rng.integers(-128, 128, n).astype(np.int8) if per_column else np.asarray(-128, np.int8)
    args = [a, np.asarray(0.03, F32), np.asarray(255, np.uint8), b, bs, bz,
            np.asarray(0.5, F32), np.asarray(3, np.uint8)]
    want = ref("QLinearMatMul")(*args)
    got = qlinear_matmul_blas(*args)
    assert got.shape == want.shape and np.array_equal(got, want)


@pytest.mark.parametrize("trans_b", [0, 1])
def test_qgemm_per_column_large_k(trans_b):
    rng = np.random.default_rng(trans_b)
    k, n = 1100, 6
    a = q8(rng, np.uint8, (3, k))
    b = q8(rng, np.int8, (n, k) if trans_b else (k, n))
    args = [a, np.asarray(0.01, F32), np.asarray(7, np.uint8), b,
            rng.uniform(0.001, 0.002, n).astype(F32), rng.integers(-3, 3, n).astype(np.int8),
            rng.integers(-100, 100, n).astype(np.int32), np.asarray(0.4, F32),
            np.asarray(100, np.uint8)]
    for cut in (9, 7):  # requantized, and float output
        want = ref("QGemm", "com.microsoft")(*args[:cut], alpha=0.5, transB=trans_b)
        got = qgemm_blas(*args[:cut], alpha=0.5, transB=trans_b)
        assert got.dtype == want.dtype and np.array_equal(got, want)


@pytest.mark.parametrize("ashape,bshape", [((7, 3072), (3072, 5)), ((2, 6, 768), (768, 4)),
                                           ((2, 3, 40), (2, 40, 8))])
def test_matmul_integer_matches_reference(ashape, bshape):
    rng = np.random.default_rng(ashape[-1])
    a, b = q8(rng, np.uint8, ashape), q8(rng, np.int8, bshape)
    cases = [(None, None), (np.asarray(131, np.uint8), np.asarray(-128, np.int8)),
             (np.asarray(0, np.uint8), rng.integers(-128, 128, bshape[-1]).astype(np.int8))]
    if len(ashape) == 2:
        cases.append((rng.integers(0, 256, ashape[0]).astype(np.uint8), None))
    for za, zb in cases:
        want = ref("MatMulInteger")(a, b, za, zb)
        got = matmul_integer_blas(a, b, za, zb)
        assert got.dtype == np.int32 and np.array_equal(got, want)


def test_matmul_integer_rejects_a_mismatched_zero_point():
    from opwarden.errors import KernelError

    a, b = np.zeros((3, 4), np.uint8), np.zeros((4, 2), np.int8)
    with pytest.raises(KernelError, match="b_zero_point"):
        matmul_integer_blas(a, b, None, np.zeros(3, np.int8))


def dql_inputs():
    rng = np.random.default_rng(3)
    yield rng.standard_normal((4, 33)).astype(F32) * 3
    yield np.abs(rng.standard_normal(50)).astype(F32)  # positive only: zero point 0
    yield -np.abs(rng.standard_normal(50)).astype(F32)  # negative only: zero point 255
    yield np.zeros((3, 3), F32)
    yield np.array([1.0, np.nan, -2.0], F32)
    yield np.array([np.inf, 1.0, -1.0], F32)
    yield np.asarray(-0.7, F32)
    yield np.zeros((0, 4), F32)


@pytest.mark.parametrize("x", list(dql_inputs()), ids=lambda x: f"{x.shape}")
def test_dynamic_quantize_linear_matches_reference(x):
    want = ref("DynamicQuantizeLinear")(x)
    got = dynamic_quantize_fast(x)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert np.array_equal(g, w, equal_nan=True)


@pytest.mark.parametrize("zt", [np.uint8, np.int8])
@pytest.mark.parametrize("axis", [None, 0, -1])
def test_quantize_dequantize_match_reference(zt, axis):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((3, 4, 5)) * 40).astype(F32)
    x[0, 0, :3] = [np.nan, np.inf, -np.inf]
    n = x.shape[axis] if axis is not None else 1
    scale = rng.uniform(0.05, 0.5, n).astype(F32) if axis is not None else np.asarray(0.2, F32)
    info = np.iinfo(zt)
    zp = rng.integers(info.min, int(info.max) + 1, n).astype(zt) if axis is not None \
        else np.asarray(info.max - 3, zt)
    kw = {"axis": axis} if axis is not None else {}
    want = ref("QuantizeLinear")(x, scale, zp, **kw)
    got = quantize_fast(x, scale, zp, **kw)
    assert got.dtype == want.dtype and np.array_equal(got, want)
    back = ref("DequantizeLinear")(want, scale, zp, **kw)
    assert np.array_equal(dequantize_fast(want, scale, zp, **kw), back)
    # a variant handed a case it does not compute (uint16) gives the reference's answer
    z16 = np.asarray(7, np.uint16)
    assert np.array_equal(quantize_fast(x, np.asarray(0.2, F32), z16),
                          ref("QuantizeLinear")(x, np.asarray(0.2, F32), z16))


@pytest.mark.parametrize("bt", [np.int8, np.uint8])
def test_dynamic_quantize_matmul_matches_reference(bt):
    rng = np.random.default_rng(4)
    k, n = 1500, 7
    b = q8(rng, bt, (k, n))
    cases = [(rng.standard_normal((2, 5, k)).astype(F32) * 3, np.asarray(0.01, F32), None,
              None),
             (np.abs(rng.standard_normal((4, k))).astype(F32),
              rng.uniform(0.001, 0.01, n).astype(F32), q8(rng, bt, (n,)),
              rng.standard_normal(n).astype(F32)),
             (np.full((3, k), 2.5, F32), np.asarray(0.01, F32), np.asarray(3, bt), None),
             (np.zeros((3, k), F32), np.asarray(0.01, F32), None, None)]
    nan = rng.standard_normal((2, k)).astype(F32)
    nan[1, 3] = np.nan
    cases.append((nan, np.asarray(0.01, F32), None, None))
    for a, bs, bz, bias in cases:
        want = ref("DynamicQuantizeMatMul", "com.microsoft")(a, b, bs, bz, bias)
        got = dynamic_quantize_matmul_blas(a, b, bs, bz, bias)
        assert got.dtype == want.dtype and np.array_equal(got, want, equal_nan=True)


def _single(op, inputs, outputs, inits, domain=""):
    g = helper.make_graph([helper.make_node(op, [i[0] for i in inputs] + [n for n, _ in inits],
                                            [o[0] for o in outputs], domain=domain)], "g",
                          [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
                          [numpy_helper.from_array(a, n) for n, a in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def test_dynamic_quantize_and_matmul_integer_match_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    import opwarden

    rng = np.random.default_rng(9)
    # weights ORT's int8 products sum exactly on this machine (tests/ort_int8.py)
    b = ort_int8.s8_weights(rng, (1024, 16))
    dql = _single("DynamicQuantizeLinear", [("x", TensorProto.FLOAT, [6, 1024])],
                  [("y", TensorProto.UINT8, None), ("s", TensorProto.FLOAT, None),
                   ("z", TensorProto.UINT8, None)], [])
    mmi = _single("MatMulInteger", [("a", TensorProto.UINT8, [6, 1024])],
                  [("y", TensorProto.INT32, None)], [("b", b)])
    x = (rng.standard_normal((6, 1024)) * 2).astype(F32)
    for data, feed in ((dql, {"x": x}), (mmi, {"a": q8(rng, np.uint8, (6, 1024))})):
        ours = opwarden.InferenceSession(data)
        theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        assert any(p.variant.name.endswith((".f32", ".blas", ".native_u8s8"))
                   for p in ours.placements)
        for g, w in zip(ours.run(None, feed), theirs.run(None, feed), strict=True):
            assert g.dtype == w.dtype and np.array_equal(g, w)


@pytest.mark.parametrize("b_constant", [True, False])
def test_matmul_integer_is_exact_where_onnxruntime_saturates(b_constant):
    """uint8 x int8 pairs whose sums overflow int16: opwarden gives the exact int32 answer
    (int64 NumPy's and onnx.reference's). ORT agrees where its kernel is exact (VNNI); where
    it sums adjacent products with the saturating int16 vpmaddubsw (AVX2) it does not, and
    its uniform cells are 32 pair sums each clipped to int16."""
    pytest.importorskip("onnxruntime")
    from onnx.reference import ReferenceEvaluator

    import opwarden

    rng = np.random.default_rng(12)
    k = 64
    a = np.full((3, k), 255, np.uint8)
    a[2] = rng.integers(0, 256, k)
    b = np.full((k, 4), -128, np.int8)
    b[:, 1] = 127
    b[:, 2] = rng.integers(-128, 128, k)
    b[:, 3] = rng.integers(-64, 64, k)  # a column ORT sums exactly either way
    exact = a.astype(np.int64) @ b.astype(np.int64)
    data = ort_int8.matmul_integer_model(a, b, b_constant)
    feeds = {"a": a} if b_constant else {"a": a, "b": b}
    ours = opwarden.InferenceSession(data).run(None, feeds)[0]
    (onnx_ref,) = ReferenceEvaluator(onnx.load_from_string(data)).run(None, feeds)
    theirs = ort_int8.ort_matmul_integer(a, b, b_constant)
    assert ours.dtype == theirs.dtype == np.int32
    assert np.array_equal(ours, exact) and np.array_equal(onnx_ref, exact)
    assert np.array_equal(theirs[:, 3], exact[:, 3])
    if ort_int8.ort_int8_exact():
        assert np.array_equal(theirs, exact)
    else:
        assert theirs[0, 0] == (k // 2) * -32768 != exact[0, 0]  # 255 * -128 * 2 -> -32768
        assert theirs[0, 1] == (k // 2) * 32767 != exact[0, 1]  # 255 * 127 * 2 -> 32767
        assert not np.array_equal(theirs, exact)


@pytest.mark.parametrize("fill", ["extreme", "random"])
def test_constant_weight_chunks_stay_exact(fill):
    """A constant weight's chunks come from its own |w| sums: weights at the type's extremes
    (the shortest chunks) and random ones (the longest) both give the exact product."""
    import opwarden

    rng = np.random.default_rng(8)
    k = 2100
    b = np.where(rng.random((k, 5)) < 0.5, 127, -128).astype(np.int8) if fill == "extreme" \
        else (rng.standard_normal((k, 5)) * 30).clip(-128, 127).astype(np.int8)
    inits = [("a_s", np.asarray(0.01, F32)), ("a_z", np.asarray(0, np.uint8)), ("b", b),
             ("b_s", np.asarray(0.002, F32)), ("b_z", np.asarray(0, np.int8)),
             ("y_s", np.asarray(40.0, F32)), ("y_z", np.asarray(128, np.uint8))]
    g = helper.make_graph(
        [helper.make_node("QLinearMatMul", ["a", *[n for n, _ in inits]], ["y"])], "g",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [3, k])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [3, 5])],
        [numpy_helper.from_array(v, n) for n, v in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    sess = opwarden.InferenceSession(m.SerializeToString())
    a = np.full((3, k), 255, np.uint8)
    a[1] = rng.integers(0, 256, k)
    want = ref("QLinearMatMul")(a, *[v for _, v in inits[:2]], b, *[v for _, v in inits[3:]])
    for _ in range(2):  # the second run uses the cached weight and chunks
        assert np.array_equal(sess.run(None, {"a": a})[0], want)
