"""The `opwarden` command."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

from opwarden.cli import main
from tests.models import small_cnn


def test_run_default_model(capsys):
    assert main(["run", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "ResNet-50" in out["model"]
    (o,) = out["outputs"]
    assert o["shape"] == [1, 1000] and o["nan_count"] == 0


def test_run_model_with_input_file(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    path.write_bytes(small_cnn(batch=2).SerializeToString())
    x = tmp_path / "x.npy"
    np.save(x, np.ones((2, 3, 8, 8), np.float32))
    assert main(["run", str(path), "--input", f"x={x}", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["outputs"][0]["shape"] == [2, 5]


def test_run_reports_errors_cleanly(tmp_path, capsys):
    assert main(["run", str(tmp_path / "missing.onnx")]) == 3
    assert "ModelError" in capsys.readouterr().err


def test_ops_json_lists_every_operator(capsys):
    assert main(["ops", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    names = {(r["domain"], r["op"]) for r in rows}
    assert ("ai.onnx", "Conv") in names and len(rows) > 300
    conv = next(r for r in rows if r["op"] == "Conv")
    assert conv["variants"][0]["device"] == "cpu" and "nan" in conv["contract"]


def test_conformance_filter(capsys):
    assert main(["conformance", "--filter", "test_relu", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["passed"] == out["total"] >= 1


def test_explain_json(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    path.write_bytes(small_cnn().SerializeToString())
    assert main(["explain", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    ops = [r["op_type"] for r in out["nodes"]]
    assert {"Conv", "FusedConv"} & set(ops) and "summary" in out
    assert all({"name", "op_type", "device", "variant", "reason"} <= set(r) for r in out["nodes"])


def test_profile_writes_trace_and_flame(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    path.write_bytes(small_cnn(batch=2).SerializeToString())
    out = tmp_path / "prof"
    assert (
        main(["profile", str(path), "--runs", "2", "--checks", "all", "--json", "--out", str(out)])
        == 0
    )
    res = json.loads(capsys.readouterr().out)
    kinds = {r["op_type"] for r in res["by_op_type"]}
    assert kinds & {"Conv", "FusedConv"} and kinds & {"Gemm", "FusedGemm"}
    count = sum(r["count"] for r in res["by_op_type"])
    assert count % 2 == 0 and count >= 2 * 4  # every traced node, twice
    assert abs(sum(r["share"] for r in res["by_op_type"]) - 1) < 1e-6
    assert 1 <= len(res["anomalies"]) <= 5
    events = json.loads((out / "trace.json").read_text())["traceEvents"]
    assert sum(e["ph"] == "X" for e in events) == count
    assert (out / "flame.svg").read_text().startswith("<svg")


def _line_at(loc):
    """The text of the line a facet's location names (the file must exist)."""
    assert loc and os.path.isfile(loc["file"]), loc
    with open(loc["file"], encoding="utf-8") as f:
        lines = f.read().split("\n")
    assert 1 <= loc["line"] <= len(lines), loc
    assert loc["at"].endswith(f":{loc['line']}")
    return lines[loc["line"] - 1]


def _defines(rule):
    """The rule's location is the line of its def."""
    name = rule.get("code", rule["function"])
    assert re.search(rf"\bdef {re.escape(name)}\b", _line_at(rule["location"])), rule


def test_ops_conv_lists_every_facet_with_where_it_lives(capsys):
    assert main(["ops", "Conv", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["op"] == "Conv" and data["domain"] == "ai.onnx"
    (ver,) = data["versions"]
    sch = ver["schema"]
    assert {1, 11, 22} <= set(sch["since_versions"]) and sch["domain"] == "ai.onnx"
    assert [p["name"] for p in sch["inputs"]] == ["X", "W", "B"]
    assert sch["inputs"][2]["option"] == "optional" and sch["outputs"][0]["name"] == "Y"
    attrs = {a["name"]: a for a in sch["attrs"]}
    assert "NOTSET" in attrs["auto_pad"]["allowed"] and attrs["group"]["default"] == 1
    for v, loc in sch["locations"].items():  # in the ONNX source tree, as onnx.defs says
        assert loc["file"].startswith("onnx/defs/") and loc["line"] > 0, (v, loc)
    assert "def from_onnx" in _line_at(sch["reader"])
    con = ver["contract"]
    assert {"layout", "may_alias", "mutates", "nan", "overflow", "thread_safe", "allowed",
            "deterministic", "tolerance", "workspace_bytes"} <= set(con)  # fmt: skip
    assert "contract=" in _line_at(con["location"])
    assert _line_at(con["defined"]).startswith(con["defined"]["name"])
    _defines(con["workspace_bytes"])
    _defines(ver["reference"])
    assert ver["shape_rule"] == {"function": "onnx shape inference"}
    _defines(ver["gradient"])
    assert ver["decomposition"] == []
    variants = {v["name"]: v for v in ver["variants"]}
    assert variants["conv.ref"]["reference"] and variants["conv.ref"]["device"] == "cpu"
    for v in variants.values():
        assert {"dtypes", "layout", "priority", "when", "workspace"} <= set(v)
        _defines(v["kernel"])
        if v["when"] is not None:
            _defines(v["when"])
        if v["workspace"]["location"] is not None:
            assert re.search(r"\bdef \w+", _line_at(v["workspace"]["location"]))
    assert any(v["layout"] == "NHWC" and v["when"] for v in variants.values())
    devs = {d["device"]: d for d in data["devices"]}
    assert set(devs["cpu"]["variants"]) == {n for n, v in variants.items() if v["device"] == "cpu"}
    for c in devs["cpu"]["constraints"]:
        assert c["attr"] in _line_at(c["location"]) or "=" in _line_at(c["location"])
    (entry,) = devs["edge-npu"]["entries"]
    assert entry["layouts"] == ["NHWC"] and 'op = "Conv"' in _line_at(entry["location"])


def test_ops_name_prints_every_facet(capsys):
    assert main(["ops", "Conv"]) == 0
    out = capsys.readouterr().out
    for facet in ("schema", "contract", "reference", "shape rule", "onnx shape inference",
                  "gradient", "decomposition", "variants", "conv.cpu.nhwc", "when", "workspace",
                  "devices", "edge-npu", "ops/conv.py:", "edge-npu.toml:"):  # fmt: skip
        assert facet in out, facet
    assert main(["ops", "opwarden::FusedConv"]) == 0
    out = capsys.readouterr().out
    assert "declared at" in out and "_fused_conv_infer" in out and "fuses" in out


def test_ops_unknown_name_is_a_clear_error(capsys):
    from opwarden.cli.op_facets import facets
    from opwarden.errors import OpwardenError

    assert main(["ops", "NoSuchOp"]) == 3
    err = capsys.readouterr().err
    assert "UnsupportedOpError" in err and "'NoSuchOp'" in err
    assert main(["ops", "conv"]) == 3
    assert "did you mean Conv" in capsys.readouterr().err
    with pytest.raises(OpwardenError):
        facets("NoSuchOp")


def test_ops_conv_shows_its_cost_rule_and_who_reads_it(capsys):
    """Conv's FLOPs are a fact declared in ops/conv.py, read by the one function the trace
    report and `opwarden bench` share; an operator without a rule says what is counted."""
    assert main(["ops", "Conv", "--json"]) == 0
    (ver,) = json.loads(capsys.readouterr().out)["versions"]
    cost = ver["cost"]
    _defines(cost)
    assert cost["location"]["at"].startswith("opwarden/ops/conv.py:")
    assert "def op_flops" in _line_at(cost["reader"])
    assert ver["pieces"] is None  # not a fused operator
    assert main(["ops", "Relu", "--json"]) == 0
    for ver in json.loads(capsys.readouterr().out)["versions"]:
        assert "location" not in ver["cost"] and "output element" in ver["cost"]["function"]
    assert main(["ops", "Conv"]) == 0
    out = capsys.readouterr().out
    assert "cost" in out and "_conv_flops" in out and "trace/report.py:" in out


def test_ops_fused_operators_show_their_pieces_and_base_cost(capsys):
    """A fused operator declares the operators it computes (read by the devices' capability
    check, which a profile device's listing points at) and takes its base operator's cost."""
    base = {"FusedConv": "ops/conv.py:", "FusedGemm": "ops/linalg.py:",
            "FusedMatMul": "ops/linalg.py:"}  # fmt: skip
    for name, cost_file in base.items():
        assert main(["ops", f"opwarden::{name}", "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        (ver,) = data["versions"]
        pieces = ver["pieces"]
        _defines(pieces)
        assert pieces["location"]["at"].startswith("opwarden/ops/fused.py:")
        assert "def fused_pieces" in _line_at(pieces["reader"])
        _defines(ver["cost"])
        assert ver["cost"]["location"]["at"].startswith(f"opwarden/{cost_file}"), name
        fused = [d["fused"] for d in data["devices"] if "fused" in d]  # profiles naming none
        assert fused and all(f["location"] == pieces["location"] for f in fused), name
    assert main(["ops", "opwarden::FusedGemm"]) == 0
    out = capsys.readouterr().out
    assert "pieces" in out and "_fused_gemm_pieces" in out and "devices/base.py:" in out


def test_declared_pieces_and_cost_of_a_fused_node():
    """The pieces rule gives the operators in the order the reference kernel runs them, with
    only the attributes each takes; the cost of a fused record is its base operator's."""
    from types import SimpleNamespace

    from opwarden.ops import REGISTRY
    from opwarden.trace.records import OpRecord
    from opwarden.trace.report import op_flops

    x, w, b, z, y = object(), object(), object(), object(), object()
    node = SimpleNamespace(inputs=[x, w, b, z], outputs=[y], attrs={
        "pads": [1, 1, 1, 1], "group": 2, "branches": [], "activation": b"Relu"})  # fmt: skip
    pieces = REGISTRY.latest("FusedConv", "opwarden").pieces_fn(node)
    assert pieces == [("Conv", {"pads": [1, 1, 1, 1], "group": 2}, [x, w, b]),
                      ("Add", {}, [y, z]), ("Relu", {}, [y])]  # fmt: skip
    node = SimpleNamespace(inputs=[x, w, None], outputs=[y], attrs={})
    assert REGISTRY.latest("FusedMatMul", "opwarden").pieces_fn(node) == [("MatMul", {}, [x, w])]
    rec = OpRecord("c", "FusedConv", "cpu", "v", [[1, 4, 6, 6], [8, 2, 3, 3]], ["float32"] * 2)
    rec.output_shapes = [[1, 8, 6, 6]]
    assert op_flops(rec) == 2 * (8 * 6 * 6) * (2 * 3 * 3)
    rec.op_type = "Conv"
    assert op_flops(rec) == 2 * (8 * 6 * 6) * (2 * 3 * 3)
    rec.op_type = "Relu"
    assert op_flops(rec) == 8 * 6 * 6
