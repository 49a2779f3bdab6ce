"""Models made by ONNX Runtime's own tools, run here and in ORT.

A tiny seeded BERT exported with torch and fused by onnxruntime.transformers.optimizer
(EmbedLayerNormalization, Attention, SkipLayerNormalization, BiasGelu, FastGelu), and a GPT-style
decoder built the way ORT's LLM model builder writes one (SimplifiedLayerNormalization,
GroupQueryAttention with rotary and a KV cache, SkipSimplifiedLayerNormalization), run for a
prompt step and then decode steps that feed the present cache back. Both compared with ORT at
the light zoo's tolerance (tests/test_zoo.py).
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import opwarden as ow

ort = pytest.importorskip("onnxruntime")

HIDDEN, HEADS, VOCAB, POSITIONS, INNER = 32, 4, 50, 16, 64


def _zoo_close(ours, theirs, what):
    """max|ours - ort| <= 1e-3 * max|ort| + 1e-5 (the light zoo's tolerance)."""
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, what
    err = float(np.abs(ours.astype(np.float64) - theirs).max())
    tol = 1e-3 * float(np.abs(theirs).max()) + 1e-5
    assert err <= tol, f"{what}: max|ours-ort| = {err:.3g} > {tol:.3g}"


def _ort(path_or_bytes):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(path_or_bytes, so, providers=["CPUExecutionProvider"])


# --------------------------------------------------------------------------------------------
# optimizer-fused BERT


def _torch_bert():
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class Layer(nn.Module):
        def __init__(self, approximate):
            super().__init__()
            self.q, self.k, self.v, self.o = (nn.Linear(HIDDEN, HIDDEN) for _ in range(4))
            self.ln1, self.ln2 = nn.LayerNorm(HIDDEN, eps=1e-12), nn.LayerNorm(HIDDEN, eps=1e-12)
            self.f1, self.f2 = nn.Linear(HIDDEN, INNER), nn.Linear(INNER, HIDDEN)
            self.approximate = approximate

        def heads(self, x):
            b, t, _ = x.size()
            return x.view(b, t, HEADS, HIDDEN // HEADS).permute(0, 2, 1, 3)

        def forward(self, x, ext):
            q, k, v = self.heads(self.q(x)), self.heads(self.k(x)), self.heads(self.v(x))
            s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(HIDDEN // HEADS) + ext
            c = torch.matmul(torch.softmax(s, dim=-1), v).permute(0, 2, 1, 3).contiguous()
            x = self.ln1(self.o(c.view(c.size(0), c.size(1), HIDDEN)) + x)
            h = nn.functional.gelu(self.f1(x), approximate=self.approximate)
            return self.ln2(self.f2(h) + x)

    class Bert(nn.Module):
        def __init__(self):
            super().__init__()
            self.we, self.pe = nn.Embedding(VOCAB, HIDDEN), nn.Embedding(POSITIONS, HIDDEN)
            self.te, self.ln = nn.Embedding(2, HIDDEN), nn.LayerNorm(HIDDEN, eps=1e-12)
            # erf GELU fuses to BiasGelu, the tanh form to FastGelu
            self.layers = nn.ModuleList([Layer("none"), Layer("tanh")])
            self.register_buffer("position_ids", torch.arange(POSITIONS).expand((1, -1)))

        def forward(self, input_ids, attention_mask, token_type_ids):
            pos = self.position_ids[:, : input_ids.size(1)]
            x = self.ln(self.we(input_ids) + self.te(token_type_ids) + self.pe(pos))
            ext = (1.0 - attention_mask[:, None, None, :].to(torch.float32)) * -10000.0
            for layer in self.layers:
                x = layer(x, ext)
            return x

    torch.manual_seed(0)
    return torch, Bert().eval()


@pytest.fixture(scope="module")
def fused_bert(tmp_path_factory):
    """(unfused path, fused path) of the tiny BERT."""
    import warnings

    from onnxruntime.transformers.optimizer import optimize_model

    torch, model = _torch_bert()
    d = tmp_path_factory.mktemp("bert")
    raw, fused = str(d / "bert.onnx"), str(d / "bert_fused.onnx")
    names = ["input_ids", "attention_mask", "token_type_ids"]
    args = (torch.randint(0, VOCAB, (2, 7)), torch.ones(2, 7, dtype=torch.long),
            torch.zeros(2, 7, dtype=torch.long))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, raw, input_names=names, output_names=["out"],
                          dynamic_axes={n: {0: "b", 1: "s"} for n in names}, opset_version=14,
                          dynamo=False)
    opt = optimize_model(raw, model_type="bert", num_heads=HEADS, hidden_size=HIDDEN)
    opt.save_model_to_file(fused)
    return raw, fused


def test_optimizer_fused_the_bert(fused_bert):
    ops = Counter(n.op_type for n in onnx.load(fused_bert[1]).graph.node)
    for fused_op in ("EmbedLayerNormalization", "Attention", "SkipLayerNormalization",
                     "BiasGelu", "FastGelu"):
        assert ops[fused_op] >= 1, (fused_op, ops)
    # nothing of the unfused attention or layer norm is left
    assert ops["Softmax"] == 0 and ops["LayerNormalization"] == 0, ops


@pytest.mark.parametrize("batch, seq, pad", [(1, 1, None), (3, 9, "right"), (2, 16, "none")])
def test_fused_bert_matches_onnxruntime(fused_bert, batch, seq, pad):
    rng = np.random.default_rng(seq)
    ids = rng.integers(0, VOCAB, (batch, seq)).astype(np.int64)
    tt = rng.integers(0, 2, (batch, seq)).astype(np.int64)
    mask = np.ones((batch, seq), np.int64)
    if pad == "right":
        mask[1, 6:] = 0
        mask[2, 2:] = 0
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": tt}
    raw, fused = fused_bert
    theirs = _ort(fused).run(None, feeds)[0]
    ours = ow.InferenceSession(fused).run(None, feeds)[0]
    _zoo_close(ours, theirs, "fused BERT")
    # and the fused model still computes the exported one
    _zoo_close(ours, _ort(raw).run(None, feeds)[0], "fused BERT vs unfused ORT")


# --------------------------------------------------------------------------------------------
# GPT-style decoder step with GroupQueryAttention


D_HEADS, D_KV, D_HEAD = 4, 2, 16
D_HIDDEN = D_HEADS * D_HEAD
D_LAYERS, D_MAX = 2, 32


def _decoder_model() -> onnx.ModelProto:
    """A model-builder-shaped decoder: input_ids, attention_mask and per-layer past KV in;
    logits and present KV out. seqlens_k and total_sequence_length come from the mask."""
    rng = np.random.default_rng(7)
    inits, nodes = [], []

    def w(name, *shape, s=0.2):
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * s).astype(np.float32),
                                             name))
        return name

    def node(op, ins, outs, domain="", **attrs):
        nodes.append(helper.make_node(op, ins, outs, domain=domain, **attrs))
        return outs[0]

    inv = 1.0 / 10000 ** (np.arange(0, D_HEAD, 2) / D_HEAD)
    ang = np.arange(D_MAX)[:, None] * inv[None, :]
    inits += [numpy_helper.from_array(np.cos(ang).astype(np.float32), "cos_cache"),
              numpy_helper.from_array(np.sin(ang).astype(np.float32), "sin_cache"),
              numpy_helper.from_array(np.array([1], np.int64), "axis1"),
              numpy_helper.from_array(np.array(1, np.int64), "one")]
    node("ReduceSum", ["attention_mask", "axis1"], ["mask_sum"], keepdims=0)
    node("Sub", ["mask_sum", "one"], ["seqlens_k64"])
    node("Cast", ["seqlens_k64"], ["seqlens_k"], to=TensorProto.INT32)
    node("Shape", ["attention_mask"], ["mask_shape"])
    node("Gather", ["mask_shape", "one"], ["total64"], axis=0)
    node("Cast", ["total64"], ["total_seq"], to=TensorProto.INT32)
    x = node("Gather", [w("embed", VOCAB, D_HIDDEN, s=1.0), "input_ids"], ["h0"])
    ms = "com.microsoft"
    norm = node("SimplifiedLayerNormalization", [x, w("ln0", D_HIDDEN)], ["n0"], axis=-1,
                epsilon=1e-6)
    skip = x
    for i in range(D_LAYERS):
        q = node("MatMul", [norm, w(f"wq{i}", D_HIDDEN, D_HIDDEN)], [f"q{i}"])
        k = node("MatMul", [norm, w(f"wk{i}", D_HIDDEN, D_KV * D_HEAD)], [f"k{i}"])
        v = node("MatMul", [norm, w(f"wv{i}", D_HIDDEN, D_KV * D_HEAD)], [f"v{i}"])
        a = node("GroupQueryAttention",
                 [q, k, v, f"past_key_{i}", f"past_value_{i}", "seqlens_k", "total_seq",
                  "cos_cache", "sin_cache"],
                 [f"a{i}", f"present_key_{i}", f"present_value_{i}"], domain=ms,
                 num_heads=D_HEADS, kv_num_heads=D_KV, do_rotary=1)
        o = node("MatMul", [a, w(f"wo{i}", D_HIDDEN, D_HIDDEN)], [f"o{i}"])
        norm2, skip = f"n2_{i}", f"res{i}"
        node("SkipSimplifiedLayerNormalization", [o, x if i == 0 else f"res_mlp{i - 1}",
                                                  w(f"ln2_{i}", D_HIDDEN)],
             [norm2, "", "", skip], domain=ms, epsilon=1e-6)
        up = node("MatMul", [norm2, w(f"wu{i}", D_HIDDEN, 2 * D_HIDDEN)], [f"u{i}"])
        act = node("QuickGelu", [up], [f"g{i}"], domain=ms, alpha=1.702)
        down = node("MatMul", [act, w(f"wd{i}", 2 * D_HIDDEN, D_HIDDEN)], [f"d{i}"])
        node("Add", [down, skip], [f"res_mlp{i}"])
        norm = node("SimplifiedLayerNormalization", [f"res_mlp{i}", w(f"ln{i + 1}", D_HIDDEN)],
                    [f"n{i + 1}"], axis=-1, epsilon=1e-6)
    node("MatMul", [norm, w("lm_head", D_HIDDEN, VOCAB)], ["logits"])

    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    kv = ["batch", D_KV, "past", D_HEAD]
    inputs = [helper.make_tensor_value_info("input_ids", i64, ["batch", "seq"]),
              helper.make_tensor_value_info("attention_mask", i64, ["batch", "total"])]
    outputs = [helper.make_tensor_value_info("logits", f32, ["batch", "seq", VOCAB])]
    for i in range(D_LAYERS):
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_{kind}_{i}", f32, kv))
            outputs.append(helper.make_tensor_value_info(f"present_{kind}_{i}", f32,
                                                         ["batch", D_KV, "total", D_HEAD]))
    g = helper.make_graph(nodes, "decoder", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m


@pytest.fixture(scope="module")
def decoder():
    return _decoder_model().SerializeToString()


def test_decoder_prompt_then_decode_steps_match_onnxruntime(decoder):
    ops = Counter(n.op_type for n in onnx.load_from_string(decoder).graph.node)
    assert ops["GroupQueryAttention"] == D_LAYERS and ops["SimplifiedLayerNormalization"]
    theirs_s, ours_s = _ort(decoder), ow.InferenceSession(decoder)
    rng = np.random.default_rng(3)
    prompt = rng.integers(0, VOCAB, (1, 5)).astype(np.int64)
    empty = np.zeros((1, D_KV, 0, D_HEAD), np.float32)
    feeds = {"input_ids": prompt, "attention_mask": np.ones((1, 5), np.int64)}
    for i in range(D_LAYERS):
        feeds[f"past_key_{i}"] = feeds[f"past_value_{i}"] = empty
    names = [o.name for o in onnx.load_from_string(decoder).graph.output]
    for step in range(4):  # the prompt, then three tokens, each feeding back the cache
        theirs = theirs_s.run(None, feeds)
        ours = ours_s.run(None, feeds)
        for name, a, b in zip(names, ours, theirs):
            _zoo_close(a, b, f"step {step} {name}")
        total = feeds["attention_mask"].shape[1] + 1
        nxt = np.argmax(theirs[0][:, -1], axis=-1)[:, None].astype(np.int64)
        feeds = {"input_ids": nxt, "attention_mask": np.ones((1, total), np.int64)}
        for i in range(D_LAYERS):
            feeds[f"past_key_{i}"] = theirs[1 + 2 * i]
            feeds[f"past_value_{i}"] = theirs[2 + 2 * i]
