"""Devices: capabilities, profiles, partitioning with explained fallback, layouts, explain."""

from __future__ import annotations

import argparse
import io
import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import opwarden as ow
from opwarden import zoo
from opwarden.cli.devices import add_parser, render_explain
from opwarden.devices import devices, get_device

from .models import feeds, mixed_npu_model

ort = pytest.importorskip("onnxruntime")


def _tol(ref: np.ndarray) -> float:
    return 1e-2 * float(np.abs(ref).max()) + 1e-3


def _model_rows(sess):
    return [r for r in sess.explain() if not r["inserted"]]


def test_mixed_model_exactly_three_nodes_fall_back_with_attribute_reasons():
    data = mixed_npu_model().SerializeToString()
    sess = ow.InferenceSession(data, providers=["edge-npu", "cpu"])
    on_cpu = {r["name"]: r["reason"] for r in _model_rows(sess) if r["device"] == "cpu"}
    assert set(on_cpu) == {"resize", "groupnorm", "pad"}
    assert "mode='linear'" in on_cpu["resize"] and "nearest" in on_cpu["resize"]
    assert "num_groups=4" in on_cpu["groupnorm"] and "C=8" in on_cpu["groupnorm"]
    assert "pads=" in on_cpu["pad"] and "symmetric" in on_cpu["pad"]
    assert all(r["device"] == "edge-npu" for r in _model_rows(sess) if r["name"] not in on_cpu)
    ref = ow.InferenceSession(data, providers=["cpu"]).run(None, feeds())[0]
    got = sess.run(None, feeds())[0]
    assert got.shape == ref.shape
    assert np.abs(got - ref).max() <= _tol(ref)
    summary = sess.explain_summary()
    assert summary["text"].startswith("edge-npu runs 7 of 10 nodes; 3 fall back to cpu")
    assert summary["copies_inserted"] > 0 and summary["simulated"] == ["edge-npu"]


def test_forbid_lists_every_fallback_at_session_creation():
    data = mixed_npu_model().SerializeToString()
    with pytest.raises(ow.UnsupportedOpError) as e:
        ow.InferenceSession(
            data, providers=["edge-npu", "cpu"], sess_options=ow.SessionOptions(fallback="forbid")
        )
    msg = str(e.value)
    assert "3 of 10 nodes" in msg
    for name, attr in (("resize", "mode="), ("groupnorm", "num_groups="), ("pad", "pads=")):
        assert f"'{name}'" in msg and attr in msg


def test_no_device_accepts_is_rejected_at_creation():
    with pytest.raises(ow.UnsupportedOpError, match="mode='linear'"):
        ow.InferenceSession(mixed_npu_model().SerializeToString(), providers=["edge-npu"])


def test_resnet50_runs_entirely_on_edge_npu():
    model = zoo.build("resnet50", seed=0)
    data = model.SerializeToString()
    sess = ow.InferenceSession(data, providers=["edge-npu", "cpu"])
    assert {r["device"] for r in sess.explain()} == {"edge-npu"}
    summary = sess.explain_summary()
    assert summary["transposes_inserted"] <= 2
    assert sum(r["op_type"] == "Transpose" for r in sess.explain()) <= 2
    f = zoo.feeds_for(model, seed=1)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, f)[0]
    got = sess.run(None, f)[0]
    assert np.abs(got - want).max() <= _tol(want)


def test_lrn_models_fall_back_and_stay_correct():
    model = zoo.build("bvlc_alexnet", seed=0)
    data = model.SerializeToString()
    sess = ow.InferenceSession(data, providers=["edge-npu", "cpu"])
    falls = [r for r in _model_rows(sess) if r["device"] == "cpu"]
    assert {r["op_type"] for r in falls} == {"LRN"}
    assert all("edge-npu does not run LRN" in r["reason"] for r in falls)
    f = zoo.feeds_for(model, seed=1)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, f)[0]
    assert np.abs(sess.run(None, f)[0] - want).max() <= _tol(want)


def test_devices_are_enumerable():
    names = [d.name for d in devices()]
    assert names[0] == "cpu" and "edge-npu" in names
    npu = get_device("edge-npu")
    d = npu.describe()
    assert d["simulated"] and d["kind"] == "profile" and d["preferred_layout"] == "NHWC"
    assert d["memory_bytes"] == 64 * 2**20 and d["compute_dtype"] == "float16"
    caps = {c["op"]: c for c in npu.capabilities()}
    assert {"Conv", "Resize", "GroupNormalization", "Pad", "Softmax", "Dropout"} <= set(caps)
    assert caps["Resize"]["variants"][0]["constraints"][0]["values"] == ["nearest"]
    assert caps["Conv"]["variants"][0]["layouts"] == ["NHWC"]
    assert any(c["op"] == "Conv" for c in get_device("cpu").capabilities())
    assert get_device("CPUExecutionProvider").name == "cpu"
    with pytest.raises(ow.OptionsError, match="unknown provider"):
        ow.InferenceSession(mixed_npu_model().SerializeToString(), providers=["no-such-npu"])


def test_user_profile_file(tmp_path):
    prof = tmp_path / "tiny.toml"
    prof.write_text(
        '[device]\nname = "tiny-npu"\nhost = "cpu"\npreferred_layout = "NHWC"\n'
        'memory = "1 KiB"\n[[ops]]\nop = "Conv"\n[[ops]]\nop = "Relu"\n'
    )
    data = mixed_npu_model().SerializeToString()
    sess = ow.InferenceSession(data, providers=[str(prof), "cpu"])
    rows = _model_rows(sess)
    # 1 KiB cannot hold a 16x16x8 activation: every partition is refused for memory.
    assert all(r["device"] == "cpu" for r in rows)
    conv = next(r for r in rows if r["name"] == "conv3")
    assert "activation memory" in conv["reason"] and "more than its 1 KiB" in conv["reason"]
    prof.write_text(prof.read_text().replace('memory = "1 KiB"', 'memory = "64 MiB"'))
    sess = ow.InferenceSession(data, providers=[str(prof), "cpu"])
    by = {r["name"]: r for r in _model_rows(sess)}
    assert by["conv3"]["device"] == "tiny-npu"
    assert by["sigmoid"]["reason"] == "tiny-npu does not run Sigmoid"
    ref = ow.InferenceSession(data).run(None, feeds())[0]
    assert np.abs(sess.run(None, feeds())[0] - ref).max() <= 1e-4


def _tf_style_model():
    """Input in NHWC, a model Transpose to NCHW, then convolutions: nothing to insert."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[0, 3, 1, 2], name="to_nchw"),
        helper.make_node("Conv", ["t", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 3, 1], name="to_nhwc"),
    ]
    g = helper.make_graph(
        nodes, "tf",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 4])],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_back_to_back_transposes_cancel():
    data = _tf_style_model().SerializeToString()
    sess = ow.InferenceSession(data, providers=["edge-npu", "cpu"])
    s = sess.explain_summary()
    assert s["transposes_inserted"] == 0
    assert s["transposes_cancelled"] >= 1
    x = np.random.default_rng(1).standard_normal((1, 8, 8, 3)).astype(np.float32)
    want = ort.InferenceSession(data).run(None, {"x": x})[0]
    got = sess.run(None, {"x": x})[0]
    assert np.abs(got - want).max() <= _tol(want)
    # Values carry their layout tag; NHWC values have physical (N, H, W, C) shapes.
    tagged = [v for v in sess.model.graph.values.values() if getattr(v, "layout", None) == "NHWC"]
    assert tagged and all(v.fact.shape[-1] == 4 or v.fact.shape[-1] == 3 for v in tagged)


def test_explain_cli_json_and_text():
    sess = ow.InferenceSession(mixed_npu_model().SerializeToString(), providers=["edge-npu", "cpu"])
    buf = io.StringIO()
    assert render_explain(sess, as_json=True, out=buf) == 0
    data = json.loads(buf.getvalue())
    assert set(data) == {"nodes", "summary"}
    assert {"name", "op_type", "device", "variant", "reason"} <= set(data["nodes"][0])
    assert "fall back to cpu" in data["summary"]["text"]
    buf = io.StringIO()
    render_explain(sess, as_json=False, out=buf)
    assert "edge-npu runs 7 of 10 nodes" in buf.getvalue()


def test_devices_subcommand(capsys):
    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers(dest="cmd"))
    args = p.parse_args(["devices", "--json"])
    assert args.fn(args) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["name"] for r in rows} >= {"cpu", "edge-npu"}
    args = p.parse_args(["devices", "--show", "edge-npu", "--json"])
    assert args.fn(args) == 0
    assert any(o["op"] == "Pad" for o in json.loads(capsys.readouterr().out)["ops"])


def test_cpu_default_path_unchanged_for_a_single_conv():
    """A lone Conv on cpu does not pay two transposes for an NHWC kernel."""
    rng = np.random.default_rng(0)
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="conv")],
        "one",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])],
        initializer=[numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype("f"), "w")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    sess = ow.InferenceSession(m.SerializeToString())
    assert [r["op_type"] for r in sess.explain()] == ["Conv"]
    assert onnx is not None


def test_a_device_defers_to_a_later_host_device_with_the_reason():
    """Device.defers hands accepted nodes to a host device later in the list (CPU only: a
    second host device is the cpu device under another name)."""
    import dataclasses

    from opwarden.ir.load import load
    from opwarden.ir.validate import validate
    from opwarden.place.partition import Partitioner as _Partitioner

    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    model = load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    validate(model)
    cpu = get_device("cpu")
    first = dataclasses.replace(
        cpu, defers=lambda n: "Relu runs faster there" if n.op_type == "Relu" else None
    )
    for devs, relu_on in (([first, cpu], cpu), ([first], first)):
        part = _Partitioner(devs, model.opsets, None)
        part.graph(model.graph)
        relu, neg = model.graph.nodes
        assert part.assign[id(neg)].device is first and not part.assign[id(neg)].rejected
        assert part.assign[id(relu)].device is relu_on
        if relu_on is cpu:
            assert part.assign[id(relu)].rejected == [
                ("cpu", "deferred to cpu: Relu runs faster there")
            ]
