"""Small models built with onnx.helper for the core tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def small_cnn(batch="N", opset: int = 13, seed: int = 0) -> onnx.ModelProto:
    """Conv -> Relu -> MaxPool -> GlobalAveragePool -> Flatten -> Gemm -> Softmax."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    fw = numpy_helper.from_array(rng.standard_normal((5, 4)).astype(np.float32), "fw")
    fb = numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "fb")
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["p"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["l"], name="fc", transB=1),
        helper.make_node("Softmax", ["l"], ["y"], name="softmax"),
    ]
    graph = helper.make_graph(
        nodes,
        "small_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 5])],
        initializer=[w, b, fw, fb],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def one_node(op_type, inputs, outputs, opset=17, domain="", **attrs) -> onnx.ModelProto:
    """A one-node model; inputs/outputs are (name, elem_type, shape) triples."""
    node = helper.make_node(
        op_type, [i[0] for i in inputs], [o[0] for o in outputs], name="n0", domain=domain, **attrs
    )
    graph = helper.make_graph(
        [node],
        "one",
        [helper.make_tensor_value_info(*i) for i in inputs],
        [helper.make_tensor_value_info(*o) for o in outputs],
    )
    imports = [helper.make_opsetid("", opset)]
    if domain:
        imports.append(helper.make_opsetid(domain, 1))
    return helper.make_model(graph, opset_imports=imports)


def graph_model(nodes, inputs, outputs, inits=(), opset=18, value_info=(),
                name="graph") -> onnx.ModelProto:
    """A model of `nodes`; inputs/outputs are (name, elem_type, shape) triples."""
    g = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        initializer=list(inits),
        value_info=list(value_info),
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


RELU_MATMUL_W = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)


def relu_matmul() -> bytes:
    """x [N, 4] -> Relu -> MatMul by RELU_MATMUL_W -> y [N, 3], serialized (the batch and Ray
    tests' model). Relu first: after a MatMul it would fuse into one Gemm, leaving no Relu to
    replace with a test kernel."""
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("MatMul", ["h", "W"], ["y"])],
        "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(RELU_MATMUL_W, "W")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
