"""Models quantized by onnxruntime.quantization (QOperator and QDQ formats) run here as in ORT.

Two small seeded float models, a CNN (Conv/Relu/Add/MaxPool/LeakyRelu/AveragePool/Sigmoid/
Concat/GlobalAveragePool/Gemm) and a BERT-like block (MatMul/Add/Transpose/Softmax), are
built with onnx.helper, quantized with quantize_static and a calibration reader, and compared
with onnxruntime within the zoo's tolerance for quantized models. Each test first asserts that
the quantizer emitted the operators it targets, so it cannot pass by testing float graphs.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import opwarden
from tests import ort_int8

ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")


def _init(name, rng, *shape, scale=0.3):
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def _cnn() -> onnx.ModelProto:
    rng = np.random.default_rng(7)
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        n("Relu", ["c1"], ["r1"]),
        n("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        n("Add", ["c2", "r1"], ["a1"]),
        n("MaxPool", ["a1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        n("Conv", ["p1", "w3", "b3"], ["c3"]),
        n("LeakyRelu", ["c3"], ["l3"], alpha=0.1),
        n("AveragePool", ["l3"], ["ap"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
          strides=[2, 2], count_include_pad=0),
        n("Conv", ["p1", "w4", "b4"], ["c4"], strides=[2, 2]),
        n("Sigmoid", ["c4"], ["s4"]),
        n("Mul", ["s4", "c4"], ["m4"]),
        n("Concat", ["ap", "m4"], ["cat"], axis=1),
        n("GlobalAveragePool", ["cat"], ["gap"]),
        n("Flatten", ["gap"], ["flat"]),
        n("Gemm", ["flat", "wf", "bf"], ["y"], transB=1),
    ]
    inits = [_init("w1", rng, 8, 3, 3, 3), _init("b1", rng, 8), _init("w2", rng, 8, 8, 3, 3),
             _init("b2", rng, 8), _init("w3", rng, 8, 8, 1, 1), _init("b3", rng, 8),
             _init("w4", rng, 8, 8, 1, 1), _init("b4", rng, 8), _init("wf", rng, 10, 16),
             _init("bf", rng, 10)]
    g = helper.make_graph(nodes, "cnn",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _bert() -> onnx.ModelProto:
    rng = np.random.default_rng(11)
    n = helper.make_node
    h = 16
    nodes = [
        n("MatMul", ["x", "wq"], ["q0"]), n("Add", ["q0", "bq"], ["q"]),
        n("MatMul", ["x", "wk"], ["k0"]), n("Add", ["k0", "bk"], ["k"]),
        n("MatMul", ["x", "wv"], ["v0"]), n("Add", ["v0", "bv"], ["v"]),
        n("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        n("MatMul", ["q", "kt"], ["s"]),
        n("Mul", ["s", "scale"], ["ss"]),
        n("Softmax", ["ss"], ["p"], axis=-1),
        n("MatMul", ["p", "v"], ["ctx"]),
        n("Add", ["ctx", "x"], ["res"]),
        n("MatMul", ["res", "wo"], ["o0"]), n("Add", ["o0", "bo"], ["y"]),
    ]
    inits = [_init(nm, rng, h, h) for nm in ("wq", "wk", "wv", "wo")]
    inits += [_init(nm, rng, h, scale=0.1) for nm in ("bq", "bk", "bv", "bo")]
    inits.append(numpy_helper.from_array(np.asarray(0.25, np.float32), "scale"))
    g = helper.make_graph(nodes, "bert",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, h])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, h])],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


class _Reader(quantization.CalibrationDataReader):
    def __init__(self, shape, seed):
        rng = np.random.default_rng(seed)
        self._feeds = iter([{"x": rng.standard_normal(shape).astype(np.float32)}
                            for _ in range(8)])

    def get_next(self):
        return next(self._feeds, None)


MODELS = {"cnn": (_cnn, (1, 3, 16, 16)), "bert": (_bert, (2, 8, 16))}
FORMATS = {"qop": quantization.QuantFormat.QOperator, "qdq": quantization.QuantFormat.QDQ}
# The QLinear operators each quantized model must contain (QDQ graphs: Q/DQ pairs).
EXPECTED = {
    ("cnn", "qop"): {"QLinearConv", "QLinearAdd", "QLinearLeakyRelu", "QLinearAveragePool",
                     "QLinearSigmoid", "QLinearMul", "QLinearConcat", "QLinearGlobalAveragePool",
                     "QGemm"},
    ("bert", "qop"): {"QLinearMatMul", "QLinearAdd", "QLinearSoftmax", "QLinearMul"},
    ("cnn", "qdq"): {"QuantizeLinear", "DequantizeLinear"},
    ("bert", "qdq"): {"QuantizeLinear", "DequantizeLinear"},
}


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """Every (model, format) quantized once per module: name -> model path. Weights in 7 bits
    (reduce_range) where ORT's u8 x s8 kernel saturates int16 pair sums (tests/ort_int8.py)."""
    root = tmp_path_factory.mktemp("quantized")
    out = {}
    for mname, (build, shape) in MODELS.items():
        src = root / f"{mname}.onnx"
        onnx.save(build(), src)
        for fname, fmt in FORMATS.items():
            dst = root / f"{mname}_{fname}.onnx"
            quantization.quantize_static(
                str(src), str(dst), _Reader(shape, 3), quant_format=fmt,
                activation_type=quantization.QuantType.QUInt8,
                weight_type=quantization.QuantType.QInt8, per_channel=(mname == "cnn"),
                reduce_range=ort_int8.reduce_range())
            out[(mname, fname)] = dst
    return out


@pytest.mark.parametrize("key", sorted(EXPECTED))
def test_quantized_model_matches_ort(quantized, key):
    path = quantized[key]
    model = onnx.load(str(path))
    emitted = {node.op_type for node in model.graph.node}
    missing = EXPECTED[key] - emitted
    assert not missing, f"the quantizer did not emit {sorted(missing)} (got {sorted(emitted)})"
    shape = MODELS[key[0]][1]
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    theirs_sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    ours_sess = opwarden.InferenceSession(str(path))
    rng = np.random.default_rng(42)
    for _ in range(3):
        feed = {"x": rng.standard_normal(shape).astype(np.float32)}
        (want,) = theirs_sess.run(None, feed)
        (got,) = ours_sess.run(None, feed)
        assert got.shape == want.shape and got.dtype == want.dtype
        scale = float(np.abs(want).max())
        err = float(np.abs(got.astype(np.float64) - want).max())
        assert err <= 1e-2 * scale + 1e-5, f"{key}: max err {err:.3g}, scale {scale:.3g}"
