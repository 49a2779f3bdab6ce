"""`opwarden run` and `profile`: warm-up outside the figures, validated counts, zoo names,
providers; `conformance` judging by the list shipped inside the package."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from opwarden.cli import main
from tests.models import small_cnn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("runs") / "m.onnx"
    path.write_bytes(small_cnn(batch=2).SerializeToString())
    return str(path)


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_run_warms_up_then_times(model, capsys):
    out = _json(capsys, ["run", model, "--warmup", "2", "--runs", "3", "--json"])
    assert out["warmup"] == 2 and out["runs"] == 3 and len(out["times_ms"]) == 3
    assert out["min_ms"] <= out["median_ms"] <= out["max_ms"] and out["iqr_ms"] >= 0
    assert out["outputs"][0]["shape"] == [2, 5]
    defaults = _json(capsys, ["run", model, "--json"])
    assert defaults["warmup"] == 1 and defaults["runs"] == 10


def test_run_takes_zoo_names_providers_and_symbolic_dims(capsys, tmp_path):
    out = _json(capsys, ["run", "light_squeezenet", "--runs", "1", "--providers", "cpu",
                         "--json"])
    assert out["model"].startswith("light squeezenet") and len(out["providers"]) == 1
    path = tmp_path / "n.onnx"
    path.write_bytes(small_cnn().SerializeToString())  # batch "N"
    out = _json(capsys, ["run", str(path), "--dim", "N=4", "--runs", "1", "--json"])
    assert out["outputs"][0]["shape"] == [4, 5]


def test_run_human_report(model, capsys):
    assert main(["run", model, "--runs", "2"]) == 0
    text = capsys.readouterr().out
    assert "median" in text and "IQR" in text and "min" in text and "after 1 warm-up" in text


def test_profile_leaves_the_warm_up_out(model, tmp_path, capsys):
    def profile(warmup, runs):
        out = tmp_path / f"p{warmup}{runs}"
        res = _json(capsys, ["profile", model, "--warmup", str(warmup), "--runs", str(runs),
                             "--json", "--out", str(out)])
        events = json.loads((out / "trace.json").read_text())["traceEvents"]
        return res, sum(e["ph"] == "X" for e in events)

    cold, n_cold = profile(0, 1)
    warm, n_warm = profile(3, 1)
    count = sum(r["count"] for r in warm["by_op_type"])
    assert count == sum(r["count"] for r in cold["by_op_type"]) == n_warm == n_cold
    two, n_two = profile(1, 2)
    assert sum(r["count"] for r in two["by_op_type"]) == n_two == 2 * count
    assert warm["warmup"] == 3 and warm["runs"] == 1 and 1 <= len(warm["anomalies"]) <= 5
    assert {a["node"] for a in warm["anomalies"]} <= {
        e["name"] for e in json.loads((tmp_path / "p31" / "trace.json").read_text())[
            "traceEvents"] if e["ph"] == "X"}


def test_fused_convolution_costs_what_its_convolution_does(model, tmp_path, capsys):
    """The roofline of a FusedConv counts the convolution's FLOPs, not its output size."""
    from opwarden.options import SessionOptions
    from opwarden.session import InferenceSession
    from opwarden.trace.report import estimate

    sess = InferenceSession(model, sess_options=SessionOptions(trace=True))
    sess.run(None, {"x": np.ones((2, 3, 8, 8), np.float32)})
    (rec,) = [r for r in sess.trace if r.op_type in ("FusedConv", "Conv")]
    flops, moved = estimate(rec)
    outputs = 2 * 4 * 8 * 8
    conv = 2 * outputs * (3 * 3 * 3)  # 2 * outputs * (C_in * kH * kW)
    assert conv <= flops <= conv + 4 * outputs  # an epilogue adds a few per output at most
    assert moved > 0


def test_conformance_list_ships_inside_the_package(capsys):
    """An installed `opwarden conformance` reads its expected failures from package data."""
    import opwarden
    from opwarden.verify import conformance as conf

    pkg = os.path.dirname(opwarden.__file__)
    assert os.path.commonpath([pkg, conf.EXPECTED_FAILURES]) == pkg
    assert os.path.isfile(conf.EXPECTED_FAILURES)
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    section = text[text.index("[tool.setuptools.package-data]"):].split("\n[", 1)[0]
    assert '"**/*.txt"' in section or "expected_failures.txt" in section
    assert main(["conformance", "--filter", "test_abs", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["passed"] == out["total"] >= 1
