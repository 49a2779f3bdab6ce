"""`opwarden compare`: every value of a model on opwarden and onnxruntime, the first divergence.

The judged case: a deliberately wrong kernel registered through `opwarden.kernel` is named as
the first diverging node, with its inputs agreeing; everything else in these models agrees.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import opwarden
from opwarden.cli import main
from opwarden.cli.compare_values import compare_value
from opwarden.ops import REGISTRY

pytest.importorskip("onnxruntime")

WRONG = "tanh.cpu.h5_wrong_test"


def _chain(path, extra_nodes=(), extra_outputs=()):
    """x[N,8] -> Relu -> Tanh -> Add(w) -> Sigmoid -> y, named nodes, a symbolic batch."""
    w = numpy_helper.from_array(np.linspace(-1, 1, 8).astype(np.float32), "w")
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu_a"),
             helper.make_node("Tanh", ["a"], ["b"], name="tanh_b"),
             helper.make_node("Add", ["b", "w"], ["c"], name="add_c"),
             helper.make_node("Sigmoid", ["c"], ["y"], name="sig_y"), *extra_nodes]
    g = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8]), *extra_outputs], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


@pytest.fixture
def wrong_tanh():
    """A Tanh kernel 1.5x too large, preferred over every other; removed afterwards."""
    @opwarden.kernel("Tanh", dtypes=["float32"], priority=10**6, name=WRONG)
    def _wrong(x):
        return (np.tanh(x) * np.float32(1.5)).astype(np.float32)

    yield
    op = REGISTRY.latest("Tanh", "")
    op.variants = [v for v in op.variants if v.name != WRONG]


def _compare(capsys, *argv):
    rc = main(["compare", *argv, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def test_a_wrong_kernel_is_named_as_the_first_divergence(tmp_path, capsys, wrong_tanh):
    rc, out = _compare(capsys, _chain(tmp_path / "m.onnx"), "--dim", "N=3")
    assert rc == 1
    first = out["first_divergence"]
    assert first["node"] == "tanh_b" and first["op_type"] == "Tanh" and first["index"] == 1
    (o,) = first["outputs"]
    assert o["name"] == "b" and o["status"] == "diverge" and o["shape"] == [3, 8]
    assert o["max_abs"] > 0.1 and 0.3 < o["max_rel"] <= 0.5 + 1e-6
    assert first["inputs"] == [{"name": "a", "shape": [3, 8], "dtype": "float32",
                                "status": "agree"}]
    assert first["inputs_agree"] is True
    assert [n["status"] for n in out["nodes"]] == ["agree", "diverge", "diverge", "diverge"]
    assert out["feeds"]["x"]["shape"] == [3, 8]
    # the human report says the same, with the table
    assert main(["compare", str(tmp_path / "m.onnx")]) == 1
    text = capsys.readouterr().out
    assert "first divergence" in text and "'tanh_b' (Tanh)" in text and "diverge (first)" in text


def test_without_the_wrong_kernel_everything_agrees(tmp_path, capsys):
    rc, out = _compare(capsys, _chain(tmp_path / "m.onnx"))
    assert rc == 0 and out["first_divergence"] is None
    assert out["summary"] == {"nodes": 4, "agree": 4, "diverge": 0, "skip": 0, "values": 4,
                              "unused_differences": 0}
    assert main(["compare", str(tmp_path / "m.onnx")]) == 0
    assert "every compared value agrees" in capsys.readouterr().out


def test_a_difference_nothing_reads_is_reported_but_no_failure(tmp_path, capsys, wrong_tanh):
    """A dangling Tanh differs; no node reads it and it is no model output."""
    side = helper.make_node("Tanh", ["x"], ["dangling"], name="side_tanh")
    rc, out = _compare(capsys, _chain(tmp_path / "m.onnx", [side]))
    # the chain's Tanh is wrong too: the first divergence is still tanh_b, not the side one
    assert rc == 1 and out["first_divergence"]["node"] == "tanh_b"
    side_row = next(n for n in out["nodes"] if n["node"] == "side_tanh")
    assert side_row["outputs"][0]["status"] == "unused" and side_row["status"] == "agree"
    assert out["summary"]["unused_differences"] == 1


def test_given_inputs_and_tolerances(tmp_path, capsys, wrong_tanh):
    x = tmp_path / "x.npy"
    np.save(x, np.full((2, 8), 1e-3, np.float32))  # tanh(1e-3) * 0.5 = 5e-4 off
    model = _chain(tmp_path / "m.onnx")
    rc, out = _compare(capsys, model, "--input", f"x={x}")
    assert rc == 0 and out["feeds"]["x"]["source"] == "file"  # within atol 1e-3
    rc, out = _compare(capsys, model, "--input", f"x={x}", "--atol", "1e-5", "--rtol", "0")
    assert rc == 1 and out["first_divergence"]["node"] == "tanh_b"


def test_random_ops_and_their_dependents_are_skipped_with_the_reason(tmp_path, capsys):
    nodes = [helper.make_node("RandomNormalLike", ["x"], ["noise"], name="rnd", seed=1.0),
             helper.make_node("Add", ["x", "noise"], ["noisy"], name="add_noise"),
             helper.make_node("Relu", ["x"], ["y"], name="relu")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [2, 3])],
                          [helper.make_tensor_value_info("y", 1, [2, 3]),
                           helper.make_tensor_value_info("noisy", 1, [2, 3])])
    path = tmp_path / "r.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    rc, out = _compare(capsys, str(path))
    assert rc == 0
    by = {n["node"]: n for n in out["nodes"]}
    assert by["rnd"]["status"] == "skip" and "random" in by["rnd"]["skip"]
    assert by["add_noise"]["status"] == "skip" and "rnd" in by["add_noise"]["skip"]
    assert by["relu"]["status"] == "agree"


def test_sequence_and_optional_values_are_compared(tmp_path, capsys):
    nodes = [helper.make_node("SplitToSequence", ["x"], ["seq"], name="split", axis=0),
             helper.make_node("SequenceAt", ["seq", "i"], ["at"], name="at"),
             helper.make_node("Optional", ["at"], ["opt"], name="opt"),
             helper.make_node("OptionalGetElement", ["opt"], ["y"], name="get")]
    i = numpy_helper.from_array(np.array(1, np.int64), "i")
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [3, 2])],
                          [helper.make_tensor_value_info("y", 1, [1, 2])], [i])
    path = tmp_path / "s.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), path)
    rc, out = _compare(capsys, str(path))
    assert rc == 0, out
    by = {n["node"]: n for n in out["nodes"]}
    assert by["split"]["outputs"][0]["dtype"] == "seq(float32)"
    assert by["split"]["outputs"][0]["shape"] == [3]
    assert all(n["status"] == "agree" for n in out["nodes"])


def test_value_verdicts():
    f = np.array([1.0, np.nan, np.inf], np.float32)
    assert compare_value(f, f.copy(), 0, 0)["status"] == "agree"
    g = np.array([1.0, 0.0, np.inf], np.float32)
    v = compare_value(f, g, 1e-3, 1e-3)
    assert v["status"] == "diverge" and "NaN" in v["detail"] and v["where"] == [1]
    assert compare_value(f, -f, 1e-3, 1e-3)["status"] == "diverge"  # the other infinity
    assert "dtype" in compare_value(f, f.astype(np.float64), 1, 1)["detail"]
    assert "shape" in compare_value(f, f[:2], 1, 1)["detail"]
    ints = np.array([1, 2, 3])
    v = compare_value(ints, np.array([1, 2, 4]), 10, 10)  # integers must be equal
    assert v["status"] == "diverge" and v["max_abs"] == 1.0 and v["where"] == [2]
    s = np.array(["a", "b"], dtype=object)
    assert compare_value(s, s.copy(), 0, 0)["status"] == "agree"
    assert compare_value([f, f], [f], 0, 0)["detail"] == "sequence length 2 vs 1"
    assert compare_value(None, None, 0, 0)["status"] == "agree"
    assert compare_value(None, f, 0, 0)["status"] == "diverge"
    near = np.array([1.0, 1e-9], np.float32)
    v = compare_value(near, np.array([1.0005, 0.0], np.float32), 1e-3, 1e-3)
    # the relative error ignores references below atol (1e-9 against 0 says nothing)
    assert v["status"] == "agree" and v["max_rel"] == pytest.approx(5e-4, rel=1e-3)


def test_a_value_onnxruntime_cannot_expose_is_skipped_with_its_reason(tmp_path, capsys,
                                                                     monkeypatch):
    """onnxruntime refusing one of the added outputs (named in its error) drops that one only."""
    import onnxruntime

    real = onnxruntime.InferenceSession

    def picky(data, *args, **kwargs):
        outs = [o.name for o in onnx.load_from_string(data).graph.output]
        if "b" in outs:
            raise RuntimeError("Node (tanh_b) output arg (b) type inference failed")
        return real(data, *args, **kwargs)

    monkeypatch.setattr(onnxruntime, "InferenceSession", picky)
    rc, out = _compare(capsys, _chain(tmp_path / "m.onnx"))
    assert rc == 0 and out["first_divergence"] is None
    by = {n["node"]: n for n in out["nodes"]}
    (b,) = by["tanh_b"]["outputs"]
    assert b["status"] == "skip" and "onnxruntime cannot expose it" in b["detail"]
    assert by["tanh_b"]["status"] == "skip"
    assert [by[n]["status"] for n in ("relu_a", "add_c", "sig_y")] == ["agree"] * 3
