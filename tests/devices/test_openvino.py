"""The openvino device: OpenVINO's own capability answer, compiled regions, the guard per
region naming the first bad node, provenance in the trace, precision as an explicit degrade.
Skipped when openvino does not import."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import opwarden as ow
from opwarden import zoo
from opwarden.contract import TensorFact
from opwarden.devices import devices, get_device
from opwarden.ops import REGISTRY

pytest.importorskip("openvino")
ort = pytest.importorskip("onnxruntime")

from opwarden.kernels.openvino import region as ov_region  # noqa: E402

PROVIDERS = ["openvino", "cpu"]


def _tol(w: np.ndarray) -> float:
    return 1e-3 * float(np.abs(w).max()) + 1e-5  # the zoo tolerance (tests/test_zoo.py)


@pytest.fixture(scope="module")
def squeeze():
    m = zoo.build("squeezenet", seed=0)
    data = m.SerializeToString()
    feeds = zoo.feeds_for(m, seed=1)
    (want,) = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    return data, feeds, want


@pytest.mark.parametrize("name", ["squeezenet", "shufflenet"])
def test_light_zoo_matches_onnxruntime_within_the_zoo_tolerance(name):
    m = zoo.build(name, seed=0)
    data = m.SerializeToString()
    s = ow.InferenceSession(data, providers=PROVIDERS)
    peer = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    rows = s.explain()
    assert {r["device"] for r in rows if not r.get("inserted")} == {"openvino"}
    for seed in (1, 2):
        feeds = zoo.feeds_for(m, seed=seed)
        for g, w in zip(s.run(None, feeds), peer.run(None, feeds)):
            assert g.shape == w.shape and g.dtype == w.dtype
            assert np.abs(g - w).max() <= _tol(w)


def test_openvino_is_listed_with_its_own_capabilities():
    dev = get_device("openvino")
    assert dev in devices()
    ok, why = dev.accepts(_custom_model_node())
    assert not ok and "No conversion rule" in why
    names = {c["op"] for c in dev.capabilities()}
    assert {"Conv", "Relu", "MatMul"} <= names


def _custom_model_node():
    sess = ow.InferenceSession(_custom_model(), providers=["cpu"])
    return next(p.node for p in sess.placements if p.node.op_type == "OvTestSquare")


def _register_custom():
    if REGISTRY._ops.get(("test.ov", "OvTestSquare")):
        return

    @ow.op("OvTestSquare", domain="test.ov", inputs=["X: T"], outputs=["Y: T"],
           types={"T": ["float32"]}, contract=ow.Contract(nan="propagate"))
    def OvTestSquare(X):
        return X * X

    @OvTestSquare.infer
    def _infer(x):
        return TensorFact(x.dtype, x.shape)


def _custom_model() -> bytes:
    _register_custom()
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "W")
    nodes = [
        helper.make_node("Conv", ["x", "W"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("OvTestSquare", ["r"], ["q"], name="square", domain="test.ov"),
        helper.make_node("Sigmoid", ["q"], ["s"], name="sigmoid"),
        helper.make_node("Add", ["s", "c"], ["y"], name="add"),
    ]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13),
                                            helper.make_opsetid("test.ov", 1)])
    return m.SerializeToString()


def test_a_custom_op_runs_on_cpu_with_openvinos_reason_the_rest_on_openvino():
    data = _custom_model()
    s = ow.InferenceSession(data, providers=PROVIDERS)
    rows = {r["name"]: r for r in s.explain() if not r.get("inserted")}
    assert {k for k, r in rows.items() if r["device"] == "cpu"} == {"square"}
    assert "No conversion rule found for operations: test.ov.OvTestSquare" in \
        rows["square"]["reason"]
    assert all(rows[k]["device"] == "openvino" for k in ("conv", "relu", "sigmoid", "add"))
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    (got,) = s.run(None, {"x": x})
    (want,) = ow.InferenceSession(data, providers=["cpu"]).run(None, {"x": x})
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5)
    # conv/relu feed the custom op and add reads conv: two regions, no cycle
    regions = [r for r in s.explain() if r.get("inserted") == "region"]
    assert sorted(len(r["covers"]) for r in regions) == [2, 2]


def test_injected_nan_in_a_region_completes_with_orts_answer_and_names_the_node(squeeze):
    data, feeds, want = squeeze
    m = onnx.load_from_string(data)
    # OpenVINO's fused ReLU maps NaN to 0: poison the pool before the softmax, whose NaN
    # reaches the output
    victim = [n.name for n in m.graph.node if n.op_type == "GlobalAveragePool"][-1]
    with ov_region.inject_nan(victim):
        s = ow.InferenceSession(data, providers=PROVIDERS, checks="all")
    (got,) = s.run(None, feeds)
    assert np.abs(got - want).max() <= _tol(want)
    (fault,) = s.faults
    assert fault.node == victim and fault.check == "nan" and fault.action == "fallback"
    assert "region" in fault.detail
    assert any(k.startswith("openvino.region.") for k in s.health()["quarantine"])
    (again,) = s.run(None, feeds)  # quarantined: the CPU path from now on
    assert np.abs(again - want).max() <= _tol(want) and len(s.faults) == 1


def test_every_model_node_appears_in_the_trace_with_per_node_times(squeeze):
    data, feeds, want = squeeze
    s = ow.InferenceSession(data, providers=PROVIDERS, trace=True)
    (got,) = s.run(None, feeds)
    assert np.abs(got - want).max() <= _tol(want)
    placed = {r["name"] for r in s.explain() if not r.get("inserted")}
    seen = set()
    for r in s.trace:
        seen.add(r.node)
        seen.update(c["node"] for c in r.covers)
    assert placed <= seen
    region = next(r for r in s.trace if r.covers)
    timed = [c for c in region.covers if c["exec_us"] > 0 and c["op_type"] == "Conv"]
    assert timed, "OpenVINO's profiling gave the convolutions no time"


def test_default_precision_is_f32_on_a_bf16_cpu(squeeze):
    import openvino as ov

    data, feeds, want = squeeze
    s = ow.InferenceSession(data, providers=PROVIDERS)
    (got,) = s.run(None, feeds)
    assert np.abs(got - want).max() <= _tol(want)
    reg = next(p for p in s.placements if p.inserted == "region").node.attrs["region"]
    (entry,) = reg.cache.values()
    assert entry.compiled.get_property("INFERENCE_PRECISION_HINT") == ov.Type.f32
    caps = get_device("openvino").extra["capabilities"]
    if "BF16" in caps:  # OpenVINO's own default here is the silent degrade
        assert "bfloat16" in get_device("openvino").extra["default_precision"]


def _has_bf16() -> bool:
    return "BF16" in get_device("openvino").extra["capabilities"]


needs_bf16 = pytest.mark.skipif("not _has_bf16()", reason="this CPU's OpenVINO plugin has no BF16")


@needs_bf16
def test_bf16_is_asked_for_and_shown_as_a_degrade(squeeze):
    data, feeds, want = squeeze
    s = ow.InferenceSession(data, providers=PROVIDERS, precision="bf16")
    rows = [r for r in s.explain() if r.get("inserted") == "region"]
    assert rows and all(r["degrade"]["to"] == "bf16" for r in rows)
    (got,) = s.run(None, feeds)
    assert np.isfinite(got).all()


def test_a_precision_openvino_cannot_compute_is_a_clear_error(squeeze):
    with pytest.raises(ow.OpwardenError, match="int8"):
        ow.InferenceSession(squeeze[0], providers=PROVIDERS, precision="int8")


@needs_bf16
def test_calibration_measures_a_degrade_against_f32_and_explain_says_so(squeeze):
    data, feeds, want = squeeze
    s = ow.InferenceSession(data, providers=PROVIDERS, precision="bf16")
    assert "not calibrated" in s.explain_summary()["text"]
    cal = s.calibrate(feeds)
    (reg,) = cal["regions"]
    assert reg["precision"] == "bf16" and reg["max_abs_error"] > 0
    (got,) = s.run(None, feeds)
    # the model-level error is the degraded run's against an all-f32 run of the same session
    assert cal["max_abs_error"] == pytest.approx(float(np.abs(got - want).max()), rel=0.2,
                                                 abs=1e-4)
    (row,) = [r for r in s.explain() if r.get("inserted") == "region"]
    assert row["degrade"]["calibrated"] and row["degrade"]["max_abs_error"] > 0
    text = s.explain_summary()["text"]
    assert "PRECISION DEGRADED to bf16" in text and "zoo tolerance" in text
    f32 = ow.InferenceSession(data, providers=PROVIDERS)
    assert f32.calibrate(feeds)["regions"] == []
    assert "DEGRADED" not in f32.explain_summary()["text"]


def test_capabilities_are_what_openvino_accepts():
    import argparse
    import contextlib
    import io
    import json

    from opwarden.cli.ops import _list_ops

    dev = get_device("openvino")
    names = {c["op"] for c in dev.capabilities()}
    assert {"Conv", "Relu", "MatMul", "LayerNormalization"} <= names
    # OpenVINO's frontend has no conversion rule for these; opwarden's CPU runs them
    assert not names & {"ConcatFromSequence", "SequenceConstruct", "StringNormalizer", "Det"}
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        _list_ops(argparse.Namespace(device="openvino", json=True))
    listed = {r["op"] for r in json.loads(buf.getvalue())}
    assert listed == names


def test_a_region_that_fails_to_compile_falls_back_to_cpu_with_the_error():
    data = _custom_model()
    with ov_region.inject_compile_failure("conv"):
        s = ow.InferenceSession(data, providers=PROVIDERS)
    rows = {r["name"]: r for r in s.explain() if not r.get("inserted")}
    # conv/relu's region failed: both on cpu with OpenVINO's own compile error; the other
    # region (sigmoid, add) still compiles
    for k in ("conv", "relu"):
        assert rows[k]["device"] == "cpu"
        assert "compile failed" in rows[k]["reason"] and "not-a-precision" in rows[k]["reason"]
    assert rows["sigmoid"]["device"] == rows["add"]["device"] == "openvino"
    x = np.random.default_rng(2).standard_normal((1, 3, 8, 8)).astype(np.float32)
    (got,) = s.run(None, {"x": x})
    (want,) = ow.InferenceSession(data, providers=["cpu"]).run(None, {"x": x})
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5)


def _qkv_model() -> bytes:
    """Three projections of one input (no producer inside a region), combined: the greedy
    grouping starts three groups, the merge makes them one."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), f"w{k}")
             for k in "qkv"]
    nodes = [helper.make_node("MatMul", ["x", f"w{k}"], [k], name=f"mm_{k}") for k in "qkv"]
    nodes += [helper.make_node("Mul", ["q", "k"], ["qk"], name="mul"),
              helper.make_node("Add", ["qk", "v"], ["y"], name="add")]
    g = helper.make_graph(nodes, "qkv", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [2, 8])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [2, 8])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


def test_sibling_groups_merge_into_one_region():
    data = _qkv_model()
    s = ow.InferenceSession(data, providers=PROVIDERS)
    (region,) = [r for r in s.explain() if r.get("inserted") == "region"]
    assert sorted(region["covers"]) == ["add", "mm_k", "mm_q", "mm_v", "mul"]
    x = np.random.default_rng(4).standard_normal((2, 8)).astype(np.float32)
    (got,) = s.run(None, {"x": x})
    (want,) = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5)


def _int_model(dtype: int, shape: list[int]) -> bytes:
    c = helper.make_tensor("c", dtype, [1], [3])
    nodes = [helper.make_node("Mul", ["x", "c"], ["m"], name="mul"),
             helper.make_node("Add", ["m", "x"], ["y"], name="add")]
    g = helper.make_graph(nodes, "ints", [helper.make_tensor_value_info("x", dtype, shape)],
                          [helper.make_tensor_value_info("y", dtype, shape)], [c])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)]).SerializeToString()


def test_measured_deviations_keep_their_nodes_right():
    # float64 is computed in float32 by OpenVINO: on cpu, said why
    s = ow.InferenceSession(_int_model(TensorProto.DOUBLE, [3]), providers=PROVIDERS)
    rows = [r for r in s.explain() if not r.get("inserted")]
    assert {r["device"] for r in rows} == {"cpu"}
    assert all("float64 in float32" in r["reason"] for r in rows)
    # 8-bit arithmetic saturates in OpenVINO, wraps in ONNX
    s = ow.InferenceSession(_int_model(TensorProto.INT8, [3]), providers=PROVIDERS)
    assert {r["device"] for r in s.explain() if not r.get("inserted")} == {"cpu"}
    x8 = np.array([100, -100, 7], np.int8)
    (got,) = s.run(None, {"x": x8})
    assert np.array_equal(got, (x8 * np.int8(3) + x8).astype(np.int8))
    # signed integer Div floors in OpenVINO, truncates in ONNX
    c = helper.make_tensor("two", TensorProto.INT32, [1], [2])
    g = helper.make_graph([helper.make_node("Div", ["x", "two"], ["y"], name="div")], "d",
                          [helper.make_tensor_value_info("x", TensorProto.INT32, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.INT32, [4])], [c])
    s = ow.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
                            .SerializeToString(), providers=PROVIDERS)
    (row,) = [r for r in s.explain() if not r.get("inserted")]
    assert row["device"] == "cpu" and "toward zero" in row["reason"]
    xi = np.array([-3, 3, -5, 5], np.int32)
    assert np.array_equal(s.run(None, {"x": xi})[0], np.array([-1, 1, -2, 2], np.int32))
    # int64 runs on openvino (in int32 there): a feed beyond int32 runs the region on the host
    s = ow.InferenceSession(_int_model(TensorProto.INT64, [3]), providers=PROVIDERS)
    assert {r["device"] for r in s.explain() if not r.get("inserted")} == {"openvino"}
    reg = next(p for p in s.placements if p.inserted == "region").node.attrs["region"]
    small = np.array([1, -2, 3], np.int64)
    assert np.array_equal(s.run(None, {"x": small})[0], small * 4) and reg.host_runs == 0
    big = np.array([1 << 40, -(1 << 41), 5], np.int64)
    assert np.array_equal(s.run(None, {"x": big})[0], big * 4) and reg.host_runs == 1


def test_a_region_node_whose_kernel_loses_nan_says_so(squeeze):
    s = ow.InferenceSession(squeeze[0], providers=PROVIDERS)
    relus = [r for r in s.explain() if r["op_type"] == "Relu" and not r.get("inserted")]
    assert relus and all("maps NaN to 0" in r["note"] for r in relus)
    # its single-node variant (what `opwarden check --device openvino` validates) is declared
    # unsupported, as the nan check found
    var = next(v for v in REGISTRY.latest("Relu").variants if v.device == "openvino")
    assert not var.when(TensorFact("float32", (3, 4)))


def test_the_op_table_and_flame_graph_show_a_regions_operators(squeeze, tmp_path):
    from opwarden.trace.report import by_op_type, expand_regions, flame_svg

    data, feeds, _ = squeeze
    s = ow.InferenceSession(data, providers=PROVIDERS, trace=True)
    s.run(None, feeds)
    recs = list(s.trace)
    (region,) = [r for r in recs if r.covers]
    table = {r["op_type"]: r for r in by_op_type(recs)}
    n_conv = sum(c["op_type"] == "Conv" for c in region.covers)
    assert table["Conv"]["count"] == n_conv > 0 and table["Conv"]["total_us"] > 0
    # the expanded records keep the region's time: its nodes' share plus its own remainder
    assert sum(r.exec_us for r in expand_regions(recs)) == pytest.approx(
        sum(r.exec_us for r in recs), rel=1e-6)
    svg = open(flame_svg(recs, str(tmp_path / "flame.svg"))).read()
    assert ">Conv" in svg or "Conv:" in svg


def test_a_precision_the_cpu_lacks_is_not_applied_and_says_so(squeeze, monkeypatch):
    import openvino as ov

    data, feeds, want = squeeze
    dev = get_device("openvino")
    monkeypatch.setitem(dev.extra, "capabilities", ["FP32", "INT8"])
    with pytest.warns(ow.PrecisionWarning, match="no BF16 capability"):
        s = ow.InferenceSession(data, providers=PROVIDERS, precision="bf16")
    rows = [r for r in s.explain() if r.get("inserted") == "region"]
    assert rows and not any(r.get("degrade") for r in rows)
    assert all("no BF16" in r["precision_note"] for r in rows)
    assert "NOT APPLIED" in s.explain_summary()["text"]
    (got,) = s.run(None, feeds)
    assert np.abs(got - want).max() <= _tol(want)
    reg = next(p for p in s.placements if p.inserted == "region").node.attrs["region"]
    (entry,) = reg.cache.values()
    assert entry.compiled.get_property("INFERENCE_PRECISION_HINT") == ov.Type.f32
    assert s.calibrate(feeds)["regions"] == []
