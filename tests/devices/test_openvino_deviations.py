"""OpenVINO's measured deviations are declared (kernels/openvino/deviations.py): every
operator's single-node openvino variant checked against the reference finds none that is not,
and a node with a declared deviation stays on cpu with it as its reason while the same operator
without it runs on openvino. Skipped when openvino does not import."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import opwarden as ow

pytest.importorskip("openvino")
ort = pytest.importorskip("onnxruntime")

from opwarden.devices import get_device  # noqa: E402

# The checks where OpenVINO's computation can depart from the reference; the memory and
# threading checks hold the runner, not OpenVINO's numerics.
CHECKS = ("numerics", "boundary", "nan", "shape")


SHARDS = 4  # every variant is checked; in shards, so xdist spreads them


@pytest.mark.parametrize("shard", range(SHARDS))
def test_every_single_node_variant_departs_only_where_declared(shard):
    from opwarden.ops.base import REGISTRY
    from opwarden.verify.harness import check

    get_device("openvino")  # registers the single-node variants, whatever ran before
    ops = [o for o in REGISTRY.all() if any(v.device == "openvino" for v in o.variants)]
    assert len(ops) > 200
    mine = sorted(ops, key=lambda o: (o.op_type, o.since))[shard::SHARDS]
    variants = [v for o in mine for v in o.variants if v.device == "openvino"]
    bad = []
    for var in variants:
        report = check(var, device="openvino", checks=CHECKS, quick=True, suite_limit=2,
                       fast_suite=True)
        bad += [f"{v.op}-{v.since} {f['check']}: {f['detail'][:240]} {f.get('input')}"
                for v in report.variants for f in v.failures]
    assert not bad, "undeclared OpenVINO deviations:\n" + "\n".join(bad)


F = TensorProto.FLOAT


def _model(node, inputs, outputs, inits=(), opset=14):
    g = helper.make_graph([node], "one", [helper.make_tensor_value_info(*i) for i in inputs],
                          [helper.make_tensor_value_info(*o) for o in outputs], list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m.SerializeToString()


def _rnn(layout):
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((1, 4, 5)).astype(np.float32), "W")
    r = numpy_helper.from_array(rng.standard_normal((1, 4, 4)).astype(np.float32), "R")
    x = [3, 2, 5] if layout == 0 else [2, 3, 5]
    n = helper.make_node("RNN", ["x", "W", "R"], ["y"], name="n", hidden_size=4, layout=layout)
    return _model(n, [("x", F, x)], [("y", F, None)], [w, r]), {"x": rng.standard_normal(
        x).astype(np.float32)}


def _topk(k):
    kk = numpy_helper.from_array(np.array([k], np.int64), "k")
    n = helper.make_node("TopK", ["x", "k"], ["v", "i"], name="n")
    return _model(n, [("x", F, [3, 6])], [("v", F, None), ("i", TensorProto.INT64, None)],
                  [kk]), {"x": np.random.default_rng(1).standard_normal((3, 6)).astype(
                      np.float32)}


def _dft(length, onesided):
    n = helper.make_node("DFT", ["x"], ["y"], name="n", axis=1, onesided=onesided)
    return _model(n, [("x", F, [2, length, 1])], [("y", F, None)], opset=17), {
        "x": np.random.default_rng(2).standard_normal((2, length, 1)).astype(np.float32)}


def _nms():
    boxes = np.array([[[0, 0, 1, 1], [0.5, 0.5, 1.5, 1.5], [3, 3, 4, 4]]], np.float32)
    inits = [numpy_helper.from_array(np.array([3], np.int64), "m")]
    n = helper.make_node("NonMaxSuppression", ["b", "s", "m"], ["y"], name="n")
    return _model(n, [("b", F, [1, 3, 4]), ("s", F, [1, 1, 3])],
                  [("y", TensorProto.INT64, None)], inits, opset=11), {
        "b": boxes, "s": np.array([[[0.9, 0.8, 0.7]]], np.float32)}


@pytest.mark.parametrize("build, device, reason", [
    (lambda: _rnn(1), "cpu", "layout=1"),
    (lambda: _rnn(0), "openvino", None),
    (lambda: _topk(0), "cpu", ""),
    (lambda: _topk(2), "openvino", None),
    (lambda: _dft(10, 0), "cpu", "not a power of 2"),
    (lambda: _dft(8, 1), "cpu", "onesided=1"),
    (lambda: _dft(8, 0), "openvino", None),
    (_nms, "cpu", "iou_threshold"),
], ids=["rnn-batch-first", "rnn", "topk-k0", "topk", "dft-length-10", "dft-onesided",
        "dft-8", "nms"])
def test_a_declared_deviation_keeps_its_node_on_cpu_with_the_reason(build, device, reason):
    data, feeds = build()
    s = ow.InferenceSession(data, providers=["openvino", "cpu"])
    (row,) = [r for r in s.explain() if not r.get("inserted")]
    assert row["device"] == device, row
    if reason is not None:
        assert reason in (row["reason"] or ""), row["reason"]
    try:
        peer = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - ORT has no batch-first RNN: opwarden's host kernels
        peer = ow.InferenceSession(data, providers=["cpu"])
    for g, w in zip(s.run(None, feeds), peer.run(None, feeds)):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def test_a_region_node_whose_kernel_loses_nan_is_noted():
    n = helper.make_node("Celu", ["x"], ["y"], name="celu", alpha=1.0)
    s = ow.InferenceSession(_model(n, [("x", F, [2, 3])], [("y", F, None)], opset=13),
                            providers=["openvino", "cpu"])
    (row,) = [r for r in s.explain() if not r.get("inserted")]
    assert row["device"] == "openvino" and "maps NaN to 0" in row["note"]
