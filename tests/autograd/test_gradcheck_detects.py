"""gradcheck catches wrong backward rules; the rule protocol is enforced with clear errors."""

from __future__ import annotations

import numpy as np
import pytest

import opwarden
from opwarden.errors import ContractError
from opwarden.ops import REGISTRY
from opwarden.verify.grads import gradcheck


def _op(name: str):
    @opwarden.op(name, domain="test.grad", inputs=["X: T", "Y: T"], outputs=["Z: T"],
                 types={"T": ["float32", "float64"]}, attrs={"alpha": 2.0})
    def f(X, Y, *, alpha=2.0):
        return np.sin(X) * Y * alpha

    return f


X = np.linspace(-1, 1, 6).reshape(2, 3)
Y = np.linspace(0.5, 2, 6).reshape(2, 3)


def test_correct_custom_rule_passes():
    f = _op("GoodGrad")

    @f.grad
    def _(ctx, dZ, *, alpha=2.0):
        x, y = ctx.inputs
        return dZ * np.cos(x) * y * alpha, dZ * np.sin(x) * alpha

    res = gradcheck(f, [X, Y], {"alpha": 3.0})
    assert res.ok, res.detail
    assert res.max_error < 1e-6


def test_wrong_rule_is_detected():
    f = _op("WrongGrad")

    @f.grad
    def _(ctx, dZ, *, alpha=2.0):
        x, y = ctx.inputs
        return dZ * np.cos(x) * y, dZ * np.sin(x) * alpha  # forgot alpha in the first

    res = gradcheck(f, [X, Y])
    assert not res.ok
    assert "input 0" in res.detail and "differ" in res.detail
    assert res.max_error > 0.1


def test_slightly_wrong_builtin_rule_is_detected():
    tanh = REGISTRY.latest("Tanh")
    good = tanh.grad_fn
    try:
        tanh.grad(lambda ctx, dY, **a: (dY * (1 - ctx.outputs[0] ** 2) * 1.01,))
        assert not gradcheck(tanh, [X]).ok
    finally:
        tanh.grad(good)
    assert gradcheck(tanh, [X]).ok


def test_missing_gradient_for_a_differentiable_input_is_detected():
    f = _op("NoneGrad")

    @f.grad
    def _(ctx, dZ, *, alpha=2.0):
        x, y = ctx.inputs
        return dZ * np.cos(x) * y * alpha, None

    res = gradcheck(f, [X, Y])
    assert not res.ok and "input 1" in res.detail and "None" in res.detail


def test_wrong_count_is_a_contract_error():
    f = _op("CountGrad")

    @f.grad
    def _(ctx, dZ, *, alpha=2.0):
        return (dZ,)

    res = gradcheck(f, [X, Y])
    assert not res.ok
    assert "CountGrad" in res.detail and "returned 1 gradient" in res.detail

    from opwarden.autograd import GradContext, call_rule

    ctx = GradContext([X, Y], [f(X, Y)], {"alpha": 2.0}, op=f)
    with pytest.raises(ContractError, match="CountGrad.*exactly one per input: 2"):
        call_rule(f, ctx, [np.ones((2, 3))])


def test_wrong_dtype_and_shape_are_flagged():
    f = _op("DtypeGrad")

    @f.grad
    def _(ctx, dZ, *, alpha=2.0):
        x, y = ctx.inputs
        return (dZ * np.cos(x) * y * alpha).astype(np.float32), dZ * np.sin(x) * alpha

    res = gradcheck(f, [X, Y])
    assert not res.ok and "dtype" in res.detail

    g = _op("ShapeGrad")

    @g.grad
    def _(ctx, dZ, *, alpha=2.0):
        return dZ.sum(axis=0), dZ

    res = gradcheck(g, [X, Y])
    assert not res.ok and "shape" in res.detail


def test_no_rule():
    f = _op("NoRule")
    res = gradcheck(f, [X, Y])
    assert not res.ok and "no backward rule" in res.detail


def test_variant_and_large_inputs():
    relu = REGISTRY.latest("Relu")
    x = np.random.default_rng(0).standard_normal(5000)
    res = gradcheck(relu.variants[0], [x], max_points=64)
    assert res.ok, res.detail
    # Exactly at the kink the derivative does not exist: skipped, not failed.
    res = gradcheck(relu, [np.array([-1.0, 0.0, 1.0])])
    assert res.ok and "1 element(s) at non-differentiable points skipped" in res.detail
