"""Regressions found by the structure-aware fuzzer (opwarden.verify.fuzz), one per escape."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import opwarden as ow
from tests.models import one_node


@pytest.mark.parametrize("value", [3, -1])
def test_unique_sorted_outside_0_1_is_refused(value):
    # fuzz seed 10, examples 7226 / 8996: ONNX allows sorted in {0, 1}; other values were run
    # as "sorted" while ONNX Runtime runs them unsorted, so the outputs disagreed.
    m = one_node(
        "Unique", [("x", TensorProto.FLOAT, [4])], [("y", TensorProto.FLOAT, None)],
        opset=11, sorted=value,
    )  # fmt: skip
    with pytest.raises(ow.ModelError, match="sorted"):
        ow.InferenceSession(m.SerializeToString())


def test_unique_sorted_0_and_1_still_run():
    x = np.array([3.0, 1.0, 3.0, 2.0], np.float32)
    for value, want in ((1, [1.0, 2.0, 3.0]), (0, [3.0, 1.0, 2.0])):
        m = one_node(
            "Unique", [("x", TensorProto.FLOAT, [4])], [("y", TensorProto.FLOAT, None)],
            opset=11, sorted=value,
        )  # fmt: skip
        (y,) = ow.InferenceSession(m.SerializeToString()).run(None, {"x": x})
        np.testing.assert_array_equal(y, want)


def _identity(value_info):
    g = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"], name="id")], "g", [value_info],
        [helper.make_value_info("y", value_info.type)],
    )  # fmt: skip
    return ow.InferenceSession(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    )


def test_sequence_feed_elements_become_arrays_of_the_declared_type():
    # fuzz: non-array elements fed to a sequence input came back as outputs
    s = _identity(helper.make_tensor_sequence_value_info("x", TensorProto.FLOAT, None))
    (y,) = s.run(None, {"x": [[1.0, 2.0], [3.0]]})
    assert [type(a) for a in y] == [np.ndarray, np.ndarray]
    assert [a.dtype for a in y] == [np.float32, np.float32]
    np.testing.assert_array_equal(y[0], [1.0, 2.0])
    with pytest.raises(ow.InputError, match="'x' element 1: .*not a tensor"):
        s.run(None, {"x": [np.zeros(2, np.float32), [[1.0], [2.0, 3.0]]]})  # ragged
    with pytest.raises(ow.InputError, match="'x' element 0 expects dtype float32, got float64"):
        s.run(None, {"x": [np.zeros(2)]})
    with pytest.raises(ow.InputError, match="'x' is a sequence"):
        s.run(None, {"x": {"a": np.zeros(2, np.float32)}})
    with pytest.raises(ow.InputError, match="'x' element 0 must be a numpy array, got dict"):
        s.run(None, {"x": [{"a": 1.0}]})
    assert s.run(None, {"x": []}) == [[]]


def test_map_feed_keys_and_values_are_checked():
    tp = helper.make_map_type_proto(TensorProto.STRING, helper.make_tensor_type_proto(
        TensorProto.FLOAT, None))  # fmt: skip
    s = _identity(helper.make_value_info("x", tp))
    (y,) = s.run(None, {"x": {"a": 1.0}})
    assert y == {"a": 1.0} and type(y["a"]) is np.float32
    with pytest.raises(ow.InputError, match="key 1 must be a string"):
        s.run(None, {"x": {1: 2.0}})
    with pytest.raises(ow.InputError, match="value for key 'a'"):
        s.run(None, {"x": {"a": "b"}})
    with pytest.raises(ow.InputError, match="is a map"):
        s.run(None, {"x": [1.0]})


def test_big_endian_feed_is_converted_to_native_order():
    s = _identity(helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]))
    x = np.array([1.0, -2.5, 3.0], ">f4")
    (y,) = s.run(None, {"x": x})
    assert y.dtype.isnative and y.dtype == np.float32
    np.testing.assert_array_equal(y, [1.0, -2.5, 3.0])
    seq = _identity(helper.make_tensor_sequence_value_info("x", TensorProto.FLOAT, None))
    (ys,) = seq.run(None, {"x": [x]})
    assert ys[0].dtype.isnative
    np.testing.assert_array_equal(ys[0], x)


def test_constant_of_shape_limit_check_on_a_million_dims_is_quick():
    # fuzz: the pre-allocation check multiplied 2**20 Python big integers (never finished)
    m = one_node(
        "ConstantOfShape", [("s", TensorProto.INT64, [None])], [("y", TensorProto.FLOAT, None)]
    )
    s = ow.InferenceSession(m.SerializeToString(), ow.SessionOptions(memory_limit_bytes=1 << 28))
    with pytest.raises(ow.MemoryLimitError, match="ConstantOfShape"):
        s.run(None, {"s": np.broadcast_to(np.full(1, 3, np.int64), (1 << 20,))})
    from opwarden.plan.limits import _count

    assert _count(np.array([3] * 100 + [0], np.int64)) == 0  # a zero dim anywhere: empty


@pytest.mark.parametrize("shape", [[1 << 31, 1 << 31, 4], [1 << 62, 4], [1 << 32] * 3])
def test_sizes_past_int64_are_refused_not_wrapped(shape):
    # fuzz seed 11 / 8851, 4840: a size product in int64 wrapped (2**64 bytes -> 0), so the
    # plan let a tensor past the limit reach the kernels (raw ValueError, OverflowError)
    g = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["s"], ["y"], name="cos"),
         helper.make_node("Relu", ["y"], ["z"], name="relu")],
        "g", [], [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(np.array(shape, np.int64), "s")],
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ow.MemoryLimitError, match="tensor 'y' produced by 'cos'"):
        ow.InferenceSession(m.SerializeToString())


def test_batchnorm_14_reference_is_not_given_noutputs():
    # fuzz: the guard's fallback passed noutputs to BatchNormalization-14's reference kernel
    m = one_node(
        "BatchNormalization",
        [("x", TensorProto.FLOAT, [2, 3, 4]), ("s", TensorProto.FLOAT, [3]),
         ("b", TensorProto.FLOAT, None), ("mu", TensorProto.FLOAT, [3]),
         ("var", TensorProto.FLOAT, [3])],
        [("y", TensorProto.FLOAT, None)], opset=15,
    )  # fmt: skip
    s = ow.InferenceSession(m.SerializeToString())
    feeds = {"x": np.ones((2, 3, 4), np.float32), "s": np.ones(3, np.float32),
             "b": np.zeros(0, np.float32), "mu": np.zeros(3, np.float32),
             "var": np.ones(3, np.float32)}  # fmt: skip
    with pytest.raises(ow.KernelError) as e:
        s.run(None, feeds)
    assert "noutputs" not in str(e.value) and "B has shape (0,)" in str(e.value)


def _crash_free_load(model: bytes) -> str:
    """Load `model` in a subprocess (a segfault of onnx's inference must not take the test
    down): the error type name, or 'ok'."""
    import subprocess
    import sys

    code = (
        "import sys, opwarden as ow\n"
        "try:\n    ow.InferenceSession(sys.stdin.buffer.read())\n    print('ok')\n"
        "except ow.OpwardenError as e:\n    print(type(e).__name__, e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], input=model, capture_output=True,
                       timeout=60)  # fmt: skip
    assert r.returncode == 0, f"exit status {r.returncode}: {r.stderr.decode()[-500:]}"
    return r.stdout.decode()


def _layernorm(axis):
    vi = helper.make_tensor_value_info
    g = helper.make_graph(
        [helper.make_node("LayerNormalization", ["X", "W", "B"], ["Y", "Mean", "InvStdDev"],
                          name="ln", axis=axis)],
        "g", [vi(n, TensorProto.FLOAT, [2, 3, 4, 5]) for n in "XWB"],
        [vi(n, TensorProto.FLOAT, None) for n in ("Y", "Mean", "InvStdDev")],
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize("axis", [2**63 - 1, 2**31])
def test_layernorm_absurd_axis_is_refused_before_onnx_inference(axis):
    # onnx.shape_inference.infer_shapes segfaults on this model
    out = _crash_free_load(_layernorm(axis))
    assert out.startswith("ModelError") and "'ln'" in out and "'axis'" in out, out


@pytest.mark.parametrize("batch_dims", [-7, -(1 << 20), -(2**31) - 1])
def test_gathernd_negative_batch_dims_is_refused_before_onnx_inference(batch_dims):
    m = one_node(
        "GatherND",
        [("x", TensorProto.FLOAT, [2, 3, 4, 5]), ("i", TensorProto.INT64, [2, 3, 4, 5])],
        [("y", TensorProto.FLOAT, None)], opset=13, batch_dims=batch_dims,
    )  # fmt: skip
    out = _crash_free_load(m.SerializeToString())
    assert out.startswith("ModelError") and "'batch_dims'" in out, out


def test_bad_element_types_and_negative_dims_are_refused_before_inference():
    from opwarden.ir.validate import sanity_before_inference

    def model(elem, dim, where="value_info"):
        t = onnx.TypeProto()
        t.tensor_type.elem_type = elem
        t.tensor_type.shape.dim.add().dim_value = dim
        vi = helper.make_value_info("m", t)
        g = helper.make_graph(
            [helper.make_node("Relu", ["x"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
            "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], value_info=[vi],
        )  # fmt: skip
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])

    with pytest.raises(ow.ModelError, match="value_info 'm' has element type -3"):
        sanity_before_inference(model(-3, 2))
    with pytest.raises(ow.ModelError, match="value_info 'm' declares dimension 0 as -5"):
        sanity_before_inference(model(TensorProto.FLOAT, -5))
    sanity_before_inference(model(TensorProto.FLOAT, 2))
    assert _crash_free_load(model(-3, -5).SerializeToString()).startswith("ModelError")


def _nested_ifs(depth, leaf, elem=TensorProto.FLOAT16, extra=()):
    """`depth` Ifs, each branch the next If, around `leaf` (a node x -> o0), every output
    declared `elem`."""
    vi = helper.make_tensor_value_info
    inner = helper.make_graph([leaf], "b0", [], [vi("o0", elem, [2])])
    for d in range(1, depth + 1):
        other = helper.make_graph([helper.make_node("Identity", ["x"], [f"e{d}"])], f"e{d}", [],
                                  [vi(f"e{d}", elem, [2])])  # fmt: skip
        node = helper.make_node("If", ["c"], [f"o{d}"], name=f"if{d}", then_branch=inner,
                                else_branch=other)  # fmt: skip
        inner = helper.make_graph([node], f"b{d}", [], [vi(f"o{d}", elem, [2])])
    g = helper.make_graph(
        list(inner.node), "main",
        [vi("x", TensorProto.FLOAT, [2]), vi("c", TensorProto.BOOL, []), *extra],
        [vi(f"o{depth}", elem, [2])],
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return ow.InferenceSession(m.SerializeToString())


def test_a_fault_in_nested_ifs_is_handled_once_where_it_happens():
    # fuzz seed 11 / 8202, 17804: an output whose dtype differs from the declared one, 25 Ifs
    # deep; each If's recorded fault reran it (and everything below): 2**25 runs
    s = _nested_ifs(12, helper.make_node("Neg", ["x"], ["o0"], name="neg"))
    (y,) = s.run(None, {"x": np.ones(2, np.float32), "c": np.array(True)})
    np.testing.assert_array_equal(y, [-1.0, -1.0])
    assert s.guard.stats["neg.ref"].calls == 1  # was 2**12
    assert s.guard.stats["if.ref"].calls == 12
    assert len(s.faults) == 13 and all(f.action == "recorded" for f in s.faults)


def test_a_kernel_error_deep_in_nested_ifs_names_its_own_node_once():
    leaf = helper.make_node("Reshape", ["x", "bad"], ["o0"], name="reshape")
    s = _nested_ifs(12, leaf, TensorProto.FLOAT,
                    [helper.make_tensor_value_info("bad", TensorProto.INT64, [1])])
    with pytest.raises(ow.KernelError) as e:
        s.run(None, {"x": np.ones(2, np.float32), "c": np.array(True),
                     "bad": np.array([5], np.int64)})
    msg = str(e.value)
    assert "reshape" in msg and "'if" not in msg, msg  # not re-blamed on the 12 Ifs around it


def _loop11():
    import warnings

    import onnx.backend.test.case.node as suite

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from onnx.backend.test.case.node import loop  # noqa: F401 - registers the cases
    case = next(c for c in suite._NodeTestCases if c.name == "test_loop11")
    return case.model.SerializeToString()


def _loop11_feeds(trip):
    return {"trip_count": np.array(trip, np.int64), "cond": np.array(True),
            "y": np.array([5], np.float32)}  # fmt: skip


@pytest.mark.parametrize("trip", [0, -1])
def test_zero_trip_loop_scan_output_has_the_body_outputs_shape(trip):
    # ORT gives [0, 1] (the body's scan output is [1]); was [0]
    res_y, res_scan = ow.InferenceSession(_loop11()).run(None, _loop11_feeds(trip))
    np.testing.assert_array_equal(res_y, [5.0])
    assert res_scan.shape == (0, 1) and res_scan.dtype == np.float32


def _scan(n_rows_dim="N"):
    vi = helper.make_tensor_value_info
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "row"], ["s_out"]),
         helper.make_node("Identity", ["s_out"], ["row_out"])],
        "body", [vi("s_in", TensorProto.FLOAT, [3]), vi("row", TensorProto.FLOAT, [3])],
        [vi("s_out", TensorProto.FLOAT, [3]), vi("row_out", TensorProto.FLOAT, [3])],
    )  # fmt: skip
    g = helper.make_graph(
        [helper.make_node("Scan", ["s0", "x"], ["s", "rows"], name="scan", body=body,
                          num_scan_inputs=1)],
        "g", [vi("s0", TensorProto.FLOAT, [3]), vi("x", TensorProto.FLOAT, [n_rows_dim, 3])],
        [vi("s", TensorProto.FLOAT, [3]), vi("rows", TensorProto.FLOAT, [n_rows_dim, 3])],
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_zero_length_scan_output_has_the_body_outputs_shape():
    s, rows = ow.InferenceSession(_scan()).run(
        None, {"s0": np.ones(3, np.float32), "x": np.zeros((0, 3), np.float32)}
    )
    np.testing.assert_array_equal(s, [1.0, 1.0, 1.0])
    assert rows.shape == (0, 3) and rows.dtype == np.float32


def test_a_loop_that_never_ends_stops_at_the_memory_limit_or_the_deadline():
    # test_loop11 with 2**63-1 trips: after five iterations the body emits empty slices forever
    sess = ow.InferenceSession(_loop11(), ow.SessionOptions(memory_limit_bytes=1 << 20))
    with pytest.raises(ow.MemoryLimitError, match="Loop: after .* iterations"):
        sess.run(None, _loop11_feeds(2**63 - 1))
    timed = ow.InferenceSession(_loop11(), ow.SessionOptions(run_timeout_ms=50))
    with pytest.raises(ow.RunTimeoutError, match="Loop"):
        timed.run(None, _loop11_feeds(2**63 - 1))
    assert timed.run(None, _loop11_feeds(3))[0].tolist() == [5.0 + 1 + 2 + 3]  # still usable


def test_fuzz_sessions_of_iterating_models_run_under_a_deadline():
    # fuzz seed 11 / 18378: a Scan over a (2**20, 3) broadcast feed, ~25 us an iteration
    # (minutes under the guard), was a hang of the worker, not an error
    from opwarden.verify import fuzz

    feeds = {"s0": np.ones(3, np.float32),
             "x": np.broadcast_to(np.ones(3, np.float32), (1 << 20, 3))}  # fmt: skip
    ex = fuzz.Example(0, 0, "scan", [], _scan(), feeds)
    res = fuzz.check_example(ex, 256 << 20, run_timeout_ms=50)
    assert res["status"] == "refused" and res["error"] == "RunTimeoutError", res
    assert not fuzz._iterates(_identity_model_bytes())


def _identity_model_bytes():
    m = one_node("Identity", [("x", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT, [2])])
    return m.SerializeToString()


def test_a_sequence_reaching_a_tensor_input_is_refused_at_load():
    # fuzz: OptionalGetElement of an optional sequence fed Selu, which ran on the list
    seq = helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None)
    g = helper.make_graph(
        [helper.make_node("Optional", ["s"], ["o"], name="opt"),
         helper.make_node("OptionalGetElement", ["o"], ["e"], name="get"),
         helper.make_node("Selu", ["e"], ["y"], name="selu")],
        "g", [seq], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(ow.ModelError, match=r"'selu' \(Selu\): input 0 .*'e'.* is a sequence"):
        ow.InferenceSession(m.SerializeToString())


@pytest.mark.parametrize("attr,value", [("kernel_shape", [-(2**63), 2]), ("strides", [0, 1]),
                                        ("dilations", [1, -1])])  # fmt: skip
def test_non_positive_window_attributes_are_refused(attr, value):
    # fuzz seed 303 / 2475 (cnn seed, MaxPool kernel_shape[0] -> -2**63): the pooling
    # kernel's band planning never finished
    attrs = {"kernel_shape": [2, 2], attr: value}
    m = one_node(
        "MaxPool", [("x", TensorProto.FLOAT, [1, 2, 6, 6])], [("y", TensorProto.FLOAT, None)],
        **attrs,
    )  # fmt: skip
    with pytest.raises(ow.ModelError, match=f"'n0' \\(MaxPool\\): attribute '{attr}'"):
        ow.InferenceSession(m.SerializeToString())
