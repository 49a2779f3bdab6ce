"""float16 models round where ONNX Runtime rounds (passes/fp16_islands.py).

Models converted with onnxconverter-common (a small seeded BERT-like encoder as exporters
write it, a small CNN) are measured against the float32 model: our error must stay within
1.2x of ORT's. Small graphs of exactly rounded ops (Add, Mul, Sub, Transpose) pin each of
ORT's decisions bit for bit: chains of ops without a float16 kernel round once, an isolated
float16-capable node joins the chain, graph inputs, graph outputs and native readers keep
float16, and a model's own Casts stay.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import opwarden

ort = pytest.importorskip("onnxruntime")
float16 = pytest.importorskip("onnxconverter_common.float16")
H, F = TensorProto.FLOAT16, TensorProto.FLOAT


class _Builder:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.inits: list = []
        self.k = 0

    def w(self, *shape, scale=None, value=None, dtype=np.float32):
        self.k += 1
        if value is None:
            scale = 1.0 / np.sqrt(shape[0]) if scale is None else scale
            value = self.rng.standard_normal(shape) * scale
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype), f"w{self.k}"))
        return f"w{self.k}"

    def n(self, op, ins, name=None, **attrs):
        self.k += 1
        self.nodes.append(helper.make_node(op, ins, [f"t{self.k}"], name=name or f"n{self.k}",
                                           **attrs))
        return f"t{self.k}"

    def linear(self, x, fin, fout):
        return self.n("Add", [self.n("MatMul", [x, self.w(fin, fout)]), self.w(fout, scale=0.1)])

    def layernorm(self, x, h):
        g = self.w(h, value=1 + 0.1 * self.rng.standard_normal(h))
        return self.n("LayerNormalization", [x, g, self.w(h, scale=0.1)], axis=-1,
                      epsilon=1e-12)

    def gelu(self, x):
        """Gelu as exporters spell it: x * (1 + erf(x / sqrt 2)) * 0.5."""
        e = self.n("Erf", [self.n("Div", [x, self.w(value=np.sqrt(2.0))])])
        return self.n("Mul", [self.n("Mul", [x, self.n("Add", [e, self.w(value=1.0)])]),
                              self.w(value=0.5)])

    def model(self, inputs, outputs):
        g = helper.make_graph(self.nodes, "g", inputs, outputs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        return m


def bert_like(seed, layers=2, hidden=64, heads=4, ffn=256, vocab=96, seq=16):
    """Embeddings + LayerNorm, mask to additive bias, attention (MatMul/Reshape/Transpose/
    Softmax), Gelu FFN, post-LayerNorm residuals, a Gemm+Tanh pooler."""
    b, d = _Builder(seed), hidden // heads
    x = b.layernorm(b.n("Add", [b.n("Gather", [b.w(vocab, hidden, scale=0.5), "input_ids"]),
                                b.n("Gather", [b.w(seq, hidden, scale=0.5),
                                               b.w(value=np.arange(seq), dtype=np.int64)])]),
                    hidden)
    m = b.n("Cast", [b.n("Unsqueeze", ["attention_mask", b.w(value=[1, 2], dtype=np.int64)])],
            name="mask_cast", to=F)
    m = b.n("Mul", [b.n("Sub", [b.w(value=1.0), m]), b.w(value=-10000.0)])
    split = b.w(value=[0, 0, heads, d], dtype=np.int64)
    for _ in range(layers):
        def heads_of(t, perm):
            return b.n("Transpose", [b.n("Reshape", [t, split])], perm=perm)
        q = heads_of(b.linear(x, hidden, hidden), [0, 2, 1, 3])
        k = heads_of(b.linear(x, hidden, hidden), [0, 2, 3, 1])
        v = heads_of(b.linear(x, hidden, hidden), [0, 2, 1, 3])
        s = b.n("Div", [b.n("MatMul", [q, k]), b.w(value=np.sqrt(d))])
        p = b.n("Softmax", [b.n("Add", [s, m])], axis=-1)
        ctx = b.n("Transpose", [b.n("MatMul", [p, v])], perm=[0, 2, 1, 3])
        ctx = b.n("Reshape", [ctx, b.w(value=[0, 0, hidden], dtype=np.int64)])
        x = b.layernorm(b.n("Add", [b.linear(ctx, hidden, hidden), x]), hidden)
        x = b.layernorm(b.n("Add", [b.linear(b.gelu(b.linear(x, hidden, ffn)), ffn, hidden), x]),
                        hidden)
    first = b.n("Gather", [x, b.w(value=0, dtype=np.int64)], axis=1)
    pooled = b.n("Tanh", [b.n("Gemm", [first, b.w(hidden, hidden), b.w(hidden, scale=0.1)])])
    b.nodes += [helper.make_node("Identity", [x], ["last_hidden_state"]),
                helper.make_node("Identity", [pooled], ["pooler_output"])]
    vi = helper.make_tensor_value_info
    return b.model([vi("input_ids", TensorProto.INT64, ["batch", seq]),
                    vi("attention_mask", TensorProto.INT64, ["batch", seq])],
                   [vi("last_hidden_state", F, ["batch", seq, hidden]),
                    vi("pooler_output", F, ["batch", hidden])])


def cnn(seed):
    """Conv + BatchNormalization + Relu + MaxPool twice, global pool, Gemm, Softmax."""
    b, c_in, x = _Builder(seed), 3, "image"
    for c in (16, 32):
        x = b.n("Conv", [x, b.w(c, c_in, 3, 3, scale=1 / np.sqrt(c_in * 9)), b.w(c, scale=0.1)],
                pads=[1, 1, 1, 1])
        x = b.n("BatchNormalization", [x, b.w(c, value=1 + 0.1 * b.rng.standard_normal(c)),
                                       b.w(c, scale=0.1), b.w(c, scale=0.1),
                                       b.w(c, value=1 + 0.1 * b.rng.uniform(size=c))])
        x = b.n("MaxPool", [b.n("Relu", [x])], kernel_shape=[2, 2], strides=[2, 2])
        c_in = c
    x = b.n("Gemm", [b.n("Flatten", [b.n("GlobalAveragePool", [x])]), b.w(c_in, 10),
                     b.w(10, scale=0.1)])
    b.nodes.append(helper.make_node("Softmax", [x], ["probs"], axis=-1))
    vi = helper.make_tensor_value_info
    return b.model([vi("image", F, ["n", 3, 16, 16])], [vi("probs", F, ["n", 10])])


def to_fp16(m32):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "-10000.0 will be truncated"
        # onnxconverter-common keeps a Cast's 'to' as written, so the mask Cast stays float32
        return float16.convert_float_to_float16(m32, node_block_list=["mask_cast"])


def ort_run(m, feeds):
    return ort.InferenceSession(m.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)


def max_error(outs, ref):
    return max(float(np.abs(a.astype(np.float64) - r).max()) for a, r in zip(outs, ref))


def errors(m32, feeds32):
    """(ORT fp16, ours fp16, ours fp16 without the pass) max errors against ORT fp32."""
    m16 = to_fp16(m32)
    feeds16 = {k: v.astype(np.float16) if v.dtype == np.float32 else v
               for k, v in feeds32.items()}
    ref = ort_run(m32, feeds32)
    blob = m16.SerializeToString()
    ours = opwarden.InferenceSession(blob).run(None, feeds16)
    plain = opwarden.InferenceSession(blob, disabled_passes=["fp16_islands"]).run(None, feeds16)
    assert all(o.dtype == np.float16 for o in ours)
    return max_error(ort_run(m16, feeds16), ref), max_error(ours, ref), max_error(plain, ref)


def bert_feeds(seed, batch=2, seq=16, vocab=96):
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), np.int64)
    mask[1, seq - 5:] = 0
    return {"input_ids": rng.integers(0, vocab, (batch, seq)).astype(np.int64),
            "attention_mask": mask}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fp16_bert_error_within_ort(seed):
    e_ort, e_ours, e_plain = errors(bert_like(seed), bert_feeds(seed + 1))
    assert e_ours <= 1.2 * e_ort, (e_ours, e_ort)
    assert e_ours < e_plain  # rounding after every operator is what this pass removes


@pytest.mark.parametrize("seed", [0, 1])
def test_fp16_cnn_error_within_ort(seed):
    x = np.random.default_rng(seed).standard_normal((2, 3, 16, 16)).astype(np.float32)
    e_ort, e_ours, _ = errors(cnn(seed), {"image": x})
    assert e_ours <= 1.2 * e_ort, (e_ours, e_ort)


# --------------------------------------------------------------------------------------------
# ORT's decisions, bit for bit, on exactly rounded ops
# --------------------------------------------------------------------------------------------

nd = helper.make_node


def small(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def same_as_ort(m, feeds):
    """Ours equals ORT bit for bit; returns whether ours without the pass did too."""
    ref = ort_run(m, feeds)
    got = opwarden.InferenceSession(m.SerializeToString()).run(None, feeds)
    for a, r in zip(got, ref):
        assert a.dtype == r.dtype and a.shape == r.shape
        np.testing.assert_array_equal(a, r)
    plain = opwarden.InferenceSession(m.SerializeToString(),
                                      disabled_passes=["fp16_islands"]).run(None, feeds)
    return all(np.array_equal(a, r) for a, r in zip(plain, ref))


vi = helper.make_tensor_value_info
X = np.random.default_rng(3).uniform(-4, 4, (64, 48)).astype(np.float16)
W = numpy_helper.from_array(np.random.default_rng(4).uniform(0.5, 1.5, (64, 48)).astype(np.float16),
                            "w")
WT = numpy_helper.from_array(np.random.default_rng(5).uniform(-1, 1, (48, 64)).astype(np.float16),
                             "wt")


def test_chain_rounds_once_and_isolated_transpose_joins_it():
    """Mul -> Add -> Transpose -> Sub -> Mul: one float32 chain, one rounding at the end."""
    nodes = [nd("Mul", ["x", "w"], ["a"]), nd("Add", ["a", "x"], ["b"]),
             nd("Transpose", ["b"], ["t"]), nd("Sub", ["t", "wt"], ["c"]),
             nd("Mul", ["c", "wt"], ["y"])]
    m = small(nodes, [vi("x", H, [64, 48])], [vi("y", H, [48, 64])], [W, WT])
    assert not same_as_ort(m, {"x": X})  # per-operator rounding differs: the test can fail


def test_native_node_on_a_graph_input_or_output_keeps_fp16():
    """A Transpose reading a graph input runs in float16; one whose result is also a graph
    output makes the chain round before it."""
    m = small([nd("Transpose", ["x"], ["t"]), nd("Mul", ["t", "wt"], ["a"]),
               nd("Add", ["a", "wt"], ["y"])],
              [vi("x", H, [64, 48])], [vi("y", H, [48, 64])], [WT])
    same_as_ort(m, {"x": X})
    m = small([nd("Mul", ["x", "w"], ["a"]), nd("Add", ["a", "w"], ["b"]),
               nd("Transpose", ["b"], ["t"]), nd("Mul", ["t", "wt"], ["c"]),
               nd("Add", ["c", "wt"], ["y"])],
              [vi("x", H, [64, 48])], [vi("y", H, [48, 64]), vi("t", H, [48, 64])], [W, WT])
    assert not same_as_ort(m, {"x": X})


def test_native_readers_split_the_chain():
    """Mul -> Add -> Reshape -> Transpose -> Mul -> Add: the two data-movement nodes feed each
    other, so neither is isolated and the result rounds at the Reshape, as in ORT."""
    shape = numpy_helper.from_array(np.array([48, 64], np.int64), "shape")
    m = small([nd("Mul", ["x", "w"], ["a"]), nd("Add", ["a", "w"], ["b"]),
               nd("Reshape", ["b", "shape"], ["r"]),
               nd("Transpose", ["r"], ["t"]),
               nd("Mul", ["t", "w"], ["c"]), nd("Add", ["c", "x"], ["y"])],
              [vi("x", H, [64, 48])], [vi("y", H, [64, 48])], [W, shape])
    assert not same_as_ort(m, {"x": X})


def test_the_models_own_casts_stay():
    """A float32 -> float16 -> float32 pair the model writes keeps its rounding (ORT 1.32
    removes only the Casts it inserts)."""
    xf = np.random.default_rng(6).uniform(-4, 4, (8, 8)).astype(np.float32)
    m = small([nd("Mul", ["x", "x"], ["a"]), nd("Cast", ["a"], ["h"], to=H),
               nd("Cast", ["h"], ["f"], to=F), nd("Add", ["f", "x"], ["y"])],
              [vi("x", F, [8, 8])], [vi("y", F, [8, 8])])
    assert same_as_ort(m, {"x": xf})


def test_layernorm_between_float32_nodes_runs_in_float32():
    """LayerNormalization has a float16 kernel, but between two nodes that run in float32 it
    is isolated and runs in float32 (its initializers do not count), as in ORT."""
    rng = np.random.default_rng(7)
    g = numpy_helper.from_array(rng.uniform(0.5, 1.5, 48).astype(np.float16), "g")
    bb = numpy_helper.from_array(rng.uniform(-0.5, 0.5, 48).astype(np.float16), "bb")
    m = small([nd("Add", ["x", "w"], ["a"]),
               nd("LayerNormalization", ["a", "g", "bb"], ["n"], axis=-1),
               nd("Mul", ["n", "w"], ["y"])],
              [vi("x", H, [64, 48])], [vi("y", H, [64, 48])], [W, g, bb])
    ref = ort_run(m, {"x": X})[0].astype(np.float32)
    got = opwarden.InferenceSession(m.SerializeToString()).run(None, {"x": X})[0]
    # LayerNormalization's float32 arithmetic differs from ORT's in the last bits: at most
    # one float16 step apart, where rounding its result too would be more
    step = np.spacing(np.abs(ref).astype(np.float16)).astype(np.float32)
    assert (np.abs(got.astype(np.float32) - ref) <= step).all()


def test_float16_layernorm_rounds_once_as_ort():
    """A float16 LayerNormalization (a graph output: ORT's float16 kernel runs it) computes
    scale and bias in float32 and rounds once; rounding the normalized value first, as the
    ONNX function body reads, puts a quarter of the values one float16 step off ORT's."""
    rng = np.random.default_rng(8)
    x = (rng.standard_normal((64, 64)) * 3).astype(np.float16)
    g = rng.uniform(0.5, 2, 64).astype(np.float16)
    b = rng.standard_normal(64).astype(np.float16)
    m = small([nd("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)],
              [vi("x", H, [64, 64]), vi("g", H, [64]), vi("b", H, [64])], [vi("y", H, [64, 64])])
    feeds = {"x": x, "g": g, "b": b}
    ref = ort_run(m, feeds)[0]
    got = opwarden.InferenceSession(m.SerializeToString()).run(None, feeds)[0]
    off = got != ref  # float32 arithmetic order: a few values on a rounding boundary
    assert off.sum() <= 0.01 * ref.size
    step = np.spacing(np.abs(ref)).astype(np.float32)
    assert (np.abs(got.astype(np.float32) - ref.astype(np.float32)) <= step).all()
