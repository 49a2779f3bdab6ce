"""1-D Conv and FusedConv on the 2-D NCHW kernel (kernels/cpu/conv1d.py) against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import opwarden as ow

CASES = [
    # (C, L, M, k, attrs)
    (3, 50, 4, 3, {}),
    (4, 61, 6, 5, {"pads": [2, 1], "strides": [2]}),
    (4, 40, 8, 3, {"dilations": [3], "pads": [3, 3]}),
    (6, 33, 6, 4, {"group": 3, "strides": [3]}),
    (8, 37, 8, 7, {"group": 8, "auto_pad": "SAME_UPPER"}),
    (1, 400, 16, 10, {"strides": [5]}),  # wav2vec2's first layer, smaller
    (5, 29, 7, 3, {"auto_pad": "VALID", "dilations": [2]}),
]


def _model(c, length, m, k, attrs, bias, act):
    g = attrs.get("group", 1)
    rng = np.random.default_rng(c * 100 + k)
    w = rng.standard_normal((m, c // g, k)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    inits = [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel())]
    ins = ["x", "w"]
    if bias:
        inits.append(helper.make_tensor("b", TensorProto.FLOAT, b.shape, b))
        ins.append("b")
    nodes = [helper.make_node("Conv", ins, ["c" if act else "y"], **attrs)]
    if act:
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    graph = helper.make_graph(
        nodes, "conv1d", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, c, length])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize(("c", "length", "m", "k", "attrs"), CASES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("act", [False, True])
def test_rank3_conv_runs_the_fast_kernel_with_onnxruntimes_values(c, length, m, k, attrs, bias,
                                                                  act):
    data = _model(c, length, m, k, attrs, bias, act)
    x = np.random.default_rng(7).standard_normal((2, c, length)).astype(np.float32)
    x[1, 0, length // 2] = np.nan  # NaN stays where the reference puts it
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    s = ow.InferenceSession(data)
    (got,) = s.run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    used = {r["variant"] for r in s.explain() if r.get("op_type") in ("Conv", "FusedConv")}
    assert used <= {"conv1d.cpu.nchw", "fusedconv1d.cpu.nchw"} and used, used
    assert not s.guard.faults


def test_rank3_kernel_writes_into_the_planned_buffer():
    from opwarden.kernels.cpu.conv1d import conv1d_nchw

    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 3, 20)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3)).astype(np.float32)
    out = np.full((1, 4, 18), np.nan, np.float32)
    assert conv1d_nchw(x, w, out=out) is out
    want = np.stack([sum(np.convolve(x[0, ci], w[mo, ci][::-1], "valid") for ci in range(3))
                     for mo in range(4)])[None]
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
