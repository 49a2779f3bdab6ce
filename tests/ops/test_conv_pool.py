"""Conv and pool family kernels against onnxruntime (and a few hand-checked facts)."""

from __future__ import annotations

import time

import numpy as np
import onnx
import pytest
from onnx import helper

from opwarden.dtypes import onnx_type
from opwarden.errors import KernelError
from opwarden.ops import REGISTRY

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(0)


def ours(op_type, opset, inputs, attrs=None, n_out=1):
    opdef, sch = REGISTRY.resolve(op_type, "", opset)
    kw = {k: a.default for k, a in sch.attrs.items() if a.has_default}
    kw.update(attrs or {})
    if "noutputs" in opdef.reference.__code__.co_varnames:
        kw["noutputs"] = n_out
    out = opdef.reference(*inputs, **kw)
    return (list(out) if isinstance(out, tuple) else [out])[:n_out]


def theirs(op_type, opset, inputs, attrs=None, n_out=1):
    names = [f"i{k}" if x is not None else "" for k, x in enumerate(inputs)]
    outs = [f"o{k}" for k in range(n_out)]
    node = helper.make_node(op_type, names, outs, **(attrs or {}))
    g = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, onnx_type(x.dtype), x.shape)
         for n, x in zip(names, inputs) if x is not None],
        [onnx.ValueInfoProto(name=o) for o in outs],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    feeds = {n: x for n, x in zip(names, inputs) if x is not None}
    return ort.InferenceSession(model.SerializeToString()).run(None, feeds)


def check(op_type, opset, inputs, attrs=None, n_out=1, rtol=1e-4):
    a_all = ours(op_type, opset, inputs, attrs, n_out)
    b_all = theirs(op_type, opset, inputs, attrs, n_out)
    for a, b in zip(a_all, b_all):
        assert isinstance(a, np.ndarray)
        assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=rtol,
                                   atol=1e-4)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


CONV_CASES = [
    ((1, 3, 9, 9), (4, 3, 3, 3), {}),
    ((2, 4, 10, 7), (6, 2, 3, 2), {"group": 2, "strides": [2, 1], "pads": [1, 0, 2, 1]}),
    ((1, 4, 11, 11), (4, 1, 3, 3), {"group": 4, "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 4, 11, 11), (4, 1, 3, 3), {"group": 4, "dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    ((1, 2, 8, 9), (3, 2, 4, 3), {"strides": [2, 3], "auto_pad": "SAME_LOWER"}),
    ((1, 2, 8, 9), (3, 2, 4, 3), {"strides": [2, 2], "auto_pad": "VALID"}),
    ((2, 3, 12), (5, 3, 4), {"strides": [3], "pads": [2, 1], "dilations": [2]}),
    ((1, 2, 5, 6, 7), (4, 2, 2, 3, 2), {"strides": [1, 2, 2], "pads": [1, 0, 1, 0, 1, 1]}),
    ((1, 8, 6, 6), (8, 8, 1, 1), {}),
]


@pytest.mark.parametrize("opset", [7, 11, 22])
@pytest.mark.parametrize("xs,ws,attrs", CONV_CASES)
def test_conv(xs, ws, attrs, opset):
    check("Conv", opset, [rand(*xs), rand(*ws), rand(ws[0])], attrs)


def test_conv_float16_and_double():
    x, w = rand(1, 3, 6, 6), rand(2, 3, 3, 3)
    check("Conv", 13, [x.astype(np.float16), w.astype(np.float16)], {}, rtol=1e-2)
    # onnxruntime has no double Conv: compare with our float32 result.
    (d,) = ours("Conv", 13, [x.astype(np.float64), w.astype(np.float64)], {"pads": [1, 1, 1, 1]})
    (f,) = ours("Conv", 13, [x, w], {"pads": [1, 1, 1, 1]})
    assert d.dtype == np.float64
    np.testing.assert_allclose(d, f, rtol=1e-5, atol=1e-5)


CT_CASES = [
    ((1, 2, 3, 3), (2, 3, 3, 3), {}),
    ((1, 4, 3, 4), (4, 2, 3, 2), {"group": 2, "strides": [2, 3], "pads": [1, 0, 0, 1]}),
    ((1, 2, 3, 3), (2, 1, 3, 3), {"strides": [3, 2], "output_padding": [1, 1]}),
    ((1, 2, 4, 3), (2, 2, 3, 3), {"strides": [2, 2], "output_shape": [9, 8]}),
    ((1, 2, 4, 3), (2, 2, 3, 3), {"strides": [2, 2], "output_shape": [9, 7],
                                  "auto_pad": "SAME_UPPER"}),
    ((1, 2, 5), (2, 3, 3), {"strides": [2], "dilations": [2], "pads": [1, 2]}),
    ((1, 1, 2, 3, 2), (1, 2, 2, 2, 2), {"strides": [2, 1, 2]}),
]


@pytest.mark.parametrize("opset", [7, 11, 22])
@pytest.mark.parametrize("xs,ws,attrs", CT_CASES)
def test_convtranspose(xs, ws, attrs, opset):
    check("ConvTranspose", opset, [rand(*xs), rand(*ws), rand(ws[1] * attrs.get("group", 1))],
          attrs)


POOL_CASES = [
    ((1, 2, 7, 7), {"kernel_shape": [3, 3]}),
    ((1, 2, 7, 8), {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1]}),
    ((1, 2, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 3], "ceil_mode": 1}),
    ((1, 2, 6, 6), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                    "ceil_mode": 1}),
    ((1, 2, 9, 9), {"kernel_shape": [2, 2], "strides": [2, 2], "dilations": [2, 2],
                    "ceil_mode": 1}),
    ((1, 2, 7, 8), {"kernel_shape": [3, 2], "strides": [2, 3], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 7, 8), {"kernel_shape": [2, 3], "strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((1, 2, 7, 8), {"kernel_shape": [2, 3], "strides": [2, 2], "auto_pad": "VALID"}),
    ((2, 3, 11), {"kernel_shape": [3], "strides": [2], "pads": [1, 2]}),
    ((1, 1, 5, 6, 7), {"kernel_shape": [2, 3, 2], "strides": [1, 2, 2],
                       "pads": [0, 1, 1, 1, 0, 1]}),
]


def _no_ceil(attrs):
    return {k: v for k, v in attrs.items() if k not in ("ceil_mode", "dilations")}


@pytest.mark.parametrize("xs,attrs", POOL_CASES)
def test_maxpool(xs, attrs):
    x = rand(*xs)
    check("MaxPool", 12, [x], attrs, n_out=2)
    check("MaxPool", 22, [x], attrs)
    if len(xs) == 4:
        check("MaxPool", 12, [x], {**attrs, "storage_order": 1}, n_out=2)
    if "ceil_mode" not in attrs and "dilations" not in attrs:
        check("MaxPool", 1, [x], attrs)
        check("MaxPool", 8, [x], attrs, n_out=2)


def test_maxpool_int8():
    x = RNG.integers(-128, 127, (1, 2, 6, 6)).astype(np.int8)
    check("MaxPool", 12, [x], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]})
    check("MaxPool", 12, [x.view(np.uint8)], {"kernel_shape": [2, 2], "strides": [2, 2]})


@pytest.mark.parametrize("cip", [0, 1])
@pytest.mark.parametrize("xs,attrs", POOL_CASES)
def test_averagepool(xs, attrs, cip):
    x = rand(*xs)
    check("AveragePool", 19, [x], {**attrs, "count_include_pad": cip})
    if "dilations" not in attrs:
        check("AveragePool", 11, [x], {**attrs, "count_include_pad": cip})
    if "ceil_mode" not in attrs and "dilations" not in attrs:
        check("AveragePool", 7, [x], {**attrs, "count_include_pad": cip})


@pytest.mark.parametrize("xs,attrs", [c for c in POOL_CASES if "dilations" not in c[1]])
def test_lppool(xs, attrs):
    x = rand(*xs)
    check("LpPool", 11, [x], {**_no_ceil(attrs), "p": 3})
    check("LpPool", 11, [x], _no_ceil(attrs))


def test_global_pools():
    x = rand(2, 3, 5, 4)
    check("GlobalAveragePool", 13, [x])
    check("GlobalMaxPool", 13, [x])
    check("GlobalLpPool", 13, [x], {"p": 3})
    check("GlobalAveragePool", 13, [rand(1, 2, 3, 4, 5)])


def test_maxunpool_roundtrip():
    # Positive values: an unpooled window's zeros must not beat its maximum when re-pooled.
    x = np.abs(rand(1, 2, 6, 6)) + np.float32(0.1)
    y, idx = ours("MaxPool", 12, [x], {"kernel_shape": [2, 2], "strides": [2, 2]}, n_out=2)
    (u,) = ours("MaxUnpool", 11, [y, idx], {"kernel_shape": [2, 2], "strides": [2, 2]})
    check("MaxUnpool", 11, [y, idx], {"kernel_shape": [2, 2], "strides": [2, 2]})
    (again,) = ours("MaxPool", 12, [u], {"kernel_shape": [2, 2], "strides": [2, 2]})
    np.testing.assert_array_equal(again, y)


def test_maxroipool():
    x = rand(2, 3, 12, 10)
    rois = np.array([[0, 1, 1, 8, 6], [1, 0, 2.5, 9, 11], [0, 3, 3, 3, 3], [1, 2, 1, 30, 5]],
                    dtype=np.float32)
    check("MaxRoiPool", 13, [x, rois], {"pooled_shape": [3, 2], "spatial_scale": 0.75})
    check("MaxRoiPool", 13, [x, rois], {"pooled_shape": [2, 4]})


def test_deform_conv_zero_offset_is_conv():
    x, w, b = rand(1, 4, 7, 6), rand(6, 2, 3, 2), rand(6)
    attrs = {"group": 2, "strides": [2, 1], "pads": [1, 0, 1, 1], "dilations": [1, 2]}
    (ref,) = ours("Conv", 22, [x, w, b], attrs)
    off = np.zeros((1, 2 * 6 * 2) + ref.shape[2:], np.float32)
    (got,) = ours("DeformConv", 22, [x, w, off, b], {**attrs, "offset_group": 2})
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    # An integer offset of +1 along W equals shifting the input left by one (zero fill).
    off1 = off.copy()
    off1[:, 1::2] = 1.0
    (shifted,) = ours("DeformConv", 22, [x, w, off1, b], {**attrs, "offset_group": 2})
    xs = np.concatenate([x[..., 1:], np.zeros_like(x[..., :1])], axis=-1)
    (ref1,) = ours("Conv", 22, [xs, w, b], attrs)
    np.testing.assert_allclose(shifted, ref1, rtol=1e-5, atol=1e-5)


def test_col2im_inverts_unfold_counts():
    # Col2Im of all-ones blocks counts how many blocks cover each pixel.
    cols = np.ones((1, 2 * 4, 9), np.float32)
    (y,) = ours("Col2Im", 18, [cols, np.array([4, 4]), np.array([2, 2])], {})
    assert y.shape == (1, 2, 4, 4)
    assert y[0, 0, 0, 0] == 1 and y[0, 0, 1, 1] == 4 and y[0, 0, 0, 1] == 2


def test_bad_shapes_raise():
    with pytest.raises(KernelError):
        ours("Conv", 22, [rand(1, 3, 5, 5), rand(2, 2, 3, 3)], {})
    with pytest.raises(KernelError):
        ours("MaxPool", 12, [rand(1, 1, 2, 2)], {"kernel_shape": [3, 3]})
    with pytest.raises(KernelError):
        ours("Col2Im", 18, [rand(1, 8, 5), np.array([4, 4]), np.array([2, 2])], {})


def test_workspace_declared():
    opdef, _ = REGISTRY.resolve("Conv", "", 22)
    ws = opdef.contract.workspace([(1, 64, 56, 56), (64, 64, 3, 3)], {"pads": [1, 1, 1, 1]})
    assert ws >= 64 * 9 * 56 * 56 * 4


def test_resnet_sized_conv_is_fast():
    x, w = rand(1, 64, 56, 56), rand(64, 64, 3, 3)
    t = time.perf_counter()
    ours("Conv", 22, [x, w], {"pads": [1, 1, 1, 1]})
    ours("MaxPool", 12, [rand(1, 64, 112, 112)], {"kernel_shape": [3, 3], "strides": [2, 2],
                                                   "pads": [1, 1, 1, 1]})
    assert time.perf_counter() - t < 2.0


def test_maxpool_indices_never_point_into_padding():
    x = np.full((1, 1, 3, 3), -128, np.int8)
    y, idx = ours("MaxPool", 12, [x], {"kernel_shape": [2, 2], "pads": [1, 1, 1, 1]}, n_out=2)
    assert y.shape == (1, 1, 4, 4) and (y == -128).all()
    assert idx.min() >= 0 and idx.max() < 9
    assert idx[0, 0, 0, 0] == 0 and idx[0, 0, 3, 3] == 8


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("level", [0, 3])
def test_ceil_mode_pool_facts_follow_the_kernels_not_onnx_inference(op, level):
    # onnx's shape inference keeps a last ceil_mode window that starts inside the end padding
    # (3x3 input, 1x1 window, stride 3: 2x2); the spec's reference and ORT drop it (1x1).
    # Planned buffers are sized from the facts, so the elementwise and convolution steps after
    # the pool (in NHWC at level 3) must not see the larger shape.
    from onnx import numpy_helper

    import opwarden as ow

    w = np.random.default_rng(0).standard_normal((2, 2, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node(op, ["c"], ["p"], kernel_shape=[1, 1], strides=[3, 3],
                              ceil_mode=1),
             helper.make_node("Relu", ["p"], ["r"]),
             helper.make_node("Conv", ["r", "w"], ["y"], pads=[1, 1, 1, 1])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2, 3, 3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    x = np.random.default_rng(1).standard_normal((1, 2, 3, 3)).astype(np.float32)
    sess = ow.InferenceSession(model.SerializeToString(),
                               ow.SessionOptions(optimization_level=level))
    pool = next(n for n in sess.model.graph.nodes if n.op_type == op)
    assert pool.outputs[0].fact.shape in ((1, 2, 1, 1), (1, 1, 1, 2))  # NCHW or NHWC
    # Inference reran with the pool's true shape: what follows it stays static.
    relu = next(n for n in sess.model.graph.nodes if n.op_type == "Relu")
    assert relu.outputs[0].fact.shape == pool.outputs[0].fact.shape
    got = sess.run(None, {"x": x})[0]
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    assert got.shape == want.shape == (1, 2, 1, 1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_ceil_mode_pool_with_a_wrong_declared_shape():
    # An exporter that ran onnx's inference wrote its answer into value_info and the output
    # type: both are overruled by the kernels' geometry.
    import opwarden as ow

    nodes = [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[1, 1], strides=[3, 3],
                              ceil_mode=1),
             helper.make_node("Neg", ["p"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2, 3, 3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 2, 2, 2])],
        value_info=[helper.make_tensor_value_info("p", onnx.TensorProto.FLOAT, [1, 2, 2, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    x = np.arange(18, dtype=np.float32).reshape(1, 2, 3, 3)
    from opwarden.ir.load import load

    loaded = load(model.SerializeToString())
    assert [n.outputs[0].fact.shape for n in loaded.graph.nodes] == [(1, 2, 1, 1)] * 2
    sess = ow.InferenceSession(model.SerializeToString())
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], -x[:, :, :1, :1])
