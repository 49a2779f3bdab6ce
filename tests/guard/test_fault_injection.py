"""Fault injection through the public API on a real model (the light SqueezeNet)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

import opwarden as ow
from opwarden import zoo
from opwarden.ops import REGISTRY

ort = pytest.importorskip("onnxruntime")

MODEL = zoo.build("squeezenet", seed=0)
DATA = MODEL.SerializeToString()
FEEDS = zoo.feeds_for(MODEL, seed=4)
(WANT,) = ort.InferenceSession(DATA, providers=["CPUExecutionProvider"]).run(None, FEEDS)


def _raises(X):
    raise RuntimeError("simulated driver failure")


def _nan(X):
    return np.full_like(X, np.nan)


def _wrong_shape(X):
    return np.maximum(X[..., :1], 0)


def _mutates(X):
    X *= 0
    return np.maximum(X, 0)


def _sleeps(X):
    time.sleep(0.4)
    return np.maximum(X, 0)


CASES = {
    "exception": (_raises, {}),
    "nan": (_nan, {"checks": "all"}),
    "shape": (_wrong_shape, {"checks": "all"}),
    "mutation": (_mutates, {}),
    "deadline": (_sleeps, {"op_timeout_ms": {"Relu": 100}}),
}


@pytest.fixture
def bad_relu(request):
    """Register a misbehaving high-priority Relu variant; remove it afterwards."""
    fn, opts = CASES[request.param]
    calls = []

    def variant(X):
        calls.append(1)
        return fn(X)

    relu = REGISTRY.latest("Relu")
    before = list(relu.variants)
    ow.kernel("Relu", priority=100, name=f"relu.cpu.bad_{request.param}")(variant)
    yield request.param, opts, calls
    relu.variants = before


def _close(got):
    assert np.abs(got - WANT).max() <= 1e-3 * np.abs(WANT).max() + 1e-5


@pytest.mark.parametrize("bad_relu", list(CASES), indirect=True)
def test_fault_falls_back_and_quarantines(bad_relu):
    kind, opts, calls = bad_relu
    sess = ow.InferenceSession(DATA, optimization_level=0, trace=True, **opts)
    assert all(
        r["variant"].startswith("relu.cpu.bad") for r in sess.explain() if r["op_type"] == "Relu"
    )
    (got,) = sess.run(None, FEEDS)
    _close(got)
    # the first Relu faulted with the right check; the rest went straight to the reference
    faults = sess.faults
    assert faults and faults[0].check == kind and faults[0].op_type == "Relu"
    assert faults[0].action == "fallback" and faults[0].input_shapes
    relu_recs = [r for r in sess.trace if r.op_type == "Relu"]
    assert all(r.status == "fallback" for r in relu_recs)
    assert kind in relu_recs[0].error
    assert f"relu.cpu.bad_{kind}" in sess.health()["quarantine"]
    stats = sess.health()["variants"][f"relu.cpu.bad_{kind}"]
    assert stats["faults"][kind] == 1 and stats["fallbacks"] == len(relu_recs)
    n_calls = len(calls)
    assert n_calls == 1
    (again,) = sess.run(None, FEEDS)
    _close(again)
    assert len(calls) == n_calls, "a quarantined variant must not be called again"


@pytest.mark.parametrize("bad_relu", list(CASES), indirect=True)
def test_on_fault_raise_names_node_and_check(bad_relu):
    kind, opts, _ = bad_relu
    sess = ow.InferenceSession(DATA, optimization_level=0, on_fault="raise", **opts)
    with pytest.raises(ow.KernelError, match=rf"node '.+' \(Relu\): check '{kind}' failed"):
        sess.run(None, FEEDS)


@pytest.mark.parametrize("bad_relu", ["exception"], indirect=True)
def test_quarantine_persists_to_a_file(bad_relu, tmp_path):
    path = str(tmp_path / "quarantine.json")
    first = ow.InferenceSession(DATA, optimization_level=0, quarantine_file=path)
    first.run(None, FEEDS)
    assert "relu.cpu.bad_exception" in json.load(open(path))["variants"]
    second = ow.InferenceSession(DATA, optimization_level=0, quarantine_file=path)
    relu_rows = [r for r in second.explain() if r["op_type"] == "Relu"]
    assert all(r["variant"] != "relu.cpu.bad_exception" for r in relu_rows)
    assert any("quarantined" in x["reason"] for x in relu_rows[0]["rejected"])
    _close(second.run(None, FEEDS)[0])


def test_chrome_trace_has_one_complete_event_per_node(tmp_path):
    sess = ow.InferenceSession(DATA, optimization_level=0, enable_profiling=True)
    sess.run(None, FEEDS)
    path = sess.end_profiling(str(tmp_path / "trace.json"))
    events = json.load(open(path))["traceEvents"]
    xs = [e for e in events if e["ph"] == "X"]
    assert len(xs) == len(sess.model.graph.nodes) == len(sess.trace)
    assert {e["name"] for e in xs} == {n.name for n in sess.model.graph.nodes}
    rec = xs[0]["args"]
    for key in (
        "op_type",
        "device",
        "variant",
        "input_shapes",
        "output_shapes",
        "exec_us",
        "status",
        "workspace_bytes",
    ):
        assert key in rec


def test_math_nan_is_recorded_not_blamed_on_the_reference():
    from tests.models import one_node

    sess = ow.InferenceSession(one_node("Log", [("x", 1, [3])], [("y", 1, [3])]), checks="all")
    (y,) = sess.run(None, {"x": np.array([-1.0, 0.0, 1.0], np.float32)})
    assert np.isnan(y[0]) and np.isinf(y[1])
    assert [f.action for f in sess.faults] == ["recorded"]


def test_traced_time_is_the_kernel_and_the_guard_checks_are_apart(monkeypatch):
    """A traced op's exec_us is its kernel alone; the guard's NaN/Inf scans around it are
    guard_us (charging them to the kernel inflated every traced op, most of all memory-bound
    ones)."""
    from onnx import TensorProto

    from opwarden.guard import guard as guard_mod
    from opwarden.trace import report
    from tests.models import one_node

    scan = guard_mod.C.all_finite

    def slow_scan(a):
        time.sleep(0.03)
        return scan(a)

    monkeypatch.setattr(guard_mod.C, "all_finite", slow_scan)
    model = one_node("Relu", [("x", TensorProto.FLOAT, [4, 8])], [("y", TensorProto.FLOAT, [4, 8])])
    sess = ow.InferenceSession(model.SerializeToString(), trace=True, checks="all")
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    (rec,) = sess.trace
    # input and output each scanned once: >= 60 ms of checks, a kernel of microseconds
    assert rec.guard_us >= 60_000
    assert rec.exec_us < 30_000
    row = next(r for r in report.by_op_type(sess.trace) if r["op_type"] == "Relu")
    assert row["total_us"] == rec.exec_us and row["guard_us"] == rec.guard_us


def test_an_in_place_kernel_that_faults_falls_back_on_the_inputs_it_was_given():
    """Add may write into its dying first input's buffer (the plan puts its output there). A
    variant that fills the planned output with NaN has then destroyed that input: the
    reference rerun must read what the node was given, and the fault is the kernel's."""
    from onnx import TensorProto, helper

    f32 = TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "y"], ["s"]),
         helper.make_node("Neg", ["s"], ["o"])], "g",
        [helper.make_tensor_value_info("x", f32, [4, 8]),
         helper.make_tensor_value_info("y", f32, [4, 8])],
        [helper.make_tensor_value_info("o", f32, [4, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    def bad(A, B, out=None):
        o = np.empty(np.broadcast_shapes(A.shape, B.shape), np.float32) if out is None else out
        o[...] = np.nan
        return o

    add = REGISTRY.latest("Add")
    before = list(add.variants)
    ow.kernel("Add", priority=100, name="add.cpu.bad_in_place", accepts_out=True)(bad)
    try:
        sess = ow.InferenceSession(model.SerializeToString(), optimization_level=0,
                                   checks="all")
        plan = sess.memory_plan
        assert any({"r", "s"} <= set(b.values) for b in plan.buffers), "Add not in place"
        rng = np.random.default_rng(0)
        x, y = rng.standard_normal((2, 4, 8), dtype=np.float32)
        (got,) = sess.run(None, {"x": x, "y": y})
        np.testing.assert_array_equal(got, -(np.maximum(x, 0) + y))
        assert [f.action for f in sess.faults] == ["fallback"]
        assert sess.faults[0].check == "nan"
    finally:
        add.variants = before
