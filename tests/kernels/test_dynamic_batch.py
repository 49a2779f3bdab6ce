"""A symbolic batch keeps convolutions on their named algorithms (not the per-call dispatcher),
and the route is the same at every batch: a model exported with a dynamic batch axis runs the
kernels the same model with a fixed batch runs, with onnxruntime's results."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import opwarden
from opwarden.kernels.cpu import conv

# (name, input C, H, output M, kernel, stride): one layer per route that depends on the map.
LAYERS = [
    ("stem", 3, 32, 12, 7, 2),
    ("direct", 3, 32, 16, 7, 2),  # (the stem route without the extension)
    ("shifted", 64, 28, 64, 3, 1),
    ("fewpixel", 256, 7, 256, 3, 1),
    ("pointwise", 32, 14, 48, 1, 1),
]


def _model(c, h, m, k, s, batch) -> onnx.ModelProto:
    rng = np.random.default_rng(c * 1000 + h)
    w = (rng.standard_normal((m, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    # Two 1x1 layers after it, so that the layout pass moves the chain to NHWC.
    w1 = (rng.standard_normal((m, m, 1, 1)) / np.sqrt(m)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[k // 2] * 4,
                              strides=[s, s], kernel_shape=[k, k]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w1"], ["c1"]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w1"], ["y"])]
    graph = helper.make_graph(
        nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, c, h, h])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"),
         numpy_helper.from_array(w1, "w1")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _conv_variants(sess) -> list[str]:
    return [p["variant"] for p in sess.explain() if "Conv" in p["op_type"]]


@pytest.mark.parametrize("layer", LAYERS, ids=[x[0] for x in LAYERS])
def test_symbolic_batch_places_the_fixed_batch_route(layer):
    _name, c, h, m, k, s = layer
    fixed = opwarden.InferenceSession(_model(c, h, m, k, s, 1).SerializeToString())
    dynamic = opwarden.InferenceSession(_model(c, h, m, k, s, "N").SerializeToString())
    ort = pytest.importorskip("onnxruntime")
    peer = ort.InferenceSession(_model(c, h, m, k, s, "N").SerializeToString(),
                                providers=["CPUExecutionProvider"])
    variants = _conv_variants(dynamic)
    assert variants == _conv_variants(fixed)
    assert not {"fusedconv.cpu.nhwc", "conv.cpu.nhwc"} & set(variants), variants
    rng = np.random.default_rng(7)
    x1 = rng.standard_normal((1, c, h, h)).astype(np.float32)
    for n in (1, 3):
        x = np.concatenate([x1] + [rng.standard_normal((1, c, h, h)).astype(np.float32)
                                   for _ in range(n - 1)])
        got = dynamic.run(None, {"x": x})[0]
        np.testing.assert_allclose(got, peer.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
        # Each image as the fixed batch-1 model computes it.
        for i in range(n):
            np.testing.assert_allclose(got[i:i + 1], fixed.run(None, {"x": x[i:i + 1]})[0],
                                       rtol=1e-4, atol=1e-4)


def test_route_does_not_depend_on_the_batch():
    attrs = {"strides": [1, 1], "pads": [1, 1, 1, 1]}
    for x, w in (((1, 7, 7, 512), (512, 512, 3, 3)), ((1, 56, 56, 64), (64, 64, 3, 3)),
                 ((1, 14, 14, 256), (256, 256, 3, 3))):
        routes = {conv.static_route((n, *x[1:]), w, attrs) for n in (1, 2, 8, 32, "batch")}
        assert len(routes) == 1 and None not in routes, routes
    # Unknown spatial dims still leave the choice to the dispatcher.
    assert conv.static_route(("N", "H", 7, 512), (512, 512, 3, 3), attrs) is None
