"""com.microsoft operators of ORT's tools against onnxruntime: every `opwarden check` sample of
QLinearWhere, NhwcMaxPool, QEmbedLayerNormalization, MatMulIntegerToFloat,
DynamicQuantizeMatMul/LSTM, FusedConv/FusedGemm (com.microsoft), QLinearConv (channels_last),
the legacy ops of contrib_legacy.py and the float contrib ops whose samples were added with
them; then models the tools wrote (QOperator Where, quantize_dynamic of
EmbedLayerNormalization, a saved ORT-optimized CNN)."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import opwarden as ow
from opwarden.errors import KernelError, OpwardenError
from opwarden.ops import REGISTRY
from opwarden.ops.contrib_dynq import quantized_lstm
from tests import ort_int8
from tests.ops.test_contrib import theirs

ort = pytest.importorskip("onnxruntime")
MS = "com.microsoft"

# Operators whose ORT kernel this package follows bit for bit.
EXACT = ("QLinearWhere", "NhwcMaxPool", "QEmbedLayerNormalization", "MatMulIntegerToFloat",
         "DynamicQuantizeMatMul", "QLinearConv", "Trilu", "Range", "ExpandDims", "GatherND",
         "Pad", "Unique", "MatMulInteger16")
# (BiasAdd has no ORT CPU kernel: tests/ops/test_contrib.py checks it against its formula.)
FLOAT = ("FusedConv", "FusedGemm", "QuickGelu", "BiasGelu", "FusedMatMul",
         "SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "Attention",
         "TransposeMatMul", "Inverse", "CDist", "GridSample")


# The int8 weight operands of the samples compared with ORT, halved where its u8 x s8 kernel
# saturates int16 pair sums (tests/ort_int8.py); `opwarden check` runs the samples as written.
INT8_WEIGHTS = {"MatMulIntegerToFloat": (1,), "DynamicQuantizeMatMul": (1,),
                "DynamicQuantizeLSTM": (1, 2)}


def _samples(op_type):
    opdef = REGISTRY.latest(op_type, MS)
    return opdef, list(opdef.samples_fn(np.random.default_rng(7)))


def _ort_exact(op_type, sample):
    """The sample with its int8 weights as ORT computes them exactly on this machine."""
    fit = INT8_WEIGHTS.get(op_type, ())
    return dataclasses.replace(sample, inputs=[ort_int8.fit_s8(x) if k in fit else x
                                               for k, x in enumerate(sample.inputs)])


def _ours(opdef, sample):
    sch = opdef.custom_schema
    kw = {k: a.default for k, a in sch.attrs.items() if a.has_default}
    kw.update(sample.attrs)
    args = list(sample.inputs)
    while args and args[-1] is None:
        args.pop()
    res = opdef.reference(*args, **kw)
    return list(res) if isinstance(res, (tuple, list)) else [res]


def _compare(op_type, exact):
    opdef, samples = _samples(op_type)
    compared = []
    for s in samples:
        s = _ort_exact(op_type, s)
        n_out = s.noutputs or 1
        try:
            ref = theirs(op_type, s.inputs, s.attrs, n_out=n_out)
        except Exception as e:  # noqa: BLE001 - ORT lacks a kernel for this dtype/shape
            if "NOT_IMPLEMENTED" in str(e) or "Could not find an implementation" in str(e):
                continue
            raise
        got = _ours(opdef, s)[:n_out]
        for k, (a, b) in enumerate(zip(got, ref)):
            what = f"{op_type} [{s.label}] output {k}"
            assert a.dtype == b.dtype and a.shape == b.shape, (what, a.dtype, a.shape,
                                                               b.dtype, b.shape)
            if exact:
                np.testing.assert_array_equal(a, b, err_msg=what)
            else:
                tol = 2e-3 if b.dtype == np.float16 else 2e-5
                np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64),
                                           rtol=tol, atol=tol, err_msg=what)
        compared.append(s.label)
    return compared, samples


@pytest.mark.parametrize("op_type", EXACT)
def test_samples_bit_exact_with_onnxruntime(op_type):
    compared, samples = _compare(op_type, exact=True)
    assert len(compared) == len(samples), set(s.label for s in samples) - set(compared)


@pytest.mark.parametrize("op_type", FLOAT)
def test_samples_match_onnxruntime(op_type):
    compared, samples = _compare(op_type, exact=False)
    # ORT has no CPU kernel for some dtypes (float64 / float16 of a few ops): most still run.
    assert len(compared) >= max(1, len(samples) // 2), (op_type, compared)


def test_dynamic_quantize_lstm_samples_match_onnxruntime():
    opdef, samples = _samples("DynamicQuantizeLSTM")
    for s in samples:
        if s.inputs[0].shape[1] == 0:
            continue  # ORT 1.32 aborts the process on an empty batch
        s = _ort_exact("DynamicQuantizeLSTM", s)
        kw = {"direction": "forward", **s.attrs}
        ref = theirs("DynamicQuantizeLSTM", s.inputs, s.attrs, n_out=3, threads=1)
        got = quantized_lstm(*s.inputs, **kw, threads=1)
        for a, b in zip(got, ref):
            assert a.shape == b.shape, s.label
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=s.label)


def test_shape_rules_agree_with_the_references():
    """Each new rule gives every sample's output shape (the check command's shape check)."""
    from opwarden.contract import TensorFact

    # Range, ExpandDims, Pad and Unique shapes depend on input values: no static rule.
    value_shaped = {"Range", "ExpandDims", "Pad", "Unique"}
    for op_type in (*EXACT, *FLOAT, "DynamicQuantizeLSTM"):
        opdef, samples = _samples(op_type)
        assert (opdef.infer_fn is None) == (op_type in value_shaped), op_type
        if opdef.infer_fn is None:
            continue
        for s in samples:
            facts = [None if x is None else TensorFact(x.dtype.name, x.shape)
                     for x in s.inputs]
            kw = {k: a.default for k, a in opdef.custom_schema.attrs.items() if a.has_default}
            kw.update(s.attrs)
            rule = opdef.infer_fn(*facts, **kw)
            rule = list(rule) if isinstance(rule, (tuple, list)) else [rule]
            for fact, out in zip(rule, _ours(opdef, s)[:s.noutputs or 1]):
                assert fact.shape == out.shape, (op_type, s.label, fact.shape, out.shape)
                assert np.dtype(fact.dtype) == out.dtype, (op_type, s.label)


def _q(rng, dt, *shape):
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max + 1, size=shape).astype(dt)


def test_qlinear_where_refuses_bad_inputs():
    rng = np.random.default_rng(0)
    cond = np.array([True, False])
    x, y = _q(rng, np.uint8, 2), _q(rng, np.uint8, 2)
    s, z = np.float32(0.1), np.uint8(3)
    opdef = REGISTRY.latest("QLinearWhere", MS)
    with pytest.raises(KernelError, match="Y has type int8"):
        opdef.reference(cond, x, s, z, y.view(np.int8), s, z, s, z)
    with pytest.raises(KernelError, match="condition must be bool"):
        opdef.reference(cond.astype(np.uint8), x, s, z, y, s, z, s, z)
    with pytest.raises(KernelError, match="do not broadcast"):
        opdef.reference(cond, x, s, z, _q(rng, np.uint8, 3), s, z, s, z)
    with pytest.raises(KernelError, match="z_scale must be a scalar"):
        opdef.reference(cond, x, s, z, y, s, z, np.ones(2, np.float32), z)


def test_fused_ms_and_qembed_refuse_bad_inputs():
    rng = np.random.default_rng(0)
    conv = REGISTRY.latest("FusedConv", MS)
    x, w = np.ones((1, 2, 4, 4), np.float32), np.ones((3, 2, 3, 3), np.float32)
    with pytest.raises(KernelError, match=r"Clip needs activation_params \[min, max\]"):
        conv.reference(x, w, activation="Clip", activation_params=[0.0])
    with pytest.raises(KernelError, match="Z has shape"):
        conv.reference(x, w, None, np.ones((1, 3, 4, 4), np.float32))
    qe = REGISTRY.latest("QEmbedLayerNormalization", MS)
    opdef, samples = _samples("QEmbedLayerNormalization")
    args = list(samples[0].inputs)
    args[0] = np.full_like(args[0], 99)
    with pytest.raises(KernelError, match="word_embedding index out of range"):
        qe.reference(*args)
    mm = REGISTRY.latest("MatMulIntegerToFloat", MS)
    a, b = _q(rng, np.uint8, 2, 4), _q(rng, np.int8, 4, 3)
    with pytest.raises(KernelError, match="b_scale must be a scalar or a 1-D tensor"):
        mm.reference(a, b, np.float32(0.1), np.ones(2, np.float32))
    with pytest.raises(KernelError, match="int8 A needs an int8 B"):
        mm.reference(a.view(np.int8), b.view(np.uint8), np.float32(0.1), np.float32(0.1))


# --------------------------------------------------------------------------------------------
# Models written by ORT's tools


def _ort_session(model, level=None):
    so = ort.SessionOptions()
    so.graph_optimization_level = level or ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    data = model if isinstance(model, (bytes, str)) else model.SerializeToString()
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def _ops(path):
    return {(n.op_type, n.domain or "") for n in onnx.load(path).graph.node}


class _Reader:
    def __init__(self, feeds):
        self.it = iter(feeds)

    def get_next(self):
        return next(self.it, None)


def test_qoperator_where_model_matches_onnxruntime(tmp_path):
    """quantize_static (QOperator) of Add -> Where writes QLinearAdd and QLinearWhere."""
    from onnxruntime import quantization as q

    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Add", ["a", "b"], ["s"]),
             helper.make_node("Greater", ["a", "zero"], ["c"]),
             helper.make_node("Where", ["c", "s", "b"], ["y"])]
    g = helper.make_graph(
        nodes, "where",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 16]) for n in ("a", "b")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])],
        [numpy_helper.from_array(np.zeros(1, np.float32), "zero")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    src, dst = str(tmp_path / "w.onnx"), str(tmp_path / "wq.onnx")
    onnx.save(m, src)
    calib = [{"a": rng.standard_normal((2, 16)).astype(np.float32),
              "b": rng.standard_normal((2, 16)).astype(np.float32)} for _ in range(8)]
    q.quantize_static(src, dst, _Reader(calib), quant_format=q.QuantFormat.QOperator,
                      extra_options={"ForceQuantizeNoInputCheck": True})
    assert ("QLinearWhere", MS) in _ops(dst), _ops(dst)
    for seed in range(3):
        feeds = {k: v * (1 + seed) for k, v in calib[seed].items()}
        want = _ort_session(dst).run(None, feeds)[0]
        got = ow.InferenceSession(dst).run(None, feeds)[0]
        np.testing.assert_array_equal(got, want)


def test_quantize_dynamic_embed_layer_norm_matches_onnxruntime(tmp_path):
    """quantize_dynamic writes QEmbedLayerNormalization for an EmbedLayerNormalization."""
    from onnxruntime import quantization as q

    rng = np.random.default_rng(4)
    H, V, P = 16, 30, 12

    def w(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.5).astype(np.float32),
                                       name)

    node = helper.make_node("EmbedLayerNormalization",
                            ["ids", "seg", "we", "pe", "se", "gamma", "beta", "mask"],
                            ["y", "mi"], domain=MS, epsilon=1e-12)
    g = helper.make_graph(
        [node], "embed",
        [helper.make_tensor_value_info(n, TensorProto.INT32, ["b", "s"])
         for n in ("ids", "seg", "mask")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("mi", TensorProto.INT32, None)],
        [w("we", V, H), w("pe", P, H), w("se", 2, H), w("gamma", H), w("beta", H)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14),
                                            helper.make_opsetid(MS, 1)])
    m.ir_version = 8
    src, dst = str(tmp_path / "e.onnx"), str(tmp_path / "eq.onnx")
    onnx.save(m, src)
    q.quantize_dynamic(src, dst)
    assert ("QEmbedLayerNormalization", MS) in _ops(dst), _ops(dst)
    for b, s in ((1, 1), (2, 7), (3, P)):
        feeds = {"ids": rng.integers(0, V, (b, s)).astype(np.int32),
                 "seg": rng.integers(0, 2, (b, s)).astype(np.int32),
                 "mask": (rng.random((b, s)) < 0.8).astype(np.int32)}
        want = _ort_session(dst).run(None, feeds)
        got = ow.InferenceSession(dst).run(None, feeds)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


def test_saved_ort_optimized_cnn_matches_onnxruntime(tmp_path):
    """A model ORT saved after its extended optimizations holds com.microsoft FusedConv (with a
    residual Z and Relu) and FusedGemm."""
    rng = np.random.default_rng(5)

    def w(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32),
                                       name)

    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("LeakyRelu", ["c1"], ["r1"], alpha=0.2),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "r1"], ["a2"]),
             helper.make_node("Relu", ["a2"], ["r2"]),
             helper.make_node("Flatten", ["r2"], ["f"]),
             helper.make_node("Gemm", ["f", "wg", "bg"], ["g"], transB=1),
             helper.make_node("Sigmoid", ["g"], ["y"])]
    g = helper.make_graph(
        nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w("w1", 4, 4, 3, 3), w("b1", 4), w("w2", 4, 4, 3, 3), w("b2", 4), w("wg", 5, 144),
         w("bg", 5)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    saved = str(tmp_path / "cnn_opt.onnx")
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = saved
    ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    ops = _ops(saved)
    assert ("FusedConv", MS) in ops and ("FusedGemm", MS) in ops, ops
    for n in (1, 3):
        x = rng.standard_normal((n, 4, 6, 6)).astype(np.float32)
        want = _ort_session(saved).run(None, {"x": x})[0]
        got = ow.InferenceSession(saved).run(None, {"x": x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_unknown_fused_activation_is_refused_with_the_node_named(tmp_path):
    node = helper.make_node("FusedGemm", ["a", "b"], ["y"], domain=MS, activation="Swish",
                            name="gemm0")
    g = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [3, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13),
                                            helper.make_opsetid(MS, 1)])
    m.ir_version = 8
    with pytest.raises(OpwardenError, match="Swish"):
        sess = ow.InferenceSession(m.SerializeToString())
        sess.run(None, {"a": np.ones((2, 3), np.float32), "b": np.ones((3, 2), np.float32)})
