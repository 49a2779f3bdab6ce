"""The fused operators: reference kernels equal the unfused nodes; the in-place variant equals
the reference; schemas, contracts and shape rules."""

from __future__ import annotations

import numpy as np
import pytest

from opwarden.contract import TensorFact
from opwarden.errors import KernelError
from opwarden.ops import REGISTRY
from opwarden.ops import activation as act
from opwarden.ops import elementwise as ew
from opwarden.ops.conv import Conv
from opwarden.ops.fused import FusedConv, FusedGemm, FusedMatMul
from opwarden.ops.fused_elementwise import (
    FusedElementwise,
    fused_elementwise_inplace,
    parse_program,
)
from opwarden.ops.linalg import Gemm, MatMul

rng = np.random.default_rng(3)


def _r(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_registered_in_opwarden_domain():
    for name in ("FusedConv", "FusedGemm", "FusedMatMul", "FusedElementwise"):
        (opdef,) = REGISTRY.versions(name, "opwarden")
        assert opdef.since == 1 and opdef.custom_schema is not None and opdef.infer_fn
    assert REGISTRY.latest("FusedConv", "opwarden").contract.layout == "NCHW"


@pytest.mark.parametrize("activation, params, unfused", [
    ("", [], lambda y: y),
    ("Relu", [], act.Relu),
    ("LeakyRelu", [0.3], lambda y: act.LeakyRelu(y, alpha=0.3)),
    ("Clip", [-0.5, 0.5], lambda y: act.Clip(y, np.float32(-0.5), np.float32(0.5))),
    ("Sigmoid", [], act.Sigmoid),
    ("HardSwish", [], act.HardSwish),
    ("Gelu", [1.0], lambda y: act.Gelu(y, approximate="tanh")),
    ("Tanh", [], act.Tanh),
])
def test_fused_conv_is_conv_add_activation(activation, params, unfused):
    x, w, b, z = _r(2, 4, 7, 7), _r(6, 2, 3, 3), _r(6), _r(2, 6, 4, 4)
    kw = {"group": 2, "strides": [2, 2], "pads": [1, 1, 1, 1]}
    got = FusedConv(x, w, b, z, activation=activation, activation_params=params, **kw)
    want = unfused(ew.Add(Conv(x, w, b, **kw), z))
    np.testing.assert_array_equal(got, want)
    fact = FusedConv.infer_fn(TensorFact("float32", x.shape), TensorFact("float32", w.shape),
                              **kw)
    assert fact.shape == got.shape


def test_fused_gemm_and_matmul():
    a, b, c = _r(3, 5), _r(4, 5), _r(4)
    got = FusedGemm(a, b, c, transB=1, alpha=0.5, activation="Relu")
    np.testing.assert_array_equal(got, act.Relu(Gemm(a, b, c, transB=1, alpha=0.5)))
    assert FusedGemm.infer_fn(TensorFact("float32", (3, 5)), TensorFact("float32", (4, 5)),
                              transB=1).shape == (3, 4)
    a3, b2, c1 = _r(2, 3, 5), _r(5, 4), _r(4)
    got = FusedMatMul(a3, b2, c1, activation="Sigmoid")
    np.testing.assert_array_equal(got, act.Sigmoid(ew.Add(MatMul(a3, b2), c1)))
    fact = FusedMatMul.infer_fn(TensorFact("float32", (2, 3, 5)), TensorFact("float32", (5, 4)),
                                TensorFact("float32", (4,)))
    assert fact.shape == (2, 3, 4)


PROGRAMS = [
    ("t0=mul(x0,x1);t1=add(t0,x2);t2=relu(t1)",
     lambda a, b, c: act.Relu(ew.Add(ew.Mul(a, b), c))),
    ("t0=sigmoid(x0);t1=mul(x0,t0)", lambda a, b, c: ew.Mul(a, act.Sigmoid(a))),
    ("t0=add(x0,x1);t1=sub(x0,x2);t2=div(t0,t1);t3=clip(t2,-1.0,1.0)",
     lambda a, b, c: act.Clip(ew.Div(ew.Add(a, b), ew.Sub(a, c)), np.float32(-1), np.float32(1))),
    ("t0=leakyrelu(x0,0.1);t1=hardswish(t0);t2=hardsigmoid(t1,0.2,0.5);t3=max(t2,x1)",
     lambda a, b, c: ew.Max(act.HardSigmoid(act.HardSwish(act.LeakyRelu(a, alpha=0.1))), b)),
    # One-sided clips (Clip without min or max): infinite bounds in the program text.
    ("t0=exp(x0);t1=clip(t0,-inf,1.5);t2=clip(t1,0.5,inf);t3=add(t2,x1)",
     lambda a, b, c: ew.Add(act.Clip(ew.Exp(a), np.float32(0.5), np.float32(1.5)), b)),
    ("t0=abs(x0);t1=sqrt(t0);t2=log(t1);t3=exp(t2);t4=neg(t3);t5=tanh(t4);t6=reciprocal(t5);"
     "t7=min(t6,x2)",
     lambda a, b, c: ew.Min(ew.Reciprocal(act.Tanh(ew.Neg(ew.Exp(ew.Log(ew.Sqrt(ew.Abs(a))))))),
                            c)),
]


@pytest.mark.parametrize("program, unfused", PROGRAMS, ids=[p[0][:30] for p in PROGRAMS])
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (1, 16, 32, 32), ()])
def test_fused_elementwise_reference_and_inplace(program, unfused, shape):
    x = _r(*shape)
    b = _r(*shape[1:2], *([1] * max(len(shape) - 2, 0))) if shape else _r()
    c = _r(*shape[-1:])
    want = unfused(x, b, c)
    ref = FusedElementwise(x, b, c, program=program)
    np.testing.assert_array_equal(ref, want)
    fast = fused_elementwise_inplace(x, b, c, program=program)
    np.testing.assert_allclose(fast, want, rtol=2e-6, atol=1e-6)
    out = np.empty(want.shape, np.float32)
    assert fused_elementwise_inplace(x, b, c, program=program, out=out) is out
    np.testing.assert_allclose(out, want, rtol=2e-6, atol=1e-6)


def test_fused_elementwise_inputs_untouched_and_nan():
    x = np.array([np.nan, -1.0, 2.0], np.float32)
    keep = x.copy()
    y = fused_elementwise_inplace(x, program="t0=relu(x0);t1=sigmoid(t0);t2=mul(t1,x0)")
    np.testing.assert_array_equal(x, keep)
    assert np.isnan(y[0]) and y[1] == -0.5 and abs(y[2] - 2 / (1 + np.exp(-2.0))) < 1e-6


@pytest.mark.parametrize("bad", ["", "t0=frob(x0)", "t0=add(x0)", "t1=relu(t0)", "y=relu(x0)",
                                 "t0=clip(x0,1)"])
def test_bad_programs_are_rejected(bad):
    with pytest.raises(KernelError):
        parse_program(bad)
    contract = REGISTRY.latest("FusedElementwise", "opwarden").contract
    assert not contract.allowed["program"].accepts(bad)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_elementwise_small_outputs_shape_their_operands(dtype):
    """Small outputs: an input of the output's size but another shape is reshaped, one read
    three times expanded, Relu compared against zeros; results equal the unfused ops exactly,
    NaN and -0.0 included, with the inputs untouched."""
    x = rng.standard_normal((1, 2, 8)).astype(dtype)
    x[0, 0, :3] = [np.nan, -0.0, 0.0]
    same = rng.standard_normal(8 * 2).astype(dtype).reshape(2, 8)  # size 16, like the output
    row = rng.standard_normal(8).astype(dtype)  # broadcast, read three times
    keep = [a.copy() for a in (x, same, row)]
    prog = ("t0=add(x0,x2);t1=relu(t0);t2=mul(t1,x2);t3=sub(t2,x1);t4=relu(t3);"
            "t5=max(t4,x2);t6=div(t5,x1)")
    want = ew.Div(ew.Max(act.Relu(ew.Sub(ew.Mul(act.Relu(ew.Add(x, row)), row), same)), row), same)
    for _ in range(2):  # the second call takes the cached setup
        got = fused_elementwise_inplace(x, same, row, program=prog)
        assert got.shape == want.shape == (1, 2, 8)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    for a, k in zip((x, same, row), keep):
        np.testing.assert_array_equal(a, k)
