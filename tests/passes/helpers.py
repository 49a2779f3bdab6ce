"""Tiny models for pass tests, and a runner comparing optimization levels."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import opwarden as ow

F32 = TensorProto.FLOAT


def model(nodes, inputs, outputs, inits=(), opset=17, ir_version=8) -> bytes:
    """A model from onnx.helper nodes; inputs/outputs are (name, shape) float32 pairs."""
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, F32, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, F32, s) for n, s in outputs],
        initializer=[numpy_helper.from_array(np.asarray(a), n) for n, a in inits],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = ir_version
    return m.SerializeToString()


def sessions(data: bytes, **opts):
    """(level-0 session, optimized session)."""
    return (
        ow.InferenceSession(data, ow.SessionOptions(optimization_level=0)),
        ow.InferenceSession(data, ow.SessionOptions(**opts)),
    )


def check_same(data: bytes, feeds: dict, rtol: float = 1e-5, **opts):
    """Run at level 0 and optimized; assert equal outputs; return the optimized session."""
    s0, s3 = sessions(data, **opts)
    want = s0.run(None, feeds)
    got = s3.run(None, feeds)
    assert [o.name for o in s0.get_outputs()] == [o.name for o in s3.get_outputs()]
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        tol = rtol * (np.abs(w).max() if w.size else 0) + 1e-6
        np.testing.assert_allclose(g, w, rtol=0, atol=tol)
    return s3


def op_types(sess) -> list[str]:
    return [n.op_type for n in sess.model.graph.nodes]


def changes(sess, name: str) -> int:
    return next((e["changes"] for e in sess.pass_report if e["pass"] == name), 0)


def onnx_model(data: bytes) -> onnx.ModelProto:
    return onnx.load_from_string(data)


def optimized(data: bytes, **opts):
    """(model IR after load -> validate -> optimize, pass report), before placement."""
    from opwarden.ir.load import load
    from opwarden.ir.validate import validate
    from opwarden.passes import optimize

    m = load(data)
    validate(m)
    report = optimize(m, ow.SessionOptions(**opts))
    return m, report


def types_of(m) -> list[str]:
    return [n.op_type for n in m.graph.nodes]
