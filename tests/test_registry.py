"""Kernel registry: deterministic, explainable selection; user variants; decomposition."""

from __future__ import annotations

import numpy as np
import pytest

import opwarden as ow
from opwarden.ops import REGISTRY
from tests.models import one_node, small_cnn


@pytest.fixture
def relu_model():
    # an operator with no fast variant, so the reference is the default
    return one_node("Atan", [("x", 1, [4])], [("y", 1, [4])], opset=17)


@pytest.fixture
def scratch_variants():
    """Remove any variant a test registers."""
    before = {id(o): list(o.variants) for o in REGISTRY.all()}
    yield
    for o in REGISTRY.all():
        if id(o) in before:
            o.variants = before[id(o)]


def test_reference_variant_chosen_by_default(relu_model):
    s = ow.InferenceSession(relu_model)
    (row,) = s.explain()
    assert row["variant"] == "atan.ref" and row["device"] == "cpu"


def test_user_kernel_overrides_with_priority(relu_model, scratch_variants):
    calls = []

    @ow.kernel("Atan", device="cpu", dtypes=["float32"], priority=10, name="atan.cpu.test")
    def relu_test(X):
        calls.append(X.shape)
        return np.maximum(X, 0)

    s = ow.InferenceSession(relu_model)
    (row,) = s.explain()
    assert row["variant"] == "atan.cpu.test"
    reasons = {r["variant"]: r["reason"] for r in row["rejected"]}
    assert "priority" in reasons["atan.ref"]
    (y,) = s.run(None, {"x": np.array([-1, 2, -3, 4], np.float32)})
    np.testing.assert_array_equal(y, [0, 2, 0, 4])
    assert calls == [(4,)]


def test_dtype_and_when_rejections_are_recorded(scratch_variants):
    @ow.kernel("Atan", dtypes=["float16"], priority=5, name="atan.cpu.half")
    def relu_half(X):
        return np.maximum(X, 0)

    @ow.kernel("Atan", priority=6, name="atan.cpu.bigonly", when=lambda X: X.shape[0] > 100)
    def relu_big(X):
        return np.maximum(X, 0)

    s = ow.InferenceSession(one_node("Atan", [("x", 1, [4])], [("y", 1, [4])]))
    (row,) = s.explain()
    assert row["variant"] == "atan.ref"
    reasons = {r["variant"]: r["reason"] for r in row["rejected"]}
    assert "float32 not in ['float16']" in reasons["atan.cpu.half"]
    assert "when-predicate is false" in reasons["atan.cpu.bigonly"]


def test_selection_is_deterministic_on_equal_priority(relu_model, scratch_variants):
    for name in ("atan.cpu.b", "atan.cpu.a"):
        ow.kernel("Atan", priority=3, name=name)(lambda X: np.maximum(X, 0))
    picks = {ow.InferenceSession(relu_model).explain()[0]["variant"] for _ in range(3)}
    assert picks == {"atan.cpu.a"}


def test_kernel_for_unknown_op_is_a_contract_error():
    with pytest.raises(ow.ContractError):
        ow.kernel("NoSuchOp")(lambda X: X)


def test_version_dispatch_softmax_1_vs_13():
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    old = ow.InferenceSession(one_node("Softmax", [("x", 1, [2, 3, 4])], [("y", 1, None)], opset=9))
    new = ow.InferenceSession(
        one_node("Softmax", [("x", 1, [2, 3, 4])], [("y", 1, None)], opset=13)
    )
    (y_old,) = old.run(None, {"x": x})
    (y_new,) = new.run(None, {"x": x})
    # Softmax-1 (axis=1) normalizes over the flattened trailing 3*4 block; Softmax-13 over axis -1.
    np.testing.assert_allclose(y_old.reshape(2, -1).sum(1), 1, rtol=1e-5)
    np.testing.assert_allclose(y_new.sum(-1), 1, rtol=1e-5)
    assert old.model.graph.nodes[0].opdef.since == 1
    assert new.model.graph.nodes[0].opdef.since == 13


def test_node_without_implementation_is_decomposed(monkeypatch):
    """Hide HardSwish's implementation: the runtime rewrites it through its ONNX function body."""
    key = ("", "HardSwish")
    monkeypatch.setitem(REGISTRY._ops, key, [])
    m = one_node("HardSwish", [("x", 1, [5])], [("y", 1, [5])], opset=17)
    s = ow.InferenceSession(m)
    rows = s.explain()
    assert len(rows) > 1 and all(r["decomposed_from"] == "n0" for r in rows)
    x = np.linspace(-4, 4, 5).astype(np.float32)
    (y,) = s.run(None, {"x": x})
    np.testing.assert_allclose(y, x * np.clip(x / 6 + 0.5, 0, 1), rtol=1e-6)


def test_no_variant_and_no_function_body_is_unsupported(monkeypatch):
    monkeypatch.setitem(REGISTRY._ops, ("", "Sin"), [])
    m = one_node("Sin", [("x", 1, [4])], [("y", 1, [4])], opset=17)
    with pytest.raises(ow.UnsupportedOpError, match=r"'n0'.*Sin at opset 17.*float32"):
        ow.InferenceSession(m)


def test_custom_op_declared_in_python_runs():
    @ow.op(
        "ScaleBy",
        domain="test.core",
        inputs=["X: T"],
        outputs=["Y: T"],
        types={"T": ["float32", "float64"]},
        attrs={"k": 2.0},
        contract=ow.Contract(nan="propagate"),
    )
    def ScaleBy(X, *, k=2.0):
        return X * X.dtype.type(k)

    m = one_node("ScaleBy", [("x", 1, [3])], [("y", 1, [3])], domain="test.core", k=3.0)
    (y,) = ow.InferenceSession(m).run(None, {"x": np.ones(3, np.float32)})
    np.testing.assert_array_equal(y, [3, 3, 3])
    bad = one_node("ScaleBy", [("x", 7, [3])], [("y", 7, [3])], domain="test.core")
    with pytest.raises(ow.ModelError, match="int64"):
        ow.InferenceSession(bad)


def test_every_operator_has_a_schema_and_reference():
    for o in REGISTRY.all():
        assert o.variants[0].reference
        assert o.schema_for(o.since if o.custom_schema is None else 1).op_type == o.op_type


def test_onnxruntime_provider_alias():
    s = ow.InferenceSession(small_cnn(), providers=["CPUExecutionProvider"])
    assert s.get_providers() == ["CPUExecutionProvider"]  # onnxruntime's name, as ORT reports
    assert [i.name for i in s.get_inputs()] == ["x"]
    assert s.get_inputs()[0].type == "tensor(float)"
    assert s.get_outputs()[0].shape == ["N", 5]
