"""The pictures read without hovering: the flame graph, the memory plan and the placement
picture carry a title, axes with ticks, a legend and visible labels (checked on the SVG's
structure, not its pixels), and keep their tooltips."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from opwarden.place.picture import placement_svg
from opwarden.place.svg import FIXED, colours, fit, nice_ticks, text_width
from opwarden.plan import report as plan_report
from opwarden.session import InferenceSession
from opwarden.trace.records import OpRecord
from opwarden.trace.report import flame_svg
from tests.models import graph_model, small_cnn

NS = "{http://www.w3.org/2000/svg}"
F = TensorProto.FLOAT


def _parse(text: str) -> ET.Element:
    return ET.fromstring(text)


def _texts(root: ET.Element, cls: str | None = None) -> list[str]:
    return ["".join(t.itertext()) for t in root.iter(f"{NS}text")
            if cls is None or t.get("class") == cls]


def _records() -> list[OpRecord]:
    """Two runs of four nodes: one big FusedConv, a Relu, and two tiny ops."""
    out = []
    for run in (1, 2):
        for node, op, us in (("conv1+relu_a", "FusedConv", 6000.0), ("pool", "MaxPool", 1500.0),
                             ("tiny_a", "Flatten", 2.0), ("tiny_b", "Softmax", 3.0)):
            out.append(OpRecord(node, op, "cpu", "v", [], [], exec_us=us, run=run,
                                origin=["conv1", "relu_a"] if op == "FusedConv" else [node]))
    return out


def test_flame_graph_has_title_axis_labels_and_legend(tmp_path):
    path = flame_svg(_records(), str(tmp_path / "flame.svg"), title="demo.onnx, 2 run(s)")
    root = _parse(open(path, encoding="utf-8").read())
    assert "demo.onnx, 2 run(s)" in _texts(root, "title")[0]
    assert "mean of 2 run(s)" in _texts(root, "subtitle")[0]
    ticks = [float(t) for t in _texts(root, "tick")]
    assert ticks[0] == 0 and ticks == sorted(ticks) and len(ticks) >= 4
    assert ticks[-1] <= 7.505 + 1e-9  # the axis spans the 7.5 ms per run, in ms
    labels = _texts(root, "label")
    assert "FusedConv 6.00 ms" in labels and "conv1+relu_a 6.00 ms" in labels  # per run
    assert "MaxPool 1.50 ms" in labels
    assert not any("tiny_a" in t for t in labels)  # too narrow to label ...
    tips = [t.text or "" for t in root.iter(f"{NS}title")]
    assert any(t.startswith("tiny_a: 0.00 ms") for t in tips)  # ... but it keeps its tooltip
    assert any("stands for conv1, relu_a" in t for t in tips)
    legend = _texts(root, "legend-entry")
    assert [e.split()[0] for e in legend] == ["FusedConv", "MaxPool", "Softmax", "Flatten"]
    assert 150 <= float(root.get("height")) <= 400


def test_op_type_colours_are_stable_and_distinct():
    a = colours(["FusedConv", "Erf", "Gather", "TopK"])
    b = colours(["Gather", "Relu", "FusedConv", "Erf"])
    assert a["FusedConv"] == b["FusedConv"] == FIXED["FusedConv"]
    assert len(set(a.values())) == 4 and len(set(b.values())) == 4
    many = colours([f"Op{i}" for i in range(12)])
    assert len(set(many.values())) == 12


@pytest.mark.parametrize("top", [0.3, 1, 7.5, 13.4, 99, 1000, 123456.0, 3 * 2**20])
def test_nice_ticks_cover_the_range_in_round_steps(top):
    t = nice_ticks(top, 6)
    assert t[0] == 0 and t[-1] >= top - 1e-9 and 3 <= len(t) <= 12
    steps = {round(b - a, 9) for a, b in zip(t, t[1:])}
    assert len(steps) == 1
    (step,) = steps
    mant = step / 10 ** math.floor(math.log10(step))
    assert any(math.isclose(mant, m) for m in (1, 2, 2.5, 5))


@pytest.mark.parametrize("width", [5, 20, 57, 120, 400])
def test_fit_labels_never_overflow_their_box(width):
    for label in ("n10+n11+n12+n13+n16+n17", "conv1", "a" * 80):
        for suffix in ("", " 12.3 ms"):
            got = fit(label, width, 11, suffix)
            assert got == "" or text_width(got, 11) <= width + 1e-9


@pytest.fixture(scope="module")
def cnn_plan():
    sess = InferenceSession(small_cnn(batch=1))
    return sess.plan_for({"x": np.ones((1, 3, 8, 8), np.float32)})


def test_plan_picture_labels_buffers_marks_the_peak_and_has_a_legend(cnn_plan):
    plan = cnn_plan
    root = _parse(plan_report.svg(plan, title="small_cnn, batch 1"))
    assert "small_cnn, batch 1" in _texts(root, "title")[0]
    steps = [int(t) for t in _texts(root, "tick") if t.isdigit()]
    assert steps and steps == sorted(steps) and steps[0] == 0
    assert max(steps) <= len(plan.steps) - 1
    legend = _texts(root, "legend-entry")
    assert any("in place" in e for e in legend) and any("workspace" in e for e in legend)
    assert any("peak" in e for e in legend)
    at, top = plan_report.peak(plan)
    live = [sum(b.nbytes for b in plan.buffers if b.first <= t <= b.last)
            for t in range(len(plan.steps))]
    assert top == max(live) and at == live.index(max(live))
    peak_text = "".join(next(g for g in root.iter(f"{NS}g") if g.get("class") == "peak")
                        .itertext())
    assert f"at step {at}" in peak_text
    big = max(plan.buffers, key=lambda b: b.nbytes)
    labels = " ".join(_texts(root, "label"))
    assert big.name in labels
    boxes = [g for g in root.iter(f"{NS}g") if g.get("class") == "buffer"]
    assert len(boxes) == len(plan.buffers)
    assert all(g.find(f"{NS}title") is not None for g in boxes)


def test_plan_png_through_matplotlib(cnn_plan, tmp_path):
    pytest.importorskip("matplotlib")
    path = plan_report.save_picture(cnn_plan, str(tmp_path / "plan.png"), "small_cnn")
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def _fallback_model():
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu_a"),
             helper.make_node("Erf", ["r"], ["e"], name="erf_b"),
             helper.make_node("Relu", ["e"], ["y"], name="relu_c")]
    return graph_model(nodes, [("x", F, [1, 3, 8, 8])], [("y", F, [1, 4, 8, 8])], inits,
                       opset=17)


def test_placement_picture_colours_devices_and_marks_fallbacks():
    sess = InferenceSession(_fallback_model(), providers=["edge-npu", "cpu"])
    root = _parse(placement_svg(sess.placements, sess.placements.report, "fallback model"))
    assert "fallback model" in _texts(root, "title")[0]
    legend = _texts(root, "legend-entry")
    assert any(e.startswith("edge-npu") for e in legend)
    assert any(e.startswith("cpu") for e in legend)
    groups = [g for g in root.iter(f"{NS}g") if (g.get("class") or "").startswith("node")]
    assert len(groups) == len(sess.placements)
    falls = [g for g in groups if "fallback" in g.get("class")]
    assert len(falls) == 1
    reason = " ".join(_texts(falls[0], "reason"))
    assert "fallback" in reason and "Erf" in reason
    labels = _texts(root, "label")
    assert "conv1+relu_a" in labels and "erf_b" in labels
    assert any(t.startswith("copy to") for t in labels)  # inserted copies, in words
    fills = {g.find(f"{NS}rect").get("fill") for g in groups if "inserted" not in g.get("class")}
    assert len(fills) == 2  # one colour per device
    edges = [p for p in root.iter(f"{NS}path") if p.get("marker-end")]
    assert len(edges) == len(sess.placements) - 1  # a chain
    assert _texts(root, "graph-input") == ["input x"]
    assert _texts(root, "graph-output") == ["output y"]


def test_explain_svg_option_writes_the_picture(tmp_path):
    import onnx

    from opwarden.cli import main

    src, out = tmp_path / "m.onnx", tmp_path / "place.svg"
    onnx.save(_fallback_model(), str(src))
    assert main(["explain", str(src), "--providers", "edge-npu,cpu", "--svg", str(out)]) == 0
    root = _parse(out.read_text(encoding="utf-8"))
    assert "erf_b" in _texts(root, "label")


def test_explain_svg_option_refuses_another_suffix_before_any_work(tmp_path):
    from opwarden.cli import main

    assert main(["explain", "no_such_model.onnx", "--svg", str(tmp_path / "a.txt")]) == 2
    assert not (tmp_path / "a.txt").exists()
