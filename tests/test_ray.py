"""opwarden.ray on a local Ray cluster of 2 CPUs, one for the whole module (one xdist group).

The workers import this module for their `setup` functions (``tests.test_ray:...``), which
register misbehaving Relu variants; each run's actors are fresh processes, so one test's
variants never reach another's workers.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")

import opwarden as ow  # noqa: E402
import opwarden.ray as owr  # noqa: E402
from opwarden.cli import main  # noqa: E402
from tests.models import RELU_MATMUL_W, relu_matmul  # noqa: E402

pytestmark = pytest.mark.xdist_group("ray")

ENV = "OPWARDEN_TEST_RAY_DIR"
W = RELU_MATMUL_W
tiny_model = relu_matmul


def _ref(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0) @ W


def _first_in_fleet(tag: str) -> bool:
    """True for exactly one call across every process (an O_EXCL marker file)."""
    try:
        os.close(os.open(os.path.join(os.environ[ENV], tag), os.O_CREAT | os.O_EXCL))
        return True
    except FileExistsError:
        return False


def register_faulty() -> None:
    """setup: a Relu variant that raises on its first call in the fleet and logs every call."""

    def relu(X):
        with open(os.path.join(os.environ[ENV], "calls.log"), "a") as f:
            f.write(f"{os.getpid()} {time.time()!r}\n")
        if _first_in_fleet("faulted"):
            raise RuntimeError("simulated kernel failure")
        return np.maximum(X, 0)

    ow.kernel("Relu", priority=100, name="relu.cpu.flaky_fleet")(relu)


def register_killer() -> None:
    """setup: a Relu variant whose first call in the fleet kills its worker process."""

    def relu(X):
        if _first_in_fleet("killed"):
            os.kill(os.getpid(), signal.SIGKILL)
        return np.maximum(X, 0)

    ow.kernel("Relu", priority=100, name="relu.cpu.killer")(relu)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    shared = str(tmp_path_factory.mktemp("ray_shared"))
    os.environ[ENV] = shared  # the driver's own setup calls (the CLI's probe session)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {ENV: shared}})
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        yield shared
    finally:
        ray.shutdown()
        os.environ.pop(ENV, None)


@pytest.fixture
def fresh(cluster):
    owr.reset_health()
    for name in ("faulted", "killed", "calls.log"):
        p = os.path.join(cluster, name)
        if os.path.exists(p):
            os.unlink(p)
    return cluster


def _data(n: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 4)).astype(np.float32)


def _rows(x: np.ndarray):
    return ray.data.from_items([{"x": x[i], "id": i} for i in range(len(x))])


def test_outputs_equal_one_session_in_order_and_traces_merge(fresh, tmp_path):
    x = _data(48)
    out = owr.predict(_rows(x), tiny_model(), batch_size=4, concurrency=2,
                      trace=True).take_all()
    want = ow.InferenceSession(tiny_model()).run(None, {"x": x})[0]
    assert [r["id"] for r in out] == list(range(48))
    np.testing.assert_array_equal(np.stack([r["y"] for r in out]), want)
    h = owr.health()
    assert sum(w["rows"] for w in h["workers"].values()) == 48
    assert all(w["node"] for w in h["workers"].values())
    # one process row per worker in the merged trace, with the op events of the workers that
    # ran batches (tiny batches: the first actor up may take them all before the second is)
    import json

    events = json.load(open(owr.write_trace(str(tmp_path / "t.json"))))["traceEvents"]
    rows = {e["pid"] for e in events if e["ph"] == "X"}
    meta = {e["pid"] for e in events if e["ph"] == "M"}
    ran = {name for name, w in h["workers"].items() if w["batches"]}
    assert len(meta) == len(h["workers"]) and rows <= meta and len(rows) == len(ran)
    ops = [e for e in events if e["ph"] == "X"]
    assert ops and len(ops) % (48 // 4) == 0  # every step of each batch's one run
    assert {e["args"]["worker"] for e in ops} == ran


def test_samples_of_a_fixed_batch_model_from_one_block(fresh):
    # one block of 24 rows (from_numpy), a model fixed to batch 1: cut into blocks of the batch
    # size (so that any idle worker can take one), run row by row, still in order
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "fixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
        [numpy_helper.from_array(W, "W")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = _data(24, seed=2)
    out = owr.predict(ray.data.from_numpy(x), model, batch_size=4, concurrency=2).take_all()
    sess = ow.InferenceSession(model.SerializeToString())
    want = np.concatenate([sess.run(None, {"x": x[i:i + 1]})[0] for i in range(24)])
    np.testing.assert_array_equal(np.stack([r["y"] for r in out]), want[:, None][:, 0])
    # the cut itself: one block per batch, which is what lets a second worker take a share
    from opwarden.ray.predictor import _in_batches
    cut = _in_batches(ray.data.from_numpy(x), 4, 2, ray.data).materialize()
    assert cut.num_blocks() == 24 // 4 and cut.count() == 24


def test_faulty_kernel_is_quarantined_fleet_wide(fresh):
    x = _data(64, seed=3)
    out = owr.predict(_rows(x), tiny_model(), batch_size=4, concurrency=2,
                      setup="tests.test_ray:register_faulty").take_all()
    np.testing.assert_allclose(np.stack([r["y"] for r in out]), _ref(x),
                               rtol=1e-5, atol=1e-6)
    h = owr.health()
    faults = [f for f in h["faults"] if f["variant"] == "relu.cpu.flaky_fleet"]
    assert len(faults) == 1 and faults[0]["check"] == "exception"
    assert faults[0]["worker"] in h["workers"] and faults[0]["cluster_node"]
    q = h["quarantine"]["relu.cpu.flaky_fleet"]
    assert q["worker"] == faults[0]["worker"] and "simulated" in q["reason"]
    if len(q["adopted"]) < 2:
        # The other worker ran no batch after the fault (an actor can take seconds to start
        # on 2 busy cores; the first may run nearly every batch): a second run's fresh
        # workers must then take the quarantine up from the board before their first call.
        out = owr.predict(_rows(x), tiny_model(), batch_size=4, concurrency=2,
                          setup="tests.test_ray:register_faulty").take_all()
        np.testing.assert_allclose(np.stack([r["y"] for r in out]), _ref(x),
                                   rtol=1e-5, atol=1e-6)
        h = owr.health()
        q = h["quarantine"]["relu.cpu.flaky_fleet"]
    assert len(q["adopted"]) >= 2, f"no other worker took the quarantine up: {h['workers']}"
    # no worker called the variant after the quarantine reached it from the board
    pid_of = {w: int(w.rsplit(":", 1)[1]) for w in h["workers"]}
    adopted = {pid_of[w]: t for w, t in q["adopted"].items()}
    calls = [line.split() for line in open(os.path.join(fresh, "calls.log"))]
    assert calls
    for pid, t in calls:
        assert float(t) < adopted.get(int(pid), float("inf"))
    counted = h["variants"]["relu.cpu.flaky_fleet"]
    assert counted["faults"] == {"exception": 1} and counted["fallbacks"] >= 1


def test_a_killed_worker_loses_and_repeats_nothing(fresh):
    x = _data(64, seed=4)
    out = owr.predict(_rows(x), tiny_model(), batch_size=4, concurrency=2,
                      setup="tests.test_ray:register_killer").take_all()
    assert os.path.exists(os.path.join(fresh, "killed")), "no worker was killed"
    assert sorted(r["id"] for r in out) == list(range(64))
    assert [r["id"] for r in out] == list(range(64))
    np.testing.assert_allclose(np.stack([r["y"] for r in out]), _ref(x),
                               rtol=1e-5, atol=1e-6)


def test_bad_batches_and_options_are_named(fresh):
    with pytest.raises(ow.OptionsError, match="unknown session option"):
        owr.predict(_rows(_data(4)), tiny_model(), no_such_option=1)
    with pytest.raises(ow.InputError, match="cannot be read"):
        owr.predict(_rows(_data(4)), "/nonexistent/model.onnx")
    z = np.zeros(4, np.float32)
    bad = ray.data.from_items([{"z": z, "w": z}, {"z": z, "w": z}])
    with pytest.raises(Exception, match="no column for model input 'x'"):
        owr.predict(bad, tiny_model()).take_all()


def test_cli_batch_on_ray_names_the_bad_file(fresh, tmp_path, capsys):
    model = tmp_path / "tiny.onnx"
    model.write_bytes(tiny_model())
    folder = tmp_path / "in"
    folder.mkdir()
    xs = {f"item{i}": _data(2, seed=10 + i) for i in range(5)}
    for k, v in xs.items():
        np.save(folder / f"{k}.npy", v)
    (folder / "broken.npy").write_bytes(b"\x93NUMPY not really")
    out = tmp_path / "out"
    code = main(["batch", str(model), str(folder), "--output", str(out), "--ray",
                 "--workers", "2", "--batch-size", "2"])
    text = capsys.readouterr().out
    assert code == 1 and "broken.npy" in text
    for k, v in xs.items():
        np.testing.assert_allclose(np.load(out / f"{k}.npy"), _ref(v), rtol=1e-5, atol=1e-6)
    assert sorted(os.listdir(out)) == sorted(f"{k}.npy" for k in xs)
    assert ray.is_initialized(), "joining a running cluster must not stop it"
