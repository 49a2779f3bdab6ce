"""The `opwarden` command."""

from __future__ import annotations

import json

import numpy as np

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
    assert main(["run", str(tmp_path / "missing.onnx")]) == 2
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
