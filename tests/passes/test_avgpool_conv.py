"""avgpool_conv_reorder: an AveragePool and a 1x1 convolution next to each other swap places
when the other order costs less (pool first when it shrinks the image, conv first when it
drops channels)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper

import opwarden as ow
from opwarden.passes import pool_swap

from .helpers import model, optimized, types_of

PASS = "avgpool_conv_reorder"


def _r(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _same(data, feeds, tol=1e-5):
    want = ow.InferenceSession(data, ow.SessionOptions(optimization_level=0)).run(None, feeds)
    got = ow.InferenceSession(data).run(None, feeds)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


def _transition(cin=64, cout=32, hw=8, bias=True):
    """DenseNet's transition: 1x1 convolution, then a 2x2/2 average pool."""
    ins = ["x", "w"] + (["b"] if bias else [])
    nodes = [helper.make_node("Conv", ins, ["c"]),
             helper.make_node("AveragePool", ["c"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    inits = [("w", _r(cout, cin, 1, 1))] + ([("b", _r(cout, seed=1))] if bias else [])
    return model(nodes, [("x", [1, cin, hw, hw])], [("y", [1, cout, hw // 2, hw // 2])], inits)


def _projection(cin=24, cout=4, hw=6, act="Relu", count_include_pad=0, group=1):
    """BN-Inception's pool projection: 3x3/1 average pool (padded), 1x1 convolution, Relu."""
    nodes = [helper.make_node("AveragePool", ["x"], ["p"], kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1], count_include_pad=count_include_pad),
             helper.make_node("Conv", ["p", "w", "b"], ["c"], group=group)]
    out = "c"
    if act:
        nodes.append(helper.make_node(act, ["c"], ["y"]))
        out = "y"
    return model(nodes, [("x", [1, cin, hw, hw])], [(out, [1, cout, hw, hw])],
                 [("w", _r(cout, cin // group, 1, 1)), ("b", _r(cout, seed=1))])


def test_pool_moves_before_a_shrinking_transition():
    data = _transition()
    m, report = optimized(data)
    assert next(e for e in report if e["pass"] == PASS)["details"] == {
        "AveragePool before a 1x1 convolution": 1}
    assert types_of(m) == ["AveragePool", "Conv"]
    assert m.graph.nodes[1].inputs[0].fact.shape == (1, 64, 4, 4)
    _same(data, {"x": _r(1, 64, 8, 8, seed=2)})


@pytest.mark.parametrize("act", ["Relu", "Sigmoid", ""])
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_pool_moves_after_a_channel_reducing_projection(act, count_include_pad):
    # count_include_pad with padding: the border windows' weights do not sum to one, so a
    # convolution with a bias may not move (see the left-alone cases); here the bias is
    # dropped for that case.
    data = _projection(act=act, count_include_pad=count_include_pad)
    if count_include_pad:
        nodes = [helper.make_node("AveragePool", ["x"], ["p"], kernel_shape=[3, 3],
                                  pads=[1, 1, 1, 1], count_include_pad=1),
                 helper.make_node("Conv", ["p", "w"], ["y"])]
        data = model(nodes, [("x", [1, 24, 6, 6])], [("y", [1, 4, 6, 6])],
                     [("w", _r(4, 24, 1, 1))])
        act = ""
    m, report = optimized(data)
    assert next(e for e in report if e["pass"] == PASS)["changes"] == 1
    types = types_of(m)
    assert types[types.index("AveragePool") - 1] in ("Conv", "FusedConv")
    if act:
        assert types[-1] == act
        conv = next(n for n in m.graph.nodes if n.op_type in ("Conv", "FusedConv"))
        assert not conv.attrs.get("activation")
    _same(data, {"x": _r(1, 24, 6, 6, seed=3)})


@pytest.mark.parametrize("case", ["include_pad_bias", "strided_conv", "3x3_conv",
                                  "more_channels", "pool_read_elsewhere", "conv_read_elsewhere",
                                  "nonlinear_between", "hardswish"])
def test_left_alone(case):
    if case == "include_pad_bias":
        data = _projection(count_include_pad=1)
    elif case == "more_channels":  # 4 -> 24 channels: pooling first stays cheaper
        data = _projection(cin=4, cout=24)
    elif case == "hardswish":  # no standalone node written for it
        data = _projection(act=None)
        nodes = [helper.make_node("AveragePool", ["x"], ["p"], kernel_shape=[3, 3],
                                  pads=[1, 1, 1, 1]),
                 helper.make_node("Conv", ["p", "w", "b"], ["c"]),
                 helper.make_node("HardSwish", ["c"], ["y"])]
        data = model(nodes, [("x", [1, 24, 6, 6])], [("y", [1, 4, 6, 6])],
                     [("w", _r(4, 24, 1, 1)), ("b", _r(4, seed=1))])
    elif case in ("strided_conv", "3x3_conv"):
        attrs = {"strides": [2, 2]} if case == "strided_conv" else {"pads": [1, 1, 1, 1]}
        k = 1 if case == "strided_conv" else 3
        hw = 4 if case == "strided_conv" else 8
        nodes = [helper.make_node("Conv", ["x", "w"], ["c"], **attrs),
                 helper.make_node("AveragePool", ["c"], ["y"], kernel_shape=[2, 2],
                                  strides=[2, 2])]
        data = model(nodes, [("x", [1, 16, 8, 8])], [("y", [1, 8, hw // 2, hw // 2])],
                     [("w", _r(8, 16, k, k))])
    elif case == "pool_read_elsewhere":
        nodes = [helper.make_node("AveragePool", ["x"], ["p"], kernel_shape=[3, 3],
                                  pads=[1, 1, 1, 1]),
                 helper.make_node("Conv", ["p", "w"], ["y"]),
                 helper.make_node("Neg", ["p"], ["z"])]
        data = model(nodes, [("x", [1, 24, 6, 6])], [("y", [1, 4, 6, 6]), ("z", [1, 24, 6, 6])],
                     [("w", _r(4, 24, 1, 1))])
    elif case == "conv_read_elsewhere":
        nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
                 helper.make_node("AveragePool", ["c"], ["y"], kernel_shape=[2, 2],
                                  strides=[2, 2]),
                 helper.make_node("Neg", ["c"], ["z"])]
        data = model(nodes, [("x", [1, 16, 8, 8])], [("y", [1, 8, 4, 4]), ("z", [1, 8, 8, 8])],
                     [("w", _r(8, 16, 1, 1))])
    else:  # nonlinear_between: conv -> Relu -> pool does not commute
        nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
                 helper.make_node("Relu", ["c"], ["r"]),
                 helper.make_node("AveragePool", ["r"], ["y"], kernel_shape=[2, 2],
                                  strides=[2, 2])]
        data = model(nodes, [("x", [1, 16, 8, 8])], [("y", [1, 8, 4, 4])],
                     [("w", _r(8, 16, 1, 1))])
    m, report = optimized(data)
    assert not next(e for e in report if e["pass"] == PASS)["changes"]
    x = m.graph.inputs[0]
    _same(data, {"x": _r(*x.fact.shape, seed=4)})


def test_switchable_by_name():
    off = ow.InferenceSession(_transition(), ow.SessionOptions(disabled_passes=[PASS]))
    assert [n.op_type for n in off.model.graph.nodes if n.op_type != "Transpose"][0] in (
        "Conv", "FusedConv")


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(order=st.sampled_from(["pool_conv", "conv_pool"]),
       pool=st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(0, 1), st.booleans(),
                      st.booleans()),
       chans=st.sampled_from([(2, 8, 1), (8, 2, 1), (12, 3, 1), (8, 4, 2), (6, 6, 3)]),
       act=st.sampled_from(["", "Relu", "Tanh"]), bias=st.booleans(), hw=st.integers(3, 7),
       specials=st.booleans(), seed=st.integers(0, 2**16))
def test_random_pairs_keep_outputs(monkeypatch, order, pool, chans, act, bias, hw, specials,
                                   seed):
    """Every legal swap (the cost model overruled) keeps level 0's outputs: any pool geometry
    (ceil mode, count_include_pad), grouped convolutions, bias or not, an activation after the
    pair, NaN and +-Inf in the input."""
    monkeypatch.setattr(pool_swap, "_cheaper", lambda now, new: True)
    k, s, p, ceil, include_pad = pool
    p = min(p, k - 1)
    cin, cout, g = chans
    pattrs = dict(kernel_shape=[k, k], strides=[s, s], pads=[p] * 4, ceil_mode=int(ceil),
                  count_include_pad=int(include_pad))
    conv_ins = ["?", "w"] + (["b"] if bias else [])
    if order == "pool_conv":
        nodes = [helper.make_node("AveragePool", ["x"], ["p"], **pattrs),
                 helper.make_node("Conv", ["p", *conv_ins[1:]], ["c"], group=g)]
    else:
        nodes = [helper.make_node("Conv", ["x", *conv_ins[1:]], ["p"], group=g),
                 helper.make_node("AveragePool", ["p"], ["c"], **pattrs)]
    out = "c"
    if act:
        nodes.append(helper.make_node(act, ["c"], ["y"]))
        out = "y"
    inits = [("w", _r(cout, cin // g, 1, 1, seed=seed))]
    if bias:
        inits.append(("b", _r(cout, seed=seed + 1)))
    data = model(nodes, [("x", [1, cin, hw, hw])], [(out, None)], inits)
    x = _r(1, cin, hw, hw, seed=seed + 2)
    if specials:
        flat = x.reshape(-1)
        flat[seed % flat.size] = np.nan
        flat[(seed // 7) % flat.size] = np.inf
        flat[(seed // 3) % flat.size] = -np.inf
    _same(data, {"x": x}, tol=1e-4)
    # With count_include_pad and padding the windows' weights do not sum to one: only a
    # bias-free convolution may swap.
    legal = not (include_pad and bias and (p or ceil))
    m, report = optimized(data)
    swapped = next(e for e in report if e["pass"] == PASS)["changes"]
    assert swapped == (1 if legal else 0)
