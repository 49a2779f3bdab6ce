"""`opwarden bench` and the benchmark scripts: smoke tests of the command and its JSON."""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import numpy as np
import pytest

from opwarden.cli import bench
from opwarden.trace.records import OpRecord
from tests.models import small_cnn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def _cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("opwarden_cache"))


@pytest.fixture(autouse=True)
def _cache(_cache_dir, monkeypatch):
    # One peaks cache per test session: measured once, never the real ~/.cache/opwarden.
    monkeypatch.setenv("OPWARDEN_CACHE_DIR", _cache_dir)


@pytest.fixture
def model_path(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(small_cnn(batch=2).SerializeToString())
    return str(path)


def _bench_json(capsys, *argv) -> dict:
    assert bench.main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_shape_vs_onnxruntime(model_path, capsys):
    out = _bench_json(
        capsys,
        model_path,
        "--vs",
        "onnxruntime",
        "--runs",
        "3",
        "--warmup",
        "1",
        "--trace-runs",
        "2",
    )
    assert out["model"] == model_path and out["runs"] == 3 and out["threads"] == 2
    for side in (out["ours"], out["peer"]):
        assert {"median_ms", "iqr_ms", "min_ms", "mean_ms"} <= set(side)
        assert len(side["times_ms"]) == 3 and side["median_ms"] > 0 and side["iqr_ms"] >= 0
    assert out["peer"]["name"] == "onnxruntime"
    assert out["faults"] == []  # guard fallbacks during the timed runs would be listed
    assert out["ratio"] == pytest.approx(out["ours"]["median_ms"] / out["peer"]["median_ms"], 1e-3)
    assert out["max_abs_diff"] < 1e-4
    ops = {r["op_type"]: r for r in out["op_types"]}
    # Passes may fuse Conv+Relu or Gemm; the FLOPs of the fused forms count the same.
    conv = ops.get("Conv") or ops["FusedConv"]
    gemm = ops.get("Gemm") or ops["FusedGemm"]
    # Conv: 2 * |Y| * |W[1:]| = 2 * (2*4*8*8) * (3*3*3); Gemm: 2 * (2*5) * 4.
    assert conv["flops"] == pytest.approx(2 * 512 * 27)
    assert gemm["flops"] == pytest.approx(2 * 10 * 4)
    assert "Softmax" in ops
    for r in out["op_types"]:
        assert r["count"] == 1 and r["time_ms"] > 0
        if r["bound"] == "view":  # a Reshape/Flatten of its input: nothing moved
            assert r["roofline_ms"] == 0 and r["mbytes"] == 0
        else:
            assert r["bound"] in ("compute", "memory") and r["mbytes"] > 0
            assert r["roofline_ms"] > 0
    assert abs(sum(r["share"] for r in out["op_types"]) - 1) < 1e-2
    assert out["peaks"]["gflops"] > 0 and out["peaks"]["gbps"] > 0


def test_ours_alone_and_options(model_path, capsys):
    out = _bench_json(
        capsys,
        model_path,
        "--runs",
        "2",
        "--warmup",
        "0",
        "--trace-runs",
        "0",
        "--checks",
        "none",
        "--optimization-level",
        "0",
    )
    assert out["peer"] is None and out["ratio"] is None and out["op_types"] == []
    assert out["session_options"] == {"checks": [], "optimization_level": 0}
    assert out["providers"] == ["CPUExecutionProvider"]  # get_providers(): onnxruntime's names


def test_human_report(model_path, capsys):
    assert bench.main([model_path, "--vs", "onnxruntime", "--runs", "2", "--trace-runs", "1"]) == 0
    text = capsys.readouterr().out
    assert "onnxruntime" in text and "ratio" in text and "roofline" in text and "Conv" in text


def test_missing_onnxruntime_is_an_options_error(model_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import now raises ImportError
    assert bench.main([model_path, "--vs", "onnxruntime"]) == 2
    err = capsys.readouterr().err
    assert "OptionsError" in err and "onnxruntime" in err and "not installed" in err


def test_bad_model_and_bad_numbers(tmp_path, model_path, capsys):
    assert bench.main([str(tmp_path / "nope.onnx")]) == 3  # a model error (opwarden --help)
    err = capsys.readouterr().err
    assert "ModelError" in err and "not found" in err
    assert bench.main(["nope"]) == 3
    assert "light-zoo name" in capsys.readouterr().err
    assert bench.main([model_path, "--runs", "0"]) == 2
    assert "--runs: must be >= 1" in capsys.readouterr().err


def test_zoo_names_resolve():
    data, label = bench.resolve_model("squeezenet")
    assert "squeezenet" in label and data[:2]
    assert bench.resolve_model("light_squeezenet")[1] == label


def test_peaks_measured_once_and_cached(tmp_path, monkeypatch):
    from opwarden.trace import report

    monkeypatch.setenv("OPWARDEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(report, "_PEAKS", {})
    calls = []
    fake = iter([{"gflops": 50.0, "gbps": 9.0}, {"gflops": 80.0, "gbps": 7.0}] * 10)

    def counting():
        calls.append(1)
        return next(fake)

    monkeypatch.setattr(report, "machine_peaks", counting)
    first = bench.cached_peaks()
    n = len(calls)
    # Best of the tries, per figure (a busy machine reads low).
    assert n >= 2 and first == {"gflops": 80.0, "gbps": 9.0, "cached": None}
    again = bench.cached_peaks()
    assert len(calls) == n and again["gflops"] == 80.0 and os.path.exists(again["cached"])
    bench.cached_peaks(refresh=True)
    assert len(calls) > n


def test_flops_of_fused_and_gemm_records():
    conv = OpRecord("c", "FusedConv", "cpu", "v", [[1, 8, 8, 3], [16, 3, 3, 3]], ["float32"] * 2)
    conv.output_shapes, conv.output_dtypes = [[1, 8, 8, 16]], ["float32"]
    assert bench.flops_bytes(conv)[0] == 2 * (8 * 8 * 16) * 27
    gemm = OpRecord("g", "Gemm", "cpu", "v", [[4, 32], [10, 32]], ["float32"] * 2)  # transB
    gemm.output_shapes, gemm.output_dtypes = [[4, 10]], ["float32"]
    flops, nbytes = bench.flops_bytes(gemm)
    assert flops == 2 * 40 * 32 and nbytes == 4 * (128 + 320 + 40)
    mm = OpRecord("m", "FusedMatMul", "cpu", "v", [[2, 4, 32], [32, 10]], ["float32"] * 2)
    mm.output_shapes, mm.output_dtypes = [[2, 4, 10]], ["float32"]
    assert bench.flops_bytes(mm)[0] == 2 * 80 * 32


def test_views_move_no_bytes_in_the_op_table():
    """A Reshape's output is a view of its input: its trace record says so and the op table
    counts neither bytes nor a roofline share for it; computed outputs (an Add planned over its
    dying input, a Transpose copy) still count."""
    import onnx
    from onnx import TensorProto, helper

    import opwarden as ow

    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]),
         helper.make_node("Reshape", ["r", "shape"], ["v"]),
         helper.make_node("Add", ["v", "v"], ["a"]),
         helper.make_node("Transpose", ["a"], ["y"], perm=[1, 0])],
        "views",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 3])],
        [helper.make_tensor("shape", TensorProto.INT64, [2], [3, 8])],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    sess = ow.InferenceSession(
        model.SerializeToString(), ow.SessionOptions(trace=True, optimization_level=0)
    )
    x = np.arange(24, dtype=np.float32).reshape(4, 6) - 5
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_array_equal(y, (2 * np.maximum(x, 0)).reshape(3, 8).T)
    recs = {r.op_type: r for r in sess.trace}
    assert recs["Reshape"].output_views == [True]
    assert recs["Relu"].output_views == [False] and recs["Add"].output_views == [False]
    assert bench.flops_bytes(recs["Reshape"]) == (0.0, 0.0)
    assert bench.flops_bytes(recs["Relu"])[1] == 2 * 24 * 4
    rows = {r["op_type"]: r for r in bench.op_table(sess.trace, 1, {"gflops": 100.0,
                                                                     "gbps": 10.0})}
    assert rows["Reshape"]["bound"] == "view" and rows["Reshape"]["roofline_share"] == 0.0
    assert rows["Relu"]["bound"] == "memory" and rows["Relu"]["mbytes"] > 0
    copied = recs["Transpose"].output_views == [False]
    assert (bench.flops_bytes(recs["Transpose"])[1] > 0) == copied


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "benchmarks", name))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_dispatch_chain_matches_numpy_and_measures():
    d = _script("dispatch.py")
    import onnxruntime as ort

    x = np.random.default_rng(0).standard_normal((1, d.WIDTH)).astype(np.float32)
    m = d.chain_model(30).SerializeToString()
    want = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(d.numpy_floor(30)(x), want, rtol=1e-6)
    res = d.measure(nodes=30, runs=2, warmup=1)
    assert res["nodes"] == 30 and len(res["rows"]) == 5
    assert all(r["us_per_node"] > 0 for r in res["rows"])


def test_zoo_table_markdown():
    z = _script("bench_zoo.py")
    row = z.bench_model(
        "squeezenet",
        runs=1,
        warmup=0,
        threads=2,
        providers=None,
        ref_runs=0,
        session_options={},
    )
    assert row["ref"] is None and row["ours_over_ort"] > 0 and row["max_abs_diff"] < 1e-3
    assert row["faults"] == []
    res = {
        "threads": 2,
        "providers": ["cpu"],
        "runs": 1,
        "warmup": 0,
        "ref_runs": 0,
        "models": [row],
        "geomean": {
            "ours_over_ort": row["ours_over_ort"],
            "ref_over_ours": None,
            "ref_over_ort": None,
        },
    }
    md = z.markdown(res)
    assert "| squeezenet |" in md and "geomean" in md
    assert z.geomean([2.0, 8.0]) == pytest.approx(4.0) and z.geomean([]) is None


def test_transformer_encoder_matches_onnxruntime_without_faults(capsys):
    t = _script("bench_transformer.py")
    import onnxruntime as ort

    import opwarden

    for opset in (13, 17):  # LayerNormalization decomposed, and the operator
        m = t.build_encoder(layers=2, hidden=32, heads=4, seq=8, batch=2, opset=opset)
        data = m.SerializeToString()
        feeds = t.feeds(2, 8, 32)
        want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        sess = opwarden.InferenceSession(data)
        for _ in range(2):
            np.testing.assert_allclose(sess.run(None, feeds)[0], want, rtol=1e-4, atol=1e-4)
        assert not sess.faults, [(f.node, f.check, f.detail) for f in sess.faults]
    assert t.main(["--layers", "1", "--hidden", "32", "--heads", "2", "--seq", "8",
                   "--runs", "2", "--warmup", "1"]) == 0
    assert "ours/ORT" in capsys.readouterr().out


def test_faults_during_the_timed_runs_are_reported(model_path, capsys, monkeypatch):
    """A kernel that faults is rerun on the reference by the guard: the bench must say so
    (its times are not the fast path's)."""
    from opwarden.ops.base import REGISTRY

    fast = next(v for v in REGISTRY.latest("Relu").variants if not v.reference and
                v.device == "cpu")

    def broken(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(fast, "fn", broken)
    out = _bench_json(capsys, model_path, "--runs", "2", "--warmup", "0", "--trace-runs", "0")
    assert out["faults"] and out["faults"][0]["op_type"] == "Relu"
    assert out["faults"][0]["detail"].endswith("injected") and out["faults"][0]["count"] >= 1


def test_torch_ceiling_runs_one_graph_everywhere(capsys):
    pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    c = _script("torch_ceiling.py")
    r = c.bench_model("squeezenet", runs=1, threads=2, compile_=False)
    assert set(r["ms"]) == {"ort", "torch eager", "opwarden torch,cpu", "opwarden cpu"}
    assert all(v > 0 for v in r["ms"].values())
    # Every runtime ran the same graph with the same weights: softmax outputs near 1e-3 agree.
    assert all(d < 1e-6 for d in r["max_abs_diff"].values()), r["max_abs_diff"]
    assert c.main(["--models", "alexnet"]) == 2
    assert "unknown model" in capsys.readouterr().err
