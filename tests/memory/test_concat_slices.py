"""Concat slices: producers write straight into their slice of a Concat's planned output."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst
from onnx import TensorProto, helper

import opwarden
from opwarden import zoo
from opwarden.ops.base import REGISTRY

DOMAIN = "test.concatslices"
SEEN: list[tuple[str, bool, bool]] = []  # (op, got out, out is C-contiguous)


def _unary(name: str, contract: opwarden.Contract | None = None):
    @opwarden.op(name, domain=DOMAIN, inputs=["X: T"], outputs=["Y: T"],
                 types={"T": ["float32"]}, contract=contract or opwarden.Contract())
    def ref(X):
        return {"SliceScale": X * np.float32(2), "FreshScale": X * np.float32(3),
                "PlainScale": X * np.float32(5), "InplaceNeg": -X}[name].astype(np.float32)

    @ref.infer
    def _shape(X):
        return X

    return ref


SliceScale = _unary("SliceScale")
FreshScale = _unary("FreshScale")
PlainScale = _unary("PlainScale")
InplaceNeg = _unary("InplaceNeg", opwarden.Contract(may_alias=((0, 0),)))


@SliceScale.kernel(device="cpu", name="slicescale.out", priority=10, accepts_out=True,
                   strided_out=True)
def _slice_scale(X, *, out=None):
    SEEN.append(("SliceScale", out is not None, out is None or out.flags.c_contiguous))
    return np.multiply(X, np.float32(2), out=out)


@FreshScale.kernel(device="cpu", name="freshscale.out", priority=10, accepts_out=True,
                   strided_out=True)
def _fresh_scale(X, *, out=None):
    # opted in, but returns a fresh array instead of writing into its slice: still correct
    SEEN.append(("FreshScale", out is not None, out is None or out.flags.c_contiguous))
    return X * np.float32(3)


@PlainScale.kernel(device="cpu", name="plainscale.out", priority=10, accepts_out=True)
def _plain_scale(X, *, out=None):
    SEEN.append(("PlainScale", out is not None, out is None or out.flags.c_contiguous))
    assert out is None or out.flags.c_contiguous, "a kernel that did not opt in got a strided out"
    return np.multiply(X, np.float32(5), out=out)


@InplaceNeg.kernel(device="cpu", name="inplaceneg.out", priority=10, accepts_out=True)
def _inplace_neg(X, *, out=None):
    # its contract allows out to BE input 0, not to overlap it elsewhere
    if out is not None and np.shares_memory(out, X):
        assert out.ctypes.data == X.ctypes.data and out.strides == X.strides, "partial overlap"
    return np.negative(X, out=out)


NP = {"SliceScale": lambda x: x * 2, "FreshScale": lambda x: x * 3,
      "PlainScale": lambda x: x * 5, "InplaceNeg": lambda x: -x}


def _shapes(nodes, inputs):
    """Every value's shape (custom ops leave ONNX shape inference without Concat shapes)."""
    shapes = dict(inputs)
    for _op, ins, out, *axis in nodes:
        shp = list(shapes[ins[0]])
        if axis:
            shp[axis[0]] = sum(shapes[i][axis[0]] for i in ins)
        shapes[out] = tuple(shp)
    return shapes


def _model(nodes, inputs, outputs) -> onnx.ModelProto:
    """nodes: (op, [inputs], output[, axis]); inputs/outputs: {name: shape}."""
    shapes = _shapes(nodes, inputs)
    made = []
    for i, (op, ins, out, *axis) in enumerate(nodes):
        if op == "Concat":
            made.append(helper.make_node("Concat", ins, [out], name=f"n{i}", axis=axis[0]))
        else:
            made.append(helper.make_node(op, ins, [out], name=f"n{i}", domain=DOMAIN))
    g = helper.make_graph(
        made, "g",
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v)) for k, v in inputs.items()],
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v)) for k, v in outputs.items()],
        value_info=[helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v))
                    for k, v in shapes.items() if k not in inputs and k not in outputs],
    )
    return helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)]
    )


def _reference(nodes, feeds, outputs):
    env = dict(feeds)
    for op, ins, out, *axis in nodes:
        xs = [env[i] for i in ins]
        env[out] = np.concatenate(xs, axis=axis[0]) if op == "Concat" else NP[op](xs[0])
    return [env[k] for k in outputs]


class _NoSlices:
    """Within the block, no variant opts in: the plan binds no slices (the old behaviour)."""

    def __enter__(self):
        self.saved = [(v, v.strided_out) for o in REGISTRY.all() for v in o.variants]
        for v, _ in self.saved:
            v.strided_out = False

    def __exit__(self, *exc):
        for v, f in self.saved:
            v.strided_out = f


MODES = {
    "lean": {},
    "lean-unchecked": {"checks": ()},
    "guarded": {"checks": ("all",)},
    "debug": {"debug_memory": True},
    "parallel": {"inter_op_num_threads": 2},
}


def _session(model, **kw):
    return opwarden.InferenceSession(model.SerializeToString(), optimization_level=0, **kw)


def _run_all_modes(nodes, inputs, outputs, expect_slices):
    model = _model(nodes, inputs, outputs)
    rng = np.random.default_rng(0)
    feeds = {k: rng.standard_normal(v).astype(np.float32) for k, v in inputs.items()}
    want = _reference(nodes, feeds, outputs)
    for mode, kw in MODES.items():
        sess = _session(model, **kw)
        for _ in range(2):  # the second run reuses the arena
            got = sess.run(None, feeds)
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=1e-6, err_msg=mode)
        plan = sess.memory_plan
        plan.check()
        assert plan.slices == expect_slices, mode
        assert not sess.faults, (mode, sess.faults)
    with _NoSlices():
        sess = _session(model)
        got = sess.run(None, feeds)
        assert sess.memory_plan.slices == {}
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6)
    return feeds


def test_opted_in_producers_write_into_their_slice_others_are_copied():
    nodes = [
        ("SliceScale", ["x"], "a"),
        ("FreshScale", ["x"], "b"),
        ("PlainScale", ["x"], "c"),
        ("Concat", ["a", "b", "c"], "cat", 1),
        ("InplaceNeg", ["cat"], "y"),
    ]
    SEEN.clear()
    _run_all_modes(nodes, {"x": (2, 3, 4)}, {"y": (2, 9, 4)}, {"a": "cat", "b": "cat"})
    strided = {op for op, got, contiguous in SEEN if got and not contiguous}
    assert strided == {"SliceScale", "FreshScale"}  # PlainScale asserts it never gets one


def test_graph_outputs_and_repeated_inputs_are_not_sliced():
    nodes = [
        ("SliceScale", ["x"], "a"),  # also a graph output: never in the arena
        ("SliceScale", ["x"], "b"),  # twice in the Concat: one slice cannot hold both
        ("SliceScale", ["x"], "c"),
        ("Concat", ["a", "b", "b", "c"], "cat", -1),
        ("InplaceNeg", ["cat"], "y"),
    ]
    _run_all_modes(nodes, {"x": (2, 3, 4)}, {"y": (2, 3, 16), "a": (2, 3, 4)}, {"c": "cat"})


def test_nested_concats_and_late_readers_keep_their_slices_alive():
    nodes = [
        ("SliceScale", ["x"], "a"),
        ("SliceScale", ["x"], "b"),
        ("Concat", ["a", "b"], "inner", 1),
        ("SliceScale", ["inner"], "d"),
        ("Concat", ["inner", "d"], "outer", 1),
        # read after the outer Concat: "a" dies here, but is part of the outer buffer, so it
        # must not be overwritten in place; "inner" likewise
        ("InplaceNeg", ["a"], "na"),
        ("InplaceNeg", ["inner"], "ni"),
        ("Concat", ["outer", "na", "ni"], "y", 1),
    ]
    slices = {"a": "inner", "b": "inner", "inner": "outer", "d": "outer"}
    _run_all_modes(nodes, {"x": (1, 2, 3)}, {"y": (1, 14, 3)}, slices)


def test_a_slice_is_never_the_input_of_an_in_place_step():
    nodes = [
        ("SliceScale", ["x"], "a"),
        ("SliceScale", ["x"], "b"),
        ("Concat", ["a", "b"], "cat", 1),
        ("PlainScale", ["cat"], "y"),
        # the Concat's whole buffer dies here, yet "b" is a strided slice in its middle
        ("InplaceNeg", ["b"], "nb"),
        ("PlainScale", ["nb"], "z"),
    ]
    _run_all_modes(nodes, {"x": (2, 1, 3)}, {"y": (2, 2, 3), "z": (2, 1, 3)},
                   {"a": "cat", "b": "cat"})


def test_concat_skips_inputs_already_in_place():
    from opwarden.kernels.cpu.shape import concat

    root = np.zeros(64, np.float32)
    out = root[:24].reshape(2, 3, 4)
    a = out[:, :, :1]
    a[...] = 1
    b = np.full((2, 3, 3), 2, np.float32)
    bad = out[:, :, 1:].copy()  # right shape, not in place
    assert concat(a, b, axis=2, out=out) is out
    np.testing.assert_array_equal(out, np.concatenate([np.ones((2, 3, 1)), b], axis=2))
    a2 = root[24:30].reshape(2, 3, 1)  # same owner, elsewhere: copied
    a2[...] = 7
    concat(a2, bad, axis=2, out=out)
    np.testing.assert_array_equal(out[:, :, :1], 7)


def test_output_helper_allows_strided_only_when_asked():
    from opwarden.kernels.cpu.util import output

    full = np.empty((1, 4, 4, 8), np.float32)
    view = full[..., 2:5]
    assert output(view, (1, 4, 4, 3)) is not view
    assert output(view, (1, 4, 4, 3), strided_ok=True) is view
    assert output(full[..., ::2], (1, 4, 4, 4), strided_ok=True) is not full  # last axis strided


@pytest.mark.parametrize("name,sliced", [("squeezenet", 0), ("densenet121", 54),
                                         ("inception_v1", 0)])
def test_light_zoo_models_match_onnxruntime(name, sliced):
    # `sliced` counts the Concat-into-Concat nesting; conv and pool outputs join once their
    # NHWC kernels opt in (strided_out=True)
    m = zoo.build(name)
    data = m.SerializeToString()
    feeds = zoo.feeds_for(m)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    sess = opwarden.InferenceSession(data)
    got = sess.run(None, feeds)
    plan = sess.memory_plan
    plan.check()
    assert len(plan.slices) >= sliced
    with _NoSlices():
        plain = opwarden.InferenceSession(data).run(None, feeds)
    for g, p, w in zip(got, plain, want):
        np.testing.assert_array_equal(g, p)
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-4)


# Random graphs of opted-in, fresh-returning, plain and in-place steps joined by Concats, run in
# debug mode (a checksum of every live tensor after every step) against NumPy.
_UNARY = ["SliceScale", "FreshScale", "PlainScale", "InplaceNeg"]


@hst.composite
def _graphs(draw):
    widths = {"x": 1}
    nodes = []
    for i in range(draw(hst.integers(2, 9))):
        names = sorted(widths)
        out = f"t{i}"
        if draw(hst.booleans()):
            ins = draw(hst.lists(hst.sampled_from(names), min_size=1, max_size=3))
            nodes.append(("Concat", ins, out, draw(hst.sampled_from([1, -2]))))
            widths[out] = sum(widths[x] for x in ins)
        else:
            x = draw(hst.sampled_from(names))
            nodes.append((draw(hst.sampled_from(_UNARY)), [x], out))
            widths[out] = widths[x]
    produced = [n[2] for n in nodes]
    extra = draw(hst.lists(hst.sampled_from(produced), max_size=2, unique=True))
    outs = sorted(set(extra) | {produced[-1]})
    return nodes, {k: (2, widths[k], 3) for k in outs}


@settings(max_examples=40, deadline=None)
@given(_graphs())
def test_random_concat_graphs_in_debug_mode(graph):
    nodes, outputs = graph
    model = _model(nodes, {"x": (2, 1, 3)}, outputs)
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 1, 3)).astype(np.float32)}
    want = _reference(nodes, feeds, list(outputs))
    sess = _session(model, debug_memory=True)
    got = sess.run(None, feeds)
    sess.memory_plan.check()
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6)


def test_builtin_elementwise_producers_write_into_their_slices():
    """Relu, Add and Sigmoid (built-in fast variants, strided_out) feed a Concat: all three
    are planned as slices, and every run path agrees with onnxruntime."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Add", ["x", "x"], ["b"]),
        helper.make_node("Sigmoid", ["x"], ["c"]),
        helper.make_node("Concat", ["a", "b", "c"], ["cat"], axis=1),
        helper.make_node("Mul", ["cat", "cat"], ["y"]),
    ]
    g = helper.make_graph(
        nodes, "ew", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 9, 4, 5])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    x = np.random.default_rng(3).standard_normal((2, 3, 4, 5)).astype(np.float32)
    (want,) = ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})
    for opts in ({}, {"checks": "all"}, {"debug_memory": True}):
        sess = opwarden.InferenceSession(m.SerializeToString(), **opts)
        assert sess.memory_plan.to_dict()["concat_slices"] == {"a": "cat", "b": "cat", "c": "cat"}
        (got,) = sess.run(None, {"x": x})
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
