"""Property tests: random small graphs of elementwise ops and transposes keep their outputs
when optimized (every pass on) and stay valid."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper

import opwarden as ow

from .helpers import model

UNARY = ["Relu", "Sigmoid", "Tanh", "Neg", "Abs", "Exp", "HardSwish", "LeakyRelu", "Identity",
         "Clip", "Sqrt", "Reciprocal"]
BINARY = ["Add", "Sub", "Mul", "Div", "Max", "Min", "Sum"]


@st.composite
def graphs(draw):
    rank = draw(st.integers(2, 4))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank)))
    values = [("x", shape)]
    nodes, inits = [], []
    n_ops = draw(st.integers(2, 9))
    for k in range(n_ops):
        kind = draw(st.sampled_from(["unary", "binary", "const", "transpose"]))
        src, sshape = values[draw(st.integers(0, len(values) - 1))]
        out = f"v{k}"
        if kind == "unary":
            op = draw(st.sampled_from(UNARY))
            extra = {"alpha": 0.2} if op == "LeakyRelu" else {}
            ins = [src]
            if op == "Clip":
                lo, hi = f"lo{k}", f"hi{k}"
                inits += [(lo, np.float32(-0.7)), (hi, np.float32(0.9))]
                ins += [lo, hi]
            nodes.append(helper.make_node(op, ins, [out], **extra))
            values.append((out, sshape))
        elif kind == "binary":
            same = [v for v in values if v[1] == sshape]
            other = draw(st.sampled_from(same))[0]
            op = draw(st.sampled_from(BINARY))
            pair = [src, other] if draw(st.booleans()) else [other, src]
            nodes.append(helper.make_node(op, pair, [out]))
            values.append((out, sshape))
        elif kind == "const":
            # a per-axis constant that broadcasts (BN-like), or a full one
            axis = draw(st.integers(0, len(sshape) - 1))
            cshape = tuple(d if i == axis else 1 for i, d in enumerate(sshape))
            c = np.random.default_rng(k).uniform(0.5, 1.5, cshape).astype(np.float32)
            inits.append((f"c{k}", c))
            op = draw(st.sampled_from(["Add", "Mul", "Sub", "Div"]))
            nodes.append(helper.make_node(op, [src, f"c{k}"], [out]))
            values.append((out, sshape))
        else:
            perm = draw(st.permutations(list(range(len(sshape)))))
            nodes.append(helper.make_node("Transpose", [src], [out], perm=list(perm)))
            values.append((out, tuple(sshape[p] for p in perm)))
    outs = [values[-1]]
    if draw(st.booleans()) and len(values) > 2:
        mid = values[draw(st.integers(1, len(values) - 2))]
        if mid[0] != outs[0][0]:
            outs.append(mid)
    return nodes, shape, [(n, list(s)) for n, s in outs], inits


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(), st.integers(0, 2**31 - 1))
def test_random_elementwise_graphs_keep_outputs(g, seed):
    nodes, shape, outs, inits = g
    data = model(nodes, [("x", list(shape))], outs, inits)
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    base = ow.InferenceSession(data, ow.SessionOptions(optimization_level=0))
    want = base.run(None, {"x": x})
    for level in (1, 3):
        sess = ow.InferenceSession(data, ow.SessionOptions(optimization_level=level))
        got = sess.run(None, {"x": x})
        assert [o.name for o in sess.get_outputs()] == [o[0] for o in outs]
        for gv, wv in zip(got, want):
            assert gv.shape == wv.shape and gv.dtype == wv.dtype
            np.testing.assert_allclose(gv, wv, rtol=1e-5, atol=1e-6, equal_nan=True)
        total = sess.pass_report[-1]
        assert total["nodes_after"] <= total["nodes_before"]


@st.composite
def sibling_convs(draw):
    """x -> several 1x1 convolutions (random width, bias, stride, Relu or not), each read by
    a random consumer (a graph output, a Neg, or a 3x3 convolution); some merge, some not."""
    c = draw(st.integers(1, 5))
    hw = draw(st.integers(2, 6))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    nodes, inits, outs = [], [], []
    for k in range(draw(st.integers(1, 5))):
        m = draw(st.integers(1, 6))
        stride = draw(st.sampled_from([1, 1, 2]))
        w = f"w{k}"
        inits.append((w, rng.standard_normal((m, c, 1, 1)).astype(np.float32)))
        ins = ["x", w]
        if draw(st.booleans()):
            inits.append((f"b{k}", rng.standard_normal(m).astype(np.float32)))
            ins.append(f"b{k}")
        nodes.append(helper.make_node("Conv", ins, [f"c{k}"], strides=[stride, stride]))
        y = f"c{k}"
        if draw(st.booleans()):
            nodes.append(helper.make_node("Relu", [y], [f"r{k}"]))
            y = f"r{k}"
        oh = (hw - 1) // stride + 1
        use = draw(st.sampled_from(["out", "neg", "conv3"]))
        if use == "neg":
            nodes.append(helper.make_node("Neg", [y], [f"n{k}"]))
            y = f"n{k}"
        elif use == "conv3":
            inits.append((f"v{k}", rng.standard_normal((2, m, 3, 3)).astype(np.float32)))
            nodes.append(helper.make_node("Conv", [y, f"v{k}"], [f"t{k}"], pads=[1, 1, 1, 1]))
            y, m = f"t{k}", 2
        outs.append((y, [2, m, oh, oh]))
    return model(nodes, [("x", [2, c, hw, hw])], outs, inits), (2, c, hw, hw)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(sibling_convs(), st.integers(0, 2**16))
def test_sibling_conv_merge_keeps_outputs(case, seed):
    _optimized_keeps_outputs(case, seed)


def _optimized_keeps_outputs(case, seed):
    """Every pass on gives level 0's outputs for a random input x."""
    data, shape = case
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    want = ow.InferenceSession(data, ow.SessionOptions(optimization_level=0)).run(None, {"x": x})
    got = ow.InferenceSession(data).run(None, {"x": x})
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


@st.composite
def bn_relu_readers(draw):
    """x -> BatchNormalization (scales of random sign, some zero) -> Relu -> 1-3 readers: a
    1x1 or padded 3x3 convolution (sometimes strided or grouped), a Neg or the output."""
    c = draw(st.sampled_from([2, 4]))
    hw = draw(st.integers(3, 6))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    sign = draw(st.sampled_from(["positive", "mixed", "zero"]))
    s = np.abs(rng.standard_normal(c)).astype(np.float32) + 0.1
    if sign == "mixed":
        s[0] = -s[0]
    elif sign == "zero":
        s[-1] = 0
    inits = [("s", s), ("bb", rng.standard_normal(c).astype(np.float32)),
             ("m", rng.standard_normal(c).astype(np.float32)),
             ("v", np.abs(rng.standard_normal(c)).astype(np.float32) + 1)]
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "bb", "m", "v"], ["bn"]),
             helper.make_node("Relu", ["bn"], ["r"])]
    outs = []
    for k in range(draw(st.integers(1, 3))):
        use = draw(st.sampled_from(["conv1", "conv3", "conv3s2", "grouped", "neg", "out"]))
        y = f"y{k}"
        if use == "out":
            nodes.append(helper.make_node("Identity", ["r"], [y]))
            outs.append((y, [1, c, hw, hw]))
            continue
        if use == "neg":
            nodes.append(helper.make_node("Neg", ["r"], [y]))
            outs.append((y, [1, c, hw, hw]))
            continue
        kk, st_, g = (1, 1, 1) if use == "conv1" else (3, 2 if use == "conv3s2" else 1, 1)
        if use == "grouped":
            kk, g = 3, 2
        inits.append((f"w{k}", rng.standard_normal((4, c // g, kk, kk)).astype(np.float32)))
        nodes.append(helper.make_node("Conv", ["r", f"w{k}"], [y], pads=[kk // 2] * 4,
                                      strides=[st_, st_], group=g))
        oh = (hw + 2 * (kk // 2) - kk) // st_ + 1
        outs.append((y, [1, 4, oh, oh]))
    return model(nodes, [("x", [1, c, hw, hw])], outs, inits), (1, c, hw, hw)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(bn_relu_readers(), st.integers(0, 2**16))
def test_bn_scale_into_conv_keeps_outputs(case, seed):
    _optimized_keeps_outputs(case, seed)
