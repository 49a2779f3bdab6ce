"""`opwarden inspect`: a model's summary from its file, and what each device runs, unrun."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from opwarden.cli import main
from opwarden.devices import base as device_base


def _external(t: onnx.TensorProto, folder, location: str, write: bool) -> onnx.TensorProto:
    """`t` with its data in `location` (written only when `write`)."""
    data = numpy_helper.to_array(t).tobytes()
    if write:
        with open(os.path.join(folder, location), "wb") as f:
            f.write(data)
    ext = onnx.TensorProto()
    ext.CopyFrom(t)
    ext.ClearField("raw_data")
    ext.data_location = onnx.TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", str(len(data)))):
        e = ext.external_data.add()
        e.key, e.value = k, v
    return ext


def _model(folder, missing: bool = True) -> str:
    """x[N,4] @ W (external, present) + B (external, missing when `missing`) -> Relu, a
    Constant, an If whose branches hold a Neg and an Identity, metadata and a producer."""
    w = numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(4, 4), "W")
    b = numpy_helper.from_array(np.ones(4, np.float32), "B")
    s = numpy_helper.from_array(np.float32(2.0), "s")
    then = helper.make_graph([helper.make_node("Neg", ["r"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", 1, None)])
    other = helper.make_graph([helper.make_node("Identity", ["r"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", 1, None)])
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["m"], name="mm"),
        helper.make_node("Add", ["m", "B"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["r"], name="relu"),
        helper.make_node("Constant", [], ["k"], name="k", value=helper.make_tensor(
            "k", TensorProto.FLOAT, [3], [1, 2, 3])),
        helper.make_node("Mul", ["r", "s"], ["y"], name="mul"),
        helper.make_node("If", ["flag"], ["z"], name="branch", then_branch=then,
                         else_branch=other),
    ]
    g = helper.make_graph(
        nodes, "ext",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
         helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("k", TensorProto.FLOAT, [3])],
        [_external(w, folder, "w.bin", True), _external(b, folder, "b.bin", not missing), s])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)],
                          producer_name="h5-test", producer_version="1.0")
    helper.set_model_props(m, {"author": "tests", "license": "MIT"})
    path = os.path.join(folder, "m.onnx")
    with open(path, "wb") as f:
        f.write(m.SerializeToString())
    return path


def _inspect(capsys, *argv):
    assert main(["inspect", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_summary_from_the_file(tmp_path, capsys):
    d = _inspect(capsys, _model(tmp_path), "--devices", "cpu,edge-npu")
    assert d["ir_version"] > 0 and d["opsets"] == {"ai.onnx": 17}
    assert d["producer"] == "h5-test 1.0" and d["metadata"] == {"author": "tests", "license": "MIT"}
    assert d["inputs"] == [
        {"name": "x", "type": "tensor", "dtype": "float32", "shape": ["N", 4]},
        {"name": "flag", "type": "tensor", "dtype": "bool", "shape": []}]
    assert [o["name"] for o in d["outputs"]] == ["y", "z", "k"]
    assert d["outputs"][1]["shape"] is None  # no rank declared
    assert d["ops"] == {"MatMul": 1, "Add": 1, "Relu": 1, "Constant": 1, "Mul": 1, "If": 1}
    assert d["subgraph_ops"] == {"Neg": 1, "Identity": 1}
    p = d["parameters"]
    assert p["count"] == 3 and p["elements"] == 16 + 4 + 1 and p["bytes"] == 4 * 21
    assert p["largest"][0] == {"name": "W", "dtype": "float32", "shape": [4, 4],
                               "elements": 16, "bytes": 64, "external": True}
    assert p["constant_nodes"] == 1 and p["constant_bytes"] == 12
    files = {f["location"]: f for f in d["external_data"]}
    assert files["w.bin"]["file_bytes"] == 64 and files["w.bin"]["problem"] is None
    assert files["b.bin"]["file_bytes"] is None and "missing" in files["b.bin"]["problem"]
    # the device check still ran, on the weights' facts
    s = d["support"]
    assert any("external data unreadable" in n for n in s["notes"])
    cpu = next(r for r in s["devices"] if r["device"] == "cpu")
    assert cpu["runs"] == cpu["nodes"] == 6 and cpu["unsupported"] == []


def test_devices_report_what_they_refuse_with_the_reason(tmp_path, capsys):
    d = _inspect(capsys, _model(tmp_path, missing=False), "--devices", "edge-npu,cpu")
    assert all(f["problem"] is None for f in d["external_data"])
    npu = next(r for r in d["support"]["devices"] if r["device"] == "edge-npu")
    refused = {u["op"]: u for u in npu["unsupported"]}
    # edge-npu's profile lists neither If nor Constant; it runs MatMul, Add, Relu, Mul
    assert {"If", "Constant"} <= set(refused) and "MatMul" not in refused
    assert refused["If"]["nodes"] == ["branch"] and "edge-npu" in refused["If"]["reason"]
    assert npu["runs"] == npu["nodes"] - sum(u["count"] for u in npu["unsupported"]) - len(
        npu["decomposed"])


def test_a_device_that_runs_a_node_through_its_function_body(tmp_path, capsys, monkeypatch):
    """A profile running LessOrEqual's pieces (ONNX's function body: Less, Equal, Or) but not
    LessOrEqual itself, nor Tanh."""
    monkeypatch.setattr(device_base, "_DEVICES", dict(device_base._DEVICES))  # restored after
    prof = tmp_path / "pieces.toml"
    ops = "".join(f'[[ops]]\nop = "{o}"\n' for o in ("Less", "Equal", "Or"))
    prof.write_text('[device]\nname = "h5-pieces"\nhost = "cpu"\n\n[defaults]\n'
                    'dtypes = ["float32", "bool"]\n\n' + ops)
    m = helper.make_model(helper.make_graph(
        [helper.make_node("Tanh", ["x"], ["t"], name="th"),
         helper.make_node("LessOrEqual", ["t", "x"], ["y"], name="le")], "g",
        [helper.make_tensor_value_info("x", 1, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.BOOL, [2, 3])]),
        opset_imports=[helper.make_opsetid("", 16)])
    path = tmp_path / "le.onnx"
    onnx.save(m, path)
    d = _inspect(capsys, str(path), "--devices", f"{prof},cpu")
    dev, cpu = d["support"]["devices"]
    assert dev["device"] == "h5-pieces" and dev["runs"] == 0
    assert [(x["node"], x["op"]) for x in dev["decomposed"]] == [("le", "LessOrEqual")]
    assert [(u["op"], u["nodes"]) for u in dev["unsupported"]] == [("Tanh", ["th"])]
    assert "h5-pieces does not run Tanh" in dev["unsupported"][0]["reason"]
    assert cpu["runs"] == 2 and not cpu["decomposed"] and not cpu["unsupported"]


def test_zoo_names_and_the_human_report(capsys):
    assert main(["inspect", "light_squeezenet", "--devices", "cpu"]) == 0
    text = capsys.readouterr().out
    for part in ("ONNX IR", "operators", "Conv", "largest initializers", "conv10_w_0",
                 "what each device runs", "66/66"):
        assert part in text, part
    assert max(len(line) for line in text.splitlines()) > 80  # not wrapped in a pipe
    d = _inspect(capsys, "squeezenet", "--devices", "cpu")
    assert d["model"].startswith("light squeezenet") and d["nodes"] == 66
    assert d["parameters"]["elements"] > 1_000_000


def test_every_registered_device_is_asked_by_default(tmp_path, capsys):
    d = _inspect(capsys, _model(tmp_path, missing=False))
    asked = {r["device"] for r in d["support"]["devices"]}
    assert {dev.name for dev in device_base.devices()} == asked


@pytest.mark.parametrize("content", [b"not an onnx file", b""])
def test_bad_files_are_model_errors(tmp_path, capsys, content):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(content)
    assert main(["inspect", str(bad)]) == 3
    err = capsys.readouterr().err
    assert "ModelError" in err and "Traceback" not in err


def test_an_unknown_operator_is_refused_by_every_device(tmp_path, capsys):
    m = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"),
         helper.make_node("Foo", ["r"], ["y"], name="foo", domain="my.ops")], "g",
        [helper.make_tensor_value_info("x", 1, [2])], [helper.make_tensor_value_info("y", 1, [2])]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("my.ops", 1)])
    path = tmp_path / "custom.onnx"
    onnx.save(m, path)
    d = _inspect(capsys, str(path), "--devices", "cpu,edge-npu")
    assert d["ops"] == {"Relu": 1, "my.ops::Foo": 1} and d["opsets"]["my.ops"] == 1
    assert [v["node"] for v in d["support"]["invalid"]] == ["foo"]
    for dev in d["support"]["devices"]:
        assert dev["nodes"] == 2 and dev["runs"] == 1
        (u,) = dev["unsupported"]
        assert u["op"] == "my.ops::Foo" and "unknown operator" in u["reason"]
