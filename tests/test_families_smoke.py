"""benchmarks/families.py --smoke runs in-process: every family's tiny model is built, agrees
with ONNX Runtime, and lands in the JSON (families whose packages are missing are skipped)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("sklearn")
pytest.importorskip("skl2onnx")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    spec = importlib.util.spec_from_file_location(
        "families_bench", os.path.join(ROOT, "benchmarks", "families.py"))
    mod = importlib.util.module_from_spec(spec)
    out = tmp_path_factory.mktemp("families") / "smoke.json"
    saved = list(sys.path)
    try:  # the script puts benchmarks/ first on sys.path; no other test should see that
        spec.loader.exec_module(mod)
        mod.main(["--smoke", "--batch", "1,3", "--json", str(out)])
    finally:
        sys.path[:] = saved
    with open(out, encoding="utf-8") as f:
        return json.load(f)


def test_smoke_rows_agree_with_onnxruntime(smoke):
    rows = [r for r in smoke["rows"] if r["status"] != "skipped"]
    assert rows, "no smoke row ran"
    for r in rows:
        assert r["status"] == "ok", f"{r['model']}: {r['status']}: {r.get('error')}"
        assert r["agree"], f"{r['model']}@{r['batch']}: {r['detail']}"
        assert r["ours"]["median_ms"] > 0 and r["ort"]["median_ms"] > 0
    for r in smoke["rows"]:
        if r["status"] == "skipped":
            assert r["error"].startswith("not installed: ")


def test_smoke_covers_every_family_and_summarizes(smoke):
    ran = {r["group"] for r in smoke["rows"] if r["status"] == "ok"}
    assert ran >= {"cnn", "vit", "bert", "decoder", "encoder", "trees", "quant", "fp16", "batch"}
    geo = smoke["geomean"]
    assert set(geo["families"]) == ran and geo["all_families"] > 0 and geo["all_models"] > 0
    batch = [r for r in smoke["rows"] if r["group"] == "batch"]
    assert {r["batch"] for r in batch} == {1, 3}
    assert all(r["vs_batch1"] > 0 for r in batch)
    # Outputs vary with the input: no builder produced a constant model.
    assert all(r["spread"] > 1e-3 for r in smoke["rows"] if r["status"] == "ok" and r["batch"] > 1)
