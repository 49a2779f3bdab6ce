"""The compiled integer GEMM variants (kernels/cpu/quant_native.py over native/qgemm.c)
against their NumPy variants bit for bit (the machine's instruction set, the AVX2 kernel of
qgemm_avx2.c where the CPU has it, and the portable loop: shapes
with row, column and inner-dimension tails, every 8-bit type pairing, zero points scalar, per
column / channel and absent, accumulators that wrap int32), and sessions against onnxruntime
on single-node models, which also run the NumPy fallback under OPWARDEN_NATIVE=0."""

from __future__ import annotations

import os

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import opwarden
from opwarden import native
from opwarden.kernels.cpu import quant
from opwarden.kernels.cpu.quant_linear import matmul_integer_blas
from opwarden.memory.constants import mark
from tests import ort_int8

DISABLED = os.environ.get("OPWARDEN_NATIVE", "1") == "0"
needs_native = pytest.mark.skipif(DISABLED, reason="compiled path disabled (OPWARDEN_NATIVE=0)")

if not DISABLED:
    from opwarden.kernels.cpu import quant_native as qn


def test_native_integer_gemm_registers_unless_disabled():
    from opwarden.ops.base import REGISTRY

    names = {v.name for v in REGISTRY.latest("QLinearConv").variants}
    q_names = {v.name for v in REGISTRY.latest("QuantizeLinear").variants}
    if DISABLED:
        assert "qlinearconv.cpu.native_u8s8" not in names
        assert "quantizelinear.cpu.native" not in q_names
    else:
        assert native.status()["active"] == "native"
        assert "quantizelinear.cpu.native" in q_names
        assert qn.isa() in ("avx512-vnni", "avx2", "portable")
        # the portable loop is not a fast path: the float-BLAS variants stay without it
        assert ("qlinearconv.cpu.native_u8s8" in names) == (qn.isa() in qn.FAST_ISAS)


@pytest.fixture(params=["isa", "avx2", "portable"])
def path(request):
    """Run each kernel test on the machine's instruction set, on the AVX2 kernel (also on an
    AVX512-VNNI machine) and on the portable loop."""
    if DISABLED:
        pytest.skip("compiled path disabled (OPWARDEN_NATIVE=0)")
    if request.param == "avx2" and qn.isa() not in qn.FAST_ISAS:
        pytest.skip("no AVX2 on this CPU")
    old = qn._PORTABLE[0]
    qn._PORTABLE[0] = {"isa": qn._CAP, "avx2": 2, "portable": 1}[request.param]
    yield request.param
    qn._PORTABLE[0] = old


def q8(rng, dtype, shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


def w8(rng, dtype, shape, path):
    """A weight operand: full range, except on the AVX2 path, where its int8 form leaves out
    -128 (int8 -128, uint8 0) so that the AVX2 kernel takes it (with -128 the variants keep
    float BLAS: test_avx2_takes_no_int8_minimum)."""
    if path != "avx2":
        return q8(rng, dtype, shape)
    info = np.iinfo(dtype)
    return rng.integers(info.min + 1, info.max + 1, shape).astype(dtype)


def ran_kernel(path):
    """The last call ran on the instruction set `path` asks for."""
    want = {"avx2": 2, "portable": 0}.get(path)
    return want is None or qn._LAST_ISA[0] == want


PAIRS = [(np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8), (np.int8, np.uint8)]
SHAPES = [(1, 1, 1), (5, 3, 7), (7, 13, 65), (13, 147, 64), (49, 768, 130)]


@pytest.mark.parametrize("at,bt", PAIRS)
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_matmul_integer_matches_numpy(path, at, bt, m, k, n):
    rng = np.random.default_rng(m * 1000 + k + n)
    a, b = q8(rng, at, (2, m, k)), w8(rng, bt, (k, n), path)
    for za, zb in [(None, None), (q8(rng, at, ()), q8(rng, bt, ())),
                   (q8(rng, at, ()), q8(rng, bt, (n,)))]:
        ref = matmul_integer_blas(a, b, za, zb)
        got = qn.matmul_integer_native(a, b, za, zb)
        assert got.dtype == ref.dtype == np.int32 and got.shape == ref.shape
        assert np.array_equal(got, ref) and ran_kernel(path)


def test_accumulator_wraps_like_int32(path):
    # (255 - 0) * (-128 - 127) over 40000 taps is about -2.6e9: beyond int32, where a 32-bit
    # accumulator (onnxruntime's, and the NumPy variant's) wraps.
    k = 40000
    a = np.full((3, k), 255, np.uint8)
    b = np.full((k, 2), -128, np.int8)
    zb = np.array(127, np.int8)
    ref = matmul_integer_blas(a, b, np.array(0, np.uint8), zb)
    got = qn.matmul_integer_native(a, b, np.array(0, np.uint8), zb)
    assert np.array_equal(got, ref)
    assert int(got[0, 0]) == (255 * -255 * k + 2**31) % 2**32 - 2**31


@pytest.mark.parametrize("at,bt", PAIRS)
@pytest.mark.parametrize("m,k,n", SHAPES[1:])
def test_qlinear_matmul_matches_numpy(path, at, bt, m, k, n):
    rng = np.random.default_rng(k + n)
    a, b = q8(rng, at, (m, k)), w8(rng, bt, (k, n), path)
    mark(b)
    sa, sy = np.float32(0.02), np.float32(0.3)
    for sb, zb in [(np.float32(0.004), q8(rng, bt, ())),
                   ((rng.random(n) * 0.01).astype(np.float32), q8(rng, bt, (n,)))]:
        zy = q8(rng, at, ())
        args = (a, sa, q8(rng, at, ()), b, sb, zb, sy, zy)
        ref = quant.qlinear_matmul_blas(*args)
        got = qn.qlinear_matmul_native(*args)
        assert got.dtype == ref.dtype and np.array_equal(got, ref) and ran_kernel(path)


@pytest.mark.parametrize("trans_a,trans_b", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("quantized", [True, False])
def test_qgemm_matches_numpy(path, trans_a, trans_b, quantized):
    rng = np.random.default_rng(trans_a * 2 + trans_b)
    m, k, n = 9, 77, 70
    a = q8(rng, np.uint8, (k, m) if trans_a else (m, k))
    b = w8(rng, np.int8, (n, k) if trans_b else (k, n), path)
    c = rng.integers(-5000, 5000, (n,)).astype(np.int32)
    bs = (rng.random(n) * 0.01).astype(np.float32)
    ys, yz = (np.float32(0.5), np.array(3, np.uint8)) if quantized else (None, None)
    args = (a, np.float32(0.03), np.array(7, np.uint8), b, bs, q8(rng, np.int8, (n,)), c, ys, yz)
    kw = dict(alpha=0.75, transA=trans_a, transB=trans_b)
    ref, got = quant.qgemm_blas(*args, **kw), qn.qgemm_native(*args, **kw)
    assert got.dtype == ref.dtype and np.array_equal(got, ref) and ran_kernel(path)


@pytest.mark.parametrize("bt", [np.int8, np.uint8])
@pytest.mark.parametrize("fill", ["normal", "zeros", "positive"])
def test_dynamic_quantize_matmul_matches_numpy(path, bt, fill):
    rng = np.random.default_rng(3)
    m, k, n = 37, 130, 67
    a = {"normal": rng.standard_normal((2, m, k)), "zeros": np.zeros((2, m, k)),
         "positive": rng.random((2, m, k)) + 1}[fill].astype(np.float32)
    b = w8(rng, bt, (k, n), path)
    bs = (rng.random(n) * 0.01).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    for zb, bi, s in [(None, None, bs), (q8(rng, bt, (n,)), bias, bs),
                      (q8(rng, bt, ()), bias, np.float32(0.02))]:
        ref = quant.dynamic_quantize_matmul_blas(a, b, s, zb, bi)
        got = qn.dynamic_quantize_matmul_native(a, b, s, zb, bi)
        assert got.dtype == ref.dtype and got.shape == ref.shape
        assert np.array_equal(got, ref) and ran_kernel(path)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the reference casts a NaN range
def test_dynamic_quantize_matmul_non_finite_falls_back(path):
    rng = np.random.default_rng(4)
    a = rng.standard_normal((4, 8)).astype(np.float32)
    a[1, 2] = np.nan
    b = q8(rng, np.int8, (8, 5))
    ref = quant.dynamic_quantize_matmul_blas(a, b, np.float32(0.1))
    got = qn.dynamic_quantize_matmul_native(a, b, np.float32(0.1))
    np.testing.assert_array_equal(got, ref)


CONVS = [  # (n, c, h, w, m, kh, kw, strides, pads, dilations)
    (1, 3, 17, 15, 10, 7, 7, [2, 2], [3, 3, 3, 3], [1, 1]),
    (2, 16, 9, 9, 70, 3, 3, [1, 1], [1, 1, 1, 1], [1, 1]),
    (1, 64, 14, 14, 32, 1, 1, [2, 2], [0, 0, 0, 0], [1, 1]),
    (1, 5, 11, 12, 6, 3, 2, [1, 2], [0, 1, 2, 0], [2, 1]),
    (1, 8, 5, 5, 4, 1, 1, [1, 1], [0, 0, 0, 0], [1, 1]),
    (1, 4, 6, 7, 5, 3, 3, [1, 1], [4, 2, 3, 5], [1, 1]),  # pads beyond the taps' reach
    (1, 4, 30, 40, 8, 5, 5, [3, 1], [2, 2, 2, 2], [1, 2]),  # long rows, strided, dilated
    (1, 3, 50, 70, 6, 7, 7, [2, 2], [3, 3, 3, 3], [1, 1]),  # stride-2 rows of 35 pixels
    (1, 5, 9, 67, 4, 1, 3, [1, 2], [0, 0, 0, 0], [1, 1]),  # stride-2 runs to the row's end
]


@pytest.mark.parametrize("xt,wt", PAIRS)
@pytest.mark.parametrize("geom", CONVS)
def test_qlinear_conv_matches_numpy(path, xt, wt, geom):
    n, c, h, w, m, kh, kw, strides, pads, dil = geom
    rng = np.random.default_rng(c * m + kh)
    x = q8(rng, xt, (n, c, h, w))
    wgt = w8(rng, wt, (m, c, kh, kw), path)
    mark(wgt)
    bias = rng.integers(-3000, 3000, (m,)).astype(np.int32)
    for ws, wz, b in [((rng.random(m) * 0.01).astype(np.float32), np.zeros(m, wt), bias),
                      (np.float32(0.003), q8(rng, wt, ()), None),
                      ((rng.random(m) * 0.01).astype(np.float32), q8(rng, wt, (m,)), bias)]:
        args = (x, np.float32(0.05), q8(rng, xt, ()), wgt, ws, wz, np.float32(0.4),
                q8(rng, xt, ()), b)
        kwargs = dict(pads=pads, strides=strides, dilations=dil)
        ref = quant.qlinear_conv_im2col(*args, **kwargs)
        got = qn.qlinear_conv_native(*args, **kwargs)
        assert got.dtype == ref.dtype and got.shape == ref.shape
        assert np.array_equal(got, ref) and ran_kernel(path)
        out = np.empty_like(ref)
        assert qn.qlinear_conv_native(*args, **kwargs, out=out) is out
        assert np.array_equal(out, ref)


@pytest.mark.parametrize("wt", [np.int8, np.uint8])
def test_avx2_takes_no_int8_minimum(path, wt):
    # The AVX2 kernel forms |x| * (w sign(x)): an int8 weight of -128 (uint8 0) has no
    # negation, so the variants keep float BLAS for it, and the kernel itself, called with
    # one, finds it and runs the portable loop: exact either way.
    if path != "avx2":
        pytest.skip("the AVX2 kernel's own refusal")
    rng = np.random.default_rng(12)
    a = q8(rng, np.uint8, (33, 70))
    b = w8(rng, wt, (70, 40), path)
    b[5, 7] = np.iinfo(wt).min
    mark(b)
    assert qn.avx2_refuses(b, "mmi")
    assert np.array_equal(qn.matmul_integer_native(a, b), matmul_integer_blas(a, b))
    got = qn.gemm(a, 0, qn.pack_b(b), 70, 40, qn._zb_shifted(None, 40, wt))
    assert qn._LAST_ISA[0] == 0
    assert np.array_equal(got, a.astype(np.int64) @ b.astype(np.int64))
    b2 = b.copy()
    b2[5, 7] = np.iinfo(wt).min + 1
    mark(b2)
    assert not qn.avx2_refuses(b2, "mmi")
    assert np.array_equal(qn.matmul_integer_native(a, b2), matmul_integer_blas(a, b2))
    assert qn._LAST_ISA[0] == 2


# ---------------------------------------------------------------------------------------------
# Sessions against onnxruntime (both paths: OPWARDEN_NATIVE=0 runs the NumPy variants), with
# int8 weights ORT sums exactly on this machine (tests/ort_int8.py: its AVX2 kernel saturates)


def _model(node, inputs, output, inits, ms=False):
    g = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info(output[0],
                                                                              output[1], None)],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    ops = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("com.microsoft", 1)] if ms
                                           else [])
    return helper.make_model(g, opset_imports=ops).SerializeToString()


def _both(data, feeds):
    ort = pytest.importorskip("onnxruntime")
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    theirs = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    ours = opwarden.InferenceSession(data)
    return ours.run(None, feeds)[0], theirs.run(None, feeds)[0]


@pytest.mark.parametrize("kh,strides,pads", [(3, [1, 1], [1, 1, 1, 1]), (1, [2, 2], [0] * 4),
                                             (7, [2, 2], [3, 3, 3, 3])])
def test_qlinear_conv_matches_onnxruntime(kh, strides, pads):
    rng = np.random.default_rng(kh)
    c, m = 24, 40
    x = q8(rng, np.uint8, (1, c, 20, 20))
    inits = {"xs": np.float32(0.02), "xz": np.uint8(120),
             "w": ort_int8.s8_weights(rng, (m, c, kh, kh)),
             "ws": (rng.random(m) * 0.01).astype(np.float32), "wz": np.zeros(m, np.int8),
             "ys": np.float32(0.05), "yz": np.uint8(10),
             "b": rng.integers(-2000, 2000, (m,)).astype(np.int32)}
    node = helper.make_node("QLinearConv", ["x", *inits], ["y"], pads=pads, strides=strides)
    data = _model(node, [helper.make_tensor_value_info("x", TensorProto.UINT8, list(x.shape))],
                  ("y", TensorProto.UINT8), inits)
    ours, theirs = _both(data, {"x": x})
    assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs)


def test_matmul_integer_and_dynamic_quantize_matmul_match_onnxruntime():
    rng = np.random.default_rng(9)
    k, n = 200, 96
    a8 = q8(rng, np.uint8, (3, 17, k))
    inits = {"b": ort_int8.s8_weights(rng, (k, n)), "bz": q8(rng, np.int8, (n,))}
    node = helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"])
    inits_mmi = {**inits, "az": np.uint8(130)}
    data = _model(node, [helper.make_tensor_value_info("a", TensorProto.UINT8, list(a8.shape))],
                  ("y", TensorProto.INT32), inits_mmi)
    ours, theirs = _both(data, {"a": a8})
    assert np.array_equal(ours, theirs)

    a = rng.standard_normal((2, 17, k)).astype(np.float32)
    inits = {"b": ort_int8.s8_weights(rng, (k, n)),
             "bs": (rng.random(n) * 0.01).astype(np.float32),
             "bias": rng.standard_normal(n).astype(np.float32)}
    node = helper.make_node("DynamicQuantizeMatMul", ["a", "b", "bs", "", "bias"], ["y"],
                            domain="com.microsoft")
    data = _model(node, [helper.make_tensor_value_info("a", TensorProto.FLOAT, list(a.shape))],
                  ("y", TensorProto.FLOAT), inits, ms=True)
    ours, theirs = _both(data, {"a": a})
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


def test_qlinear_matmul_matches_onnxruntime():
    rng = np.random.default_rng(11)
    k, n = 96, 72
    a = q8(rng, np.uint8, (2, 9, k))
    inits = {"as": np.float32(0.03), "az": np.uint8(128),
             "b": ort_int8.s8_weights(rng, (k, n)), "bs": np.float32(0.01), "bz": np.int8(0),
             "ys": np.float32(0.2), "yz": np.uint8(5)}
    node = helper.make_node("QLinearMatMul", ["a", *inits], ["y"])
    data = _model(node, [helper.make_tensor_value_info("a", TensorProto.UINT8, list(a.shape))],
                  ("y", TensorProto.UINT8), inits)
    ours, theirs = _both(data, {"a": a})
    assert np.array_equal(ours, theirs)


@needs_native
@pytest.mark.parametrize("scale", [0.1, 1.0, 3.7e-3, 0.0, 1e-30])
@pytest.mark.parametrize("zp", [np.uint8(0), np.uint8(128), np.int8(-5), np.int8(0), None])
def test_quantize_and_dequantize_match_numpy(scale, zp):
    from opwarden.kernels.cpu.quant_linear import dequantize_fast, quantize_fast

    rng = np.random.default_rng(5)
    x = (rng.standard_normal(10007) * 50).astype(np.float32)
    x[:12] = [np.nan, np.inf, -np.inf, 0.5, 1.5, 2.5, -0.5, -1.5, 1e30, -1e30, 3e9, 127.5]
    s = np.float32(scale)
    with np.errstate(all="ignore"):
        ref, got = quantize_fast(x, s, zp), qn.quantize_native(x, s, zp)
    assert got.dtype == ref.dtype and np.array_equal(got, ref)
    if zp is not None:
        ref2, got2 = dequantize_fast(ref, s, zp), qn.dequantize_native(ref, s, zp)
        assert got2.dtype == np.float32 and np.array_equal(got2, ref2, equal_nan=True)
    per_axis = np.array([0.1, 0.2], np.float32)  # per axis: the NumPy variant runs it
    xa = x[:10000].reshape(2, -1)
    assert np.array_equal(qn.quantize_native(xa, per_axis, None, axis=0),
                          quantize_fast(xa, per_axis, None, axis=0))


@needs_native
@pytest.mark.parametrize("dt", [np.uint8, np.int8])
def test_qlinear_add_matches_reference(dt):
    from opwarden.kernels.cpu.quant_linear import latest

    ref = latest("QLinearAdd", "com.microsoft").reference
    rng = np.random.default_rng(6)
    for t in range(20):
        a, b = q8(rng, dt, (2, 17, 9, 9)), q8(rng, dt, (2, 17, 9, 9))
        ps = [np.float32(rng.random() * 0.1 + 1e-3), q8(rng, dt, ()),
              np.float32(rng.random() * 0.1 + 1e-3), q8(rng, dt, ()),
              np.float32(rng.random() * 0.2 + 1e-3), q8(rng, dt, ())]
        want = ref(a, ps[0], ps[1], b, ps[2], ps[3], ps[4], ps[5])
        got = qn.qlinear_add_native(a, ps[0], ps[1], b, ps[2], ps[3], ps[4], ps[5])
        assert got.dtype == want.dtype and np.array_equal(got, want), t
    # broadcasting and a zero C_scale run the reference
    c = q8(rng, dt, (1, 17, 1, 1))
    args = (np.float32(0.1), q8(rng, dt, ()), c, np.float32(0.2), q8(rng, dt, ()))
    zc = q8(rng, dt, ())
    for sc in (np.float32(0.3), np.float32(0.0)):
        with np.errstate(all="ignore"):
            assert np.array_equal(qn.qlinear_add_native(a, *args, sc, zc),
                                  ref(a, *args, sc, zc))
