"""com.microsoft transformer operators (ops/contrib_attention.py, ops/contrib_embed.py) against
onnxruntime's CPU kernels on random inputs at their boundary shapes; forms ORT's CPU lacks
(packed QKV/KV, GemmFastGelu, BiasSplitGelu) against ORT running the equivalent graph."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import opwarden as ow
from opwarden.dtypes import onnx_type
from opwarden.errors import KernelError, OpwardenError
from opwarden.ops import REGISTRY

ort = pytest.importorskip("onnxruntime")

MS = "com.microsoft"
RNG = np.random.default_rng(34)
I32 = np.int32


def f(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def i32(*v):
    return np.array(v, I32)


def ours(op_type, inputs, attrs=None, n_out=1):
    opdef, sch = REGISTRY.resolve(op_type, MS, 1)
    kw = {k: a.default for k, a in sch.attrs.items() if a.has_default}
    kw.update(attrs or {})
    args = list(inputs)
    while args and args[-1] is None:
        args.pop()
    res = opdef.reference(*args, **kw)
    return (list(res) if isinstance(res, tuple) else [res])[:n_out]


def _model(nodes, inputs, outputs):
    g = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, onnx_type(x.dtype), x.shape) for n, x in inputs],
        [helper.make_tensor_value_info(n, t, None) for n, t in outputs])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid(MS, 1)])
    m.ir_version = 8
    return m


def _ort_run(model, feeds):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"]).run(None, feeds)


def theirs(op_type, inputs, attrs=None, n_out=1):
    """ORT's outputs of the one-node model (outputs typed like input 0)."""
    names = [f"i{k}" if x is not None else "" for k, x in enumerate(inputs)]
    while names and not names[-1]:
        names.pop()
    elem = onnx_type(inputs[0].dtype)
    outs = [f"o{k}" for k in range(n_out)]
    node = helper.make_node(op_type, names, outs, domain=MS, **(attrs or {}))
    out_types = [(o, elem) for o in outs]
    if op_type == "EmbedLayerNormalization":
        elem = onnx_type(inputs[2].dtype)
        out_types = [(o, TensorProto.INT32 if k == 1 else elem) for k, o in enumerate(outs)]
    live = [(n, x) for n, x in zip(names, inputs) if n]
    return _ort_run(_model([node], live, out_types), dict(live))


def close(a, b, rtol, atol, what=""):
    assert a.dtype == b.dtype and a.shape == b.shape, (what, a.dtype, a.shape, b.dtype, b.shape)
    np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=atol,
                               err_msg=what)


def compare(op_type, inputs, attrs, n_out, rows=None):
    """Ours vs ORT on every output; `rows` (B, S) bool limits output 0 to the rows ORT
    specifies (a right-padded chunk's padding rows are unspecified)."""
    half = inputs[0].dtype == np.float16 or (
        len(inputs) > 2 and inputs[2] is not None and inputs[2].dtype == np.float16)
    rtol, atol = (5e-3, 5e-3) if half else (1e-4, 2e-5)
    a, b = ours(op_type, inputs, attrs, n_out), theirs(op_type, inputs, attrs, n_out)
    for k, (x, y) in enumerate(zip(a, b)):
        if k == 0 and rows is not None:
            x, y = x[rows], y[rows]
        close(x, y, rtol, atol, f"{op_type} output {k}")


# ---------------------------------------------------------------------------- MultiHeadAttention

B, S, L, N, H = 2, 3, 5, 2, 4
D = N * H


def _mha_cases():
    q, k, v = f(B, S, D), f(B, L, D), f(B, L, D)
    qs, ks, vs = f(B, S, D), f(B, S, D), f(B, S, D)
    pk, pv = f(B, N, 4, H), f(B, N, 4, H)
    mask2 = (RNG.random((B, L)) > 0.4).astype(I32)
    h = np.float16
    a = {"num_heads": N}
    return [
        ("cross", [q, k, v], a, 1),
        ("cross, bias", [q, k, v, f(3 * D)], a, 1),
        ("self, causal", [qs, ks, vs, f(3 * D)], {**a, "unidirectional": 1}, 1),
        ("1-D key lengths, incl. 0", [q, k, v, None, i32(0, 4)], a, 1),
        ("(3B+2) key lengths", [q, k, v, None, i32(2, 5, 0, 3, 6, 0, 2, 7)], a, 1),
        ("2-D padding mask", [q, k, v, None, mask2], a, 1),
        ("3-D mask", [q, k, v, None, (RNG.random((B, S, L)) > 0.4).astype(I32)], a, 1),
        ("attention bias (1, N)", [q, k, v, None, None, f(1, N, S, L)], a, 1),
        ("attention bias (B, 1), mask, scale, filter",
         [q, k, v, None, i32(2, 5), f(B, 1, S, L)],
         {**a, "scale": 0.7, "mask_filter_value": -50.0}, 1),
        ("v hidden != q hidden", [q, k, f(B, L, 6), f(2 * D + 6)], a, 1),
        ("4-D projected key/value", [q, f(B, N, L, H), f(B, N, L, H), f(3 * D)], a, 1),
        ("past/present", [qs, ks, vs, None, None, None, pk, pv], a, 3),
        ("past, causal, 2-D mask over total",
         [qs, ks, vs, f(3 * D), (RNG.random((B, 7)) > 0.3).astype(I32), None, pk, pv],
         {**a, "unidirectional": 1}, 3),
        ("empty past", [qs, ks, vs, None, None, None, f(B, N, 0, H), f(B, N, 0, H)], a, 3),
        ("one token", [f(1, 1, D), f(1, 1, D), f(1, 1, D)], a, 1),
        ("float16", [q.astype(h), k.astype(h), v.astype(h), f(3 * D).astype(h)], a, 1),
    ]


@pytest.mark.parametrize("label, inputs, attrs, n_out", _mha_cases(),
                         ids=[c[0] for c in _mha_cases()])
def test_multihead_attention_matches_onnxruntime(label, inputs, attrs, n_out):
    compare("MultiHeadAttention", inputs, attrs, n_out)


def test_multihead_attention_packed_forms_equal_unpacked_onnxruntime():
    """ORT's CPU kernel lacks packed QKV / KV: the packed forms must equal ORT on the same
    tensors unpacked."""
    qkv, bias = f(B, S, N, 3, H), f(3 * D)
    q, k, v = (qkv[:, :, :, i].reshape(B, S, D) for i in range(3))
    want = theirs("MultiHeadAttention", [q, k, v, bias], {"num_heads": N})[0]
    got = ours("MultiHeadAttention", [qkv, None, None, bias], {"num_heads": N})[0]
    close(got, want, 1e-5, 1e-6)
    kv = f(B, L, N, 2, H)
    k, v = (kv[:, :, :, i].reshape(B, L, D) for i in range(2))
    want = theirs("MultiHeadAttention", [q, k, v], {"num_heads": N})[0]
    close(ours("MultiHeadAttention", [q, kv], {"num_heads": N})[0], want, 1e-5, 1e-6)


@pytest.mark.parametrize("inputs, match", [
    ([f(B, S, D), f(B, L, 6), f(B, L, D)], "do not match query heads"),
    ([f(B, S, D), f(B, L, D), f(B, L, D), f(5)], "bias must be 1-D of length 24"),
    ([f(B, S, D), f(B, L, D), f(B, L, D), None, np.ones((B, 4), I32)], "mask"),
    ([f(B, S, D), f(B, S, D), f(B, S, D), None, np.ones((B, S), I32), None,
      f(B, N, 2, H), f(B, N, 2, H)], "kv_sequence_length"),
    ([f(B, S, D), f(B, L, D), f(B, L, D), None, None, f(1, N, S, 4)], "attention_bias"),
    ([f(B, S, D), f(B, L, D), f(B, L, D), None, None, None, f(B, N, 2, H)], "together"),
    ([f(B, S, D)], "needs key"),
])
def test_multihead_attention_refuses_bad_inputs(inputs, match):
    with pytest.raises(KernelError, match=match):
        ours("MultiHeadAttention", inputs, {"num_heads": N})


# ---------------------------------------------------------------------------- GroupQueryAttention

GN, GKV, GH = 4, 2, 16


def _gqa_cases():
    q, k, v = f(B, S, GN * GH), f(B, S, GKV * GH), f(B, S, GKV * GH)
    q1, k1, v1 = f(B, 1, GN * GH), f(B, 1, GKV * GH), f(B, 1, GKV * GH)
    p5, p8 = f(B, GKV, 5, GH), f(B, GKV, 8, GH)
    cos, sin = f(32, GH // 2), f(32, GH // 2)
    a = {"num_heads": GN, "kv_num_heads": GKV}
    rot = {**a, "do_rotary": 1}
    h = np.float16
    lens = (i32(2, 2), i32(3))
    dec = (i32(5, 3), i32(6))
    return [
        ("prompt", [q, k, v, None, None, *lens], a, 3),
        ("prompt over a 0-row past", [q, k, v, p5[:, :, :0], p5[:, :, :0], *lens], a, 3),
        ("prompt into an 8-row buffer", [q, k, v, p8, p8, *lens], a, 3),
        ("right-padded prompt", [q, k, v, None, None, i32(2, 0), i32(3)], a, 3),
        ("packed QKV", [f(B, S, (GN + 2 * GKV) * GH), None, None, None, None, *lens], a, 3),
        ("decode, ragged", [q1, k1, v1, p5, p5, *dec], a, 3),
        ("decode into a buffer", [q1, k1, v1, p8, p8, *dec], a, 3),
        ("subsequent prompt", [q[:1], k[:1], v[:1], p5[:1], p5[:1], i32(7), i32(8)], a, 3),
        ("rotary prompt", [q, k, v, None, None, *lens, cos, sin], rot, 3),
        ("rotary interleaved decode", [q1, k1, v1, p5, p5, *dec, cos, sin],
         {**rot, "rotary_interleaved": 1}, 3),
        ("rotary position_ids prompt", [q, k, v, None, None, *lens, cos, sin,
                                        np.array([[3, 4, 5], [0, 1, 2]], np.int64)], rot, 3),
        ("rotary position_ids decode", [q1, k1, v1, p5, p5, *dec, cos, sin,
                                        np.array([[9], [1]], np.int64)], rot, 3),
        ("attention bias", [q, k, v, None, None, *lens, None, None, None, f(B, GN, S, 3)],
         a, 3),
        ("attention bias decode", [q1, k1, v1, p5, p5, *dec, None, None, None,
                                   f(1, 1, 1, 6)], a, 3),
        ("head sink", [q, k, v, None, None, *lens, None, None, None, None, f(GN)], a, 3),
        ("smooth softmax", [q, k, v, None, None, *lens], {**a, "smooth_softmax": 1}, 3),
        ("qk before softmax, softcap, bias",
         [q, k, v, None, None, *lens, None, None, None, f(B, GN, S, 3)],
         {**a, "qk_output": 1, "softcap": 2.0}, 4),
        ("qk after softmax", [q, k, v, None, None, *lens], {**a, "qk_output": 2}, 4),
        ("non-causal, padded", [q, k, v, None, None, i32(2, 1), i32(3)], {**a, "causal": 0}, 3),
        ("non-causal decode", [q1, k1, v1, p5, p5, *dec], {**a, "causal": 0}, 3),
        ("local window 1", [q, k, v, None, None, *lens], {**a, "local_window_size": 1}, 3),
        ("local window decode", [q1, k1, v1, p5, p5, *dec], {**a, "local_window_size": 2}, 3),
        ("local window subsequent prompt",
         [q[:1], k[:1], v[:1], p5[:1], p5[:1], i32(7), i32(8)], {**a, "local_window_size": 3},
         3),
        ("softcap, scale", [q, k, v, None, None, *lens], {**a, "softcap": 2.0, "scale": 0.1},
         3),
        ("one token", [q1, k1, v1, None, None, i32(0, 0), i32(1)], a, 3),
        ("float16 rotary decode", [q1.astype(h), k1.astype(h), v1.astype(h), p5.astype(h),
                                   p5.astype(h), *dec, cos.astype(h), sin.astype(h)], rot, 3),
    ]


@pytest.mark.parametrize("label, inputs, attrs, n_out", _gqa_cases(),
                         ids=[c[0] for c in _gqa_cases()])
def test_group_query_attention_matches_onnxruntime(label, inputs, attrs, n_out):
    compare("GroupQueryAttention", inputs, attrs, n_out)


def test_group_query_attention_query_seqlens_valid_rows():
    """Right-padded chunks: only the valid rows are specified (and only they enter the cache)."""
    qs = np.array([2, 3], I32)
    inputs = [f(B, S, GN * GH), f(B, S, GKV * GH), f(B, S, GKV * GH), f(B, GKV, 8, GH),
              f(B, GKV, 8, GH), i32(6, 4), i32(8)] + [None] * 9 + [qs]
    rows = np.arange(S)[None, :] < qs[:, None]
    compare("GroupQueryAttention", inputs, {"num_heads": GN, "kv_num_heads": GKV}, 3, rows)


@pytest.mark.parametrize("inputs, attrs, match", [
    ([f(B, S, 41), None, None, None, None, i32(2, 2), i32(3)], {}, "packed QKV width"),
    ([f(B, S, 64), f(B, S, 32), f(B, S, 32), None, None, i32(2, 3), i32(3)], {},
     r"seqlens_k \+ 1"),
    ([f(B, S, 64), f(B, S, 32), f(B, S, 32), None, None, i32(2), i32(3)], {}, "2 entries"),
    ([f(B, 1, 64), f(B, 1, 32), f(B, 1, 32), f(B, 2, 2, 16), f(B, 2, 2, 16), i32(5, 5),
      i32(6)], {}, "past_key holds 2 rows"),
    ([f(B, S, 64), f(B, S, 32), f(B, S, 32), None, None, i32(2, 2), i32(3)],
     {"do_rotary": 1}, "cos_cache"),
    ([f(B, S, 64), f(B, S, 32), f(B, S, 32), None, None, i32(2, 2), i32(3), f(2, 8),
      f(2, 8)], {"do_rotary": 1}, "rotary positions"),
    ([f(B, S, 64), f(B, S, 32), f(B, S, 32), None, None, i32(2, 2), i32(3)],
     {"num_heads": 3}, "multiple"),
    ([f(B, S, 64), f(B, S, 32), f(B, S, 32), None, None, i32(2, 2), i32(3)] + [None] * 5
     + [f(1)], {}, "quantized"),
])
def test_group_query_attention_refuses_bad_inputs(inputs, attrs, match):
    with pytest.raises(KernelError, match=match):
        ours("GroupQueryAttention", inputs, {"num_heads": GN, "kv_num_heads": GKV, **attrs})


# ---------------------------------------------------------------------------- EmbedLayerNorm

EB, ES, EH, EV = 3, 6, 8, 13


def _embed_cases():
    ids = RNG.integers(0, EV, (EB, ES)).astype(I32)
    seg = RNG.integers(0, 2, (EB, ES)).astype(I32)
    we, pe, se, g, b = f(EV, EH), f(ES + 2, EH), f(2, EH), f(EH), f(EH)
    mask = np.array([[1, 1, 1, 0, 0, 0], [1] * 6, [2, 1, 0, 1, 5, 1]], I32)
    h = np.float16
    return [
        ("BERT", [ids, seg, we, pe, se, g, b, mask], {}, 3),
        ("no mask", [ids, seg, we, pe, se, g, b], {}, 3),
        ("no segments", [ids, None, we, pe, None, g, b], {}, 2),
        ("(1, S) position_ids", [ids, seg, we, pe, se, g, b, None,
                                 np.array([[5, 4, 3, 2, 1, 0]], I32)], {"epsilon": 1e-5}, 3),
        ("(B, S) position_ids", [ids, seg, we, pe, se, g, b, mask,
                                 RNG.integers(0, ES + 2, (EB, ES)).astype(I32)], {}, 3),
        ("large embeddings", [ids, seg, we * 100 + 50, pe, se, g, b, mask], {}, 2),
        ("one token", [ids[:1, :1], seg[:1, :1], we, pe, se, g, b, mask[:1, :1]], {}, 3),
        ("float16", [ids, seg, we.astype(h), pe.astype(h), se.astype(h), g.astype(h),
                     b.astype(h), mask], {}, 3),
    ]


@pytest.mark.parametrize("label, inputs, attrs, n_out", _embed_cases(),
                         ids=[c[0] for c in _embed_cases()])
def test_embed_layer_normalization_matches_onnxruntime(label, inputs, attrs, n_out):
    compare("EmbedLayerNormalization", inputs, attrs, n_out)


def test_embed_layer_normalization_refuses_bad_ids():
    ids = np.array([[1, 13]], I32)
    base = [ids, None, f(EV, EH), f(4, EH), None, f(EH), f(EH)]
    with pytest.raises(KernelError, match=r"word_embedding: index 13 out of range \[0, 13\)"):
        ours("EmbedLayerNormalization", base)
    with pytest.raises(KernelError, match="position_embedding"):
        ours("EmbedLayerNormalization", [np.zeros((1, 5), I32)] + base[1:])
    with pytest.raises(KernelError, match="together"):
        ours("EmbedLayerNormalization", [ids, ids] + base[2:])


def test_embed_layer_normalization_error_in_a_session_keeps_it_usable():
    """A bad id in a feed is an OpwardenError naming the table; the next good run works."""
    we, pe, g, b = f(EV, EH), f(ES, EH), f(EH), f(EH)
    node = helper.make_node("EmbedLayerNormalization", ["ids", "", "we", "pe", "", "g", "b"],
                            ["y", "mi"], domain=MS)
    m = _model([node], [("ids", np.zeros((1, 4), I32)), ("we", we), ("pe", pe), ("g", g),
                        ("b", b)], [("y", TensorProto.FLOAT), ("mi", TensorProto.INT32)])
    s = ow.InferenceSession(m.SerializeToString())
    feeds = {"we": we, "pe": pe, "g": g, "b": b}
    with pytest.raises(OpwardenError, match="word_embedding"):
        s.run(None, {**feeds, "ids": np.array([[0, 99, 1, 2]], I32)})
    good = {**feeds, "ids": np.array([[0, 12, 1, 2]], I32)}
    close(s.run(None, good)[0], _ort_run(m, good)[0], 1e-5, 1e-5)


# ---------------------------------------------------------------------------- RotaryEmbedding


def _rotary_cases():
    b, s, n, hd = 2, 3, 4, 8
    cos, sin = f(16, hd // 2), f(16, hd // 2)
    start = np.array([2], np.int64)
    h = np.float16
    return [
        ("3-D, start", [f(b, s, n * hd), start, cos, sin], {}),
        ("3-D interleaved", [f(b, s, n * hd), start, cos, sin], {"interleaved": 1}),
        ("4-D (B, N, S, H)", [f(b, n, s, hd), start, cos, sin], {}),
        ("(B, S) positions", [f(b, s, n * hd), RNG.integers(0, 16, (b, s)).astype(np.int64),
                              cos, sin], {"interleaved": 1}),
        ("partial rotation", [f(b, s, n * hd), start, cos[:, :2], sin[:, :2]],
         {"num_heads": n, "rotary_embedding_dim": 4}),
        ("packed batching flag", [f(b, s, n * hd), start, cos, sin], {"is_packed_batching": 1}),
        ("last cache row", [f(1, 1, hd), np.array([15], np.int64), cos, sin], {}),
        ("float16", [f(b, s, n * hd).astype(h), start, cos.astype(h), sin.astype(h)], {}),
    ]


@pytest.mark.parametrize("label, inputs, attrs", _rotary_cases(),
                         ids=[c[0] for c in _rotary_cases()])
def test_rotary_embedding_matches_onnxruntime(label, inputs, attrs):
    compare("RotaryEmbedding", inputs, attrs, 1)


def test_rotary_embedding_refuses_out_of_cache_positions():
    cos = f(16, 4)
    with pytest.raises(KernelError, match="outside the 16 rows"):
        ours("RotaryEmbedding", [f(1, 3, 8), np.array([14], np.int64), cos, cos])
    with pytest.raises(KernelError, match="num_heads"):
        ours("RotaryEmbedding", [f(1, 3, 16), np.array([0], np.int64), cos[:, :2], cos[:, :2]],
             {"rotary_embedding_dim": 4})


# ---------------------------------------------------------------------------- GemmFastGelu etc.


def _ort_graph(build, inputs):
    """ORT's result of a small graph built by build(names) -> (nodes, output dtype)."""
    names = [f"i{k}" for k in range(len(inputs))]
    nodes, elem = build(names)
    return _ort_run(_model(nodes, list(zip(names, inputs)), [("y", elem)]),
                    dict(zip(names, inputs)))[0]


@pytest.mark.parametrize("shape, bias, dtype", [
    ((2, 3, 8), True, np.float32), ((4, 8), False, np.float32), ((0, 8), True, np.float32),
    ((3, 16), True, np.float16)])
def test_gemm_fast_gelu_equals_onnxruntime_matmul_fast_gelu(shape, bias, dtype):
    x, w, b = f(*shape, dtype=dtype), f(shape[-1], 5, dtype=dtype), f(5, dtype=dtype)
    inputs = [x, w, b] if bias else [x, w]

    def build(n):
        mm = helper.make_node("MatMul", n[:2], ["mm"])
        fg = helper.make_node("FastGelu", ["mm"] + n[2:], ["y"], domain=MS)
        return [mm, fg], onnx_type(x.dtype)

    tol = 2e-3 if dtype == np.float16 else 1e-5
    close(ours("GemmFastGelu", inputs)[0], _ort_graph(build, inputs), tol, tol)


@pytest.mark.parametrize("shape, dtype", [((2, 4, 10), np.float32), ((1, 1, 2), np.float32),
                                          ((1, 0, 6), np.float32), ((2, 3, 8), np.float16)])
def test_bias_split_gelu_equals_onnxruntime_add_split_gelu_mul(shape, dtype):
    x, b = f(*shape, dtype=dtype), f(shape[-1], dtype=dtype)

    def build(n):
        return [helper.make_node("Add", n, ["s"]),
                helper.make_node("Split", ["s"], ["l", "r"], axis=-1),
                helper.make_node("Gelu", ["r"], ["g"], domain=MS),
                helper.make_node("Mul", ["l", "g"], ["y"])], onnx_type(x.dtype)

    tol = 2e-3 if dtype == np.float16 else 1e-5
    close(ours("BiasSplitGelu", [x, b])[0], _ort_graph(build, [x, b]), tol, tol)
    with pytest.raises(KernelError, match="even"):
        ours("BiasSplitGelu", [f(1, 2, 3), f(3)])


# ---------------------------------------------------------------------------- existing contrib ops


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("alpha", [1.702, -0.7])
def test_quick_gelu_matches_onnxruntime(dtype, alpha):
    x = (f(3, 5, 7) * 4).astype(dtype)
    tol = 2e-3 if dtype == np.float16 else 1e-5
    close(ours("QuickGelu", [x], {"alpha": alpha})[0],
          theirs("QuickGelu", [x], {"alpha": alpha})[0], tol, tol)


@pytest.mark.parametrize("shape, bias, dtype", [((2, 3, 8), True, np.float32),
                                                ((6, 8), False, np.float32),
                                                ((2, 3, 8), False, np.float16)])
def test_skip_simplified_layer_norm_matches_onnxruntime(shape, bias, dtype):
    inputs = [f(*shape, dtype=dtype), f(*shape, dtype=dtype), f(shape[-1], dtype=dtype),
              f(shape[-1], dtype=dtype) if bias else None]
    a = ours("SkipSimplifiedLayerNormalization", inputs, {"epsilon": 1e-5}, 4)
    names = ["i0", "i1", "i2"] + (["i3"] if bias else [])
    node = helper.make_node("SkipSimplifiedLayerNormalization", names, ["y", "m", "iv", "s"],
                            domain=MS, epsilon=1e-5)
    e = onnx_type(inputs[0].dtype)
    live = [(n, x) for n, x in zip(names, inputs)]
    b = _ort_run(_model([node], live, [("y", e), ("m", TensorProto.FLOAT),
                                       ("iv", TensorProto.FLOAT), ("s", e)]), dict(live))
    tol = 2e-3 if dtype == np.float16 else 1e-5
    for k in (0, 2, 3):  # ORT leaves `mean` unset for RMS normalization
        close(a[k], b[k], tol, tol, f"output {k}")


@pytest.mark.parametrize("axis, shape", [(-1, (2, 3, 8)), (1, (2, 3, 8)), (-1, (5, 4))])
def test_simplified_layer_norm_in_the_default_domain_runs_like_onnxruntime(axis, shape):
    """ORT's optimizer writes SimplifiedLayerNormalization without a domain."""
    x, sc = f(*shape), f(*shape[axis:])
    node = helper.make_node("SimplifiedLayerNormalization", ["x", "s"], ["y", "iv"], axis=axis,
                            epsilon=1e-5)
    m = _model([node], [("x", x), ("s", sc)], [("y", TensorProto.FLOAT),
                                                ("iv", TensorProto.FLOAT)])
    feeds = {"x": x, "s": sc}
    for a, b in zip(ow.InferenceSession(m.SerializeToString()).run(None, feeds),
                    _ort_run(m, feeds)):
        close(a, b, 1e-5, 1e-6)


def test_every_new_operator_has_a_shape_rule_and_samples():
    for name in ("MultiHeadAttention", "GroupQueryAttention", "EmbedLayerNormalization",
                 "RotaryEmbedding", "GemmFastGelu", "BiasSplitGelu"):
        opdef = REGISTRY.latest(name, MS)
        assert opdef is not None and opdef.infer_fn is not None and opdef.samples_fn is not None
        assert list(opdef.samples_fn(np.random.default_rng(0)))


def test_onnx_model_with_multihead_attention_runs_in_a_session():
    """The session path (shape rule, plan, guarded loop) on a MultiHeadAttention node with
    past/present outputs."""
    inputs = [("q", f(B, S, D)), ("k", f(B, S, D)), ("v", f(B, S, D)), ("pk", f(B, N, 4, H)),
              ("pv", f(B, N, 4, H))]
    node = helper.make_node("MultiHeadAttention", ["q", "k", "v", "", "", "", "pk", "pv"],
                            ["y", "ok", "ov"], domain=MS, num_heads=N, unidirectional=1)
    m = _model([node], inputs, [(o, TensorProto.FLOAT) for o in ("y", "ok", "ov")])
    feeds = dict(inputs)
    for opts in ({}, {"checks": ["all"]}):  # the lean loop, the guarded one
        got = ow.InferenceSession(m.SerializeToString(),
                                  ow.SessionOptions(**opts)).run(None, feeds)
        for a, b in zip(got, _ort_run(m, feeds)):
            close(a, b, 1e-4, 1e-5)
