"""Reshape-like views in the memory plan: a Reshape of a planned tensor, or a Transpose that
keeps the order of the non-1 dims, shares its input's buffer (contract view_when); any other
Transpose copies into its own planned buffer. Nothing is copied out of the arena per run."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import opwarden
from opwarden.execute import program as program_mod
from opwarden.ops.common import transpose_keeps_order


def _model(shape, steps):
    """x -> Relu -> each of `steps` ("reshape", shape) / ("transpose", perm) -> Neg -> y."""
    nodes = [helper.make_node("Relu", ["x"], ["t0"])]
    inits = []
    cur = list(shape)
    for i, (kind, arg) in enumerate(steps):
        src, dst = f"t{i}", f"t{i + 1}"
        if kind == "reshape":
            inits.append(numpy_helper.from_array(np.array(arg, np.int64), f"shape{i}"))
            nodes.append(helper.make_node("Reshape", [src, f"shape{i}"], [dst]))
            cur = list(arg)
        else:
            nodes.append(helper.make_node("Transpose", [src], [dst], perm=list(arg)))
            cur = [cur[p] for p in arg]
    nodes.append(helper.make_node("Neg", [f"t{len(steps)}"], ["y"]))
    g = helper.make_graph(nodes, "views", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                           list(shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, cur)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _expected(x, steps):
    y = np.maximum(x, 0)
    for kind, arg in steps:
        y = y.reshape(arg) if kind == "reshape" else y.transpose(arg)
    return -y


@pytest.fixture
def arena_copies(monkeypatch):
    """Counts the results the lean loop had to copy out of the arena (unplanned views)."""
    copies = []
    fix = program_mod._ArenaViews.fix

    def counting(self, x, k):
        y = fix(self, x, k)
        if y is not x:
            copies.append(x.shape)
        return y

    monkeypatch.setattr(program_mod._ArenaViews, "fix", counting)
    return copies


def _buffer_of(plan, name):
    return next((b for b in plan.buffers if name in b.values), None)


def test_reshape_and_order_keeping_transpose_share_their_input_buffer(arena_copies):
    steps = [("reshape", [2, 1, 12, 5]), ("transpose", [1, 0, 2, 3]), ("reshape", [2, 60])]
    sess = opwarden.InferenceSession(_model((2, 3, 4, 5), steps), optimization_level=0)
    plan = sess.memory_plan
    plan.check()
    buf = _buffer_of(plan, "t0")
    assert buf is not None and {"t0", "t1", "t2"} <= set(buf.values)
    for seed in (0, 1):  # the second run must not see the first one's arena contents
        x = np.random.default_rng(seed).standard_normal((2, 3, 4, 5)).astype(np.float32)
        (y,) = sess.run(None, {"x": x})
        np.testing.assert_array_equal(y, _expected(x, steps))
    assert arena_copies == []


def test_a_reordering_transpose_writes_into_its_own_planned_buffer(arena_copies):
    steps = [("transpose", [0, 2, 3, 1])]
    sess = opwarden.InferenceSession(_model((2, 3, 4, 5), steps), optimization_level=0)
    plan = sess.memory_plan
    step = next(s for s in sess.program.steps if s.placement.node.op_type == "Transpose")
    assert step.placement.variant.name == "transpose.cpu.out"
    a, b = _buffer_of(plan, "t0"), _buffer_of(plan, "t1")
    assert a is not None and b is not None and a is not b
    x = np.random.default_rng(2).standard_normal((2, 3, 4, 5)).astype(np.float32)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_array_equal(y, _expected(x, steps))
    assert arena_copies == []


def test_views_of_a_graph_output_are_not_planned():
    # t0 is a graph output: its view t1 must not put it (or t1) in the arena.
    m = _model((2, 3), [("reshape", [3, 2])])
    m.graph.output.append(helper.make_tensor_value_info("t0", TensorProto.FLOAT, [2, 3]))
    sess = opwarden.InferenceSession(m, optimization_level=0)
    assert _buffer_of(sess.memory_plan, "t0") is None
    x1 = np.ones((2, 3), np.float32)
    y1, t1 = sess.run(None, {"x": x1})
    keep = t1.copy()
    sess.run(None, {"x": -x1})
    np.testing.assert_array_equal(t1, keep)


@pytest.mark.parametrize("perm,shape,keeps", [
    ([0, 2, 3, 1], (1, 3, 4, 5), False),
    ([0, 2, 3, 1], (1, 3, 1, 1), True),
    ([1, 0, 2], (1, 7, 3), True),
    (None, (4, 1), True),
    (None, (4, 2), False),
    ([0, 0, 1], (2, 2, 2), False),
])
def test_transpose_keeps_order(perm, shape, keeps):
    assert transpose_keeps_order({"perm": perm}, shape) is keeps
    if keeps:
        assert np.zeros(shape).transpose(perm).flags.c_contiguous


_dims = st.lists(st.sampled_from([1, 2, 3]), min_size=2, max_size=4)


@st.composite
def _chains(draw):
    shape = tuple(draw(_dims))
    steps, cur = [], list(shape)
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.booleans()):
            perm = draw(st.permutations(range(len(cur))))
            steps.append(("transpose", list(perm)))
            cur = [cur[p] for p in perm]
        else:
            n = int(np.prod(cur))
            new = draw(st.sampled_from([[n], [1, n], [n, 1]] + ([cur[::-1]] if n else [])))
            steps.append(("reshape", list(new)))
            cur = list(new)
    return shape, steps


@settings(max_examples=60, deadline=None)
@given(_chains())
def test_any_chain_of_views_and_copies_gives_numpys_answer(chain):
    shape, steps = chain
    sess = opwarden.InferenceSession(_model(shape, steps), optimization_level=0,
                                     debug_memory=True)
    sess.memory_plan.check()
    for seed in (0, 1):
        x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
        (y,) = sess.run(None, {"x": x})
        np.testing.assert_array_equal(y, _expected(x, steps))

