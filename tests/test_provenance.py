"""Provenance: every executed node names the model nodes it stands for (`explain`'s and the
trace's ``origin``), and every model node is accounted for: executed as (part of) some node,
or removed by a named pass."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from opwarden import zoo
from opwarden.cli.devices import explain_json, render_explain
from opwarden.ir.load import load
from opwarden.options import SessionOptions
from opwarden.passes import PASS_NAMES
from opwarden.session import InferenceSession
from tests.models import graph_model

F = TensorProto.FLOAT


def _model_names(source) -> list[str]:
    """The model's own node names, as loaded (an unnamed node gets its loader name)."""
    return [n.name for n in load(source).graph.nodes]


@pytest.fixture(scope="module")
def light_names() -> dict[str, list[str]]:
    return {n: _model_names(zoo.light_path(n)) for n in zoo.LIGHT_MODELS}


def _check_accounted(rows, summary, names: list[str]) -> None:
    carried = [o for r in rows for o in r["origin"]]
    removed = summary["removed"]
    assert set(carried) <= set(names), "an origin names a node the model does not have"
    missing = set(names) - set(carried) - set(removed)
    assert not missing, f"model nodes neither executed nor reported removed: {sorted(missing)}"
    assert not set(removed) & set(carried)
    steps = set(PASS_NAMES) | {"layout (transpose cancelled)"}
    assert set(removed.values()) <= steps
    executed = [r["name"] for r in rows]
    assert len(set(executed)) == len(executed), "executed node names are not unique"
    for r in rows:
        if r["inserted"] in ("copy", "transpose", "view"):
            assert r["origin"] == [], r
        else:
            assert r["origin"], f"{r['name']} stands for no model node"


@pytest.mark.parametrize("providers", [["cpu"], ["edge-npu", "cpu"]], ids=["cpu", "edge-npu"])
@pytest.mark.parametrize("name", zoo.LIGHT_MODELS)
def test_every_light_zoo_node_is_executed_or_reported_removed(name, providers, light_names):
    sess = InferenceSession(zoo.light_path(name), providers=providers)
    data = explain_json(sess)
    _check_accounted(data["nodes"], data["summary"], light_names[name])
    # The light files hold weights as ConstantOfShape nodes: constant folding removes them.
    assert "constant_folding" in data["summary"]["removed"].values()
    fused = data["summary"]["fused"]
    assert fused and all(len(v) >= 1 for v in fused.values())


def _conv_relu(path) -> None:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu_a")]
    m = graph_model(nodes, [("x", F, [1, 3, 16, 16])], [("y", F, [1, 8, 16, 16])], inits,
                    opset=17)
    import onnx

    onnx.save(m, path)


def test_fused_conv_on_edge_npu_lists_its_conv_and_relu(tmp_path):
    path = str(tmp_path / "cr.onnx")
    _conv_relu(path)
    sess = InferenceSession(path, providers=["edge-npu", "cpu"])
    data = explain_json(sess)
    (fc,) = [r for r in data["nodes"] if r["op_type"] == "FusedConv"]
    assert fc["origin"] == ["conv1", "relu_a"]
    assert fc["name"] == "conv1+relu_a"  # named after its parts, not n123_fused
    assert fc["device"] == "edge-npu"
    copies = [r for r in data["nodes"] if r["inserted"]]
    assert copies and all(r["origin"] == [] for r in copies)
    assert data["summary"]["fused"] == {"conv1+relu_a": ["conv1", "relu_a"]}
    out = io.StringIO()
    render_explain(sess, as_json=True, out=out)
    assert json.loads(out.getvalue())["nodes"] == data["nodes"]
    text = io.StringIO()
    render_explain(sess, out=text)
    assert "relu_a" in text.getvalue()  # a user looking for relu_a finds it


def test_level_zero_lists_the_models_own_nodes(tmp_path):
    path = str(tmp_path / "cr.onnx")
    _conv_relu(path)
    sess = InferenceSession(path, sess_options=SessionOptions(optimization_level=0))
    assert [(r["name"], r["origin"]) for r in sess.explain()] == [
        ("conv1", ["conv1"]), ("relu_a", ["relu_a"])]


def test_trace_events_carry_the_origin(tmp_path):
    path = str(tmp_path / "cr.onnx")
    _conv_relu(path)
    sess = InferenceSession(path, sess_options=SessionOptions(trace=True))
    sess.run(None, {"x": np.ones((1, 3, 16, 16), np.float32)})
    (rec,) = [r for r in sess.trace if r.op_type == "FusedConv"]
    assert rec.origin == ["conv1", "relu_a"]
    trace = json.load(open(sess.end_profiling(str(tmp_path / "t.json")), encoding="utf-8"))
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    assert any(e["args"]["origin"] == ["conv1", "relu_a"] for e in events)


def test_folded_dead_and_bypassed_nodes_are_reported_with_their_pass():
    k = numpy_helper.from_array(np.full((1, 4), 2.0, np.float32), "k")
    nodes = [
        helper.make_node("Mul", ["k", "k"], ["k2"], name="const_mul"),  # folded
        helper.make_node("Identity", ["x"], ["xi"], name="ident"),  # bypassed
        helper.make_node("Add", ["xi", "k2"], ["y"], name="add"),
        helper.make_node("Neg", ["x"], ["unused"], name="dead_neg"),  # read by nothing
    ]
    m = graph_model(nodes, [("x", F, [3, 4])], [("y", F, [3, 4])], [k])
    sess = InferenceSession(m)
    data = explain_json(sess)
    assert data["summary"]["removed"] == {"const_mul": "constant_folding",
                                          "ident": "identity_elimination",
                                          "dead_neg": "dead_code_elimination"}
    assert "3 model node(s) removed (" in data["summary"]["text"]
    assert "constant_folding: const_mul" in data["summary"]["text"]  # few: named
    (y,) = sess.run(None, {"x": np.ones((3, 4), np.float32)})
    np.testing.assert_array_equal(y, np.full((3, 4), 5.0, np.float32))


def test_bn_folded_into_conv_then_fused_keeps_every_part():
    rng = np.random.default_rng(1)
    c = 4
    inits = [numpy_helper.from_array(rng.standard_normal((c, 3, 3, 3)).astype(np.float32), "w")]
    for nm, v in (("s", 1.5), ("t", 0.1), ("mu", 0.2), ("var", 0.9)):
        inits.append(numpy_helper.from_array(np.full(c, v, np.float32), nm))
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "s", "t", "mu", "var"], ["bn"], name="bn"),
        helper.make_node("Relu", ["bn"], ["y"], name="relu"),
    ]
    m = graph_model(nodes, [("x", F, [1, 3, 8, 8])], [("y", F, [1, c, 8, 8])], inits)
    rows = InferenceSession(m).explain()
    assert [(r["op_type"], r["origin"]) for r in rows] == [("FusedConv", ["conv", "bn", "relu"])]
    assert rows[0]["name"] == "conv+bn+relu"  # the Conv (BN folded into it) and the Relu


def test_long_chains_get_short_unique_names():
    nodes, prev = [], "x"
    for i in range(12):
        nodes.append(helper.make_node("Relu" if i % 2 else "Neg", [prev], [f"v{i}"],
                                      name=f"elementwise_step_{i}"))
        prev = f"v{i}"
    m = graph_model(nodes, [("x", F, [2, 8])], [(prev, F, [2, 8])])
    rows = InferenceSession(m).explain()
    assert len(rows) == 1 and rows[0]["op_type"] == "FusedElementwise"
    assert rows[0]["origin"] == [f"elementwise_step_{i}" for i in range(12)]
    assert rows[0]["name"] == "elementwise_step_0+10_more+elementwise_step_11"


def test_activation_moved_after_the_pool_keeps_its_own_origin():
    from tests.models import small_cnn

    rows = InferenceSession(small_cnn(batch=1)).explain()
    by_origin = {tuple(r["origin"]): r for r in rows if not r["inserted"]}
    # Conv+Relu fused, then the Relu moved after the MaxPool: each part names its own node
    assert by_origin[("conv",)]["name"] == "conv"
    assert by_origin[("relu",)]["op_type"] == "Relu"
    assert by_origin[("relu",)]["name"] == "relu"
    assert by_origin[("pool",)]["op_type"] == "MaxPool"
