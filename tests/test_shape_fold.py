"""Shape arithmetic folded per signature (execute/shapes.py): recorded on a signature's first
compiled run, skipped from its second on, checked at each Shape of a computed tensor."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import opwarden as ow
from opwarden.execute.shapes import FOLD_VALUE_BYTES, ShapeMiss, candidates

F32 = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "g", inputs, outputs,
                          initializer=[numpy_helper.from_array(np.asarray(a), n)
                                       for n, a in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def _reshape_heads():
    """x [B, S, 8] -> [B, S, 2, 4] -> transpose -> back, the target computed from Shape(x)
    as exporters write it (Shape, Gather, Unsqueeze, Concat), plus a position-id Range."""
    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    nodes = [
        helper.make_node("Relu", ["x"], ["h"]),
        helper.make_node("Shape", ["h"], ["sh"]),
        helper.make_node("Gather", ["sh", "zero"], ["b"], axis=0),
        helper.make_node("Gather", ["sh", "one"], ["s"], axis=0),
        helper.make_node("Unsqueeze", ["b", "ax0"], ["bu"]),
        helper.make_node("Unsqueeze", ["s", "ax0"], ["su"]),
        helper.make_node("Concat", ["bu", "su", "heads"], ["target"], axis=0),
        helper.make_node("Reshape", ["h", "target"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3]),
        helper.make_node("Shape", ["t"], ["tsh"]),
        helper.make_node("Slice", ["tsh", "zero1", "two1"], ["bh"]),
        helper.make_node("Concat", ["bh", "minus1"], ["flat"], axis=0),
        helper.make_node("Reshape", ["t", "flat"], ["y"]),
        helper.make_node("Range", ["z0", "s", "o1"], ["pos"]),
        helper.make_node("Cast", ["pos"], ["posf"], to=F32),
    ]
    inits = [("zero", np.int64(0)), ("one", np.int64(1)), ("ax0", i64(0)), ("heads", i64(2, 4)),
             ("zero1", i64(0)), ("two1", i64(2)), ("minus1", i64(-1)), ("z0", np.int64(0)),
             ("o1", np.int64(1))]
    return _model(nodes, [helper.make_tensor_value_info("x", F32, ["B", "S", 8])],
                  [helper.make_tensor_value_info("y", F32, None),
                   helper.make_tensor_value_info("posf", F32, None)], inits)


def _bound(sess):
    entries = [e for e in sess.memory._cache.values() if e.bound is not None]
    assert len(entries) == 1
    return entries[0].bound


def _ort(data, feeds):
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("checks", [("contract",), ()])
def test_fold_skips_shape_steps_and_keeps_outputs(checks):
    data = _reshape_heads()
    sess = ow.InferenceSession(data, ow.SessionOptions(checks=list(checks)))
    cands = candidates(sess.program)
    folded_types = {sess.program.steps[i].placement.node.op_type for i in cands.steps}
    assert {"Shape", "Gather", "Unsqueeze", "Concat", "Slice", "Range"} <= folded_types
    assert not {"Relu", "Reshape", "Transpose"} & folded_types  # they read x's data
    rng = np.random.default_rng(0)
    for b, s in [(2, 3), (2, 3), (2, 3), (1, 5), (1, 5), (2, 3)]:
        x = rng.standard_normal((b, s, 8)).astype(np.float32)
        got = sess.run(None, {"x": x})
        for g, w in zip(got, _ort(data, {"x": x})):
            np.testing.assert_array_equal(g, w)
    bound = _bound_for(sess, (2, 3))
    assert bound.fold and bound.fold.skip == set(cands.steps)
    assert all(not v.flags.writeable for v in bound.fold.values.values())
    assert len(bound.fold.roots) == 2  # Shape(h) and Shape(t): computed tensors


def _bound_for(sess, dims):
    key = sess.memory.signature([np.empty((*dims, 8), np.float32)])[0]
    return sess.memory._cache[key].bound


def test_first_run_records_second_folds():
    data = _reshape_heads()
    sess = ow.InferenceSession(data)
    x = np.ones((2, 3, 8), np.float32)
    sess.run(None, {"x": x})
    b = _bound_for(sess, (2, 3))
    assert b.fold is None and b.recorded  # a signature run once is not compiled twice
    sess.run(None, {"x": x})
    assert b.fold and b.recorded is None
    fn = next(iter(b.lean.values()))
    assert "_rec" not in fn.source.split("try:")[1]  # the folded loop records nothing
    assert "Concat" not in fn.source and "_miss(" in fn.source


def _data_dependent():
    """NonZero's output shape depends on x's values, not its shape: a Shape of it is a root
    whose recorded shape a later run of the same signature contradicts."""
    nodes = [
        helper.make_node("Greater", ["x", "zero"], ["pos"]),
        helper.make_node("NonZero", ["pos"], ["nz"]),
        helper.make_node("Shape", ["nz"], ["sh"]),
        helper.make_node("ConstantOfShape", ["sh"], ["fill"],
                         value=numpy_helper.from_array(np.array([1.5], np.float32))),
        helper.make_node("ReduceSum", ["fill"], ["y"], keepdims=0),
    ]
    return _model(nodes, [helper.make_tensor_value_info("x", F32, ["N"])],
                  [helper.make_tensor_value_info("y", F32, None)],
                  [("zero", np.float32(0.0))])


def test_a_contradicted_fold_is_dropped_and_the_run_is_right():
    data = _data_dependent()
    sess = ow.InferenceSession(data)
    runs = [np.array([1, -1, 2, 3], np.float32)] * 3 + [np.array([-1, -1, 2, -3], np.float32),
                                                         np.array([1, 1, 1, 1], np.float32)]
    key = sess.memory.signature([runs[0]])[0]
    for k, x in enumerate(runs):
        got = sess.run(None, {"x": x})[0]
        assert got == pytest.approx(1.5 * (x > 0).sum()), x
        if k == 2:
            assert sess.memory._cache[key].bound.fold  # folded for 3 positives
    assert sess.memory._cache[key].bound.fold is False  # dropped after the contradiction
    assert not sess.guard.faults  # a contradicted fold is no kernel fault


def test_shape_miss_names_the_step():
    e = ShapeMiss(3, (1, 2), (1, 3))
    assert e.step == 3 and "(1, 2)" in str(e)


def test_guarded_and_traced_runs_execute_every_step(tmp_path):
    data = _reshape_heads()
    sess = ow.InferenceSession(data, ow.SessionOptions(checks=["nan"]))
    x = np.ones((2, 3, 8), np.float32)
    for _ in range(3):
        got = sess.run(None, {"x": x})
    np.testing.assert_array_equal(got[0], _ort(data, {"x": x})[0])
    b = _bound_for(sess, (2, 3))
    assert b is None or not b.fold  # the guarded loop neither records nor folds


def test_large_values_are_not_folded():
    """A shape-derived value past FOLD_VALUE_BYTES (a big ConstantOfShape) runs every time;
    what reads it is not folded either."""
    n = FOLD_VALUE_BYTES // 4 + 16
    nodes = [
        helper.make_node("Shape", ["x"], ["sh"]),
        helper.make_node("ConstantOfShape", ["sh"], ["big"],
                         value=numpy_helper.from_array(np.array([2.0], np.float32))),
        helper.make_node("Shape", ["big"], ["sh2"]),
        helper.make_node("Mul", ["x", "big"], ["y"]),
    ]
    data = _model(nodes, [helper.make_tensor_value_info("x", F32, ["N"])],
                  [helper.make_tensor_value_info("y", F32, None),
                   helper.make_tensor_value_info("sh2", TensorProto.INT64, None)])
    sess = ow.InferenceSession(data)
    x = np.arange(n, dtype=np.float32)
    for _ in range(3):
        y, sh2 = sess.run(None, {"x": x})
        np.testing.assert_array_equal(y, 2 * x)
        assert sh2.tolist() == [n]
    b = sess.memory._cache[sess.memory.signature([x])[0]].bound
    kinds = {sess.program.steps[i].placement.node.op_type for i in (b.fold.skip if b.fold else ())}
    assert "ConstantOfShape" not in kinds
