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
