"""`opwarden batch` in-process (no Ray): outputs by input name, bad files named and skipped,
exit codes, Parquet in and out, and the thread fleet sharing one quarantine."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import opwarden as ow
from opwarden.batch import HealthBoard, local_workers, run_items
from opwarden.batch.files import discover
from opwarden.cli import main
from opwarden.ops import REGISTRY
from tests.models import relu_matmul

_model_bytes = relu_matmul


def _ref(x):
    return ow.InferenceSession(_model_bytes()).run(None, {"x": x})[0]


@pytest.fixture
def model(tmp_path):
    p = tmp_path / "tiny.onnx"
    p.write_bytes(_model_bytes())
    return str(p)


def _folder(tmp_path, n=5):
    folder = tmp_path / "in"
    folder.mkdir()
    xs = {f"a{i}": np.random.default_rng(i).standard_normal((2, 4)).astype(np.float32)
          for i in range(n)}
    for k, v in xs.items():
        np.save(folder / f"{k}.npy", v)
    return folder, xs


def test_bad_files_are_named_and_skipped_and_the_rest_written(model, tmp_path, capsys):
    folder, xs = _folder(tmp_path)
    (folder / "corrupt.npy").write_bytes(b"\x93NUMPY\x01\x00garbage")
    np.save(folder / "wide.npy", np.zeros((2, 5), np.float32))  # 5 features, model takes 4
    (folder / "README.txt").write_text("not an input")
    out = tmp_path / "out"
    code = main(["batch", model, str(folder), "--output", str(out), "--workers", "2",
                 "--batch-size", "2"])
    text = capsys.readouterr().out
    assert code == 1
    assert "corrupt.npy" in text and "wide.npy" in text and "dimension 1" in text
    assert "ignored 1 file" in text and "README.txt" in text
    assert sorted(os.listdir(out)) == sorted(f"{k}.npy" for k in xs)
    for k, v in xs.items():
        np.testing.assert_array_equal(np.load(out / f"{k}.npy"), _ref(v))


def test_all_good_exits_0_with_a_json_report(model, tmp_path, capsys):
    folder, xs = _folder(tmp_path, 4)
    code = main(["batch", model, str(folder), "-o", str(tmp_path / "o"), "--workers", "2",
                 "--batch-size", "1", "--json"])
    rep = json.loads(capsys.readouterr().out)
    assert code == 0 and rep["done"] == rep["total"] == 4 and rep["failed"] == []
    workers = rep["health"]["workers"]
    assert sum(w["rows"] for w in workers.values()) == 4 and len(workers) == 2


def test_exit_codes_for_usage_model_and_inputs(model, tmp_path, capsys):
    folder, _ = _folder(tmp_path, 1)
    out = str(tmp_path / "o")
    assert main(["batch", model, str(folder), "-o", out, "--batch-size", "0"]) == 2
    assert main(["batch", str(tmp_path / "none.onnx"), str(folder), "-o", out]) == 3
    assert main(["batch", model, str(tmp_path / "missing"), "-o", out]) == 3
    bad_model = tmp_path / "bad.onnx"
    bad_model.write_bytes(b"not a model")
    assert main(["batch", str(bad_model), str(folder), "-o", out]) == 3
    err = capsys.readouterr().err
    assert "missing" in err and "none.onnx" in err


def test_parquet_rows_in_and_out(model, tmp_path, capsys):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    x = np.random.default_rng(7).standard_normal((7, 4)).astype(np.float32)
    rows = [list(map(float, r)) for r in x]
    rows[3] = None  # a null row: named and skipped
    table = pa.table({"x": pa.array(rows, pa.list_(pa.float32())),
                      "id": pa.array(range(7), pa.int64())})
    src = tmp_path / "data.parquet"
    pq.write_table(table, src)
    out = tmp_path / "o"
    code = main(["batch", model, str(src), "-o", str(out), "--batch-size", "3"])
    text = capsys.readouterr().out
    assert code == 1 and "data.parquet[row 3]" in text and "null" in text
    got = pq.read_table(out / "data.parquet")
    assert got.column("row").to_pylist() == [0, 1, 2, 4, 5, 6]
    ys = got.column("y").combine_chunks().to_numpy_ndarray()
    keep = [0, 1, 2, 4, 5, 6]
    np.testing.assert_allclose(ys, _ref(x[keep]), rtol=1e-5, atol=1e-6)


@pytest.fixture
def flaky_relu():
    """A Relu variant that raises on its first call only; removed afterwards."""
    relu = REGISTRY.latest("Relu")
    before = list(relu.variants)
    calls = []

    def variant(X):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("simulated one-off failure")
        return np.maximum(X, 0)

    ow.kernel("Relu", priority=100, name="relu.cpu.flaky_threads")(variant)
    yield calls
    relu.variants = before


def test_thread_fleet_shares_one_quarantine(flaky_relu, tmp_path):
    folder, xs = _folder(tmp_path, 8)
    board = HealthBoard()
    workers = local_workers(_model_bytes(), 2, board)
    inputs = discover(str(folder), ["x"])
    res = run_items(inputs, str(tmp_path / "o"), [w.run_items for w in workers],
                    input_names=["x"], output_names=["y"], batch_size=1)
    assert res.done == 8 and not res.failed
    # the worker that met the fault: 1 call; the other stops at its next batch after that
    assert len(flaky_relu) < 8, "the workers kept calling a quarantined variant"
    h = board.health()
    (fault,) = [f for f in h["faults"] if f["variant"] == "relu.cpu.flaky_threads"]
    assert fault["worker"].startswith("thread-") and fault["cluster_node"]
    q = h["quarantine"]["relu.cpu.flaky_threads"]
    assert q["worker"] == fault["worker"]
    # the one-off failure (caught on the guarded loop) quarantined it in both sessions
    for w in workers:
        assert "relu.cpu.flaky_threads" in w.session.guard.quarantine
    for k, v in xs.items():
        np.testing.assert_array_equal(np.load(tmp_path / "o" / f"{k}.npy"), _ref(v))
