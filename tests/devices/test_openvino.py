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
