"""Chunked float32 activations (opwarden/kernels/activation.py) against the reference kernels
and, where they compute differently (Softplus, Mish), against float64."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import opwarden as ow
from opwarden.errors import KernelError
from opwarden.kernels.cpu import activation as kact
from opwarden.kernels.cpu import util as kutil
from opwarden.ops.base import REGISTRY

SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, -100.0, 100.0, 1e-30, -1e-30, 88.8,
                     -88.8, 3.0, -3.0, 1.0, 2.5, -2.5], np.float32)
# Attributes beyond the defaults, per operator.
ATTRS = {
    "Elu": [{}, {"alpha": 0.5}, {"alpha": -2.0}],
    "Selu": [{}, {"alpha": 1.5, "gamma": 2.0}],
    "Celu": [{}, {"alpha": 0.25}, {"alpha": -1.5}],
    "ThresholdedRelu": [{}, {"alpha": 0.0}, {"alpha": -1.0}, {"alpha": 2.5}],
    "HardSigmoid": [{}, {"alpha": 1.0 / 6, "beta": 0.5}, {"alpha": -0.3, "beta": 0.1}],
}


def data(shape, seed=0):
    x = (np.random.default_rng(seed).standard_normal(shape) * 6).astype(np.float32)
    flat = x.reshape(-1)
    flat[:min(flat.size, SPECIALS.size)] = SPECIALS[:flat.size]
    return x


def reference(op_type, x, **attrs):
    return REGISTRY.versions(op_type)[-1].reference(x, **attrs)


def close(got, want, op_type):
    # Elu/Selu/Celu/Softsign/ThresholdedRelu/HardSigmoid/HardSwish take the reference's own
    # float32 operations; Softplus/Mish a different (few-ulp) form; Sigmoid flushes below 2^-127.
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-37)


CASES = [(op, attrs) for op in kact.KERNELS for attrs in ATTRS.get(op, [{}])]


@pytest.mark.parametrize("op_type,attrs", CASES)
@pytest.mark.parametrize("shape", [(16,), (3, 7), (300, 500), (2, 70000), (), (0, 4)])
def test_matches_reference(op_type, attrs, shape):
    fn = kact.KERNELS[op_type][0]
    x = data(shape)
    close(fn(x, **attrs), reference(op_type, x, **attrs), op_type)


@pytest.mark.parametrize("op_type", kact.KERNELS)
def test_into_the_planned_buffer_in_place_and_strided(op_type):
    fn = kact.KERNELS[op_type][0]
    x = data((400, 300), seed=1)
    want = reference(op_type, x)
    out = np.empty_like(x)
    assert fn(x, out=out) is out
    close(out, want, op_type)
    inplace = x.copy()
    assert fn(inplace, out=inplace) is inplace  # may_alias (0, 0): Y over X
    close(inplace, want, op_type)
    # A slice of a Concat's output: outer axis strided, last axis contiguous.
    big = np.full((400, 500), 7.0, np.float32)
    view = big[:, 100:400]
    fn(x, out=view)
    close(view, want, op_type)
    assert np.all(big[:, :100] == 7) and np.all(big[:, 400:] == 7)


def test_softplus_and_mish_stay_within_a_few_ulp_of_float64():
    x = np.concatenate([
        np.linspace(-105, 105, 200001, dtype=np.float32),
        np.geomspace(1e-38, 1e-3, 5000).astype(np.float32),
        -np.geomspace(1e-38, 1e-3, 5000).astype(np.float32),
    ])
    x64 = x.astype(np.float64)
    for fn, truth in ((kact.softplus, np.logaddexp(0.0, x64)),
                      (kact.mish, x64 * np.tanh(np.logaddexp(0.0, x64)))):
        got = fn(x).astype(np.float64)
        # In ulp where softplus is a normal float32 (x > -87); below, e^x is subnormal and
        # float32 itself keeps only a few bits: within a few of the smallest subnormals.
        normal = (x > -87) & (np.abs(truth) >= np.finfo(np.float32).tiny)
        scale = np.spacing(np.abs(truth[normal]).astype(np.float32)).astype(np.float64)
        ulp = np.abs(got[normal] - truth[normal]) / scale
        assert ulp.max() <= 8, (fn.__name__, float(ulp.max()), float(x[normal][np.argmax(ulp)]))
        assert np.abs(got[~normal] - truth[~normal]).max() <= 1e-37, fn.__name__


def test_non_finite_attributes_go_to_the_reference():
    x = data((5, 6))
    np.testing.assert_array_equal(kact.elu(x, alpha=np.inf), reference("Elu", x, alpha=np.inf))
    got = kact.selu(x, alpha=1.0, gamma=np.nan)
    assert np.isnan(got).all() == np.isnan(reference("Selu", x, alpha=1.0, gamma=np.nan)).all()
    with pytest.raises(KernelError, match="alpha must be nonzero"):
        kact.celu(x, alpha=0.0)


def test_workspace_is_the_declared_chunks():
    x = data((300, 500))
    for op_type, (fn, ntemps) in kact.KERNELS.items():
        with kutil.scratch_probe() as got:
            fn(x)
        assert sum(got.values()) <= kutil.chunked_workspace(ntemps, x.size), op_type


def test_sessions_pick_the_chunked_variants():
    nodes = [helper.make_node("Elu", ["x"], ["a"], alpha=0.7),
             helper.make_node("Softplus", ["a"], ["b"]),
             helper.make_node("Mish", ["b"], ["c"]),
             helper.make_node("ThresholdedRelu", ["c"], ["y"], alpha=0.3)]
    graph = helper.make_graph(
        nodes, "acts", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 96])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 96])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    sess = ow.InferenceSession(model.SerializeToString())
    variants = {p.node.op_type: p.variant.name for p in sess.placements}
    assert variants == {"Elu": "elu.cpu.out", "Softplus": "softplus.cpu.out",
                        "Mish": "mish.cpu.out", "ThresholdedRelu": "thresholdedrelu.cpu.out"}
    x = data((64, 96), seed=3)
    want = reference("Elu", x, alpha=0.7)
    want = reference("ThresholdedRelu", reference("Mish", reference("Softplus", want)),
                     alpha=0.3)
    (got,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
