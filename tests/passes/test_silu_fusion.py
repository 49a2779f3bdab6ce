"""SiLU in the Conv/Gemm/MatMul epilogue (passes/match.silu_chain, fusion._with_act): Sigmoid(y)
and Mul(y, Sigmoid(y)) in either operand order, ONNX Swish-24 and com.microsoft QuickGelu
become the activation "Swish" [alpha]; lookalikes (the Sigmoid or y read elsewhere, a Mul of
something else, a float64 chain into a Gemm's other dtype) stay as they are. Each fused graph
agrees with the unfused one (optimization level 0) and with onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import opwarden as ow
from tests.passes.helpers import check_same, model, optimized, types_of

ort = pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(11)
W = (RNG.standard_normal((8, 4, 3, 3)) * 0.4).astype(np.float32)
B = RNG.standard_normal(8).astype(np.float32)
X = (RNG.standard_normal((1, 4, 6, 6)) * 2).astype(np.float32)


def _conv(out="c"):
    return helper.make_node("Conv", ["x", "w", "b"], [out], pads=[1, 1, 1, 1], name="conv")


def _silu(y="c", out="y", order=0, s="s"):
    mul_in = [y, s] if order == 0 else [s, y]
    return [helper.make_node("Sigmoid", [y], [s], name=f"sig_{s}"),
            helper.make_node("Mul", mul_in, [out], name=f"mul_{s}")]


def _conv_model(nodes, outputs=(("y", None),)) -> bytes:
    return model(nodes, [("x", [1, 4, 6, 6])], list(outputs), [("w", W), ("b", B)])


def _fused(m):
    return [(n.op_type, str(n.attrs.get("activation", "")),
             [float(v) for v in n.attrs.get("activation_params") or ()])
            for n in m.graph.nodes if n.domain == "opwarden"]


def _against_ort(data: bytes, feeds: dict) -> None:
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ow.InferenceSession(data).run(None, feeds)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("order", [0, 1])
def test_conv_silu_fuses_either_mul_order(order):
    data = _conv_model([_conv(), *_silu(order=order)])
    m, report = optimized(data)
    assert types_of(m) == ["FusedConv"]
    assert _fused(m) == [("FusedConv", "Swish", [1.0])]
    fusion = next(e for e in report if e["pass"] == "conv_fusion")
    assert fusion["details"].get("Conv+Sigmoid+Mul") == 1
    check_same(data, {"x": X})
    _against_ort(data, {"x": X})


def test_conv_residual_then_silu_fuses():
    nodes = [_conv(), helper.make_node("Add", ["c", "z"], ["a"]), *_silu(y="a")]
    data = model(nodes, [("x", [1, 4, 6, 6]), ("z", [1, 8, 6, 6])], [("y", None)],
                 [("w", W), ("b", B)])
    m, _ = optimized(data)
    assert types_of(m) == ["FusedConv"] and len(m.graph.nodes[0].inputs) == 4
    feeds = {"x": X, "z": RNG.standard_normal((1, 8, 6, 6)).astype(np.float32)}
    check_same(data, feeds)
    _against_ort(data, feeds)


def test_silu_output_read_twice_still_fuses():
    # The Mul's result may have any readers: EfficientNet's SiLU feeds the SE pool and the
    # SE multiply.
    nodes = [_conv(), *_silu(), helper.make_node("Relu", ["y"], ["r"])]
    data = _conv_model(nodes, [("y", None), ("r", None)])
    m, _ = optimized(data)
    assert _fused(m) == [("FusedConv", "Swish", [1.0])]
    check_same(data, {"x": X})


@pytest.mark.parametrize("spoil", ["sigmoid_read_elsewhere", "sigmoid_is_output",
                                   "y_read_by_third", "y_is_output", "mul_other",
                                   "mul_of_sigmoid_squared"])
def test_silu_lookalikes_stay_unfused(spoil):
    outputs = [("y", None)]
    nodes = [_conv(), *_silu()]
    inits = [("w", W), ("b", B)]
    if spoil == "sigmoid_read_elsewhere":
        nodes.append(helper.make_node("Neg", ["s"], ["n"]))
        outputs.append(("n", None))
    elif spoil == "sigmoid_is_output":
        outputs.append(("s", None))
    elif spoil == "y_read_by_third":
        nodes.append(helper.make_node("Neg", ["c"], ["n"]))
        outputs.append(("n", None))
    elif spoil == "y_is_output":
        outputs.append(("c", None))
    elif spoil == "mul_other":  # Sigmoid(c) * k: a gate, not SiLU
        nodes[2] = helper.make_node("Mul", ["k", "s"], ["y"], name="mul_s")
        inits.append(("k", RNG.standard_normal((1, 8, 6, 6)).astype(np.float32)))
    else:  # Sigmoid(c)^2: c's only reader is the Sigmoid, which fuses as Sigmoid
        nodes[2] = helper.make_node("Mul", ["s", "s"], ["y"], name="mul_s")
    data = model(nodes, [("x", [1, 4, 6, 6])], outputs, inits)
    m, _ = optimized(data)
    assert all(act != "Swish" for _, act, _ in _fused(m)), _fused(m)
    check_same(data, {"x": X})


def test_float64_chain_needs_matching_mul_dtype():
    # float64 conv and SiLU: fused (FLOAT dtypes), the reference computing as the nodes do
    w, b = W.astype(np.float64), B.astype(np.float64)
    g = helper.make_graph(
        [_conv(), *_silu()], "g",
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [1, 4, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    mp = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    mp.ir_version = 8
    data = mp.SerializeToString()
    m, _ = optimized(data)
    assert _fused(m) == [("FusedConv", "Swish", [1.0])]
    x = X.astype(np.float64)
    want = ow.InferenceSession(data, ow.SessionOptions(optimization_level=0)).run(None, {"x": x})
    got = ow.InferenceSession(data).run(None, {"x": x})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("order", [0, 1])
def test_matmul_bias_silu_and_gemm_silu(order):
    a = RNG.standard_normal((5, 6)).astype(np.float32)
    wm = RNG.standard_normal((6, 7)).astype(np.float32)
    bm = RNG.standard_normal(7).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["a", "wm"], ["p"]),
             helper.make_node("Add", ["p", "bm"], ["q"]), *_silu(y="q", out="y", order=order),
             helper.make_node("Gemm", ["y", "wg", "bg"], ["g"]),
             *_silu(y="g", out="out", order=1 - order, s="s2")]
    wg = RNG.standard_normal((7, 3)).astype(np.float32)
    bg = RNG.standard_normal(3).astype(np.float32)
    data = model(nodes, [("a", [5, 6])], [("out", None)],
                 [("wm", wm), ("bm", bm), ("wg", wg), ("bg", bg)])
    m, _ = optimized(data)
    assert sorted(_fused(m)) == [("FusedGemm", "Swish", [1.0])] * 2
    check_same(data, {"a": a})
    _against_ort(data, {"a": a})


def test_onnx_swish_24_fuses_with_its_alpha():
    nodes = [_conv(), helper.make_node("Swish", ["c"], ["y"], alpha=0.75)]
    data = model(nodes, [("x", [1, 4, 6, 6])], [("y", None)], [("w", W), ("b", B)],
                 opset=24, ir_version=11)
    m, _ = optimized(data)
    assert _fused(m) == [("FusedConv", "Swish", [0.75])]
    check_same(data, {"x": X})
    c = ow.InferenceSession(_conv_model([_conv("y")])).run(None, {"x": X})[0]
    got = ow.InferenceSession(data).run(None, {"x": X})[0]
    np.testing.assert_allclose(got, c / (1 + np.exp(-0.75 * c)), rtol=1e-5, atol=1e-6)


def test_quick_gelu_fuses_into_the_matmul():
    a = RNG.standard_normal((4, 6)).astype(np.float32)
    wm = RNG.standard_normal((6, 5)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["a", "wm"], ["p"]),
             helper.make_node("QuickGelu", ["p"], ["y"], domain="com.microsoft", alpha=1.5)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT,
                                                                     [4, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(wm, "wm")])
    mp = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                             helper.make_opsetid("com.microsoft", 1)])
    mp.ir_version = 8
    data = mp.SerializeToString()
    m, _ = optimized(data)
    assert _fused(m) == [("FusedGemm", "Swish", [1.5])]
    check_same(data, {"a": a})
    _against_ort(data, {"a": a})


def test_level_1_and_disabled_pass_leave_silu_alone():
    data = _conv_model([_conv(), *_silu()])
    for opts in ({"optimization_level": 1}, {"disabled_passes": ["conv_fusion"]}):
        m, _ = optimized(data, **opts)
        assert all(act != "Swish" for _, act, _ in _fused(m))
        assert "Sigmoid" in types_of(m) or any(
            n.op_type == "FusedElementwise" for n in m.graph.nodes)


@pytest.mark.parametrize("alpha", [None, 1.702])
def test_optimized_model_with_standard_ops_expands_swish(tmp_path, alpha):
    import warnings

    import onnx

    if alpha is None:  # SiLU as exported
        nodes, opset, domain = [_conv(), *_silu()], 17, ""
    else:  # QuickGelu: Swish with alpha
        nodes = [_conv(), helper.make_node("QuickGelu", ["c"], ["y"], domain="com.microsoft",
                                           alpha=alpha)]
        opset, domain = 17, "com.microsoft"
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     [1, 4, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(W, "w"), numpy_helper.from_array(B, "b")])
    imports = [helper.make_opsetid("", opset)] + (
        [helper.make_opsetid(domain, 1)] if domain else [])
    mp = helper.make_model(g, opset_imports=imports)
    mp.ir_version = 8
    data = mp.SerializeToString()
    path = str(tmp_path / "opt.onnx")
    so = ow.SessionOptions(optimized_model_filepath=path)
    so.add_session_config_entry("opwarden.optimized_model_standard_ops", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ow.OpwardenWarning)  # expanded, no fallback
        ow.InferenceSession(data, so)
    written = onnx.load(path)
    assert all(n.domain in ("", "ai.onnx") for n in written.graph.node)
    assert [n.op_type for n in written.graph.node].count("Sigmoid") == 1
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": X})
    got = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": X})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
