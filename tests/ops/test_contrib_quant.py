"""The quantized com.microsoft operators against onnxruntime, bit for bit.

Every declared sample of each operator (broadcasting, scalar scales, zero-size dims,
saturation, every 8-bit value, per-channel / per-column parameters, NHWC) runs as a one-node
model in onnxruntime and through our reference kernel; the outputs must be identical. The
binary ops are also checked on all 65536 input pairs for random scales and zero points.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from opwarden.dtypes import onnx_type
from opwarden.errors import KernelError
from opwarden.ops import REGISTRY

ort = pytest.importorskip("onnxruntime")
MS = "com.microsoft"
OPS = ["QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearSoftmax",
       "QLinearConcat", "QLinearAveragePool", "QLinearGlobalAveragePool", "QGemm", "QLinearConv",
       "QuantizeLinear", "DequantizeLinear"]
_SMALL_INTS = (np.dtype(ml_dtypes.int4), np.dtype(ml_dtypes.uint4))


def _session(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21),
                                            helper.make_opsetid(MS, 1)])
    m.ir_version = 10
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def ort_node(op_type, inputs, attrs):
    """onnxruntime's output of one com.microsoft node (None inputs omitted)."""
    names = [f"i{k}" if x is not None else "" for k, x in enumerate(inputs)]
    node = helper.make_node(op_type, names, ["y"], domain=MS, **attrs)
    vi = [helper.make_tensor_value_info(n, onnx_type(x.dtype), x.shape)
          for n, x in zip(names, inputs) if x is not None]
    sess = _session([node], vi, [onnx.ValueInfoProto(name="y")])
    return sess.run(None, {n: x for n, x in zip(names, inputs) if x is not None})[0]


def ours(op_type, inputs, attrs):
    o = REGISTRY.latest(op_type, MS)
    kw = {n: a.default for n, a in o.custom_schema.attrs.items() if a.has_default}
    return o.reference(*inputs, **{**kw, **attrs})


def _ort_can_take(op_type, inputs, attrs) -> bool:
    """Samples outside what onnxruntime's Python API or kernels accept."""
    if any(x is not None and x.dtype in _SMALL_INTS for x in inputs):
        return False  # int4 feeds: see test_int4_round_trip
    if op_type in ("QLinearAdd", "QLinearMul") and inputs[-1] is None:
        return False  # ORT's type inference needs C_zero_point
    return True


def _cases():
    for op_type in OPS:
        o = REGISTRY.latest(op_type, MS)
        for smp in o.samples_fn(np.random.default_rng(5)):
            inputs = [None if x is None else np.asarray(x) for x in smp.inputs]
            if _ort_can_take(op_type, inputs, smp.attrs):
                yield pytest.param(op_type, inputs, smp.attrs, id=f"{op_type}-{smp.label}")


@pytest.mark.parametrize(("op_type", "inputs", "attrs"), list(_cases()))
def test_matches_onnxruntime_exactly(op_type, inputs, attrs):
    got = ours(op_type, inputs, attrs)
    want = ort_node(op_type, inputs, attrs)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op_type", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_binary_every_pair(op_type, dtype):
    info = np.iinfo(dtype)
    vals = np.arange(info.min, info.max + 1).astype(dtype)
    a, b = np.repeat(vals, 256), np.tile(vals, 256)
    rng = np.random.default_rng(3)
    for _ in range(4):
        sa, sb, sc = rng.uniform(0.002, 0.2, 3).astype(np.float32)
        za, zb, zc = (np.asarray(rng.integers(info.min, info.max + 1), dtype) for _ in range(3))
        ins = [a, np.asarray(sa), za, b, np.asarray(sb), zb, np.asarray(sc), zc]
        np.testing.assert_array_equal(ours(op_type, ins, {}), ort_node(op_type, ins, {}))
        # The innermost span broadcast on either side (ORT's operand order changes then).
        ins = [a[:256].reshape(16, 16)[:, :1], *ins[1:3], b[:256].reshape(1, 256)[:, :16],
               *ins[4:]]
        np.testing.assert_array_equal(ours(op_type, ins, {}), ort_node(op_type, ins, {}))


@pytest.mark.parametrize("dtype", [ml_dtypes.int4, ml_dtypes.uint4])
def test_int4_round_trip(dtype):
    """QuantizeLinear -> DequantizeLinear (com.microsoft) to int4/uint4, read back as float."""
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((3, 8)) * 5).astype(np.float32)
    zp = np.asarray(1 if dtype == ml_dtypes.int4 else 7, dtype)
    scale = np.asarray(0.7, np.float32)
    inits = [numpy_helper.from_array(scale, "s"), helper.make_tensor(
        "z", onnx_type(np.dtype(dtype)), [], [int(zp.astype(np.int8))])]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], domain=MS),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], domain=MS)]
    sess = _session(nodes, [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x.shape)],
                    [onnx.ValueInfoProto(name="y")], inits)
    want = sess.run(None, {"x": x})[0]
    q = ours("QuantizeLinear", [x, scale, zp], {})
    assert q.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(ours("DequantizeLinear", [q, scale, zp], {}), want)


def test_float16_dequantize_keeps_scale_type():
    y = ours("DequantizeLinear", [np.arange(-3, 3, dtype=np.int16), np.asarray(0.5, np.float16)],
             {})
    assert y.dtype == np.float16 and y.tolist() == [-1.5, -1.0, -0.5, 0.0, 0.5, 1.0]


@pytest.mark.parametrize(("op_type", "inputs", "match"), [
    ("QLinearAdd", [np.zeros(3, np.uint8), np.ones(2, np.float32), np.uint8(0),
                    np.zeros(3, np.uint8), np.float32(1), np.uint8(0), np.float32(1),
                    np.uint8(0)], "A_scale must be a scalar"),
    ("QLinearMul", [np.zeros(3, np.uint8), np.float32(1), np.uint8(0), np.zeros(3, np.int8),
                    np.float32(1), np.int8(0), np.float32(1), np.uint8(0)], "B has type int8"),
    ("QLinearAdd", [np.zeros(3, np.uint8), np.float32(1), np.uint8(0), np.zeros(4, np.uint8),
                    np.float32(1), np.uint8(0), np.float32(1), np.uint8(0)], "do not broadcast"),
    ("QGemm", [np.zeros((2, 3), np.uint8), np.float32(1), np.uint8(0), np.zeros((4, 5), np.int8),
               np.float32(1), np.int8(0)], "inner dimensions differ"),
    ("QGemm", [np.zeros((2, 3), np.uint8), np.float32(1), np.uint8(0), np.zeros((3, 5), np.int8),
               np.float32(1), np.zeros(4, np.int8)], "b_zero_point must be a scalar or have 5"),
    ("QLinearGlobalAveragePool", [np.zeros((2, 3), np.uint8), np.float32(1), np.uint8(0),
                                  np.float32(1), np.uint8(0)], r"\(N, C, \*spatial\)"),
])
def test_bad_inputs_raise_clear_errors(op_type, inputs, match):
    with pytest.raises(KernelError, match=match):
        ours(op_type, [np.asarray(x) for x in inputs], {})


def test_softmax_needs_opset_and_concat_needs_triples():
    x = np.zeros((2, 3), np.uint8)
    with pytest.raises(KernelError, match="opset"):
        ours("QLinearSoftmax", [x, np.float32(1), None, np.float32(1 / 256), np.uint8(0)],
             {"opset": None})
    with pytest.raises(KernelError, match="triples"):
        ours("QLinearConcat", [np.float32(1), np.uint8(0), x, np.float32(1)], {"axis": 0})


def test_fast_variants_agree_with_reference_on_large_k():
    """The BLAS variants take float64 beyond K = 258; results stay exact."""
    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, (5, 1000)).astype(np.uint8)
    b = rng.integers(-128, 128, (1000, 7)).astype(np.int8)
    args = [a, np.float32(0.01), np.uint8(255), b, np.float32(0.01), np.int8(-128), None,
            np.float32(30.0), np.uint8(3)]
    args = [None if v is None else np.asarray(v) for v in args]
    o = REGISTRY.latest("QGemm", MS)
    fast = next(v for v in o.variants if v.name == "qgemm.cpu.blas")
    np.testing.assert_array_equal(fast.fn(*args), o.reference(*args))


@pytest.mark.parametrize("x_scale", [0.0, -0.5, float("nan")])
def test_softmax_rejects_non_positive_x_scale(x_scale):
    """ORT refuses x_scale <= 0 or NaN at run time; so does the reference, naming the input."""
    x = np.zeros((2, 3), np.int8)
    with pytest.raises(KernelError, match="X_scale must be positive"):
        ours("QLinearSoftmax", [x, np.float32(x_scale), None, np.float32(1 / 256), np.int8(0)],
             {"opset": 13})


def test_softmax_with_the_gpt_decoder_parameters():
    """The quantizer's parameters of the masked attention softmax in gpt_decoder_op13_qop
    (x_scale = inf from a -inf mask, y = 1/256 and -128): every int8 input, rows of 1 to 4."""
    from pathlib import Path

    path = Path(__file__).parents[1] / "data" / "real" / "gpt_decoder_op13_qop.onnx"
    if not path.exists():
        pytest.skip("model not present")
    model = onnx.load(str(path))
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    nodes = [n for n in model.graph.node if n.op_type == "QLinearSoftmax"]
    assert nodes
    for node in nodes:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        xs, _, ys, yz = (inits[name] for name in node.input[1:5])
        for d in (1, 2, 4):
            x = np.arange(-128, 128, dtype=np.int8).reshape(-1, 1, 1, d)
            for scale in (xs, np.float32(0.05)):
                ins = [x, np.asarray(scale), None, ys, yz]
                np.testing.assert_array_equal(ours("QLinearSoftmax", ins, attrs),
                                              ort_node("QLinearSoftmax", ins, attrs))
