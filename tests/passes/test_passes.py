"""Each pass in isolation on small hand-built models: what it rewrites, and that outputs stay."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import opwarden as ow
from opwarden.passes import PASS_NAMES

from .helpers import changes, check_same, model, optimized, types_of

rng = np.random.default_rng(0)


def _r(*shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _conv_bn_model(extra_nodes=(), out="y", bn_after_conv=True):
    w, b = _r(4, 3, 3, 3), _r(4)
    scale, bias, mean = _r(4), _r(4), _r(4)
    var = np.abs(_r(4)) + 0.5
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c" if bn_after_conv else "x2", "s", "bb", "m",
                                                "v"], ["bn"], epsilon=1e-3),
        *extra_nodes,
    ]
    inits = [("w", w), ("b", b), ("s", scale), ("bb", bias), ("m", mean), ("v", var)]
    return model(nodes, [("x", [2, 3, 6, 6])], [(out, [2, 4, 6, 6])], inits)


def test_conv_bn_relu_becomes_one_fused_conv():
    data = _conv_bn_model([helper.make_node("Relu", ["bn"], ["y"])])
    m, report = optimized(data)
    assert types_of(m) == ["FusedConv"]
    node = m.graph.nodes[0]
    assert node.attrs["activation"] == "Relu" and node.domain == "opwarden"
    assert m.opsets["opwarden"] == 1
    by = {e["pass"]: e for e in report}
    assert by["conv_bn_folding"]["details"] == {"folded_nodes": 1, "convs": 1}
    assert by["conv_fusion"]["details"]["Conv+Relu"] == 1
    check_same(data, {"x": _r(2, 3, 6, 6)}, rtol=1e-4)


def test_bn_as_mul_add_after_conv_folds_into_weights():
    c = np.arange(1, 5, dtype=np.float32).reshape(4, 1, 1)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"]),
        helper.make_node("Mul", ["c", "k"], ["mu"]),
        helper.make_node("Add", ["d", "mu"], ["y"]),  # constant first: Add is commutative
    ]
    data = model(nodes, [("x", [1, 3, 5, 5])], [("y", [1, 4, 3, 3])],
                 [("w", _r(4, 3, 3, 3)), ("k", c), ("d", -c)])
    m, _ = optimized(data)
    assert types_of(m) == ["Conv"]
    assert len(m.graph.nodes[0].inputs) == 3  # a bias was created
    check_same(data, {"x": _r(1, 3, 5, 5)}, rtol=1e-5)


def test_conv_bn_folding_keeps_shared_intermediates():
    # The Conv output is also a graph output: nothing may be folded into it.
    data = _conv_bn_model([helper.make_node("Relu", ["bn"], ["y"])], out="y")
    m, _ = optimized(data)
    assert "BatchNormalization" not in types_of(m)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["y"])]
    inits = [("w", _r(4, 3, 1, 1)), ("s", _r(4)), ("bb", _r(4)), ("m", _r(4)),
             ("v", np.abs(_r(4)) + 1)]
    data = model(nodes, [("x", [1, 3, 4, 4])], [("y", [1, 4, 4, 4]), ("c", [1, 4, 4, 4])], inits)
    m, _ = optimized(data)
    assert types_of(m) == ["Conv", "FusedElementwise"]  # the BN as x * s + t, fused
    check_same(data, {"x": _r(1, 3, 4, 4)})


def test_standalone_bn_becomes_one_fused_elementwise_with_relu():
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "bb", "m", "v"], ["bn"]),
             helper.make_node("Relu", ["bn"], ["y"])]
    inits = [("s", _r(3)), ("bb", _r(3)), ("m", _r(3)), ("v", np.abs(_r(3)) + 1)]
    data = model(nodes, [("x", [2, 3, 4, 4])], [("y", [2, 3, 4, 4])], inits)
    m, report = optimized(data)
    assert types_of(m) == ["FusedElementwise"]
    assert m.graph.nodes[0].attrs["program"] == "t0=mul(x0,x1);t1=add(t0,x2);t2=relu(t1)"
    check_same(data, {"x": _r(2, 3, 4, 4)}, rtol=1e-5)


@pytest.mark.parametrize("act, attrs, extra", [
    ("Relu", {}, []), ("Sigmoid", {}, []), ("Tanh", {}, []), ("HardSwish", {}, []),
    ("LeakyRelu", {"alpha": 0.2}, []), ("Clip", {}, ["lo", "hi"]), ("Clip", {}, ["", "hi"]),
    ("Gelu", {"approximate": "tanh"}, []), ("Gelu", {}, []),
])
def test_conv_activation_fusion(act, attrs, extra):
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[2, 2]),
             helper.make_node(act, ["c", *extra], ["y"], **attrs)]
    inits = [("w", _r(4, 3, 3, 3)), ("b", _r(4)),
             ("lo", np.float32(-0.5)), ("hi", np.float32(0.7))]
    data = model(nodes, [("x", [1, 3, 9, 9])], [("y", [1, 4, 4, 4])], inits, opset=20)
    m, _ = optimized(data)
    assert types_of(m) == ["FusedConv"]
    assert m.graph.nodes[0].attrs["activation"] == act
    check_same(data, {"x": _r(1, 3, 9, 9)})


def test_conv_residual_add_relu_and_guard_against_broadcast():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["z", "c"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    data = model(nodes, [("x", [1, 4, 5, 5]), ("z", [1, 4, 5, 5])], [("y", [1, 4, 5, 5])],
                 [("w", _r(4, 4, 3, 3))])
    m, _ = optimized(data)
    assert types_of(m) == ["FusedConv"]
    assert [v.name if v else None for v in m.graph.nodes[0].inputs] == ["x", "w", None, "z"]
    check_same(data, {"x": _r(1, 4, 5, 5), "z": _r(1, 4, 5, 5)})
    # z broadcasts (it is not Y's shape): Add is not a residual; only Relu may not fuse either.
    data = model(nodes, [("x", [1, 4, 5, 5]), ("z", [1, 1, 5, 5])], [("y", [1, 4, 5, 5])],
                 [("w", _r(4, 4, 3, 3))])
    m, _ = optimized(data)
    assert "FusedConv" not in types_of(m)
    check_same(data, {"x": _r(1, 4, 5, 5), "z": _r(1, 1, 5, 5)})


def test_gemm_and_matmul_fusion():
    nodes = [helper.make_node("Gemm", ["a", "w", "b"], ["g"], transB=1, alpha=0.5),
             helper.make_node("Relu", ["g"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["mm"]),
             helper.make_node("Add", ["mm", "b2"], ["ad"]),
             helper.make_node("Sigmoid", ["ad"], ["y"]),
             helper.make_node("MatMul", ["x3", "w3"], ["m3"]),
             helper.make_node("Add", ["m3", "b3"], ["y3"])]
    inits = [("w", _r(6, 5)), ("b", _r(6)), ("w2", _r(6, 7)), ("b2", _r(7)),
             ("w3", _r(4, 3)), ("b3", _r(3))]
    data = model(nodes, [("a", [2, 5]), ("x3", [2, 5, 4])], [("y", [2, 7]), ("y3", [2, 5, 3])],
                 inits)
    m, _ = optimized(data)
    assert types_of(m) == ["FusedGemm", "FusedGemm", "FusedMatMul"]
    assert m.graph.nodes[1].attrs["activation"] == "Sigmoid"
    check_same(data, {"a": _r(2, 5), "x3": _r(2, 5, 4)})


def test_constant_and_shape_folding_then_reshape_disappears():
    nodes = [helper.make_node("Shape", ["x"], ["sh"]),
             helper.make_node("Gather", ["sh", "i0"], ["d0"], axis=0),
             helper.make_node("Unsqueeze", ["d0", "ax"], ["d0u"]),
             helper.make_node("Concat", ["d0u", "rest"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node("Add", ["r", "k2"], ["y"]),
             helper.make_node("Mul", ["k0", "k1"], ["k2"])]
    inits = [("i0", np.array(0, np.int64)), ("ax", np.array([0], np.int64)),
             ("rest", np.array([3, 4], np.int64)), ("k0", _r(4)), ("k1", _r(4))]
    data = model(nodes, [("x", [2, 3, 4])], [("y", [2, 3, 4])], inits)
    m, report = optimized(data, optimization_level=1)
    assert types_of(m) == ["Add"]
    by = {e["pass"]: e for e in report}
    assert by["shape_folding"]["details"] == {"Shape": 1}
    assert by["constant_folding"]["details"] == {"Gather": 1, "Unsqueeze": 1, "Concat": 1,
                                                 "Mul": 1}
    assert by["identity_elimination"]["details"] == {"Reshape": 1}
    check_same(data, {"x": _r(2, 3, 4)}, optimization_level=1)


def test_symbolic_shapes_are_not_folded():
    nodes = [helper.make_node("Shape", ["x"], ["sh"]),
             helper.make_node("Reshape", ["x", "sh"], ["y"])]
    data = model(nodes, [("x", ["N", 3])], [("y", ["N", 3])])
    m, _ = optimized(data)
    assert types_of(m) == ["Shape", "Reshape"]
    check_same(data, {"x": _r(5, 3)})


def test_constant_folding_size_cap():
    nodes = [helper.make_node("ConstantOfShape", ["big"], ["z"]),
             helper.make_node("Add", ["x", "z"], ["y"])]
    data = model(nodes, [("x", [4096, 4096])], [("y", [4096, 4096])],
                 [("big", np.array([4096, 4096], np.int64))])
    m, _ = optimized(data)  # 64 MiB > the cap: stays a node
    assert "ConstantOfShape" in types_of(m)
    small = model(nodes, [("x", [4, 4])], [("y", [4, 4])],
                  [("big", np.array([4, 4], np.int64))])
    m, _ = optimized(small)
    assert "ConstantOfShape" not in types_of(m)


def test_overridable_initializers_are_not_constants_from_ir4():
    nodes = [helper.make_node("Mul", ["k", "k"], ["k2"]),
             helper.make_node("Add", ["x", "k2"], ["y"])]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", 1, [3]), helper.make_tensor_value_info("k", 1, [3])],
        [helper.make_tensor_value_info("y", 1, [3])],
        initializer=[helper.make_tensor("k", 1, [3], [1.0, 2.0, 3.0])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    data = m.SerializeToString()
    ir, report = optimized(data, optimization_level=1)
    assert types_of(ir) == ["Mul", "Add"]
    assert {e["pass"]: e["changes"] for e in report}["constant_folding"] == 0
    check_same(data, {"x": np.zeros(3, np.float32), "k": np.ones(3, np.float32)})
    m.ir_version = 3  # before IR 4 every initializer is listed as an input and is a constant
    ir, _ = optimized(m.SerializeToString(), optimization_level=1)
    assert types_of(ir) == ["Add"]


def test_identity_elimination_keeps_graph_output_names():
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Identity", ["r"], ["y"]),
             helper.make_node("Dropout", ["y"], ["d"]),
             helper.make_node("Cast", ["d"], ["c"], to=1),
             helper.make_node("Transpose", ["c"], ["t"], perm=[0, 1]),
             helper.make_node("Identity", ["t"], ["y2"])]
    data = model(nodes, [("x", [2, 3])], [("y", [2, 3]), ("y2", [2, 3])])
    m, report = optimized(data, optimization_level=1)
    # y is a graph output and read downstream: Relu writes y directly; y2 stays named.
    assert types_of(m) == ["Relu", "Identity"]
    assert [v.name for v in m.graph.outputs] == ["y", "y2"]
    s = check_same(data, {"x": _r(2, 3)}, optimization_level=1)
    assert [o.name for o in s.get_outputs()] == ["y", "y2"]


def test_dead_code_elimination():
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Exp", ["x"], ["unused"]),
             helper.make_node("Neg", ["unused"], ["unused2"])]
    data = model(nodes, [("x", [3])], [("y", [3])])
    m, report = optimized(data, optimization_level=1)
    assert types_of(m) == ["Relu"]
    assert {e["pass"]: e["changes"] for e in report}["dead_code_elimination"] == 2


def test_transpose_cancellation():
    nodes = [helper.make_node("Transpose", ["x"], ["t1"], perm=[0, 2, 3, 1]),
             helper.make_node("Transpose", ["t1"], ["y"], perm=[0, 3, 1, 2]),
             helper.make_node("Transpose", ["x"], ["u1"], perm=[1, 0, 2, 3]),
             helper.make_node("Transpose", ["u1"], ["y2"], perm=[0, 2, 3, 1])]
    data = model(nodes, [("x", [1, 2, 3, 4])], [("y", [1, 2, 3, 4]), ("y2", [2, 3, 4, 1])])
    m, report = optimized(data, optimization_level=2)
    # y is a graph output fed straight by a graph input: one Transpose must stay to write it.
    by = {e["pass"]: e for e in report}
    assert by["transpose_cancellation"]["details"]["composed"] == 2
    assert types_of(m) == ["Transpose", "Transpose"]
    assert m.graph.nodes[1].attrs["perm"] == [1, 2, 3, 0]
    check_same(data, {"x": _r(1, 2, 3, 4)}, optimization_level=2)
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t1"], perm=[0, 2, 3, 1]),
             helper.make_node("Transpose", ["t1"], ["t2"], perm=[0, 3, 1, 2]),
             helper.make_node("Neg", ["t2"], ["y"])]
    data = model(nodes, [("x", [1, 2, 3, 4])], [("y", [1, 2, 3, 4])])
    m, _ = optimized(data, optimization_level=2, disabled_passes=["elementwise_fusion"])
    assert types_of(m) == ["Relu", "Neg"]
    check_same(data, {"x": _r(1, 2, 3, 4)}, optimization_level=2)


def test_levels_and_disabled_passes():
    data = _conv_bn_model([helper.make_node("Relu", ["bn"], ["y"])])
    m, report = optimized(data, optimization_level=0)
    assert types_of(m) == ["Conv", "BatchNormalization", "Relu"]
    assert report[-1]["changes"] == 0
    m, report = optimized(data, disabled_passes=["conv_bn_folding"])
    assert "BatchNormalization" not in types_of(m)  # it became Mul/Add, fused with the Relu
    assert {"pass": "conv_bn_folding", "changes": 0, "skipped": "disabled"} in report
    m, _ = optimized(data, disabled_passes=["conv_bn_folding", "bn_to_affine"])
    assert types_of(m) == ["Conv", "BatchNormalization", "Relu"]
    assert set(PASS_NAMES) >= {e["pass"] for e in report[:-1]}
    sess = ow.InferenceSession(data)
    assert sess.pass_report[-1]["pass"] == "total"
    assert sess.pass_report[-1]["nodes_before"] == 3 and sess.pass_report[-1]["nodes_after"] == 1


def test_subgraph_reads_keep_main_graph_values():
    then_g = helper.make_graph([helper.make_node("Neg", ["r"], ["o"])], "then", [],
                               [helper.make_tensor_value_info("o", 1, [3])])
    else_g = helper.make_graph([helper.make_node("Identity", ["r"], ["o2"])], "else", [],
                               [helper.make_tensor_value_info("o2", 1, [3])])
    nodes = [helper.make_node("Relu", ["x"], ["r0"]),
             helper.make_node("Identity", ["r0"], ["r"]),
             helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["cond"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)]
    data = model(nodes, [("x", [3])], [("y", [3])], [("zero", np.float32(0))])
    m, _ = optimized(data)
    assert "Identity" in types_of(m)  # r is read inside the branches
    for x in (np.array([1, -2, 3], np.float32), np.array([-1, -2, 3], np.float32)):
        check_same(data, {"x": x})


@pytest.mark.parametrize("which", ["conv_bn_relu", "fire"])
def test_fused_model_exports_and_reloads(which):
    # FusedConv (with activation, or with branches) survives export and reload.
    from opwarden.ir.export import model_proto

    if which == "fire":
        data, shape = _fire_model(), (2, 6, 5, 5)
    else:
        data, shape = _conv_bn_model([helper.make_node("Relu", ["bn"], ["y"])]), (2, 3, 6, 6)
    m, _ = optimized(data)
    proto = model_proto(m)
    sess = ow.InferenceSession(proto.SerializeToString(), ow.SessionOptions(optimization_level=0))
    x = _r(*shape)
    want = ow.InferenceSession(data, ow.SessionOptions(optimization_level=0)).run(None, {"x": x})
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want[0], rtol=1e-4, atol=1e-4)


def _siblings_model(opset=17):
    """Inception-like heads: three 1x1 convolutions of x with Relu (one without bias), a 1x1
    with a residual, a strided 1x1 and a 3x3 (none of those three can join), then consumers
    of every output."""
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"]),
        helper.make_node("Relu", ["c1"], ["a"]),
        helper.make_node("Conv", ["x", "w2"], ["c2"]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Conv", ["r2", "w5", "b5"], ["b"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["x", "w3", "b3"], ["c3"]),
        helper.make_node("Relu", ["c3"], ["c"]),
        helper.make_node("Conv", ["x", "w4", "b4"], ["c4"], strides=[2, 2]),
        helper.make_node("Conv", ["x", "w7", "b7"], ["c7"], strides=[2, 2]),
        helper.make_node("Add", ["c7", "c4"], ["z"]),
        helper.make_node("Conv", ["x", "w6", "b6"], ["c6"], pads=[1, 1, 1, 1]),
        helper.make_node("Concat", ["a", "b", "c", "c6"], ["y"], axis=1),
    ]
    inits = [("w1", _r(5, 8, 1, 1)), ("b1", _r(5)), ("w2", _r(3, 8, 1, 1)),
             ("w3", _r(4, 8, 1, 1)), ("b3", _r(4)), ("w4", _r(6, 8, 1, 1)), ("b4", _r(6)),
             ("w5", _r(7, 3, 3, 3)), ("b5", _r(7)), ("w6", _r(2, 8, 3, 3)), ("b6", _r(2)),
             ("w7", _r(6, 8, 1, 1)), ("b7", _r(6))]
    return model(nodes, [("x", [2, 8, 6, 6])], [("y", [2, 18, 6, 6]), ("z", [2, 6, 3, 3])],
                 inits, opset=opset)


@pytest.mark.parametrize("opset", [9, 17])
def test_sibling_1x1_convolutions_merge_into_one(opset):
    data = _siblings_model(opset)
    m, report = optimized(data)
    by = {e["pass"]: e for e in report}
    assert by["sibling_conv_merge"]["details"] == {"1x1 convolutions merged": 3,
                                                   "merged groups": 1}
    split = next(n for n in m.graph.nodes if n.op_type == "Split")
    merged = split.inputs[0].producer
    assert merged.op_type == "FusedConv" and merged.attrs["activation"] == "Relu"
    assert [o.name for o in split.outputs] == ["a", "r2", "c"]
    assert merged.inputs[1].const.shape == (12, 8, 1, 1)
    np.testing.assert_array_equal(merged.inputs[2].const[5:8], 0)  # w2 had no bias
    # The 3x3s, the lone strided 1x1 and the one with a residual (its Add fused) stay.
    convs = [n for n in m.graph.nodes if n.op_type in ("Conv", "FusedConv")]
    assert len(convs) == 5
    assert sum(len(n.inputs) > 3 and n.inputs[3] is not None for n in convs) == 1
    sess = check_same(data, {"x": _r(2, 8, 6, 6)}, rtol=1e-5)
    off = ow.InferenceSession(data, ow.SessionOptions(disabled_passes=["sibling_conv_merge"]))
    assert "Split" not in [n.op_type for n in off.model.graph.nodes]
    # In NHWC the Split stays channels-last (its axis remapped), its outputs are views of the
    # merged convolution's output and no transpose is inserted for it.
    nodes = sess.model.graph.nodes
    sp = next(n for n in nodes if n.op_type == "Split")
    assert sp.attrs["axis"] == 3 and sp.outputs[0].fact.shape == (2, 6, 6, 5)
    assert sum(n.op_type == "Transpose" for n in nodes) == 3  # x in; y and z out


def test_split_outputs_are_views_planned_with_their_input():
    # Split declares every output a view of its input (must_alias (0, -1)): the plan keeps the
    # input's buffer alive while any output is read, so later steps cannot overwrite them.
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Split", ["r", "sizes"], ["p", "q", "s"], axis=1),
             helper.make_node("Neg", ["p"], ["np"]),
             helper.make_node("Exp", ["q"], ["eq"]),
             helper.make_node("Abs", ["np"], ["ap"]),
             helper.make_node("Concat", ["ap", "eq", "s"], ["y"], axis=1)]
    data = model(nodes, [("x", [2, 9, 4, 4])], [("y", [2, 9, 4, 4])],
                 [("sizes", np.array([2, 3, 4], np.int64))])
    x = _r(2, 9, 4, 4)
    s = ow.InferenceSession(data, ow.SessionOptions(debug_memory=True))
    r = np.maximum(x, 0)
    want = np.concatenate([np.abs(-r[:, :2]), np.exp(r[:, 2:5]), r[:, 5:]], axis=1)
    np.testing.assert_allclose(s.run(None, {"x": x})[0], want, rtol=1e-6)
    from opwarden.ops.shape import SPLIT_VIEWS

    assert SPLIT_VIEWS.views(3) == [(0, 0), (0, 1), (0, 2)]
    assert SPLIT_VIEWS.aliases(2) == {(0, 0), (0, 1)}


def _fire_model(act=True, second_reader=False, other_input=False):
    """squeeze -> {1x1 expand, 3x3 expand} -> Concat, as in SqueezeNet's fire module."""
    nodes = [
        helper.make_node("Conv", ["x", "ws", "bs"], ["s0"]),
        helper.make_node("Relu", ["s0"], ["s"]),
        helper.make_node("Conv", ["s", "w1", "b1"], ["e1c"]),
        helper.make_node("Conv", ["x2" if other_input else "s", "w3", "b3"], ["e3c"],
                         pads=[1, 1, 1, 1]),
    ]
    e1, e3 = "e1c", "e3c"
    if act:
        nodes += [helper.make_node("Relu", ["e1c"], ["e1"]),
                  helper.make_node("Relu", ["e3c"], ["e3"])]
        e1, e3 = "e1", "e3"
    nodes.append(helper.make_node("Concat", [e1, e3], ["y"], axis=1))
    outs = [("y", [2, 9, 5, 5])]
    if second_reader:
        nodes.append(helper.make_node("Neg", [e3], ["n"]))
        outs.append(("n", [2, 5, 5, 5]))
    inits = [("ws", _r(3, 6, 1, 1)), ("bs", _r(3)), ("w1", _r(4, 3, 1, 1)), ("b1", _r(4)),
             ("w3", _r(5, 3, 3, 3)), ("b3", _r(5))]
    ins = [("x", [2, 6, 5, 5])] + ([("x2", [2, 3, 5, 5])] if other_input else [])
    return model(nodes, ins, outs, inits)


def test_concat_of_sibling_convolutions_becomes_one_fused_conv_with_branches():
    data = _fire_model()
    m, report = optimized(data)
    by = {e["pass"]: e for e in report}
    assert by["concat_conv_merge"]["details"] == {"concats of convolutions merged": 1,
                                                  "convolutions merged": 2}
    assert types_of(m) == ["FusedConv", "FusedConv"]
    fire = m.graph.nodes[1]
    assert fire.attrs["branches"] == [4, 1, 1, 5, 3, 3]
    assert fire.attrs["activation"] == "Relu" and fire.attrs["pads"] == [1, 1, 1, 1]
    w = fire.inputs[1].const
    assert w.shape == (9, 3, 3, 3) and not w[:4, :, [0, 2]].any() and not w[:4, :, :, [0, 2]].any()
    check_same(data, {"x": _r(2, 6, 5, 5)}, rtol=1e-5)
    x = _r(2, 6, 5, 5)
    x[0, 1, 2, 2] = np.inf  # exact NaN/Inf positions through the branch-by-branch path
    want = ow.InferenceSession(data, ow.SessionOptions(optimization_level=0)).run(None, {"x": x})
    got = ow.InferenceSession(data).run(None, {"x": x})
    np.testing.assert_array_equal(np.isnan(got[0]), np.isnan(want[0]))
    np.testing.assert_array_equal(np.isinf(got[0]), np.isinf(want[0]))


@pytest.mark.parametrize("kw", [dict(second_reader=True), dict(other_input=True)])
def test_concat_conv_merge_needs_sole_readers_of_one_input(kw):
    data = _fire_model(**kw)
    m, _ = optimized(data)
    assert "Concat" in types_of(m)
    feeds = {"x": _r(2, 6, 5, 5)}
    if kw.get("other_input"):
        feeds["x2"] = _r(2, 3, 5, 5)
    check_same(data, feeds, rtol=1e-5)


def _bn_relu_convs_model(scale, consumers=("conv", "conv3"), group=1):
    """x -> BatchNormalization(scale) -> Relu -> the consumers (1x1 / padded 3x3 convs, or a
    'pool'); every consumer's output is a graph output."""
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "bb", "m", "v"], ["bn"]),
             helper.make_node("Relu", ["bn"], ["r"])]
    inits = [("s", scale), ("bb", _r(4)), ("m", _r(4)), ("v", np.abs(_r(4)) + 1)]
    outs = []
    for k, kind in enumerate(consumers):
        y = f"y{k}"
        if kind == "pool":
            nodes.append(helper.make_node("MaxPool", ["r"], [y], kernel_shape=[3, 3],
                                          pads=[1, 1, 1, 1]))
            outs.append((y, [1, 4, 6, 6]))
            continue
        kk = 3 if kind == "conv3" else 1
        nodes.append(helper.make_node("Conv", ["r", f"w{k}"], [y], pads=[kk // 2] * 4,
                                      group=group))
        inits.append((f"w{k}", _r(8, 4 // group, kk, kk)))
        outs.append((y, [1, 8, 6, 6]))
    return model(nodes, [("x", [1, 4, 6, 6])], outs, inits)


def test_positive_bn_scale_before_relu_moves_into_the_convolutions():
    scale = np.array([0.5, 2.0, 1.0, 3.0], np.float32)
    data = _bn_relu_convs_model(scale)
    x = _r(1, 4, 6, 6)
    s3 = check_same(data, {"x": x}, rtol=1e-5)
    assert changes(s3, "scale_into_conv") == 1
    progs = [n.attrs.get("program") for n in s3.model.graph.nodes
             if n.op_type == "FusedElementwise"]
    assert progs == ["t0=add(x0,x1);t1=relu(t0)"]  # the multiply is gone
    off = ow.InferenceSession(data, ow.SessionOptions(disabled_passes=["scale_into_conv"]))
    assert changes(off, "scale_into_conv") == 0


@pytest.mark.parametrize("scale, consumers, group", [
    (np.array([0.5, -2.0, 1.0, 3.0], np.float32), ("conv",), 1),  # a negative scale
    (np.array([0.5, 0.0, 1.0, 3.0], np.float32), ("conv",), 1),  # a zero scale
    (np.array([0.5, 2.0, 1.0, 3.0], np.float32), ("conv", "pool"), 1),  # a non-conv reader
    (np.array([0.5, 2.0, 1.0, 3.0], np.float32), ("conv",), 2),  # a grouped convolution
])
def test_bn_scale_stays_where_it_cannot_move(scale, consumers, group):
    data = _bn_relu_convs_model(scale, consumers, group)
    s3 = check_same(data, {"x": _r(1, 4, 6, 6)}, rtol=1e-5)
    assert changes(s3, "scale_into_conv") == 0


def _gelu_nodes(x, y, order, scale="div"):
    """x * 0.5 * (1 + erf(x / sqrt 2)) as exporters write it, ending in y."""
    first = (helper.make_node("Div", [x, "sqrt2"], ["u"]) if scale == "div"
             else helper.make_node("Mul", ["inv_sqrt2", x], ["u"]))
    nodes = [first, helper.make_node("Erf", ["u"], ["e"]),
             helper.make_node("Add", ["one", "e"], ["t"])]
    if order == "x_then_half":
        nodes += [helper.make_node("Mul", [x, "t"], ["m"]),
                  helper.make_node("Mul", ["m", "half"], [y])]
    elif order == "half_then_x":
        nodes += [helper.make_node("Mul", ["t", "half"], ["m"]),
                  helper.make_node("Mul", [x, "m"], [y])]
    else:  # (x * 0.5) * (1 + erf)
        nodes += [helper.make_node("Mul", [x, "half"], ["h"]),
                  helper.make_node("Mul", ["h", "t"], [y])]
    return nodes


_GELU_CONSTS = [("sqrt2", np.float32(np.sqrt(2.0))), ("inv_sqrt2", np.float32(np.sqrt(0.5))),
                ("one", np.float32(1.0)), ("half", np.float32(0.5))]


@pytest.mark.parametrize("order", ["x_then_half", "half_then_x", "half_first"])
@pytest.mark.parametrize("scale", ["div", "mul"])
def test_exported_erf_gelu_fuses_into_the_matmul(order, scale):
    nodes = [helper.make_node("MatMul", ["a", "w"], ["mm"]),
             helper.make_node("Add", ["mm", "b"], ["g"]), *_gelu_nodes("g", "y", order, scale)]
    inits = [("w", _r(8, 16)), ("b", _r(16)), *_GELU_CONSTS]
    data = model(nodes, [("a", [2, 5, 8])], [("y", [2, 5, 16])], inits)
    m, report = optimized(data)
    assert types_of(m) == ["FusedMatMul"]
    assert m.graph.nodes[0].attrs["activation"] == "Gelu"
    assert m.graph.nodes[0].attrs["activation_params"] == [0.0]
    check_same(data, {"a": _r(2, 5, 8, scale=2.0)}, rtol=1e-5)


def test_exported_erf_gelu_fuses_into_the_conv():
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             *_gelu_nodes("c", "y", "x_then_half")]
    data = model(nodes, [("x", [1, 3, 6, 6])], [("y", [1, 4, 6, 6])],
                 [("w", _r(4, 3, 3, 3)), ("b", _r(4)), *_GELU_CONSTS])
    m, _ = optimized(data)
    assert types_of(m) == ["FusedConv"] and m.graph.nodes[0].attrs["activation"] == "Gelu"
    check_same(data, {"x": _r(1, 3, 6, 6)}, rtol=1e-5)


@pytest.mark.parametrize("spoil", ["constant", "erf_output", "extra_reader", "approx"])
def test_erf_gelu_lookalikes_stay_unfused(spoil):
    """Not a Gelu (another constant, 0.7 for 1/sqrt 2), or one whose intermediates or input
    something else reads: the MatMul + bias still fuse, the chain stays."""
    nodes = [helper.make_node("MatMul", ["a", "w"], ["mm"]),
             helper.make_node("Add", ["mm", "b"], ["g"]),
             *_gelu_nodes("g", "y", "x_then_half", "mul" if spoil == "approx" else "div")]
    consts = dict(_GELU_CONSTS)
    outputs = [("y", [2, 16])]
    if spoil == "constant":
        consts["half"] = np.float32(0.6)
    elif spoil == "approx":
        consts["inv_sqrt2"] = np.float32(0.7)
    elif spoil == "erf_output":
        outputs.append(("e", [2, 16]))
    else:
        nodes.append(helper.make_node("Neg", ["g"], ["z"]))
        outputs.append(("z", [2, 16]))
    data = model(nodes, [("a", [2, 8])], outputs, [("w", _r(8, 16)), ("b", _r(16)),
                                                    *consts.items()])
    m, _ = optimized(data)
    assert all(n.attrs.get("activation", "") == "" for n in m.graph.nodes
               if n.op_type in ("FusedGemm", "FusedMatMul"))
    if spoil == "extra_reader":  # a Gelu all the same, only not the MatMul's epilogue
        assert "Erf" not in types_of(m) and "Gelu" in types_of(m)
        check_same(data, {"a": _r(2, 8)}, rtol=1e-5)
        return
    assert "Erf" in types_of(m) and "Gelu" not in types_of(m)
    check_same(data, {"a": _r(2, 8)}, rtol=1e-6)


@pytest.mark.parametrize("order", ["x_then_half", "half_then_x", "half_first"])
@pytest.mark.parametrize("scale", ["div", "mul"])
def test_standalone_erf_gelu_becomes_one_gelu(order, scale):
    """A chain no epilogue can take (its input a graph input, read by another node too)
    becomes one com.microsoft Gelu running the compiled kernel; its result matches the
    chain's, also as a graph output."""
    nodes = [*_gelu_nodes("x", "y", order, scale), helper.make_node("Neg", ["x"], ["z"])]
    data = model(nodes, [("x", [3, 40])], [("y", [3, 40]), ("z", [3, 40])], _GELU_CONSTS)
    m, report = optimized(data)
    assert sorted(types_of(m)) == ["Gelu", "Neg"]
    gelu = next(n for n in m.graph.nodes if n.op_type == "Gelu")
    assert gelu.domain == "com.microsoft"
    assert next(r for r in report if r["pass"] == "gelu_fusion")["changes"] >= 4
    x = _r(3, 40, scale=3.0)
    x[0, :4] = [0.0, -0.0, 8.0, -8.0]
    check_same(data, {"x": x}, rtol=1e-5)


def test_gelu_fusion_leaves_float64_and_disabled():
    """float64 chains stay (the com.microsoft Gelu kernels compute in float32), and so does
    every chain with the pass disabled."""
    from onnx import TensorProto, numpy_helper

    f64 = helper.make_graph(
        _gelu_nodes("x", "y", "x_then_half"), "g",
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [2, 8])],
        initializer=[numpy_helper.from_array(np.float64(v), k) for k, v in _GELU_CONSTS])
    m64 = helper.make_model(f64, opset_imports=[helper.make_opsetid("", 17)])
    m64.ir_version = 8
    assert "Erf" in types_of(optimized(m64.SerializeToString())[0])
    data = model(_gelu_nodes("x", "y", "x_then_half"), [("x", [2, 8])], [("y", [2, 8])],
                 _GELU_CONSTS)
    assert "Gelu" in types_of(optimized(data)[0])
    assert "Erf" in types_of(optimized(data, disabled_passes=["gelu_fusion"])[0])
