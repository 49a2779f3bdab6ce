"""The compiled packed-weight float32 GEMM (native/sgemm.c via kernels/cpu/packed_gemm.py)
against float64 products: row, column and inner-dimension tails of its 12 x 32 tiles and 256
k blocks, bias rows, empty shapes, NaN/inf as BLAS gives them, the same bits on 1 and 2
threads; and the MatMul / FusedMatMul variants on it in sessions against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import opwarden
from opwarden import native
from opwarden.kernels.cpu import packed_gemm
from opwarden.memory.constants import mark

pytestmark = pytest.mark.skipif(
    not packed_gemm.available(), reason="no compiled packed GEMM here (no extension or AVX-512F)")

SHAPES = [(1, 1, 1), (5, 3, 7), (13, 40, 33), (12, 256, 32), (25, 300, 65), (130, 513, 100),
          (11, 257, 31), (200, 64, 96)]


def _check(y, a, b, bias=None):
    want = a.astype(np.float64) @ b.astype(np.float64)
    if bias is not None:
        want += bias
    bound = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64) + 1
    assert np.all(np.abs(y - want) <= 1e-5 * bound)


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_float64(m, k, n, with_bias):
    rng = np.random.default_rng(m * 7 + k + n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = mark(rng.standard_normal((k, n)).astype(np.float32))
    bias = rng.standard_normal(n).astype(np.float32) if with_bias else None
    assert packed_gemm.takes(a, b)
    y = np.full((m, n), np.nan, np.float32)
    packed_gemm.matmul_into(a, b, y, bias)
    _check(y, a, b, bias)


def test_stacked_rows_and_empty_shapes():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((2, 3, 17, 40)).astype(np.float32)
    b = mark(rng.standard_normal((40, 45)).astype(np.float32))
    y = np.empty((2, 3, 17, 45), np.float32)
    packed_gemm.matmul_into(a, b, y)
    _check(y.reshape(-1, 45), a.reshape(-1, 40), b)
    # k = 0: the empty sum, plus the bias
    b0 = mark(np.zeros((0, 5), np.float32))
    bias = np.arange(5, dtype=np.float32)
    y0 = np.full((3, 5), np.nan, np.float32)
    packed_gemm.matmul_into(np.zeros((3, 0), np.float32), b0, y0, bias)
    assert np.array_equal(y0, np.broadcast_to(bias, (3, 5)))
    packed_gemm.matmul_into(np.zeros((0, 40), np.float32), b, np.zeros((0, 45), np.float32))


def test_specials_as_blas_and_thread_count_independent():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((40, 300)).astype(np.float32)
    a[3, 7], a[9, 0], a[20, 299] = np.nan, np.inf, -np.inf
    b = mark(rng.standard_normal((300, 70)).astype(np.float32))
    want = a @ b
    y = np.empty_like(want)
    packed_gemm.matmul_into(a, b, y)
    assert np.array_equal(np.isnan(y), np.isnan(want))
    assert np.array_equal(np.isinf(y), np.isinf(want))
    ok = np.isfinite(want)
    assert np.allclose(y[ok], want[ok], rtol=1e-4, atol=1e-3)
    bp = packed_gemm.panels(b)
    outs = []
    for threads in (1, 2):
        c = np.empty_like(want)
        native._LIB.sgemm_packed(a.reshape(-1), 300, np.zeros(1, np.int64), 40, 300, bp, 70,
                                 c[:0].reshape(-1), False, c.reshape(-1), 70, False, threads)
        outs.append(c)
    assert np.array_equal(outs[0], outs[1], equal_nan=True)


def test_refuses_what_it_does_not_take():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((4, 8)).astype(np.float32)
    b = rng.standard_normal((8, 5)).astype(np.float32)
    assert not packed_gemm.takes(a, b)  # not a constant
    mark(b)
    assert not packed_gemm.takes(a.T.copy().T, b)  # A not C-contiguous
    assert not packed_gemm.takes(a.astype(np.float64), b)
    assert packed_gemm.takes(a, b)


def _session(nodes, inputs, inits, opsets):
    g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y",
                                                                             TensorProto.FLOAT,
                                                                             None)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=opsets).SerializeToString()


@pytest.mark.parametrize("op", ["MatMul", "MatMul+Add+Relu", "MatMul of inputs"])
def test_variants_match_onnxruntime(op):
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 37, 96)).astype(np.float32)
    w = (rng.standard_normal((96, 70)) * 0.1).astype(np.float32)
    bias = rng.standard_normal(70).astype(np.float32)
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))]
    feeds = {"x": x}
    if op == "MatMul":
        nodes, inits = [helper.make_node("MatMul", ["x", "w"], ["y"])], {"w": w}
    elif op == "MatMul+Add+Relu":
        nodes = [helper.make_node("MatMul", ["x", "w"], ["t"]),
                 helper.make_node("Add", ["t", "b"], ["u"]),
                 helper.make_node("Relu", ["u"], ["y"])]
        inits = {"w": w, "b": bias}
    else:
        nodes, inits = [helper.make_node("MatMul", ["x", "w"], ["y"])], {}
        ins.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, list(w.shape)))
        feeds["w"] = w
    data = _session(nodes, ins, inits, [helper.make_opsetid("", 17)])
    sess = opwarden.InferenceSession(data)
    got = sess.run(None, feeds)[0]
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    used = {r["variant"] for r in sess.explain()}
    if op == "MatMul":
        assert "matmul.cpu.packed" in used, used
    if op == "MatMul+Add+Relu":
        assert "fusedmatmul.cpu.packed" in used, used


def test_taps_sum_shifted_row_ranges():
    # a 3 x 3 convolution's shape: 5 taps at their offsets into one flat image, each [rows, c]
    rng = np.random.default_rng(5)
    c, n, rows = 24, 40, 50
    flat = rng.standard_normal(4000).astype(np.float32)
    offs = np.array([0, 3 * c, 7, 100, 2 * c + 5], np.int64)
    b = mark(rng.standard_normal((len(offs) * c, n)).astype(np.float32))
    y = np.empty((rows, n), np.float32)
    packed_gemm.taps_into(flat, c, offs, rows, b, y, b)
    want = sum(np.lib.stride_tricks.as_strided(flat[o:], (rows, c), (4 * c, 4)).astype(
        np.float64) @ b[t * c:(t + 1) * c].astype(np.float64) for t, o in enumerate(offs))
    assert np.allclose(y, want, rtol=1e-5, atol=1e-4)
    y2 = np.ones_like(y)
    packed_gemm.taps_into(flat, c, offs, rows, b, y2, b, accumulate=True)
    assert np.allclose(y2, want + 1, rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError):  # a tap's rows past the image's end
        packed_gemm.taps_into(flat, c, np.array([0, 3990], np.int64), rows,
                              mark(rng.standard_normal((2 * c, n)).astype(np.float32)), y, None)
