"""Small models for the device tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _w(rng, *shape):
    fan_in = int(np.prod(shape[1:])) or 1
    return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)


def mixed_npu_model(opset: int = 21, seed: int = 0) -> onnx.ModelProto:
    """NPU-friendly convolutions around a linear Resize, a 4-of-8 GroupNorm, an asymmetric Pad."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(_w(rng, 8, 3, 3, 3), "w1"),
        numpy_helper.from_array(rng.uniform(-0.1, 0.1, 8).astype(np.float32), "b1"),
        numpy_helper.from_array(_w(rng, 8, 1, 3, 3), "w2"),  # depthwise
        numpy_helper.from_array(_w(rng, 8, 8, 1, 1), "w3"),
        numpy_helper.from_array(_w(rng, 4, 8, 3, 3), "w4"),
        numpy_helper.from_array(np.array([], np.float32), "roi"),
        numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
        numpy_helper.from_array(rng.uniform(0.8, 1.2, 8).astype(np.float32), "gn_scale"),
        numpy_helper.from_array(rng.uniform(-0.1, 0.1, 8).astype(np.float32), "gn_bias"),
        numpy_helper.from_array(np.array([0, 0, 1, 0, 0, 0, 2, 1], np.int64), "pads"),
        numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "sym_pads"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="dwconv", group=8, pads=[1, 1, 1, 1]),
        helper.make_node("Resize", ["c2", "roi", "scales"], ["up"], name="resize", mode="linear"),
        helper.make_node("Conv", ["up", "w3"], ["c3"], name="conv3"),
        helper.make_node(
            "GroupNormalization", ["c3", "gn_scale", "gn_bias"], ["gn"], name="groupnorm",
            num_groups=4,
        ),
        helper.make_node("Sigmoid", ["gn"], ["s"], name="sigmoid"),
        helper.make_node("Pad", ["s", "pads"], ["p"], name="pad"),
        helper.make_node("Pad", ["p", "sym_pads"], ["p2"], name="sympad"),
        helper.make_node("Conv", ["p2", "w4"], ["c4"], name="conv4"),
        helper.make_node("Relu", ["c4"], ["y"], name="relu4"),
    ]
    g = helper.make_graph(
        nodes, "mixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 35, 33])],
        initializer=inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    onnx.checker.check_model(m)
    return m


def feeds(seed: int = 1) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((1, 3, 16, 16)).astype(np.float32)}
