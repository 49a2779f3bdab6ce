"""Tiny models built with onnx.helper for --smoke: one per network family, no torch needed.

Each mirrors the op patterns of its family's real model at toy widths: a CNN with BatchNorm,
depthwise convolution, SiLU and squeeze-excite; a BERT-like encoder layer with an embedding
Gather, a padded attention mask, LayerNormalization and Erf-Gelu; a ViT patch embedding; a
decode step that concatenates a KV cache; a Conv1d audio front end. Weights are seeded and
He/Xavier-scaled; BatchNorm statistics are drawn to match the scale a He-scaled convolution
gives on unit inputs, so activations neither vanish nor saturate and outputs vary with the input.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from families.base import Case, Feeds, normal, padded_tokens, register

OPSET = 17


class Graph:
    """A minimal graph builder: `op()` adds a node and returns its output name."""

    def __init__(self, seed: int) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.rng = np.random.default_rng(seed)
        self.n = 0

    def name(self, stem: str) -> str:
        self.n += 1
        return f"{stem}_{self.n}"

    def const(self, value: np.ndarray, stem: str = "c") -> str:
        nm = self.name(stem)
        self.inits.append(numpy_helper.from_array(np.asarray(value), nm))
        return nm

    def weight(self, shape: tuple[int, ...], fan_in: int, gain: float = 1.0) -> str:
        w = self.rng.standard_normal(shape) * gain / np.sqrt(fan_in)
        return self.const(w.astype(np.float32), "w")

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, **attrs) -> str | list[str]:
        outs = [self.name(op_type.lower()) for _ in range(n_out)]
        # Unique node names: onnxconverter_common's float16 pass keys its inserted Casts on them.
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=outs[0], **attrs))
        return outs[0] if n_out == 1 else outs

    def model(self, inputs: list, outputs: list) -> bytes:
        g = helper.make_graph(self.nodes, "tiny", inputs, outputs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])
        m.ir_version = 8
        onnx.checker.check_model(m)
        return m.SerializeToString()

    # -- blocks -----------------------------------------------------------------------------
    def conv_bn(self, x: str, cin: int, cout: int, k: int, group: int = 1, act: str = "relu"):
        w = self.weight((cout, cin // group, k, k), cin // group * k * k, gain=np.sqrt(2.0))
        y = self.op("Conv", [x, w], pads=[k // 2] * 4, group=group)
        # Statistics of a He-scaled conv on unit inputs: mean ~0, variance ~2 per channel.
        mean = self.rng.normal(0, 0.1, cout).astype(np.float32)
        var = self.rng.uniform(1.5, 2.5, cout).astype(np.float32)
        gamma = self.rng.uniform(0.5, 1.5, cout).astype(np.float32)
        beta = self.rng.normal(0, 0.1, cout).astype(np.float32)
        y = self.op("BatchNormalization", [y, *(self.const(v) for v in (gamma, beta, mean, var))])
        if act == "relu":
            return self.op("Relu", [y])
        return self.op("Mul", [y, self.op("Sigmoid", [y])])  # SiLU, as timm exports it

    def squeeze_excite(self, x: str, c: int) -> str:
        s = self.op("GlobalAveragePool", [x])
        s = self.op("Conv", [s, self.weight((c // 2, c, 1, 1), c, np.sqrt(2.0))])
        s = self.op("Relu", [s])
        s = self.op("Conv", [s, self.weight((c, c // 2, 1, 1), c // 2)])
        return self.op("Mul", [x, self.op("HardSigmoid", [s])])

    def linear(self, x: str, din: int, dout: int) -> str:
        y = self.op("MatMul", [x, self.weight((din, dout), din)])
        return self.op("Add", [y, self.const(self.rng.normal(0, 0.02, dout).astype(np.float32))])

    def layer_norm(self, x: str, d: int) -> str:
        g = self.const(self.rng.uniform(0.8, 1.2, d).astype(np.float32))
        b = self.const(self.rng.normal(0, 0.05, d).astype(np.float32))
        return self.op("LayerNormalization", [x, g, b], axis=-1, epsilon=1e-5)

    def gelu(self, x: str) -> str:
        e = self.op("Erf", [self.op("Div", [x, self.const(np.float32(np.sqrt(2.0)))])])
        y = self.op("Mul", [x, self.op("Add", [e, self.const(np.float32(1.0))])])
        return self.op("Mul", [y, self.const(np.float32(0.5))])

    def heads(self, x: str, h: int, dh: int) -> str:
        y = self.op("Reshape", [x, self.const(np.array([0, 0, h, dh], np.int64))])
        return self.op("Transpose", [y], perm=[0, 2, 1, 3])

    def attention(self, q: str, k: str, v: str, d: int, h: int, bias: str | None) -> str:
        s = self.op("MatMul", [q, self.op("Transpose", [k], perm=[0, 1, 3, 2])])
        s = self.op("Div", [s, self.const(np.float32(np.sqrt(d // h)))])
        if bias is not None:
            s = self.op("Add", [s, bias])
        p = self.op("Softmax", [s], axis=-1)
        o = self.op("Transpose", [self.op("MatMul", [p, v])], perm=[0, 2, 1, 3])
        return self.op("Reshape", [o, self.const(np.array([0, 0, d], np.int64))])

    def encoder_layer(self, x: str, d: int, h: int, bias: str | None) -> str:
        """Post-LN BERT layer: attention + residual + LN, Gelu MLP + residual + LN."""
        q, k, v = (self.heads(self.linear(x, d, d), h, d // h) for _ in range(3))
        a = self.linear(self.attention(q, k, v, d, h, bias), d, d)
        x = self.layer_norm(self.op("Add", [x, a]), d)
        m = self.linear(self.gelu(self.linear(x, d, 4 * d)), 4 * d, d)
        return self.layer_norm(self.op("Add", [x, m]), d)

    def mask_bias(self, mask: str) -> str:
        """BERT's exporter pattern: (1 - mask[:, None, None, :]) * large negative."""
        m = self.op("Cast", [self.op("Unsqueeze", [mask, self.const(np.array([1, 2]))])], to=1)
        inv = self.op("Sub", [self.const(np.float32(1.0)), m])
        return self.op("Mul", [inv, self.const(np.float32(np.finfo(np.float32).min))])


def _vi(name: str, elem: int, shape: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


F32, I64 = TensorProto.FLOAT, TensorProto.INT64


def tiny_cnn(seed: int = 0) -> bytes:
    """Conv-BN-ReLU stem, a depthwise SiLU block with squeeze-excite and a residual, a pooled
    Gemm head: [B, 3, 16, 16] -> [B, 10]."""
    g = Graph(seed)
    x = g.conv_bn("image", 3, 8, 3)
    y = g.conv_bn(x, 8, 8, 3, group=8, act="silu")
    y = g.squeeze_excite(y, 8)
    y = g.conv_bn(y, 8, 8, 1)
    x = g.op("MaxPool", [g.op("Add", [x, y])], kernel_shape=[2, 2], strides=[2, 2])
    x = g.conv_bn(x, 8, 16, 3)
    x = g.op("Flatten", [g.op("GlobalAveragePool", [x])])
    w = g.weight((10, 16), 16)
    g.op("Gemm", [x, w, g.const(np.zeros(10, np.float32))], transB=1)
    g.nodes[-1].output[0] = "logits"
    return g.model([_vi("image", F32, ["B", 3, 16, 16])], [_vi("logits", F32, ["B", 10])])


def tiny_bert(seed: int = 0, vocab: int = 50, d: int = 32, h: int = 4, layers: int = 2) -> bytes:
    """Token + position embeddings, LayerNorm, `layers` post-LN encoder layers with a padded
    mask: (input_ids, attention_mask) [B, S] int64 -> [B, S, d]."""
    g = Graph(seed)
    tok = g.op("Gather", [g.const(g.rng.normal(0, 1, (vocab, d)).astype(np.float32)), "input_ids"])
    pos = g.const(g.rng.normal(0, 0.5, (1, 16, d)).astype(np.float32))
    shape = g.op("Shape", ["input_ids"])
    s = g.op("Slice", [shape, g.const(np.array([1])), g.const(np.array([2]))])
    pos = g.op("Slice", [pos, g.const(np.array([0])), s, g.const(np.array([1]))])
    x = g.layer_norm(g.op("Add", [tok, pos]), d)
    bias = g.mask_bias("attention_mask")
    for _ in range(layers):
        x = g.encoder_layer(x, d, h, bias)
    g.nodes[-1].output[0] = "hidden"
    ins = [_vi("input_ids", I64, ["B", "S"]), _vi("attention_mask", I64, ["B", "S"])]
    return g.model(ins, [_vi("hidden", F32, ["B", "S", d])])


def tiny_vit(seed: int = 0, d: int = 32, h: int = 4) -> bytes:
    """4x4 patch embedding Conv of a [B, 3, 16, 16] image, one pre-LN encoder layer, mean pool."""
    g = Graph(seed)
    p = g.op("Conv", ["image", g.weight((d, 3, 4, 4), 48)], strides=[4, 4])
    p = g.op("Reshape", [p, g.const(np.array([0, d, -1], np.int64))])
    x = g.op("Transpose", [p], perm=[0, 2, 1])
    x = g.op("Add", [x, g.const(g.rng.normal(0, 0.5, (1, 16, d)).astype(np.float32))])
    x = g.encoder_layer(g.layer_norm(x, d), d, h, None)
    g.op("ReduceMean", [x], axes=[1], keepdims=0)
    g.nodes[-1].output[0] = "pooled"
    return g.model([_vi("image", F32, ["B", 3, 16, 16])], [_vi("pooled", F32, ["B", d])])


def tiny_decode(seed: int = 0, d: int = 32, h: int = 4) -> bytes:
    """One GPT-style decode step: x [B, 1, d] and past_k/past_v [B, h, P, d/h] -> y and the
    presents [B, h, P+1, d/h] (Concat on the sequence axis)."""
    g = Graph(seed)
    x = g.layer_norm("x", d)
    q, k, v = (g.heads(g.linear(x, d, d), h, d // h) for _ in range(3))
    pk = g.op("Concat", ["past_k", k], axis=2)
    pv = g.op("Concat", ["past_v", v], axis=2)
    a = g.linear(g.attention(q, pk, pv, d, h, None), d, d)
    y = g.op("Add", ["x", a])
    m = g.linear(g.gelu(g.linear(g.layer_norm(y, d), d, 4 * d)), 4 * d, d)
    g.op("Add", [y, m])
    g.nodes[-1].output[0] = "y"
    g.nodes.append(helper.make_node("Identity", [pk], ["present_k"]))
    g.nodes.append(helper.make_node("Identity", [pv], ["present_v"]))
    kv = ["B", h, "P", d // h]
    ins = [_vi("x", F32, ["B", 1, d]), _vi("past_k", F32, kv), _vi("past_v", F32, kv)]
    pkv = ["B", h, "P1", d // h]
    outs = [_vi("y", F32, ["B", 1, d]), _vi("present_k", F32, pkv), _vi("present_v", F32, pkv)]
    return g.model(ins, outs)


def tiny_audio(seed: int = 0, d: int = 32, h: int = 4) -> bytes:
    """A wav2vec2-like front end: strided Conv1d + Gelu twice on [B, 1, 400] samples, then one
    encoder layer over the frames."""
    g = Graph(seed)
    x = g.gelu(g.op("Conv", ["audio", g.weight((d, 1, 10), 10)], strides=[5]))
    x = g.gelu(g.op("Conv", [x, g.weight((d, d, 4), 4 * d)], strides=[4]))
    x = g.layer_norm(g.op("Transpose", [x], perm=[0, 2, 1]), d)
    x = g.encoder_layer(x, d, h, None)
    g.nodes[-1].output[0] = "frames"
    return g.model([_vi("audio", F32, ["B", 1, 400])], [_vi("frames", F32, ["B", 19, d])])


# -- feeds -------------------------------------------------------------------------------------
def image_feeds(size: int, name: str = "image") -> Callable[[int, int], Feeds]:
    """Feeds of one [B, 3, size, size] image input: a blocky low-frequency pattern (an 8x8
    grid of N(0, 1) cells per channel) plus N(0, 0.5^2) pixel noise. White noise alone looks
    the same to every global-pooling network, so all images would get nearly equal outputs."""

    def feeds(b: int, seed: int) -> Feeds:
        cell = size // 8
        coarse = normal((b, 3, 8, 8), seed, name + "/coarse")
        x = np.kron(coarse, np.ones((1, 1, cell, cell), np.float32))
        return {name: (x + normal((b, 3, size, size), seed, name, 0.5)).astype(np.float32)}

    return feeds


def token_feeds(seq: int, vocab: int) -> Callable[[int, int], Feeds]:
    """(input_ids, attention_mask) with padded rows."""

    def feeds(b: int, seed: int) -> Feeds:
        ids, mask = padded_tokens(b, seq, vocab, seed)
        return {"input_ids": ids, "attention_mask": mask}

    return feeds


def _decode_feeds(b: int, seed: int) -> Feeds:
    return {"x": normal((b, 1, 32), seed, "x"), "past_k": normal((b, 4, 11, 8), seed, "k"),
            "past_v": normal((b, 4, 11, 8), seed, "v")}


def register_smoke() -> None:
    """The --smoke cases of the network families (the trees, quant and fp16 smoke cases are
    registered by their own modules)."""
    for name, family, build, feeds in [
        ("tiny_cnn", "cnn", tiny_cnn, image_feeds(16)),
        ("tiny_vit", "vit", tiny_vit, image_feeds(16)),
        ("tiny_bert", "bert", tiny_bert, token_feeds(16, 50)),
        ("tiny_decode", "decoder", tiny_decode, _decode_feeds),
        ("tiny_audio", "encoder", tiny_audio,
         lambda b, seed: {"audio": normal((b, 1, 400), seed, "audio")}),
    ]:
        register(Case(name, family, build, feeds, needs=("onnx",), smoke=True, cache=False,
                      batches=(2,), note="onnx.helper toy widths"))
