"""A model's declared shapes (value_info, graph-output types) never make a correct kernel fault.

Shape inference runs without the declarations; what it infers is the fact kernels are held to.
A declaration contradicting it is noted once at load (ORT: "Falling back to lenient merge");
dims only a declaration gives are hints that nothing plans from or checks against; a graph
output differing from its declared shape warns once (ORT: "Expected shape from model of ...").
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper

import opwarden as ow
from opwarden.contract import TensorFact, declared_value, verified
from opwarden.ir.load import load
from opwarden.ops import REGISTRY

F32 = TensorProto.FLOAT


def _chain(xin, decl_mid, decl_out) -> bytes:
    """y = Neg(Relu(x)), m = Relu(x) declared in value_info when decl_mid is given."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["m"], name="relu"),
         helper.make_node("Neg", ["m"], ["y"], name="neg")], "g",
        [helper.make_tensor_value_info("x", F32, xin)],
        [helper.make_tensor_value_info("y", F32, decl_out)],
        value_info=[helper.make_tensor_value_info("m", F32, decl_mid)] if decl_mid else [])
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


CASES = {
    "intermediate pins N": (["N", 3], [5, 3], ["N", 3]),
    "output pins N": (["N", 3], None, [7, 3]),
    "no input shape": (None, [5, 5], None),
    "intermediate pins M": (["N", "M"], ["N", 4], None),
    "static output contradicted": ([2, 3], None, [5, 5]),
}
PATHS = {
    "lean": {},
    "unfused": {"optimization_level": 0},
    "guarded": {"checks": ["contract", "nan"]},
    "parallel": {"inter_op_num_threads": 2},
}


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("case", list(CASES))
def test_a_stale_declaration_is_no_fault(case, path):
    ort = pytest.importorskip("onnxruntime")
    model = _chain(*CASES[case])
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        sess = ow.InferenceSession(model, **PATHS[path])
        got = [sess.run(None, {"x": x})[0] for _ in range(2)]
    so = ort.SessionOptions()
    so.log_severity_level = 3  # ORT's own merge warnings
    (want,) = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(
        None, {"x": x})
    assert want.shape == (2, 3)
    for y in got:
        np.testing.assert_array_equal(y, want)
    assert sess.faults == []
    assert sess.health()["quarantine"] == {}


def test_a_contradicting_declaration_is_one_note_and_one_warning():
    model = _chain([2, 3], None, [5, 5])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        sess = ow.InferenceSession(model)
        for _ in range(3):
            sess.run(None, {"x": np.ones((2, 3), np.float32)})
    msgs = [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]
    assert len(msgs) == 1, msgs
    assert "'y'" in msgs[0] and "[5, 5]" in msgs[0] and "[2, 3]" in msgs[0]
    assert len(sess.model.notes) == 1 and "'y'" in sess.model.notes[0]
    y = next(v for v in sess.model.graph.values.values() if v.name == "y")
    assert y.fact.shape == (2, 3)  # the inferred fact won


def test_an_intermediate_contradiction_is_noted_once():
    model = _chain([2, 3], [2, 4], None)
    with pytest.warns(RuntimeWarning, match=r"value 'm'.*\[2, 4\].*\[2, 3\]") as seen:
        m = load(model)
    assert len([w for w in seen if issubclass(w.category, RuntimeWarning)]) == 1
    assert m.notes == [m.notes[0]] and "'m'" in m.notes[0]


def test_an_output_pinning_a_symbol_warns_once_at_run_time():
    sess = ow.InferenceSession(_chain(["N", 3], None, [7, 3]))
    assert sess.model.notes == []  # 7 may be N: nothing to note at load
    with pytest.warns(RuntimeWarning, match=r"\{7,3\}.*\{2,3\}.*'y'"):
        sess.run(None, {"x": np.ones((2, 3), np.float32)})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sess.run(None, {"x": np.ones((2, 3), np.float32)})  # once only
        sess.run(None, {"x": np.ones((7, 3), np.float32)})


def test_dims_only_declared_are_marked_hints():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        sess = ow.InferenceSession(_chain(None, [5, 5], None), optimization_level=0)
        (y,) = sess.run(None, {"x": np.ones((2, 3), np.float32)})
    assert y.shape == (2, 3)
    m = sess.model.graph.values["m"]
    assert [declared_value(d) for d in m.fact.shape] == [5, 5]
    assert not any(verified(d) for d in m.fact.shape)
    assert not m.fact.static  # no shape folding, no memory-limit shortcut from a declaration


OUTS: list = []  # (step name, whether the kernel was handed an out= buffer)


def _declared_op():
    """Twice: a custom op without a shape rule whose fast variant writes into out=."""
    key = ("test.declared", "Twice")
    if REGISTRY._ops.get(key):
        return

    @ow.op("Twice", domain="test.declared", inputs=["X: T"], outputs=["Y: T"],
           types={"T": ["float32"]}, contract=ow.Contract(nan="propagate"))
    def Twice(X):
        return X * np.float32(2)

    @Twice.kernel(device="cpu", name="twice.cpu.out", priority=10, accepts_out=True)
    def twice_out(X, *, out=None):
        OUTS.append(out is not None)
        return np.multiply(X, np.float32(2), out=out)


@pytest.mark.parametrize("path", ["lean", "guarded", "parallel"])
@pytest.mark.parametrize("declared", [[5, 5], [1, 3], [4, 3], [2, 3, 1], [2, 3]])
def test_a_custom_op_with_a_wrong_declared_shape_runs(declared, path):
    _declared_op()
    graph = helper.make_graph(
        [helper.make_node("Twice", ["x"], ["t"], domain="test.declared", name="twice"),
         helper.make_node("Twice", ["t"], ["u"], domain="test.declared", name="again"),
         helper.make_node("Neg", ["u"], ["n"], name="neg"),
         helper.make_node("Relu", ["n"], ["y"], name="relu")], "g",
        [helper.make_tensor_value_info("x", F32, ["N", 3])],
        [helper.make_tensor_value_info("y", F32, None)],
        value_info=[helper.make_tensor_value_info("t", F32, declared),
                    helper.make_tensor_value_info("u", F32, declared)])
    model = helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("test.declared", 1)])
    opts = {"lean": {}, "guarded": {"checks": ["contract", "nan"]},
            "parallel": {"inter_op_num_threads": 2}}[path]
    sess = ow.InferenceSession(model.SerializeToString(), optimization_level=0, **opts)
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 3
    OUTS.clear()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(3):
            (y,) = sess.run(None, {"x": x})
            np.testing.assert_array_equal(y, np.maximum(-4 * x, 0))
    assert sess.faults == []
    assert sess.health()["quarantine"] == {}
    # A buffer sized from the declaration is handed over only after a run confirmed it (the
    # guarded loop never hands it over).
    right = declared == [2, 3] and path != "guarded"
    assert OUTS[:2] == [False, False] and set(OUTS[2:]) == ({True} if right else {False})
    msgs = [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]
    if path != "guarded":
        assert len(msgs) == (0 if right else 2), msgs  # t and u, once each


def test_a_custom_shape_rule_overrides_the_declaration():
    key = ("test.declared", "Widen")
    if not REGISTRY._ops.get(key):
        @ow.op("Widen", domain="test.declared", inputs=["X: T"], outputs=["Y: T"],
               types={"T": ["float32"]}, contract=ow.Contract(nan="propagate"))
        def Widen(X):
            return np.concatenate([X, X], axis=-1)

        @Widen.infer
        def _widen(x, **_):
            return TensorFact(x.dtype, None if x.shape is None else
                              (*x.shape[:-1], x.shape[-1] * 2))

    graph = helper.make_graph(
        [helper.make_node("Widen", ["x"], ["w"], domain="test.declared", name="widen"),
         helper.make_node("Neg", ["w"], ["y"], name="neg")], "g",
        [helper.make_tensor_value_info("x", F32, [2, 3])],
        [helper.make_tensor_value_info("y", F32, None)],
        value_info=[helper.make_tensor_value_info("w", F32, [2, 5])])
    model = helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("test.declared", 1)])
    with pytest.warns(RuntimeWarning, match=r"'w'.*\[2, 5\].*rule.*\[2, 6\]"):
        sess = ow.InferenceSession(model.SerializeToString())
    assert sess.model.graph.values["w"].fact.shape == (2, 6)
    (y,) = sess.run(None, {"x": np.ones((2, 3), np.float32)})
    assert y.shape == (2, 6) and sess.faults == []


def _doubled_batch(X):
    return np.concatenate([np.maximum(X, 0)] * 2)


@pytest.mark.parametrize("path", ["lean", "guarded"])
def test_a_wrong_kernel_is_still_blamed_where_the_shape_is_inferred(path):
    # m's declaration pins N to 5 (a hint); N itself is bound from the feed and checked.
    op = REGISTRY.latest("Relu")
    before = list(op.variants)
    ow.kernel("Relu", priority=100, name="relu.cpu.doubled")(_doubled_batch)
    try:
        opts = {"checks": ["contract", "nan"]} if path == "guarded" else {}
        sess = ow.InferenceSession(_chain(["N", 3], [5, 3], ["N", 3]),
                                   optimization_level=0, **opts)
        x = np.ones((2, 3), np.float32)
        (y,) = sess.run(None, {"x": x})
        np.testing.assert_array_equal(y, -x)
    finally:
        op.variants = before
    (fault,) = sess.faults
    assert (fault.node, fault.check) == ("relu", "shape")
    assert "relu.cpu.doubled" in sess.health()["quarantine"]
