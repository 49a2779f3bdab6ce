"""The lean loop's direct steps and the run path's fast feed check.

Elementwise variants that declare a `direct` form run as bare ufunc calls in the compiled loop
(execute.codegen.direct_form); these tests hold the declarations to their kernels, the loop to
onnxruntime, a fault in a direct step to its own node, and `FastFeeds` to `check_feeds`.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import opwarden as ow
from opwarden.errors import InputError, KernelError
from opwarden.execute.codegen import KEYWORD_OUT, LeanFault, shaped_operand
from opwarden.feed_check import FastFeeds, check_feeds
from opwarden.ops import REGISTRY
from opwarden.ops.activation import RELU_SMALL

F32 = TensorProto.FLOAT
RNG = np.random.default_rng(7)


def _chain(kinds: list[str], width: int, mul: float = 0.99, rows: int | str = 3) -> bytes:
    """x -> one node per kind (Add/Mul with a broadcast (width,) constant, Relu, Tanh, Neg)."""
    inits = [numpy_helper.from_array(np.full(width, 0.25, np.float32), "add_c"),
             numpy_helper.from_array(np.full(width, mul, np.float32), "mul_c")]
    nodes, prev = [], "x"
    for i, kind in enumerate(kinds):
        out = "y" if i == len(kinds) - 1 else f"t{i}"
        extra = {"Add": ["add_c"], "Mul": ["mul_c"], "Sub": ["add_c"]}.get(kind, [])
        nodes.append(helper.make_node(kind, [prev, *extra], [out], name=f"{kind.lower()}{i}"))
        prev = out
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", F32, [rows, width])],
                          [helper.make_tensor_value_info("y", F32, [rows, width])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _lean_source(sess: ow.InferenceSession, x: np.ndarray, contract: bool) -> str:
    entry, token = sess.memory.lease([x])
    token.release()
    return entry.bound.lean[contract].source


KINDS = ["Add", "Relu", "Mul", "Tanh", "Sub", "Neg", "Add", "Relu", "Mul"]


# (rows, width): constants reshaped (1 row), copied to the output's shape (3 x 16), or left
# to broadcast (3 x 300 is past codegen.SHAPED_MAX)
@pytest.mark.parametrize("rows,width", [(1, 16), (3, 16), (3, 300)])
@pytest.mark.parametrize("checks", [None, ()], ids=["contract", "checks-off"])
def test_chain_runs_direct_and_matches_onnxruntime(checks, rows, width):
    data = _chain(KINDS, width, rows=rows)
    opts = {"optimization_level": 0} | ({} if checks is None else {"checks": checks})
    sess = ow.InferenceSession(data, **opts)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    peer = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    for _ in range(3):  # the same compiled loop and arena, run after run
        x = RNG.standard_normal((rows, width)).astype(np.float32)
        x.flat[::7] = np.nan
        got = sess.run(None, {"x": x})[0]
        np.testing.assert_allclose(got, peer.run(None, {"x": x})[0], rtol=1e-6, atol=1e-6)
        assert not got.flags.writeable or checks == ()
        assert not np.shares_memory(got, x)
        # bit for bit what the kernels compute, called one by one by the generic loop
        entry, token = sess.memory.lease([x])
        token.release()
        np.testing.assert_array_equal(got, sess.program.run([x], None, entry.bound.calls)[0])
    src = _lean_source(sess, x, checks is None)
    # every Add/Relu/Mul/Tanh/Sub node is a bare ufunc call; Neg has no direct form
    direct = {int(i) for i in re.findall(r"\bu(\d+)\(", src)}
    assert direct == {i for i, k in enumerate(KINDS) if k != "Neg"}
    assert re.findall(r"\bf(\d+)\(", src) == [str(KINDS.index("Neg"))]
    assert sess.faults == []


def test_large_relu_keeps_its_chunked_kernel():
    width = RELU_SMALL  # rows * width elements: past the direct form's bound
    sess = ow.InferenceSession(_chain(["Add", "Relu", "Mul"], width, rows=2),
                               optimization_level=0)
    x = RNG.standard_normal((2, width)).astype(np.float32)
    got = sess.run(None, {"x": x})[0]
    np.testing.assert_allclose(got, np.maximum(x + 0.25, 0) * np.float32(0.99), rtol=1e-6)
    src = _lean_source(sess, x, True)
    assert re.search(r"\bf1\(", src) and not re.search(r"\bu1\(", src)


ARITY = {"Add": 2, "Sub": 2, "Mul": 2, "Relu": 1, "Tanh": 1}
SHAPES = [((3, 4), (4,)), ((2, 1, 5), (3, 5)), ((), ()), ((0, 4), (4,)), ((7,), ())]


def _declaring_variants():
    found = []
    for opdef in REGISTRY.all():
        for var in opdef.variants:
            if callable(getattr(var.fn, "direct", None)):
                found.append((opdef.op_type, var))
    return found


def test_direct_declarations_compute_what_their_kernels_do():
    found = _declaring_variants()
    assert {name for name, _ in found} == set(ARITY)  # a new declaration gets cases here
    for name, var in found:
        for shapes in SHAPES:
            shapes = shapes[:ARITY[name]] if ARITY[name] == 2 else (shapes[0],)
            ins = [np.asarray(RNG.standard_normal(s) * 3, np.float32) for s in shapes]
            ins[0].flat[:1] = np.nan  # NaN propagates the same way (Relu keeps it)
            shape = np.broadcast_shapes(*shapes)
            out, want = np.empty(shape, np.float32), np.empty(shape, np.float32)
            form = var.fn.direct(out)
            assert form is not None, var.name
            ufunc, consts = form
            r = var.fn(*ins, out=out)
            assert r is out and ufunc(*ins, *consts, out=want) is want
            np.testing.assert_array_equal(out, want, err_msg=f"{var.name} {shapes}")
            ufunc, consts = var.fn.direct(None)
            np.testing.assert_array_equal(var.fn(*ins), np.asarray(ufunc(*ins, *consts)))


def test_direct_ufuncs_take_out_positionally_without_a_warning():
    # codegen passes out= positionally except to KEYWORD_OUT: a NumPy that deprecates it for
    # another ufunc fails here instead of warning (and slowing) in every run
    a = np.ones((2, 3), np.float32)
    for _name, var in _declaring_variants():
        ufunc, consts = var.fn.direct(np.empty((2, 3), np.float32))
        if ufunc in KEYWORD_OUT:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ufunc(*([a] * (ufunc.nin - len(consts))), *consts, np.empty((2, 3), np.float32))


def test_shaped_operand_keeps_the_broadcast_values():
    c = np.arange(4, dtype=np.float32)
    for shape in [(1, 4), (3, 4), (2, 3, 4), (100, 4)]:
        got = shaped_operand(c, shape)
        assert not getattr(got, "flags", c.flags).writeable or got is c
        np.testing.assert_array_equal(np.broadcast_to(got, shape), np.broadcast_to(c, shape))
    assert shaped_operand(c, (3, 5)) is c  # (not broadcastable: the ufunc reports it)
    assert shaped_operand(c, (4, 1)) is c
    zero = shaped_operand(np.float32(0), (1000, 4))
    assert isinstance(zero, np.ndarray) and zero.shape == () and zero.dtype == np.float32


def test_relu_direct_form_only_below_its_chunk_bound():
    relu = next(v for name, v in _declaring_variants() if name == "Relu")
    assert relu.fn.direct(np.empty(RELU_SMALL - 1, np.float32)) is not None
    assert relu.fn.direct(np.empty(RELU_SMALL, np.float32)) is None


def test_fault_in_a_direct_step_is_blamed_on_its_node():
    # x * 1e30 overflows float32 at the first Mul (step 2), a direct step
    data = _chain(["Add", "Relu", "Mul", "Relu", "Mul"], 4, mul=1e30)
    x = np.full((3, 4), 1e20, np.float32)
    sess = ow.InferenceSession(data, optimization_level=0, checks=())
    entry, token = sess.memory.lease([x])
    token.release()
    calls, _ = sess.program.calls_for(entry)
    for stoppable in (False, True):
        fn = sess.program.compile(calls, contract=False, stoppable=stoppable)
        assert re.search(r"\bu2\(", fn.source)
        args = ([x], None) + ((_NoStop(),) if stoppable else ())
        with np.errstate(over="raise"), pytest.raises(LeanFault) as e:
            fn(*args)
        assert e.value.index == 2 and isinstance(e.value.error, FloatingPointError)
    with np.errstate(over="raise"), pytest.raises(KernelError, match="node 'mul2'"):
        sess.run(None, {"x": x})
    with np.errstate(over="ignore"):  # the session stays usable: inf, as NumPy computes
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.float32(np.inf))


class _NoStop:
    def check(self, where: str) -> None:
        pass


def _inputs_model(rows: int | str = "N") -> ow.InferenceSession:
    g = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["y"])], "two",
        [helper.make_tensor_value_info("a", F32, [rows, 4]),
         helper.make_tensor_value_info("b", F32, [rows, 4])],
        [helper.make_tensor_value_info("y", F32, [rows, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return ow.InferenceSession(m.SerializeToString())


def test_fast_feeds_agree_with_check_feeds_or_step_aside():
    sess = _inputs_model()
    inputs = sess.model.graph.inputs
    fast = FastFeeds(inputs)
    a = RNG.standard_normal((2, 4)).astype(np.float32)
    b = RNG.standard_normal((2, 4)).astype(np.float32)
    got = fast({"a": a, "b": b})
    want = check_feeds(inputs, inputs, {"a": a, "b": b})
    for g, w, x in zip(got, want, (a, b)):
        assert not g.flags.writeable and np.shares_memory(g, x) and x.flags.writeable
        np.testing.assert_array_equal(g, w)
    c = RNG.standard_normal((3, 4)).astype(np.float32)
    for feed in [{"a": a}, {"a": a, "b": b, "z": a}, {"a": a, "b": c},
                 {"a": a, "b": b.astype(np.float64)}, {"a": a, "b": b.astype(">f4")},
                 {"a": a, "b": b[None]}, {"a": a, "b": b.tolist()}, [("a", a), ("b", b)],
                 {"a": a, "b": np.ones((2, 5), np.float32)}, {"a": a, "b": None}]:
        assert fast(feed) is None, feed  # check_feeds words the refusal or converts
    # the session gives the same answers and refusals either way
    np.testing.assert_array_equal(sess.run(None, {"a": a, "b": b.astype(">f4")})[0], a + b)
    np.testing.assert_array_equal(sess.run(None, {"a": a, "b": b.tolist()})[0], a + b)
    with pytest.raises(InputError, match="'b' dimension 0"):
        sess.run(None, {"a": a, "b": c})
    with pytest.raises(InputError, match="expects dtype float32, got float64"):
        sess.run(None, {"a": a, "b": b.astype(np.float64)})
    with pytest.raises(InputError, match="unknown input name 'z'"):
        sess.run(None, {"a": a, "b": b, "z": a})
    np.testing.assert_array_equal(sess.run(None, {"a": a, "b": b})[0], a + b)


def test_identity_output_never_shares_the_callers_memory():
    g = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"]), helper.make_node("Relu", ["x"], ["z"])],
        "ident", [helper.make_tensor_value_info("x", F32, [2, 3])],
        [helper.make_tensor_value_info("y", F32, [2, 3]),
         helper.make_tensor_value_info("z", F32, [2, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    sess = ow.InferenceSession(m.SerializeToString(), optimization_level=0)
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    for names in (None, ["y"], ["z", "y"]):
        outs = sess.run(names, {"x": x})
        assert all(not np.shares_memory(o, x) for o in outs)
    y, before = sess.run(["y"], {"x": x})[0], x.copy()
    x += 1
    np.testing.assert_array_equal(y, before)
