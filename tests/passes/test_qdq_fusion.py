"""qdq_fusion: QDQ groups around Conv/MatMul/Gemm become QLinearConv/QLinearMatMul/QGemm where
ONNX Runtime's CPU optimizer fuses them, with ORT's numerics.

The models are small seeded float models quantized by onnxruntime.quantization (quantize_static
in QDQ format, quantize_dynamic). A chain of only fusable groups (and Q/DQ pairs ORT drops
exactly) must equal ORT bit for bit; whole models (Add, Softmax, LayerNormalization, pools,
which ORT turns into its own QLinear* contrib kernels) agree within the quantized tolerance.
Each test checks what the pass rewrote, and that with the pass disabled the answer is the same.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import opwarden
from opwarden.kernels.cpu import quant_native
from tests import ort_int8

# the compiled integer GEMM variants run the fused nodes where they are registered (VNNI, AVX2)
COMPILED_GEMM = quant_native.isa() in quant_native.FAST_ISAS

ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")

F32 = np.float32
# The zoo's tolerance for quantized models, relative to the output's scale, and never below
# 1.5x ORT's own gap between all optimizations and none (benchmarks/families/runner.py: a
# float difference before a QuantizeLinear moves a value by a whole step, and ORT's QLinear*
# contrib kernels, its QLinearSoftmax's table among them, round differently from the chain).
QTOL = 1e-2
GAP_SLACK = 1.5


def _init(name, rng, *shape, scale=0.3):
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(F32), name)


def _model(nodes, x_shape, y_name, y_shape, inits, opset=17) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info(y_name, TensorProto.FLOAT, y_shape)],
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _chain() -> onnx.ModelProto:
    """Only groups ORT fuses, and Q/DQ pairs around MaxPool/Flatten it drops exactly."""
    rng = np.random.default_rng(5)
    n = helper.make_node
    nodes = [n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]), n("Relu", ["c1"], ["r1"]),
             n("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
             n("Relu", ["c2"], ["r2"]),
             n("MaxPool", ["r2"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             n("Conv", ["p", "w3", "b3"], ["c3"], pads=[1, 1, 1, 1], group=16),
             n("Relu", ["c3"], ["r3"]), n("Conv", ["r3", "w4", "b4"], ["c4"], group=4),
             n("Flatten", ["c4"], ["f"]), n("Gemm", ["f", "wf", "bf"], ["y"], transB=1)]
    inits = [_init("w1", rng, 16, 3, 3, 3), _init("b1", rng, 16),
             _init("w2", rng, 16, 16, 3, 3, scale=0.1), _init("b2", rng, 16),
             _init("w3", rng, 16, 1, 3, 3), _init("b3", rng, 16),
             _init("w4", rng, 8, 4, 1, 1), _init("b4", rng, 8),
             _init("wf", rng, 10, 8 * 4 * 4, scale=0.05), _init("bf", rng, 10)]
    return _model(nodes, [2, 3, 16, 16], "y", [2, 10], inits)


def _cnn() -> onnx.ModelProto:
    rng = np.random.default_rng(7)
    n = helper.make_node
    nodes = [n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]), n("Relu", ["c1"], ["r1"]),
             n("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             n("Add", ["c2", "r1"], ["a1"]), n("Relu", ["a1"], ["r2"]),
             n("MaxPool", ["r2"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             n("Conv", ["p1", "w3", "b3"], ["c3"]), n("GlobalAveragePool", ["c3"], ["gap"]),
             n("Flatten", ["gap"], ["flat"]), n("Gemm", ["flat", "wf", "bf"], ["y"], transB=1)]
    inits = [_init("w1", rng, 8, 3, 3, 3), _init("b1", rng, 8), _init("w2", rng, 8, 8, 3, 3),
             _init("b2", rng, 8), _init("w3", rng, 16, 8, 1, 1), _init("b3", rng, 16),
             _init("wf", rng, 10, 16), _init("bf", rng, 10)]
    return _model(nodes, [1, 3, 16, 16], "y", [1, 10], inits)


def _bert() -> onnx.ModelProto:
    rng = np.random.default_rng(11)
    n = helper.make_node
    h = 32
    nodes = [
        n("MatMul", ["x", "wq"], ["q0"]), n("Add", ["q0", "bq"], ["q"]),
        n("MatMul", ["x", "wk"], ["k0"]), n("Add", ["k0", "bk"], ["k"]),
        n("MatMul", ["x", "wv"], ["v0"]), n("Add", ["v0", "bv"], ["v"]),
        n("Transpose", ["k"], ["kt"], perm=[0, 2, 1]), n("MatMul", ["q", "kt"], ["s"]),
        n("Mul", ["s", "scale"], ["ss"]), n("Softmax", ["ss"], ["p"], axis=-1),
        n("MatMul", ["p", "v"], ["ctx"]), n("Add", ["ctx", "x"], ["res"]),
        n("LayerNormalization", ["res", "g", "beta"], ["ln"], axis=-1),
        n("MatMul", ["ln", "wo"], ["o0"]), n("Add", ["o0", "bo"], ["y"]),
    ]
    inits = [_init(nm, rng, h, h) for nm in ("wq", "wk", "wv", "wo")]
    inits += [_init(nm, rng, h, scale=0.1) for nm in ("bq", "bk", "bv", "bo", "beta")]
    inits += [numpy_helper.from_array(np.asarray(0.2, F32), "scale"),
              numpy_helper.from_array(np.ones(h, F32), "g")]
    return _model(nodes, [2, 8, h], "y", [2, 8, h], inits)


class _Reader(quantization.CalibrationDataReader):
    def __init__(self, shape, seed):
        rng = np.random.default_rng(seed)
        self._feeds = iter([{"x": rng.standard_normal(shape).astype(F32)} for _ in range(6)])

    def get_next(self):
        return next(self._feeds, None)


MODELS = {"chain": (_chain, (2, 3, 16, 16)), "cnn": (_cnn, (1, 3, 16, 16)),
          "bert": (_bert, (2, 8, 32))}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Each model quantized once: (name, activation type) -> path; ("bert", "dyn"). Weights
    in 7 bits (reduce_range) where ORT's u8 x s8 kernel saturates int16 pair sums
    (tests/ort_int8.py): its answer is then the exact one the bit-exact checks compare with."""
    rr = ort_int8.reduce_range()
    root = tmp_path_factory.mktemp("qdq")
    out = {}
    for name, (build, shape) in MODELS.items():
        src = root / f"{name}.onnx"
        onnx.save(build(), src)
        for act, qt in (("u8", quantization.QuantType.QUInt8),
                        ("s8", quantization.QuantType.QInt8)):
            dst = root / f"{name}_{act}.onnx"
            quantization.quantize_static(
                str(src), str(dst), _Reader(shape, 3), quant_format=quantization.QuantFormat.QDQ,
                activation_type=qt, weight_type=quantization.QuantType.QInt8,
                per_channel=name != "bert", reduce_range=rr)
            out[(name, act)] = dst
    dst = root / "bert_dyn.onnx"
    quantization.quantize_dynamic(str(root / "bert.onnx"), str(dst),
                                  weight_type=quantization.QuantType.QInt8, reduce_range=rr)
    out[("bert", "dyn")] = dst
    return out


def _ort(path, optimize=True):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _ort_fused(data_or_path, tmp_path) -> dict[str, int]:
    """The QLinearConv/QLinearMatMul/QGemm/DynamicQuantizeMatMul/QLinearAdd counts of ORT's
    own optimized graph."""
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "ort_optimized.onnx")
    so.log_severity_level = 3
    src = data_or_path if isinstance(data_or_path, bytes) else str(data_or_path)
    ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
    nodes = onnx.load(so.optimized_model_filepath).graph.node
    ops = [n.op_type for n in nodes]
    got = {t: ops.count(t) for t in ("QLinearConv", "QLinearMatMul", "QGemm",
                                     "DynamicQuantizeMatMul", "QLinearAdd") if t in ops}
    # a MaxPool whose DequantizeLinear/QuantizeLinear pair ORT dropped reads 8 bits
    made = {o: n.op_type for n in nodes for o in n.output}
    pools = sum(n.op_type in ("MaxPool", "NhwcMaxPool")
                and made.get(n.input[0]) != "DequantizeLinear" for n in nodes)
    return {**got, "MaxPool": pools} if pools else got


def _ours(path, disabled=()):
    return opwarden.InferenceSession(str(path), opwarden.SessionOptions(
        disabled_passes=list(disabled)))


def _fused(sess) -> dict[str, int]:
    e = next(e for e in sess.pass_report if e["pass"] == "qdq_fusion")
    return dict(e["details"])


def _feeds(name, n=3):
    rng = np.random.default_rng(42)
    return [{"x": rng.standard_normal(MODELS[name][1]).astype(F32)} for _ in range(n)]


def _close(got, want, gap=0.0):
    """got agrees with ORT's `want` (`gap`: ORT's own distance between its levels)."""
    scale = float(np.abs(want).max())
    err = float(np.abs(got.astype(np.float64) - want).max())
    tol = max(QTOL * scale + 1e-5, GAP_SLACK * gap)
    assert err <= tol, f"max err {err:.3g}, scale {scale:.3g}, ORT's own gap {gap:.3g}"


def _gap(other, feed, want) -> float:
    return float(np.abs(other.run(None, feed)[0].astype(np.float64) - want).max())


def test_fusable_chain_is_bit_exact_with_onnxruntime(models, tmp_path):
    path = models[("chain", "u8")]
    ours, plain, theirs = _ours(path), _ours(path, ["qdq_fusion"]), _ort(path)
    assert _fused(ours) == {"QLinearConv": 4, "QGemm": 1, "MaxPool": 1} == _ort_fused(
        path, tmp_path)
    assert "QLinearConv" not in {n.op_type for n in plain.model.graph.nodes}
    variants = {p.variant.name for p in ours.placements if p.node.op_type in ("QLinearConv",
                                                                              "QGemm")}
    # the compiled integer GEMM where the extension is built (a grouped conv stays on im2col),
    # else the float-BLAS one
    assert variants == ({"qlinearconv.cpu.native_u8s8", "qlinearconv.cpu.im2col",
                         "qgemm.cpu.native_u8s8"} if COMPILED_GEMM
                        else {"qlinearconv.cpu.im2col", "qgemm.cpu.blas"})
    for feed in _feeds("chain"):
        (want,) = theirs.run(None, feed)
        (got,) = ours.run(None, feed)
        assert got.dtype == want.dtype and np.array_equal(got, want)
        _close(plain.run(None, feed)[0], want)


@pytest.mark.parametrize("name,expect", [("cnn", {"QLinearConv": 3, "QGemm": 1,
                                                   "QLinearAdd": 1, "MaxPool": 1}),
                                         ("bert", {"QLinearMatMul": 6, "QLinearAdd": 5})])
def test_quantized_models_match_onnxruntime(models, name, expect, tmp_path):
    path = models[(name, "u8")]
    ours, plain, theirs = _ours(path), _ours(path, ["qdq_fusion"]), _ort(path)
    unopt = _ort(path, optimize=False)
    assert _fused(ours) == expect == _ort_fused(path, tmp_path)
    for feed in _feeds(name):
        (want,) = theirs.run(None, feed)
        (got,) = ours.run(None, feed)
        assert got.shape == want.shape and got.dtype == want.dtype
        gap = _gap(unopt, feed, want)
        _close(got, want, gap)
        _close(plain.run(None, feed)[0], want, gap)


@pytest.mark.parametrize("name", ["chain", "cnn", "bert"])
def test_int8_activations_fuse_where_the_integer_gemm_is_signed(models, name, tmp_path):
    """int8-activation groups fuse where the integer GEMM runs (VNNI, AVX2), and stay float
    elsewhere (a Gemm of int8 A and B fuses everywhere, into QGemm, as in ORT). ORT 1.32
    fuses int8 groups on VNNI too, but not every one (in the cnn model only the 1x1 Conv;
    none on AVX2): where its graph is ours the answer is ORT's bit for bit, else within the
    quantized tolerance."""
    path = models[(name, "s8")]
    ours, theirs, unopt = _ours(path), _ort(path), _ort(path, optimize=False)
    fused, ort_fused = _fused(ours), _ort_fused(path, tmp_path)
    if quant_native.isa() in quant_native.FAST_ISAS:
        assert fused.get("QLinearConv", 0) + fused.get("QLinearMatMul", 0) > 0
        assert ours.run(None, _feeds(name, 1)[0])[0].dtype == np.float32
    else:
        assert "QLinearConv" not in fused and "QLinearMatMul" not in fused
    for feed in _feeds(name, 2):
        (want,) = theirs.run(None, feed)
        got = ours.run(None, feed)[0]
        if ort_fused == fused and name == "chain":
            assert np.array_equal(got, want)  # the same integer arithmetic, as for uint8
        _close(got, want, _gap(unopt, feed, want))


def test_dynamic_quantized_bert_matches_onnxruntime(models, tmp_path):
    path = models[("bert", "dyn")]
    ours, theirs, unopt = _ours(path), _ort(path), _ort(path, optimize=False)
    chain = _ours(path, ["dynamic_quantize_matmul_fusion"])
    e = next(e for e in ours.pass_report if e["pass"] == "dynamic_quantize_matmul_fusion")
    assert dict(e["details"]) == {"DynamicQuantizeMatMul": 4}
    # ORT fuses the projection whose DynamicQuantizeLinear has one reader (the others become
    # its MatMulIntegerToFloat: the same arithmetic on the shared quantized input)
    assert _ort_fused(path, tmp_path) == {"DynamicQuantizeMatMul": 1}
    names = {p.node.op_type: p.variant.name for p in ours.placements}
    assert names["DynamicQuantizeMatMul"] == ("dynamicquantizematmul.cpu.native_u8s8"
                                              if COMPILED_GEMM else
                                              "dynamicquantizematmul.cpu.blas")
    assert "DynamicQuantizeLinear" not in names and "MatMulInteger" not in names
    names = {p.node.op_type: p.variant.name for p in chain.placements}
    assert names["MatMulInteger"] == ("matmulinteger.cpu.native_u8s8" if COMPILED_GEMM
                                      else "matmulinteger.cpu.blas")
    assert names["DynamicQuantizeLinear"] == "dynamicquantizelinear.cpu.f32"
    assert not ours.model.graph.removed.keys() - chain.model.graph.removed.keys()
    for feed in _feeds("bert"):
        (want,) = theirs.run(None, feed)
        (got,) = ours.run(None, feed)
        _close(got, want, _gap(unopt, feed, want))
        # the fused node computes the chain's arithmetic: bit for bit
        assert np.array_equal(got, chain.run(None, feed)[0])


def test_fused_node_carries_its_model_nodes(models):
    ours = _ours(models[("chain", "u8")])
    conv = next(n for n in ours.model.graph.nodes if n.op_type == "QLinearConv")
    assert conv.name.startswith("Conv_")
    kinds = {o.rsplit("_", 1)[-1] if "Linear" in o else "op" for o in conv.origin}
    assert kinds == {"DequantizeLinear", "QuantizeLinear", "op"}
    removed = ours.model.graph.removed
    assert not any(o in removed for o in conv.origin)


# ---------------------------------------------------------------------------------------------
# Hand-built groups: which ones fuse


def _qdq_conv(act=None, zp=0, clip=(0.0, 6.0), extra_reader=False) -> bytes:
    """x -> Q -> DQ -> Conv(DQ(w)) [-> act] -> Q(zp) -> DQ -> y."""
    rng = np.random.default_rng(1)
    n = helper.make_node
    c = lambda nm, a: numpy_helper.from_array(np.asarray(a), nm)  # noqa: E731
    # the weight halved where ORT's int8 products saturate (tests/ort_int8.py)
    w = ort_int8.fit_s8(rng.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8))
    inits = [c("xs", F32(0.05)), c("xz", np.uint8(128)), c("w", w), c("ws", np.full(4, 0.01, F32)),
        c("wz", np.zeros(4, np.int8)), c("ys", F32(0.02)), c("yz", np.uint8(zp)),
        c("lo", F32(clip[0])), c("hi", F32(clip[1]))]
    nodes = [n("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             n("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             n("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             n("Conv", ["xd", "wd"], ["cv"], pads=[1, 1, 1, 1])]
    last = "cv"
    if act == "Relu":
        nodes.append(n("Relu", ["cv"], ["a"]))
        last = "a"
    elif act == "Clip":
        nodes.append(n("Clip", ["cv", "lo", "hi"], ["a"]))
        last = "a"
    nodes += [n("QuantizeLinear", [last, "ys", "yz"], ["yq"]),
              n("DequantizeLinear", ["yq", "ys", "yz"], ["y0"])]
    outs = [helper.make_tensor_value_info("y0", TensorProto.FLOAT, [1, 4, 6, 6])]
    if extra_reader:
        nodes.append(n("Neg", ["cv"], ["y1"]))
        outs.append(helper.make_tensor_value_info("y1", TensorProto.FLOAT, [1, 4, 6, 6]))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 3, 6, 6])], outs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


@pytest.mark.parametrize("kw,fuses", [
    ({}, True),
    ({"act": "Relu", "zp": 0}, True),  # the zero point at uint8's minimum: Relu is redundant
    ({"act": "Relu", "zp": 10}, False),
    ({"act": "Clip", "zp": 0, "clip": (0.0, 6.0)}, True),  # 6 / 0.02 + 0 > 255
    ({"act": "Clip", "zp": 0, "clip": (0.0, 1.0)}, False),  # Clip cuts inside the range
    ({"extra_reader": True}, False),  # the Conv's output has another reader
])
def test_which_groups_fuse(kw, fuses, tmp_path):
    data = _qdq_conv(**kw)
    assert ("QLinearConv" in _ort_fused(data, tmp_path)) == fuses  # ORT decides alike
    ours = opwarden.InferenceSession(data)
    plain = opwarden.InferenceSession(data, opwarden.SessionOptions(
        disabled_passes=["qdq_fusion"]))
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    types = [nd.op_type for nd in ours.model.graph.nodes]
    assert ("QLinearConv" in types) == fuses
    if fuses and kw.get("act"):
        assert kw["act"] not in types
    feed = {"x": np.random.default_rng(2).standard_normal((1, 3, 6, 6)).astype(F32) * 3}
    for g, p, w in zip(ours.run(None, feed), plain.run(None, feed), theirs.run(None, feed),
                       strict=True):
        assert np.array_equal(g, w) if fuses else True
        _close(g, w)
        _close(p, w)


def _qdq_maxpool(zp_out=128, scale_out=0.05, signed=False, opset=17, pads=(1, 1, 1, 1)) -> bytes:
    """x -> Q -> DQ -> MaxPool -> Q(scale_out, zp_out) -> DQ -> y."""
    n = helper.make_node
    c = lambda nm, a: numpy_helper.from_array(np.asarray(a), nm)  # noqa: E731
    zt = np.int8 if signed else np.uint8
    inits = [c("s", F32(0.05)), c("z", zt(0 if signed else 128)), c("s2", F32(scale_out)),
             c("z2", zt(0 if signed else zp_out))]
    nodes = [n("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             n("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             n("MaxPool", ["xd"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=list(pads)),
             n("QuantizeLinear", ["p", "s2", "z2"], ["pq"]),
             n("DequantizeLinear", ["pq", "s2", "z2"], ["y"])]
    side = 5 if pads[0] else 4
    m = _model(nodes, [1, 4, 9, 9], "y", [1, 4, side, side], inits, opset=opset)
    return m.SerializeToString()


@pytest.mark.parametrize("kw,fuses", [
    ({}, True), ({"signed": True}, True), ({"pads": (0, 0, 0, 0)}, True),
    ({"zp_out": 100}, False), ({"scale_out": 0.1}, False),  # other parameters: a requantize
    ({"opset": 11}, False),  # no 8-bit MaxPool before opset 12
])
def test_maxpool_between_equal_qdq_runs_on_8_bits(kw, fuses):
    data = _qdq_maxpool(**kw)
    ours = opwarden.InferenceSession(data)
    pools = [p for p in ours.placements if p.node.op_type == "MaxPool"]
    assert len(pools) == 1
    assert (pools[0].node.inputs[0].fact.dtype in ("uint8", "int8")) == fuses
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    plain = opwarden.InferenceSession(data, opwarden.SessionOptions(optimization_level=0))
    x = np.random.default_rng(4).standard_normal((1, 4, 9, 9)).astype(F32) * 4
    x[0, 0, :3, :3] = [[-100, 100, np.nan], [0, -0.0, 1e9], [-1e9, 6.3, -6.4]]
    got = ours.run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, plain.run(None, {"x": x})[0])  # exact, not close
    np.testing.assert_array_equal(got, theirs.run(None, {"x": x})[0])
