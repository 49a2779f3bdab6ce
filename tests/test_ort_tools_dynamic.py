"""Models written by onnxruntime.quantization, opwarden against onnxruntime:

- quantize_dynamic on a seeded float LSTM (DynamicQuantizeLSTM asserted present) and on a
  seeded MatMul model fused by ORT's optimizer into DynamicQuantizeMatMul;
- MatMulNBitsQuantizer (int4, block-wise) on a seeded float MLP (MatMulNBits asserted present).

ORT's dynamic quantization of the LSTM's recurrent state depends on its thread count (each
thread quantizes its block of batch rows), so the node-level checks pin both sides to the same
count and the model-level ones run both at their defaults.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import opwarden
from opwarden.ops.contrib_dynq import quantized_lstm
from tests import ort_int8

ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")
RNG = np.random.default_rng(11)


def _model(nodes, inputs, outputs, inits, opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    return m


def _init(name, a):
    return numpy_helper.from_array(np.asarray(a), name)


def _quantize_dynamic(model, tmp_path, name, **kw):
    """quantize_dynamic's model; weights in 7 bits (reduce_range) where ORT's u8 x s8 kernel
    saturates int16 pair sums (tests/ort_int8.py), so that its answer is the exact one."""
    src, dst = tmp_path / f"{name}.onnx", tmp_path / f"{name}_q.onnx"
    onnx.save(model, src)
    kw.setdefault("reduce_range", ort_int8.reduce_range())
    quantization.quantize_dynamic(str(src), str(dst), **kw)
    return onnx.load(str(dst))


def _ops(model):
    return {n.op_type for n in model.graph.node}


def _ort(model, threads=0, level=None):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.graph_optimization_level = level or ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def lstm_models(tmp_path_factory):
    """A two-layer bidirectional float LSTM (as PyTorch exports it: Y transposed and reshaped
    into the next layer) and its dynamically quantized copies (per tensor and per channel)."""
    tmp = tmp_path_factory.mktemp("lstm")
    I, H, D = 8, 16, 2
    nodes, inits, x = [], [_init("shape", np.array([0, 0, -1], np.int64))], "X"
    for layer in range(2):
        width = I if layer == 0 else D * H
        inits += [_init(f"W{layer}", RNG.standard_normal((D, 4 * H, width)).astype(np.float32)
                        * 0.3),
                  _init(f"R{layer}", RNG.standard_normal((D, 4 * H, H)).astype(np.float32) * 0.3),
                  _init(f"B{layer}", RNG.standard_normal((D, 8 * H)).astype(np.float32) * 0.1)]
        nodes += [helper.make_node("LSTM", [x, f"W{layer}", f"R{layer}", f"B{layer}"],
                                   [f"Y{layer}", f"Yh{layer}", f"Yc{layer}"], hidden_size=H,
                                   direction="bidirectional"),
                  helper.make_node("Transpose", [f"Y{layer}"], [f"T{layer}"], perm=[0, 2, 1, 3]),
                  helper.make_node("Reshape", [f"T{layer}", "shape"], [f"X{layer + 1}"])]
        x = f"X{layer + 1}"
    model = _model(nodes, [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["T", "B", I])],
                   [helper.make_tensor_value_info(x, TensorProto.FLOAT, None),
                    helper.make_tensor_value_info("Yh1", TensorProto.FLOAT, None)], inits, 14)
    return {pc: _quantize_dynamic(model, tmp, f"lstm{pc}", per_channel=pc) for pc in (False, True)}


@pytest.mark.parametrize("per_channel", [False, True])
def test_quantize_dynamic_lstm_matches_onnxruntime(lstm_models, per_channel):
    model = lstm_models[per_channel]
    assert "DynamicQuantizeLSTM" in _ops(model) and "LSTM" not in _ops(model)
    # Both at 2 threads: ORT's result depends on its thread count, and ours follows the BLAS
    # pool, which another session in this process may have resized.
    so = opwarden.SessionOptions(intra_op_num_threads=2)
    ours, theirs = opwarden.InferenceSession(model.SerializeToString(), so), _ort(model, 2)
    for T, B in ((5, 1), (7, 3), (6, 8), (4, 13)):  # B > 4: ORT splits the batch over threads
        X = RNG.standard_normal((T, B, 8)).astype(np.float32)
        for got, want in zip(ours.run(None, {"X": X}), theirs.run(None, {"X": X}), strict=True):
            assert got.shape == want.shape
            # Exact but for MLAS's sigmoid/tanh approximations (a few float32 ulps a step);
            # before matching ORT's per-thread quantization this was off by 1e-2 to 1e-1.
            np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
def test_dynamic_quantize_lstm_per_thread_blocks(lstm_models, threads):
    """The first layer's node on its own, at a pinned thread count, batch 2..9."""
    model = lstm_models[True]
    node = next(n for n in model.graph.node if n.op_type == "DynamicQuantizeLSTM")
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    attrs["direction"] = attrs["direction"].decode()
    one = _model([node], [helper.make_tensor_value_info(node.input[0], TensorProto.FLOAT, None)],
                 [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in node.output],
                 [i for i in model.graph.initializer if i.name in node.input])
    one.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    sess = _ort(one, threads)
    for B in (2, 5, 9):
        X = (RNG.standard_normal((6, B, 8)) * 2).astype(np.float32)
        want = sess.run(None, {node.input[0]: X})
        ins = [X] + [inits.get(n) if n else None for n in node.input[1:]]
        got = quantized_lstm(*ins, **attrs, threads=threads)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=0, atol=2e-6)


def test_dynamic_quantize_matmul_from_ort_optimizer_bit_exact(tmp_path):
    """quantize_dynamic writes DynamicQuantizeLinear + MatMulInteger; ORT's optimizer fuses them
    into DynamicQuantizeMatMul, which we run bit for bit as ORT does."""
    K, N = 24, 10
    w = RNG.standard_normal((K, N)).astype(np.float32)
    model = _model([helper.make_node("MatMul", ["A", "W"], ["M"]),
                    helper.make_node("Add", ["M", "bias"], ["Y"])],
                   [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["B", "S", K])],
                   [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
                   [_init("W", w), _init("bias", RNG.standard_normal(N).astype(np.float32))])
    q = _quantize_dynamic(model, tmp_path, "mm")
    assert "MatMulInteger" in _ops(q)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(tmp_path / "mm_fused.onnx")
    ort.InferenceSession(q.SerializeToString(), so, providers=["CPUExecutionProvider"])
    fused = onnx.load(str(tmp_path / "mm_fused.onnx"))
    assert "DynamicQuantizeMatMul" in _ops(fused)
    ours, theirs = opwarden.InferenceSession(fused.SerializeToString()), _ort(fused)
    for shape in ((1, 1, K), (2, 5, K), (3, 7, K)):
        A = (RNG.standard_normal(shape) * RNG.uniform(0.1, 4) + RNG.uniform(-1, 1)).astype(
            np.float32)
        np.testing.assert_array_equal(ours.run(None, {"A": A})[0], theirs.run(None, {"A": A})[0])


@pytest.mark.parametrize("accuracy_level", [None, 4])
def test_matmul_4bits_quantizer_mlp_matches_onnxruntime(accuracy_level):
    pytest.importorskip("onnx_ir")
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    K, H, N = 96, 64, 10  # K = 96 is not a multiple of the block size 64
    model = _model([helper.make_node("MatMul", ["X", "W1"], ["h"]),
                    helper.make_node("Add", ["h", "b1"], ["hb"]),
                    helper.make_node("Relu", ["hb"], ["r"]),
                    helper.make_node("MatMul", ["r", "W2"], ["Y"])],
                   [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["B", K])],
                   [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
                   [_init("W1", RNG.standard_normal((K, H)).astype(np.float32) * 0.2),
                    _init("b1", RNG.standard_normal(H).astype(np.float32) * 0.1),
                    _init("W2", RNG.standard_normal((H, N)).astype(np.float32) * 0.2)])
    quant = MatMulNBitsQuantizer(model, bits=4, block_size=64, is_symmetric=False,
                                 accuracy_level=accuracy_level)
    quant.process()
    q = quant.model.model
    assert [n.op_type for n in q.graph.node].count("MatMulNBits") == 2
    ours, theirs = opwarden.InferenceSession(q.SerializeToString()), _ort(q)
    for b in (1, 5):
        X = RNG.standard_normal((b, K)).astype(np.float32)
        got, want = ours.run(None, {"X": X})[0], theirs.run(None, {"X": X})[0]
        scale = float(np.abs(want).max())
        # Level 4 lets ORT quantize X to int8 per block; the float32 path is ORT's own math.
        tol = 1e-5 if accuracy_level is None else 1e-2
        assert float(np.abs(got - want).max()) <= tol * scale
