"""MatMulNBits, GatherBlockQuantized and QAttention (com.microsoft) against onnxruntime on random
inputs at their boundary shapes (K not a multiple of block_size, N = 1, batch dims, 2/4/8 bits,
packed/float/absent zero points, g_idx), the fast MatMulNBits variant against the reference, and
clear errors for malformed inputs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from opwarden.dtypes import onnx_type
from opwarden.errors import KernelError
from opwarden.memory.constants import mark
from opwarden.ops import REGISTRY
from opwarden.ops.contrib_wq import pack_bits, quantize_nbits, unpack_bits
from tests import ort_int8

ort = pytest.importorskip("onnxruntime")
MS = "com.microsoft"
RNG = np.random.default_rng(7)


def ours(op_type, inputs, attrs):
    opdef, sch = REGISTRY.resolve(op_type, MS, 1)
    kw = {k: a.default for k, a in sch.attrs.items() if a.has_default}
    kw.update(attrs)
    args = list(inputs)
    while args and args[-1] is None:
        args.pop()
    res = opdef.reference(*args, **kw)
    return list(res) if isinstance(res, tuple) else [res]


def theirs(op_type, inputs, attrs, consts=(), n_out=1, threads=1):
    """ORT's outputs of one node; inputs at `consts` are initializers (as in real models)."""
    names = [f"i{k}" if x is not None else "" for k, x in enumerate(inputs)]
    while names and not names[-1]:
        names.pop()
    outs = [f"o{k}" for k in range(n_out)]
    node = helper.make_node(op_type, names, outs, domain=MS, **attrs)
    inits = [numpy_helper.from_array(np.asarray(x), n) for k, (n, x) in
             enumerate(zip(names, inputs)) if n and k in consts]
    g = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, onnx_type(x.dtype), x.shape)
         for k, (n, x) in enumerate(zip(names, inputs)) if n and k not in consts],
        [onnx.ValueInfoProto(name=o) for o in outs], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                                helper.make_opsetid(MS, 1)])
    model.ir_version = 9
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    feeds = {n: x for k, (n, x) in enumerate(zip(names, inputs)) if n and k not in consts}
    return ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"]).run(None, feeds)


def _close(a, b, rtol=1e-5):
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    scale = max(1.0, float(np.abs(b64).max(initial=0)))
    tol = rtol * scale if a.dtype != np.float16 else 2e-3 * scale
    assert float(np.abs(a64 - b64).max(initial=0)) <= tol


def test_pack_unpack_round_trip():
    for bits in (2, 4, 8):
        v = RNG.integers(0, 1 << bits, (3, 13))
        np.testing.assert_array_equal(unpack_bits(pack_bits(v, bits), bits, 13), v)
    # Low bits first: 0x21 holds 1 then 2.
    assert unpack_bits(np.array([0x21], np.uint8), 4, 2).tolist() == [1, 2]


# --------------------------------------------------------------------------------- MatMulNBits


def _nbits_case(shape_a, K, N, bits, bs, zp="packed", g=False, bias=False, dtype=np.float32):
    B, s, z = quantize_nbits(RNG.standard_normal((K, N)).astype(np.float32), bits, bs)
    k_blocks = -(-K // bs)
    zps = {"packed": z, "none": None,
           "float": (RNG.random(N * k_blocks) * (1 << bits)).astype(dtype)}[zp]
    gi = RNG.permutation(np.arange(K) // bs).astype(np.int32) if g else None
    ins = [RNG.standard_normal((*shape_a, K)).astype(dtype), B, s.astype(dtype), zps, gi,
           RNG.standard_normal(N).astype(dtype) if bias else None]
    return ins, {"K": K, "N": N, "bits": bits, "block_size": bs}


NBITS_CASES = [
    ((3,), 64, 8, 4, 32, "packed", False, False, np.float32),
    ((2, 3), 40, 5, 4, 16, "packed", False, True, np.float32),  # K % block_size != 0
    ((1,), 33, 1, 4, 32, "none", False, False, np.float32),  # N = 1, default zero point
    ((5,), 200, 7, 4, 128, "packed", False, True, np.float32),
    ((2, 1, 3), 48, 6, 2, 16, "packed", False, False, np.float32),  # 2 bits, rank 3
    ((4,), 70, 3, 8, 64, "packed", False, False, np.float32),  # 8 bits
    ((4,), 70, 3, 4, 16, "float", False, False, np.float32),  # float zero points
    ((2,), 32, 4, 4, 16, "packed", True, False, np.float32),  # g_idx (ORT: default zp)
    ((2,), 40, 4, 4, 16, "float", True, False, np.float32),  # g_idx, float zero points
    ((2, 2), 24, 4, 4, 16, "packed", False, True, np.float16),
    ((3,), 96, 5, 4, 32, "float", False, False, np.float16),
]


@pytest.mark.parametrize("case", NBITS_CASES, ids=lambda c: f"A{list(c[0])}K{c[1]}N{c[2]}"
                         f"b{c[3]}bs{c[4]}{c[5]}{'g' if c[6] else ''}{np.dtype(c[8]).name}")
def test_matmul_nbits_matches_onnxruntime(case):
    ins, attrs = _nbits_case(*case)
    got = ours("MatMulNBits", ins, attrs)[0]
    want = theirs("MatMulNBits", ins, attrs, consts=(1, 2, 3, 4))[0]
    _close(got, want)


def test_matmul_nbits_accuracy_level_4_near_onnxruntime():
    """Level 4 lets ORT quantize A to int8 per block; this computes in float32, within the
    int8 rounding of A of ORT's result."""
    ins, attrs = _nbits_case((4,), 128, 16, 4, 32)
    attrs["accuracy_level"] = 4
    got = ours("MatMulNBits", ins, attrs)[0]
    want = theirs("MatMulNBits", ins, attrs, consts=(1, 2, 3))[0]
    np.testing.assert_allclose(got, want, atol=2e-2 * np.abs(want).max())


def test_matmul_nbits_fast_variant_caches_constant_weights():
    from opwarden.kernels.cpu import quant_nbits

    ins, attrs = _nbits_case((2, 3), 40, 5, 4, 16, bias=True)
    for k in (1, 2, 3):
        mark(ins[k])
    want = ours("MatMulNBits", ins, attrs)[0]
    calls = []
    real = quant_nbits.dequantize_nbits

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    quant_nbits.dequantize_nbits = counting
    try:
        for _ in range(3):
            got = quant_nbits.matmul_nbits_cached(*ins, **attrs, accuracy_level=0)
            np.testing.assert_array_equal(got, want)
        assert len(calls) == 1  # dequantized once for the constant weight
        # A weight that is not declared constant is dequantized on every call.
        b = ins[1].copy()
        quant_nbits.matmul_nbits_cached(ins[0], b, *ins[2:], **attrs, accuracy_level=0)
        quant_nbits.matmul_nbits_cached(ins[0], b, *ins[2:], **attrs, accuracy_level=0)
        assert len(calls) == 3
    finally:
        quant_nbits.dequantize_nbits = real


def test_matmul_nbits_errors():
    ins, attrs = _nbits_case((3,), 64, 8, 4, 32)
    with pytest.raises(KernelError, match="last dimension must be K"):
        ours("MatMulNBits", [ins[0][:, :60], *ins[1:]], attrs)
    with pytest.raises(KernelError, match="B must be uint8"):
        ours("MatMulNBits", [ins[0], ins[1][:, :1], *ins[2:]], attrs)
    with pytest.raises(KernelError, match="scales must have"):
        ours("MatMulNBits", [ins[0], ins[1], ins[2][:-1], *ins[3:]], attrs)
    with pytest.raises(KernelError, match="zero_points"):
        ours("MatMulNBits", [*ins[:3], ins[3][:-1], *ins[4:]], attrs)
    with pytest.raises(KernelError, match="g_idx"):
        ours("MatMulNBits", [*ins[:4], np.full(64, 9, np.int32)], attrs)


# ------------------------------------------------------------------------ GatherBlockQuantized


def _gbq(rows, cols, bits, bs, idx, g=0, qa=1, zp=True, dtype=np.float32, kind="uint8"):
    shape_s = (rows, -(-cols // bs)) if qa == 1 else (-(-rows // bs), cols)
    q = RNG.integers(0, 1 << bits, (rows, cols))
    z = RNG.integers(0, 1 << bits, shape_s)
    if kind == "uint8":
        data = pack_bits(q, 4) if bits == 4 else q.astype(np.uint8)
        zps = (pack_bits(z, 4) if bits == 4 else z.astype(np.uint8)) if zp else None
    else:  # int4 / uint4 (ml_dtypes), one value an element
        import ml_dtypes

        dt = getattr(ml_dtypes, kind)
        off = 8 if kind == "int4" else 0
        data, zps = (q - off).astype(dt), (z - off).astype(dt) if zp else None
    scales = (RNG.random(shape_s) * 0.1 + 0.01).astype(dtype)
    attrs = {"gather_axis": g, "quantize_axis": qa, "block_size": bs, "bits": bits}
    return [data, np.asarray(idx, np.int64), scales, zps], attrs


GBQ_CASES = [
    (10, 64, 4, 32, [[1, 9], [0, -1]], 0, 1, True, np.float32, "uint8"),
    (7, 40, 4, 16, [3, 3, 6], 0, 1, False, np.float32, "uint8"),  # cols % block_size != 0
    (5, 48, 8, 16, [4, 0], 0, 1, True, np.float32, "uint8"),
    (6, 32, 4, 16, [1], 0, 1, True, np.float16, "uint8"),
    (9, 40, 4, 16, [8, 0, 3], 0, 1, True, np.float32, "int4"),
    (9, 40, 4, 16, [2, 2], 0, 1, False, np.float32, "uint4"),
    (40, 6, 4, 16, [39, 0, 17], 0, 0, True, np.float32, "int4"),  # blocks along rows
]


@pytest.mark.parametrize("case", GBQ_CASES, ids=lambda c: f"{c[9]}b{c[2]}bs{c[3]}g{c[5]}q{c[6]}"
                         f"{'zp' if c[7] else ''}{np.dtype(c[8]).name}")
def test_gather_block_quantized_matches_onnxruntime(case):
    ins, attrs = _gbq(*case)
    got = ours("GatherBlockQuantized", ins, attrs)[0]
    want = theirs("GatherBlockQuantized", ins, attrs, consts=(0, 2, 3))[0]
    _close(got, want, rtol=0)


def test_gather_block_quantized_along_quantized_axis():
    """Gathering along the quantized axis (ORT's CPU kernel refuses it) picks each index's
    block scale: the same as dequantizing everything, then gathering."""
    ins, attrs = _gbq(6, 33, 8, 16, [[2, 32], [0, 17]], g=1)
    got = ours("GatherBlockQuantized", ins, attrs)[0]
    data, _, s, z = ins
    full = (data.astype(np.float32) - np.repeat(z, 16, 1)[:, :33]) * np.repeat(s, 16, 1)[:, :33]
    np.testing.assert_array_equal(got, full[:, ins[1]])


def test_gather_block_quantized_errors():
    ins, attrs = _gbq(10, 64, 4, 32, [1])
    with pytest.raises(KernelError, match="indices must lie"):
        ours("GatherBlockQuantized", [ins[0], np.array([10]), *ins[2:]], attrs)
    with pytest.raises(KernelError, match="scales must have shape"):
        ours("GatherBlockQuantized", [ins[0], ins[1], ins[2][:, :1], ins[3]], attrs)
    with pytest.raises(KernelError, match="quantize_axis = last"):
        ours("GatherBlockQuantized", ins, {**attrs, "quantize_axis": 0})


# --------------------------------------------------------------------------------- QAttention


def _qattn(B=2, S=3, N=2, H=4, mask=None, past=False, per_col=False, zp=True, wdt=np.int8):
    D = N * H
    lo, hi = (-128, 128) if wdt == np.int8 else (0, 256)
    wshape = (3 * D,) if per_col else ()
    ws = np.asarray(RNG.random(wshape) * 0.002 + 0.001, np.float32)
    ins = [RNG.integers(0, 256, (B, S, D)).astype(np.uint8),
           RNG.integers(lo, hi, (D, 3 * D)).astype(wdt), RNG.standard_normal(3 * D).astype(
               np.float32), np.asarray(0.02, np.float32), ws, mask,
           np.asarray(RNG.integers(0, 256), np.uint8) if zp else None,
           np.asarray(RNG.integers(lo, hi, wshape), wdt) if zp else None,
           RNG.standard_normal((2, B, N, 2, H)).astype(np.float32) if past else None]
    return ins


QATTN_CASES = {
    "plain": ({}, {}),
    "key lengths": ({"mask": np.array([3, 1], np.int32)}, {}),
    "start/end lengths": ({"mask": np.array([3, 2, 1, 0], np.int32)}, {}),
    "2-D mask, uint8 weight": ({"mask": np.array([[1, 1, 0], [1, 0, 1]], np.int32),
                                "wdt": np.uint8}, {}),
    "per-column": ({"per_col": True}, {}),
    "past, causal": ({"past": True}, {"unidirectional": 1}),
    "causal, no zero points": ({"zp": False}, {"unidirectional": 1}),
    "N=1, S=1": ({"B": 1, "S": 1, "N": 1, "H": 8}, {}),
}


@pytest.mark.parametrize("name", list(QATTN_CASES))
def test_qattention_matches_onnxruntime(name):
    make, extra = QATTN_CASES[name]
    ins = _qattn(**make)
    # an int8 weight halved where ORT's u8 x s8 kernel saturates int16 pair sums
    # (tests/ort_int8.py)
    ins[1] = ort_int8.fit_s8(ins[1])
    attrs = {"num_heads": make.get("N", 2), **extra}
    n_out = 2 if make.get("past") else 1
    got = ours("QAttention", ins, attrs)[:n_out]
    want = theirs("QAttention", ins, attrs, consts=(1, 2, 4, 7), n_out=n_out)
    for a, b in zip(got, want):
        _close(a, b)


def test_qattention_errors():
    ins = _qattn()
    with pytest.raises(KernelError, match="weight width"):
        ours("QAttention", [ins[0], ins[1][:, :23], ins[2][:23], *ins[3:]], {"num_heads": 2})
    with pytest.raises(KernelError, match="weight_scale"):
        ours("QAttention", [*ins[:4], np.ones(5, np.float32), *ins[5:]], {"num_heads": 2})
