"""Memory plans on real sessions: planned buffers, in-place reuse, views, limits, zero copy."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import opwarden
from opwarden import native, zoo
from opwarden.errors import MemoryLimitError, OpwardenError
from tests.models import small_cnn

DOMAIN = "test.memory"


# A custom op whose fast variant writes into the planned buffer, in place when allowed.
@opwarden.op(
    "PlannedScale",
    domain=DOMAIN,
    inputs=["X: T"],
    outputs=["Y: T"],
    types={"T": ["float32"]},
    attrs={"alpha": 2.0},
    contract=opwarden.Contract(may_alias=((0, 0),)),
)
def PlannedScale(X, *, alpha=2.0):
    return (X * np.float32(alpha)).astype(np.float32)


@PlannedScale.infer
def _scale_shape(X, *, alpha=2.0):
    return X


CALLS: list[tuple[bool, bool]] = []  # (got out, out is input)


@PlannedScale.kernel(device="cpu", name="plannedscale.cpu.out", priority=10, accepts_out=True)
def _scale_out(X, *, alpha=2.0, out=None):
    CALLS.append((out is not None, out is not None and np.shares_memory(out, X)))
    return np.multiply(X, np.float32(alpha), out=out)


# A kernel that returns a view of its input without declaring it (the executor must copy it
# out of the arena before the region is reused).
@opwarden.op(
    "SneakyView",
    domain=DOMAIN,
    inputs=["X: T"],
    outputs=["Y: T"],
    types={"T": ["float32"]},
    contract=opwarden.Contract(),
)
def SneakyView(X):
    return X[...]


@SneakyView.infer
def _sneaky_shape(X):
    return X


def _chain(ops: list[str], shape=(2, 3, 4)) -> onnx.ModelProto:
    nodes, prev = [], "x"
    for i, op in enumerate(ops):
        out = f"t{i}" if i < len(ops) - 1 else "y"
        dom = DOMAIN if op in ("PlannedScale", "SneakyView") else ""
        nodes.append(helper.make_node(op, [prev], [out], name=f"n{i}", domain=dom))
        prev = out
    g = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
    )
    return helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)]
    )


def _expected(ops, x):
    y = x
    for op in ops:
        y = {"PlannedScale": lambda v: v * 2, "Relu": lambda v: np.maximum(v, 0),
             "Neg": lambda v: -v, "SneakyView": lambda v: v}[op](y)
    return y


def test_kernels_write_into_the_arena_and_in_place():
    ops = ["Relu", "PlannedScale", "PlannedScale", "Neg"]
    sess = opwarden.InferenceSession(_chain(ops), optimization_level=0)
    plan = sess.memory_plan
    plan.check()
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    CALLS.clear()
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(y, _expected(ops, x), rtol=1e-6)
    # both write into planned buffers; the second reuses its dying input's buffer
    assert CALLS[0][0] and CALLS[1] == (True, True)
    shared = [b.values for b in plan.buffers if len(b.values) > 1]
    assert any(v[-2:] == ["t1", "t2"] for v in shared)
    assert plan.arena_bytes <= plan.naive_bytes


def test_outputs_never_alias_the_arena_across_runs():
    ops = ["Relu", "PlannedScale", "PlannedScale"]  # last one writes the graph output
    sess = opwarden.InferenceSession(_chain(ops), optimization_level=0)
    x1 = np.ones((2, 3, 4), np.float32)
    (y1,) = sess.run(None, {"x": x1})
    keep = y1.copy()
    sess.run(None, {"x": -x1 * 5})
    np.testing.assert_array_equal(y1, keep)  # the first result was not overwritten


def test_undeclared_views_are_copied_out_of_the_arena():
    ops = ["Relu", "PlannedScale", "SneakyView", "PlannedScale", "PlannedScale", "Neg"]
    sess = opwarden.InferenceSession(_chain(ops), optimization_level=0, debug_memory=True)
    x = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(y, _expected(ops, x), rtol=1e-6)


@pytest.mark.parametrize("guarded", [False, True])
def test_planned_and_unplanned_runs_agree(guarded):
    ops = ["Relu", "PlannedScale", "Neg", "PlannedScale", "Relu", "PlannedScale"]
    checks = ("all",) if guarded else ()
    sess = opwarden.InferenceSession(_chain(ops), optimization_level=0, checks=checks)
    x = np.random.default_rng(2).standard_normal((2, 3, 4)).astype(np.float32)
    planned = sess.run(None, {"x": x})[0]
    unplanned = sess.program.run([x])[0]  # no out= buffers
    np.testing.assert_array_equal(planned, unplanned)


@pytest.mark.parametrize("name", ["resnet50", "densenet121", "inception_v2", "squeezenet"])
def test_light_models_arena_close_to_lower_bound(name):
    m = zoo.build(name)
    sess = opwarden.InferenceSession(m.SerializeToString())
    plan = sess.memory_plan
    plan.check()
    assert plan.lower_bound_bytes > 0
    assert plan.arena_bytes <= 1.10 * plan.lower_bound_bytes
    d = plan.to_dict()
    assert {"arena_bytes", "lower_bound_bytes", "naive_bytes", "buffers"} <= set(d)


def test_debug_mode_matches_plain_run_on_a_cnn():
    m = zoo.build("squeezenet")
    feeds = zoo.feeds_for(m)
    plain = opwarden.InferenceSession(m.SerializeToString()).run(None, feeds)[0]
    dbg = opwarden.InferenceSession(m.SerializeToString(), debug_memory=True).run(None, feeds)[0]
    np.testing.assert_array_equal(plain, dbg)


def test_plans_per_batch_size_are_cached_and_bounded():
    sess = opwarden.InferenceSession(small_cnn(), plan_cache_size=4)
    rng = np.random.default_rng(0)
    sizes = []
    for n in list(range(1, 11)) * 2:
        sess.run(None, {"x": rng.standard_normal((n, 3, 8, 8)).astype(np.float32)})
        sizes.append(sess.memory_plan.signature)
    assert len(sess.memory._cache) == 4
    biggest = sess.plan_for({"x": np.zeros((10, 3, 8, 8), np.float32)}).arena_bytes
    # one arena for all plans, grown geometrically: at least the biggest plan, not unbounded
    assert biggest <= sess.memory.arena_bytes <= 2 * biggest
    # a bigger batch needs a bigger plan; the arena grows once and is reused after
    assert sess.plan_for({"x": np.zeros((7, 3, 8, 8), np.float32)}).arena_bytes < (
        sess.plan_for({"x": np.zeros((70, 3, 8, 8), np.float32)}).arena_bytes
    )


def _constant_of_shape_model(shape_from_input: bool, n: int) -> onnx.ModelProto:
    if shape_from_input:
        inputs = [helper.make_tensor_value_info("s", TensorProto.INT64, [1])]
        inits = []
    else:
        inputs = []
        inits = [numpy_helper.from_array(np.array([n], np.int64), "s")]
    g = helper.make_graph(
        [
            helper.make_node("ConstantOfShape", ["s"], ["z"], name="bomb"),
            helper.make_node("ReduceSum", ["z"], ["y"], name="sum", keepdims=0),
        ],
        "bomb",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
        initializer=inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_memory_bomb_with_static_shape_is_refused_at_load():
    with pytest.raises(MemoryLimitError, match="bomb"):
        opwarden.InferenceSession(_constant_of_shape_model(False, 10**12))


def test_memory_bomb_from_data_is_refused_before_allocating():
    sess = opwarden.InferenceSession(
        _constant_of_shape_model(True, 0), memory_limit_bytes=64 << 20
    )
    with pytest.raises(MemoryLimitError, match="bomb"):
        sess.run(None, {"s": np.array([10**12], np.int64)})
    # the session stays usable
    (y,) = sess.run(None, {"s": np.array([10], np.int64)})
    assert float(y) == 0.0


def test_feed_that_blows_the_plan_is_refused_before_running():
    sess = opwarden.InferenceSession(small_cnn(), memory_limit_bytes=1 << 20)
    sess.run(None, {"x": np.zeros((1, 3, 8, 8), np.float32)})
    with pytest.raises(MemoryLimitError, match="memory limit"):
        sess.run(None, {"x": np.zeros((4096, 3, 8, 8), np.float32)})
    assert isinstance(MemoryLimitError("x"), OpwardenError)


def test_weights_are_views_over_the_model_file(tmp_path):
    m = zoo.build("squeezenet")
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    sess = opwarden.InferenceSession(str(path), optimization_level=0)
    big = [v.const for v in sess.model.graph.initializers.values() if v.const.nbytes >= 65536]
    assert big
    views = 0
    for w in big:
        assert not w.flags.writeable and w.flags.aligned
        views += not w.flags.owndata
    # payloads at aligned offsets are views over the file; misaligned ones are copied once
    # (NumPy would otherwise copy them on every kernel call)
    assert views > 0 or all(w.flags.owndata for w in big)
    from_bytes = opwarden.InferenceSession(m.SerializeToString(), optimization_level=0)
    feeds = zoo.feeds_for(m)
    np.testing.assert_array_equal(sess.run(None, feeds)[0], from_bytes.run(None, feeds)[0])


@pytest.mark.parametrize("name", ["inception_v1", "squeezenet"])
def test_parallel_branches_give_the_sequential_result(name):
    m = zoo.build(name)
    feeds = zoo.feeds_for(m)
    # (SqueezeNet's fire branches are one FusedConv unless that pass is off.)
    off = ["concat_conv_merge"] if name == "squeezenet" else []
    seq = opwarden.InferenceSession(m.SerializeToString(), disabled_passes=off)
    par = opwarden.InferenceSession(m.SerializeToString(), inter_op_num_threads=2,
                                    disabled_passes=off)
    assert par.program.levels is not None
    assert max(len(lv) for lv in par.program.levels) > 1  # the model has independent branches
    par.memory_plan.check()  # buffers of one wavefront never share memory
    want = seq.run(None, feeds)[0]
    for _ in range(3):  # deterministic from run to run
        got = par.run(None, feeds)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_overridden_initializer_feeds_win_over_the_constant():
    w = numpy_helper.from_array(np.full((3,), 2.0, np.float32), "w")
    g = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["y"], name="mul")],
        "override",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [3]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
        initializer=[w],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    sess = opwarden.InferenceSession(m)
    x = np.ones(3, np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], [2, 2, 2])
    np.testing.assert_array_equal(
        sess.run(None, {"x": x, "w": np.full(3, 5.0, np.float32)})[0], [5, 5, 5]
    )


def test_plan_command_json_and_picture(tmp_path, capsys):
    import json

    from opwarden.cli import main

    path = tmp_path / "m.onnx"
    path.write_bytes(small_cnn().SerializeToString())
    svg = tmp_path / "arena.svg"
    assert main(["plan", str(path), "--json", "--batch", "3", "--png", str(svg)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"arena_bytes", "lower_bound_bytes", "naive_bytes", "buffers"} <= set(out)
    assert out["lower_bound_bytes"] <= out["arena_bytes"] <= out["naive_bytes"]
    assert out["signature"] == [3]
    assert all({"name", "producer", "size", "offset", "first_step", "last_step"} <= set(b)
               for b in out["buffers"])
    assert svg.read_text().startswith("<svg") and svg.read_text().count("<rect") > len(
        out["buffers"]
    )
    assert main(["plan", str(path)]) == 0  # the table
    assert "lower bound" in capsys.readouterr().out


def _residual_blocks(group: int, inner: bool, blocks: int = 2, c: int = 16) -> onnx.ModelProto:
    """s0 = Relu(x); s[i+1] = Relu(Conv1x1(u[i]) + s[i]) with u[i] = Relu(Conv1x1(s[i])) when
    `inner` (a ResNet block: the residual s[i] dies at the second, fused convolution), else
    u[i] = s[i] (the fused convolution reads the residual as its input too). Two blocks: enough
    for the layout pass to run them in NHWC."""
    rng = np.random.default_rng(group)
    nodes = [helper.make_node("Relu", ["x"], ["s0"])]
    inits = []

    def conv(i, name, x, y):
        w = rng.standard_normal((c, c // group, 1, 1)).astype(np.float32)
        b = rng.standard_normal(c).astype(np.float32)
        inits.extend([numpy_helper.from_array(w, f"w{name}{i}"),
                      numpy_helper.from_array(b, f"b{name}{i}")])
        nodes.append(helper.make_node("Conv", [x, f"w{name}{i}", f"b{name}{i}"], [y],
                                      group=group))

    for i in range(blocks):
        u = f"s{i}"
        if inner:
            conv(i, "a", f"s{i}", f"v{i}")
            nodes.append(helper.make_node("Relu", [f"v{i}"], [f"u{i}"]))
            u = f"u{i}"
        conv(i, "b", u, f"c{i}")
        nodes += [helper.make_node("Add", [f"c{i}", f"s{i}"], [f"a{i}"]),
                  helper.make_node("Relu", [f"a{i}"], [f"s{i + 1}"])]
    g = helper.make_graph(
        nodes, "res", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 16, 16])],
        [helper.make_tensor_value_info(f"s{blocks}", TensorProto.FLOAT, [1, c, 16, 16])],
        inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("inner", [True, False])
@pytest.mark.parametrize("group", [1, 2])
def test_fused_conv_writes_over_its_residual_where_its_kernel_says_it_pays(group, inner):
    """FusedConv's contract allows Y over Z; the NHWC kernel takes it for group 1 only
    (Variant.in_place_when: grouped convolutions measured slower in place), and never when Z
    is also the convolution's input X (which may not share Y)."""
    model = _residual_blocks(group, inner)
    sess = opwarden.InferenceSession(model, optimization_level=3)
    fused = [r for r in sess.explain() if r["op_type"] == "FusedConv"]
    # 1x1: its named algorithm (grouped 1x1 with few channels per group: the compiled loop)
    want = "fusedconv.cpu.grouped" if group > 1 and native.available() else \
        "fusedconv.cpu.pointwise"
    assert {r["variant"] for r in fused} == {want}
    buffers = [set(b.values) for b in sess.memory_plan.buffers]
    over_z = any({"s0__nhwc", "s1__nhwc"} <= v for v in buffers)
    assert over_z == (group == 1 and inner), buffers
    x = np.random.default_rng(3).standard_normal((1, 16, 16, 16)).astype(np.float32)
    ref = opwarden.InferenceSession(model, optimization_level=0)
    for _ in range(2):  # the second run reads the arena the first one left
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0],
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op,attrs,shape", [
    ("Transpose", {"perm": [1, 0]}, [3, 2]), ("Identity", {}, [2, 3]),
    ("Flatten", {"axis": 0}, [1, 6]),
])
def test_outputs_never_alias_the_callers_feeds(op, attrs, shape):
    """A view of a feed handed back as an output would change when the caller next writes
    into its input array."""
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 9
    sess = opwarden.InferenceSession(model.SerializeToString())
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    y = sess.run(None, {"x": x})[0]
    want = y.copy()
    assert not np.shares_memory(x, y)
    x[...] = -1
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("consumer", ["Relu", None])
def test_planned_buffer_of_a_tuple_returning_kernel_stays_writable(consumer):
    """LayerNormalization's fast kernel writes Y into its planned buffer and returns (Y, Mean,
    InvStdDev). The lean loop made the returned Y read-only for later steps in place, i.e.
    the planned buffer itself: the next run's kernel then faulted on it and the guard
    quietly reran the node on the reference kernel, every run."""
    nodes = [helper.make_node("Add", ["x", "x"], ["s"]),
             helper.make_node("LayerNormalization", ["s", "g", "b"], ["n"], axis=-1)]
    if consumer:
        nodes.append(helper.make_node(consumer, ["n"], ["y"]))
    else:
        nodes.append(helper.make_node("Identity", ["n"], ["y"]))
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(64).astype(np.float32), "g"),
             numpy_helper.from_array(rng.standard_normal(64).astype(np.float32), "b")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 64])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    sess = opwarden.InferenceSession(model.SerializeToString())
    ref = opwarden.InferenceSession(model.SerializeToString(), optimization_level=0,
                                    fallback="allow", checks=[])
    x = rng.standard_normal((8, 64)).astype(np.float32)
    want = ref.run(None, {"x": x})[0]
    variants = {p.node.name or p.node.op_type: p.variant.name for p in sess.placements}
    assert "layernormalization.cpu.fast" in variants.values(), variants
    for _ in range(3):
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-5)
    assert not sess.faults, [(f.node, f.check, f.detail) for f in sess.faults]
