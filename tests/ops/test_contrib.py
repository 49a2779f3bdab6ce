"""com.microsoft contrib kernels against NumPy formulas and onnxruntime (when installed)."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import helper

from opwarden.dtypes import onnx_type
from opwarden.errors import KernelError
from opwarden.ops import REGISTRY
from tests import ort_int8

MS = "com.microsoft"
RNG = np.random.default_rng(0)


def ours(op_type, inputs, attrs=None, n_out=1):
    """Our reference kernel's outputs (schema defaults filled in like the runtime does)."""
    opdef, sch = REGISTRY.resolve(op_type, MS, 1)
    kw = {k: a.default for k, a in sch.attrs.items() if a.has_default}
    kw.update(attrs or {})
    args = list(inputs)
    while args and args[-1] is None:
        args.pop()
    res = opdef.reference(*args, **kw)
    res = list(res) if isinstance(res, tuple) else [res]
    return res[:n_out]


def theirs(op_type, inputs, attrs=None, n_out=1, domain=MS, threads=None):
    """onnxruntime's outputs of the same one-node model (skips the test without onnxruntime).

    `threads` pins the intra-op thread count (results of some ORT kernels depend on it)."""
    ort = pytest.importorskip("onnxruntime")
    names = [f"i{k}" if x is not None else "" for k, x in enumerate(inputs)]
    while names and not names[-1]:
        names.pop()
    outs = [f"o{k}" for k in range(n_out)]
    node = helper.make_node(op_type, names, outs, domain=domain, **(attrs or {}))
    g = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, onnx_type(x.dtype), x.shape)
         for n, x in zip(names, inputs) if n],
        [onnx.ValueInfoProto(name=o) for o in outs],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                                helper.make_opsetid(MS, 1)])
    model.ir_version = 8
    feeds = {n: x for n, x in zip(names, inputs) if n}
    so = ort.SessionOptions()
    if threads is not None:
        so.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"]).run(None, feeds)


def close(a, b, rtol=1e-5, atol=1e-6):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
    np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=atol)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def gelu_np(x):
    return np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.ravel()],
                    dtype=np.float64).reshape(x.shape)


# ---------------------------------------------------------------------------- GELU family


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_gelu(dtype):
    x = rand(3, 5, dtype=dtype)
    (y,) = ours("Gelu", [x])
    rtol = 1e-3 if dtype == np.float16 else 1e-6
    close(y, gelu_np(x.astype(np.float64)).astype(dtype), rtol=rtol)
    if dtype != np.float64:
        close(y, theirs("Gelu", [x])[0], rtol=2e-3, atol=1e-3)


def test_bias_gelu():
    a, b = rand(2, 3, 4), rand(4)
    (y,) = ours("BiasGelu", [a, b])
    close(y, gelu_np((a + b).astype(np.float64)).astype(np.float32))
    close(y, theirs("BiasGelu", [a, b])[0])


@pytest.mark.parametrize("with_bias", [False, True])
def test_fast_gelu(with_bias):
    x = rand(2, 3, 8)
    bias = rand(8) if with_bias else None
    (y,) = ours("FastGelu", [x, bias])
    z = x.astype(np.float64) + (0 if bias is None else bias)
    want = 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z**3)))
    close(y, want.astype(np.float32))
    close(y, theirs("FastGelu", [x, bias])[0])


@pytest.mark.parametrize("alpha", [None, 1.0])
def test_quick_gelu(alpha):
    x = rand(4, 6) * 10
    attrs = {} if alpha is None else {"alpha": alpha}
    (y,) = ours("QuickGelu", [x], attrs)
    a = 1.702 if alpha is None else alpha
    close(y, (x / (1 + np.exp(-a * x.astype(np.float64)))).astype(np.float32))
    close(y, theirs("QuickGelu", [x], attrs)[0])


def test_bias_add():
    x, b, s = rand(2, 3, 4), rand(4), rand(2, 3, 4)
    (y,) = ours("BiasAdd", [x, b, s])
    close(y, x + b + s)
    with pytest.raises(KernelError):
        ours("BiasAdd", [x, rand(5), s])


# ---------------------------------------------------------------------------- MatMul


@pytest.mark.parametrize("sa,sb,attrs", [
    ((3, 4), (4, 5), {}),
    ((4, 3), (4, 5), {"transA": 1}),
    ((3, 4), (5, 4), {"transB": 1, "alpha": 0.5}),
    ((2, 3, 4), (2, 4, 5), {"alpha": 2.0}),
    ((2, 4, 3), (4, 5), {"transA": 1}),
    ((3, 2, 4), (2, 4, 5), {"transBatchA": 1}),
    ((2, 3, 4), (4, 2, 5), {"transBatchB": 1}),
    ((3, 2, 4), (5, 2, 4), {"transBatchA": 1, "transBatchB": 1, "transB": 1}),
    ((4, 2, 3), (2, 4, 5), {"transBatchA": 1, "transA": 1}),
])
def test_fused_matmul(sa, sb, attrs):
    a, b = rand(*sa), rand(*sb)
    (y,) = ours("FusedMatMul", [a, b], attrs)
    close(y, theirs("FusedMatMul", [a, b], attrs)[0], rtol=1e-5, atol=1e-5)


def test_fused_matmul_numpy():
    a, b = rand(4, 3), rand(5, 4)
    (y,) = ours("FusedMatMul", [a, b], {"transA": 1, "transB": 1, "alpha": 3.0})
    close(y, 3.0 * (a.T @ b.T), rtol=1e-5)
    with pytest.raises(KernelError):
        ours("FusedMatMul", [a, b])


@pytest.mark.parametrize("btype", [np.int8, np.uint8])
@pytest.mark.parametrize("per_column,zp,bias", [
    (False, False, False), (True, True, False), (False, True, True), (True, False, True)])
def test_dynamic_quantize_matmul(btype, per_column, zp, bias):
    a = rand(3, 4, 6)
    # int8 weights ORT's u8 x s8 kernel sums exactly on this machine (tests/ort_int8.py)
    lo, hi = ort_int8.s8_range() if btype == np.int8 else (0, 255)
    b = RNG.integers(lo, hi + 1, size=(6, 5)).astype(btype)
    shape = (5,) if per_column else ()
    scale = np.asarray(RNG.random(shape) * 0.1 + 0.01, dtype=np.float32)
    zpt = np.asarray(RNG.integers(lo, hi + 1, size=shape), dtype=btype) if zp else None
    bia = rand(5) if bias else None
    (y,) = ours("DynamicQuantizeMatMul", [a, b, scale, zpt, bia])
    # NumPy formulation without quantizing A: quantization error stays within a few A-steps.
    deq_b = (b.astype(np.float32) - (0 if zpt is None else zpt.astype(np.float32))) * scale
    want = a @ deq_b + (0 if bia is None else bia)
    np.testing.assert_allclose(y, want, atol=0.1 * np.abs(deq_b).sum(0).max())
    close(y, theirs("DynamicQuantizeMatMul", [a, b, scale, zpt, bia])[0], rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------- normalization


def _ln(x, g, b, eps):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * g + (0 if b is None else b), m, 1 / np.sqrt(v + eps)


@pytest.mark.parametrize("beta,bias", [(False, False), (True, False), (True, True)])
def test_skip_layer_norm(beta, bias):
    x, s, g = rand(2, 3, 8), rand(2, 3, 8), rand(8)
    bt = rand(8) if beta else None
    bi = rand(8) if bias else None
    got = ours("SkipLayerNormalization", [x, s, g, bt, bi], {"epsilon": 1e-5}, n_out=4)
    total = x + s + (0 if bi is None else bi)
    y, m, inv = _ln(total.astype(np.float64), g, bt, 1e-5)
    close(got[0], y.astype(np.float32), rtol=1e-5, atol=1e-5)
    close(got[1], m.astype(np.float32), rtol=1e-5, atol=1e-5)
    close(got[2], inv.astype(np.float32), rtol=1e-5, atol=1e-5)
    close(got[3], total.astype(np.float32), rtol=1e-6)
    ref = theirs("SkipLayerNormalization", [x, s, g, bt, bi], {"epsilon": 1e-5}, n_out=4)
    for a, b in zip(got, ref):
        close(a, b, rtol=1e-4, atol=1e-5)


def test_skip_layer_norm_fp16_and_broadcast_skip():
    h = np.float16
    x, s, g = rand(2, 3, 8, dtype=h), rand(3, 8, dtype=h), rand(8, dtype=h)
    got = ours("SkipLayerNormalization", [x, s, g], n_out=1)
    close(got[0], theirs("SkipLayerNormalization", [x, s, g])[0], rtol=1e-2, atol=1e-2)


def test_skip_simplified_layer_norm():
    x, s, g, bi = rand(2, 3, 8), rand(2, 3, 8), rand(8), rand(8)
    got = ours("SkipSimplifiedLayerNormalization", [x, s, g, bi], {"epsilon": 1e-6}, n_out=4)
    total = (x + s + bi).astype(np.float64)
    inv = 1 / np.sqrt((total**2).mean(-1, keepdims=True) + 1e-6)
    close(got[0], (total * inv * g).astype(np.float32), rtol=1e-5, atol=1e-5)
    close(got[2], inv.astype(np.float32), rtol=1e-5)
    close(got[3], total.astype(np.float32))
    ref = theirs("SkipSimplifiedLayerNormalization", [x, s, g, bi], {"epsilon": 1e-6}, n_out=4)
    for a, b in zip(got, ref):
        close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("axis", [-1, 1])
def test_simplified_layer_norm(axis):
    x = rand(2, 3, 4)
    scale = rand(*x.shape[axis % 3:])
    y, inv = ours("SimplifiedLayerNormalization", [x, scale], {"axis": axis}, n_out=2)
    axes = tuple(range(axis % 3, 3))
    want_inv = 1 / np.sqrt((x.astype(np.float64) ** 2).mean(axes, keepdims=True) + 1e-5)
    close(y, (x * want_inv * scale).astype(np.float32), rtol=1e-5, atol=1e-6)
    close(inv, want_inv.astype(np.float32), rtol=1e-5)
    # onnxruntime registers this op in the default domain.
    ref = theirs("SimplifiedLayerNormalization", [x, scale], {"axis": axis}, n_out=1, domain="")
    close(y, ref[0], rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------- Attention


def attention_np(x, w, b, heads, mask_bias=None, causal=False, past=None, filt=-10000.0):
    bsz, seq, _ = x.shape
    qkv = x.astype(np.float64) @ w + (0 if b is None else b)
    hid = w.shape[1] // 3
    hs = hid // heads

    def split(t):
        return t.reshape(bsz, seq, heads, hs).transpose(0, 2, 1, 3)

    q, k, v = split(qkv[..., :hid]), split(qkv[..., hid:2 * hid]), split(qkv[..., 2 * hid:])
    plen = 0
    if past is not None:
        plen = past.shape[3]
        k = np.concatenate([past[0], k], 2)
        v = np.concatenate([past[1], v], 2)
    sc = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hs)
    if mask_bias is not None:
        sc = sc + mask_bias
    if causal:
        tot = k.shape[2]
        sc = sc + np.where(np.arange(tot)[None] > np.arange(seq)[:, None] + plen, filt, 0.0)
    p = np.exp(sc - sc.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return (p @ v).transpose(0, 2, 1, 3).reshape(bsz, seq, hid), np.stack([k, v])


def _attn_inputs(bsz=2, seq=4, hidden=8):
    return rand(bsz, seq, hidden), rand(hidden, 3 * hidden) * 0.5, rand(3 * hidden)


def test_attention_no_mask():
    x, w, b = _attn_inputs()
    y, present = ours("Attention", [x, w, b], {"num_heads": 2}, n_out=2)
    want, want_present = attention_np(x, w, b, 2)
    close(y, want.astype(np.float32), rtol=1e-4, atol=1e-5)
    close(present, want_present.astype(np.float32), rtol=1e-4, atol=1e-5)
    close(y, theirs("Attention", [x, w, b], {"num_heads": 2})[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["1d_end", "1d_end_start", "2d_raw", "3d_raw"])
def test_attention_mask_index(kind):
    x, w, b = _attn_inputs()
    bsz, seq = x.shape[:2]
    if kind == "1d_end":
        m = np.array([4, 2], np.int32)
        keep = np.arange(seq)[None] < m[:, None]
        keep = np.broadcast_to(keep[:, None, :], (bsz, seq, seq))
    elif kind == "1d_end_start":
        m = np.array([4, 3, 1, 0], np.int32)
        keep = (np.arange(seq)[None] < m[:2, None]) & (np.arange(seq)[None] >= m[2:, None])
        keep = np.broadcast_to(keep[:, None, :], (bsz, seq, seq))
    elif kind == "2d_raw":
        m = np.array([[1, 1, 1, 0], [1, 0, 1, 1]], np.int32)
        keep = np.broadcast_to(m[:, None, :] > 0, (bsz, seq, seq))
    else:
        m = RNG.integers(0, 2, size=(bsz, seq, seq)).astype(np.int32)
        m[..., 0] = 1
        keep = m > 0
    bias = np.where(keep, 0.0, -10000.0)[:, None]
    (y,) = ours("Attention", [x, w, b, m], {"num_heads": 2})
    close(y, attention_np(x, w, b, 2, bias)[0].astype(np.float32), rtol=1e-4, atol=1e-5)
    close(y, theirs("Attention", [x, w, b, m], {"num_heads": 2})[0], rtol=1e-4, atol=1e-5)


def test_attention_unidirectional_with_past():
    x, w, b = _attn_inputs(seq=3)
    past = rand(2, 2, 2, 5, 4)
    attrs = {"num_heads": 2, "unidirectional": 1}
    y, present = ours("Attention", [x, w, b, None, past], attrs, n_out=2)
    want, want_present = attention_np(x, w, b, 2, causal=True, past=past.astype(np.float64))
    close(y, want.astype(np.float32), rtol=1e-4, atol=1e-5)
    close(present, want_present.astype(np.float32), rtol=1e-4, atol=1e-5)
    ref = theirs("Attention", [x, w, b, None, past], attrs, n_out=2)
    close(y, ref[0], rtol=1e-4, atol=1e-5)
    close(present, ref[1], rtol=1e-4, atol=1e-5)


def test_attention_unidirectional_mask_and_bias():
    x, w, b = _attn_inputs()
    m = np.array([3, 4], np.int32)
    ab = rand(1, 2, 4, 4)
    attrs = {"num_heads": 2, "unidirectional": 1}
    (y,) = ours("Attention", [x, w, b, m, None, ab], attrs)
    close(y, theirs("Attention", [x, w, b, m, None, ab], attrs)[0], rtol=1e-4, atol=1e-5)


def test_attention_qkv_hidden_sizes_and_scale():
    x = rand(2, 3, 8)
    w, b = rand(8, 4 + 4 + 8), rand(16)
    attrs = {"num_heads": 2, "qkv_hidden_sizes": [4, 4, 8], "scale": 0.3}
    (y,) = ours("Attention", [x, w, b], attrs)
    assert y.shape == (2, 3, 8)
    close(y, theirs("Attention", [x, w, b], attrs)[0], rtol=1e-4, atol=1e-5)


def test_attention_bad_shapes():
    x, w, b = _attn_inputs()
    with pytest.raises(KernelError):
        ours("Attention", [x, w[:, :23], b], {"num_heads": 2})
    with pytest.raises(KernelError):
        ours("Attention", [x, w, b, np.array([1, 2, 3], np.int32)], {"num_heads": 2})


# ---------------------------------------------------------------------------- DynamicQuantizeLSTM


def _qlstm_inputs(direction="forward", wdt=np.int8, per_column=True, lens=None, extras=True,
                  T=5, batch=3, inp=4, H=3, zero_points=False):
    """Inputs for one DynamicQuantizeLSTM call: quantized W [D, I, 4H], R [D, H, 4H]."""
    D = 2 if direction == "bidirectional" else 1
    lo, hi = (-128, 128) if wdt == np.int8 else (0, 256)
    shp = (D, 4 * H) if per_column else (D,)

    def scales():
        return (RNG.random(shp) * 0.01 + 0.002).astype(np.float32)

    def zps():
        if not zero_points:
            return np.zeros(shp, wdt)
        return RNG.integers(lo // 4 if lo else 100, hi // 4 if lo else 150, shp).astype(wdt)

    def opt(*shape, k=1.0):
        return (RNG.standard_normal(shape) * k).astype(np.float32) if extras else None

    return [rand(T, batch, inp), RNG.integers(lo, hi, (D, inp, 4 * H)).astype(wdt),
            RNG.integers(lo, hi, (D, H, 4 * H)).astype(wdt), opt(D, 8 * H, k=0.1),
            None if lens is None else np.array(lens, np.int32), opt(D, batch, H),
            opt(D, batch, H), opt(D, 3 * H, k=0.1), scales(), zps(), scales(), zps()]


@pytest.mark.parametrize("direction,wdt,per_column,lens,extras,attrs", [
    ("forward", np.int8, True, None, True, {}),
    ("reverse", np.uint8, False, None, True, {}),
    ("bidirectional", np.int8, True, None, True, {}),
    ("bidirectional", np.uint8, True, [5, 3, 2], True, {}),
    ("forward", np.int8, True, [4, 3, 2], True, {}),
    ("reverse", np.int8, True, [2, 5, 4], False, {}),
    ("forward", np.int8, True, None, False, {}),
    ("forward", np.int8, True, None, True, {"clip": 0.5, "input_forget": 1}),
    ("bidirectional", np.int8, True, None, True,
     {"activations": ["HardSigmoid", "Tanh", "Relu"] * 2, "activation_alpha": [0.3, 0.3],
      "activation_beta": [0.4, 0.4]}),
])
def test_dynamic_quantize_lstm_matches_onnxruntime(direction, wdt, per_column, lens, extras,
                                                   attrs):
    ins = _qlstm_inputs(direction, wdt, per_column, lens, extras)
    # W and R halved where ORT's int8 products saturate (tests/ort_int8.py)
    ins[1], ins[2] = ort_int8.fit_s8(ins[1]), ort_int8.fit_s8(ins[2])
    attrs = {"hidden_size": 3, "direction": direction, **attrs}
    got = ours("DynamicQuantizeLSTM", ins, attrs, n_out=3)
    # ORT quantizes the recurrent state per thread's slice of the batch: same thread count.
    from opwarden.ops.contrib_dynq import ort_intra_threads
    ref = theirs("DynamicQuantizeLSTM", ins, attrs, n_out=3, threads=ort_intra_threads())
    for a, b in zip(got, ref):
        close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("wdt", [np.int8, np.uint8])
def test_dynamic_quantize_lstm_near_float_lstm(wdt):
    """Nonzero weight zero points (ORT rejects them) against LSTM on dequantized weights."""
    ins = _qlstm_inputs("bidirectional", wdt, True, None, True, zero_points=True)
    X, W, R, B, _, h0, c0, P, ws, wz, rs, rz = ins
    got = ours("DynamicQuantizeLSTM", ins, {"hidden_size": 3, "direction": "bidirectional"},
               n_out=3)
    # ONNX LSTM wants W as [D, 4H, I]: dequantize, then swap the last two axes.
    w = ((W.astype(np.float32) - wz[:, None, :]) * ws[:, None, :]).transpose(0, 2, 1)
    r = ((R.astype(np.float32) - rz[:, None, :]) * rs[:, None, :]).transpose(0, 2, 1)
    lstm = REGISTRY.resolve("LSTM", "", 14)[0].reference
    want = lstm(X, w, r, B, None, h0, c0, P, hidden_size=3, direction="bidirectional")
    for a, b in zip(got, want):
        assert a.dtype == np.float32 and a.shape == b.shape
        # Only the uint8 quantization of X and h separates the two.
        np.testing.assert_allclose(a, b, atol=0.05)


def test_dynamic_quantize_lstm_checks_shapes():
    ins = _qlstm_inputs()
    ins[1] = np.zeros((1, 4 * 3, 4), np.int8)  # LSTM's [D, 4H, I], not [D, I, 4H]
    with pytest.raises(KernelError, match="W has shape"):
        ours("DynamicQuantizeLSTM", ins, {"hidden_size": 3})
    ins = _qlstm_inputs()
    ins[8] = np.ones((1, 5), np.float32)
    with pytest.raises(KernelError, match="W_scale"):
        ours("DynamicQuantizeLSTM", ins, {"hidden_size": 3})
