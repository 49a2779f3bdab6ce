"""activation_after_maxpool: a non-decreasing activation moves after the MaxPool reading it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper

import opwarden as ow

from .helpers import check_same, model, optimized, types_of

PASS = "activation_after_maxpool"


def _r(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _act(op, src, dst, opset=17, alpha=None, bounds=(-0.5, 0.7)):
    """(node, initializers) for y = op(x)."""
    if op == "LeakyRelu":
        return helper.make_node(op, [src], [dst], alpha=alpha if alpha is not None else 0.1), []
    if op == "Clip":
        if opset < 11:
            return helper.make_node(op, [src], [dst], min=bounds[0], max=bounds[1]), []
        lo, hi = f"{dst}_lo", f"{dst}_hi"
        return (helper.make_node(op, [src, lo, hi], [dst]),
                [(lo, np.float32(bounds[0])), (hi, np.float32(bounds[1]))])
    return helper.make_node(op, [src], [dst]), []


def _conv_act_pool(op="Relu", pool=None, opset=17, alpha=None, outputs_act=False):
    """x -> Conv(+bias) -> op -> MaxPool 3x3/2 (pads 1) -> y; with `outputs_act` the
    activation's output is a graph output too."""
    act, inits = _act(op, "c", "a", opset, alpha)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), act,
             pool or helper.make_node("MaxPool", ["a"], ["y"], kernel_shape=[3, 3],
                                      strides=[2, 2], pads=[1, 1, 1, 1])]
    outs = [("y", [1, 4, 4, 4])] + ([("a", [1, 4, 8, 8])] if outputs_act else [])
    return model(nodes, [("x", [1, 3, 8, 8])], outs,
                 [("w", _r(4, 3, 3, 3)), ("b", _r(4, seed=1))] + inits, opset=opset)


def _same(data, feeds):
    """Level 0's outputs with every pass on; NaN where level 0 has NaN, Inf where it has Inf."""
    want = ow.InferenceSession(data, ow.SessionOptions(optimization_level=0)).run(None, feeds)
    got = ow.InferenceSession(data).run(None, feeds)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def _moved(m) -> list[str]:
    """The op types from the first MaxPool on."""
    types = types_of(m)
    return types[types.index("MaxPool"):]


@pytest.mark.parametrize("op", ["Relu", "LeakyRelu", "Clip", "Sigmoid", "Tanh"])
@pytest.mark.parametrize("opset", [9, 17])
def test_fused_activation_moves_after_the_pool(op, opset):
    data = _conv_act_pool(op, opset=opset)
    m, report = optimized(data, disabled_passes=["elementwise_fusion"])
    by = {e["pass"]: e for e in report}
    assert by[PASS]["details"] == {f"{op} after MaxPool": 1}
    conv = next(n for n in m.graph.nodes if n.op_type == "FusedConv")
    assert "activation" not in conv.attrs
    assert _moved(m) == ["MaxPool", op]
    x = _r(1, 3, 8, 8, seed=3)
    x[0, 0, 2, 2] = np.nan
    x[0, 1, 5, 5] = np.inf
    x[0, 2, 0, 0] = -np.inf
    _same(data, {"x": x})


def test_standalone_activation_moves_and_runs_on_the_pooled_tensor():
    # No convolution before it (the activation reads the graph input): the node itself moves.
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("MaxPool", ["a"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    data = model(nodes, [("x", [1, 2, 6, 6])], [("y", [1, 2, 3, 3])])
    m, _ = optimized(data)
    assert types_of(m) == ["MaxPool", "Relu"]
    check_same(data, {"x": _r(1, 2, 6, 6)})


def test_global_max_pool_too():
    nodes = [helper.make_node("Sigmoid", ["x"], ["a"]),
             helper.make_node("GlobalMaxPool", ["a"], ["y"])]
    data = model(nodes, [("x", [2, 3, 5, 5])], [("y", [2, 3, 1, 1])])
    m, _ = optimized(data)
    assert types_of(m) == ["GlobalMaxPool", "Sigmoid"]
    check_same(data, {"x": _r(2, 3, 5, 5)})


@pytest.mark.parametrize("case", ["decreasing", "not_monotone", "same_size", "indices",
                                  "activation_read_elsewhere", "activation_is_output",
                                  "average"])
def test_left_alone(case):
    pool = None
    op, alpha, outputs_act = "Relu", None, False
    if case == "decreasing":
        op, alpha = "LeakyRelu", -0.5  # not monotone for a negative slope
    elif case == "not_monotone":
        op = "HardSwish"
    elif case == "same_size":  # a stride-1 pool: nothing to save, the fused activation stays
        pool = helper.make_node("MaxPool", ["a"], ["y"], kernel_shape=[3, 3],
                                pads=[1, 1, 1, 1])
    elif case == "indices":
        pool = helper.make_node("MaxPool", ["a"], ["y", "i"], kernel_shape=[3, 3],
                                strides=[2, 2], pads=[1, 1, 1, 1])
    elif case == "average":
        pool = helper.make_node("AveragePool", ["a"], ["y"], kernel_shape=[3, 3],
                                strides=[2, 2], pads=[1, 1, 1, 1])
    elif case == "activation_is_output":
        outputs_act = True
    data = _conv_act_pool(op, pool, alpha=alpha, outputs_act=outputs_act)
    if case == "same_size":
        data = model([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                      helper.make_node("Relu", ["c"], ["a"]), pool],
                     [("x", [1, 3, 8, 8])], [("y", [1, 4, 8, 8])],
                     [("w", _r(4, 3, 3, 3)), ("b", _r(4, seed=1))])
    elif case == "activation_read_elsewhere":
        data = model([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                      helper.make_node("Relu", ["c"], ["a"]),
                      helper.make_node("MaxPool", ["a"], ["y"], kernel_shape=[2, 2],
                                       strides=[2, 2]),
                      helper.make_node("Neg", ["a"], ["z"])],
                     [("x", [1, 3, 8, 8])], [("y", [1, 4, 4, 4]), ("z", [1, 4, 8, 8])],
                     [("w", _r(4, 3, 3, 3)), ("b", _r(4, seed=1))])
    elif case == "indices":
        data = model([helper.make_node("Relu", ["x"], ["a"]), pool],
                     [("x", [1, 3, 8, 8])], [("y", [1, 3, 4, 4])])
    m, report = optimized(data)
    assert not next(e for e in report if e["pass"] == PASS)["changes"]
    feeds = {"x": _r(1, 3, 8, 8, seed=5)}
    if case != "indices":  # (the Indices output is int64; covered by the pool tests)
        check_same(data, feeds)


def test_switchable_by_name():
    data = _conv_act_pool()
    off = ow.InferenceSession(data, ow.SessionOptions(disabled_passes=[PASS]))
    conv = next(n for n in off.model.graph.nodes if n.op_type == "FusedConv")
    assert conv.attrs["activation"] == "Relu"


POOLS = st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(0, 1), st.booleans())


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(op=st.sampled_from(["Relu", "LeakyRelu", "Clip", "Sigmoid", "Tanh"]),
       conv=st.booleans(), pool=POOLS, hw=st.integers(3, 7), specials=st.booleans(),
       seed=st.integers(0, 2**16))
def test_random_pools_keep_outputs(op, conv, pool, hw, specials, seed):
    """Any kernel, stride, padding and ceil mode, with or without a convolution before the
    activation, NaN and +-Inf in the input: every pass on gives level 0's outputs."""
    k, s, p, ceil = pool
    p = min(p, k - 1)
    src = "x"
    nodes, inits = [], []
    if conv:
        nodes.append(helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]))
        inits.append(("w", _r(2, 2, 3, 3, seed=seed)))
        src = "c"
    act, more = _act(op, src, "a", alpha=0.3)
    nodes += [act, helper.make_node("MaxPool", ["a"], ["y"], kernel_shape=[k, k],
                                    strides=[s, s], pads=[p] * 4, ceil_mode=int(ceil))]
    data = model(nodes, [("x", [1, 2, hw, hw])], [("y", None)], inits + more)
    x = _r(1, 2, hw, hw, seed=seed + 1)
    if specials:
        flat = x.reshape(-1)
        flat[seed % flat.size] = np.nan
        flat[(seed // 7) % flat.size] = np.inf
        flat[(seed // 3) % flat.size] = -np.inf
    _same(data, {"x": x})
