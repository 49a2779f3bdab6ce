"""Isolated kernels (SessionOptions.isolate): a native crash in a custom kernel is a fault of its
node, the node reruns on the reference kernel, and the process and the session live on."""

from __future__ import annotations

import ctypes
import gc
import multiprocessing
import os
import signal
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import opwarden as ow
from tests.models import one_node

pytestmark = pytest.mark.skipif(
    "fork" not in multiprocessing.get_all_start_methods() or not hasattr(os, "memfd_create"),
    reason="isolate needs fork and memfd_create (Linux)",
)

DOMAIN = "isolate.test"


@ow.op("IsoRelu", domain=DOMAIN, inputs=["X: T"], outputs=["Y: T"],
       types={"T": ["float32", "float64"]})
def IsoRelu(X):
    return np.maximum(X, 0)


@ow.op("IsoAffine", domain=DOMAIN, inputs=["X: T", "B: T"], outputs=["Y: T", "S: T"],
       types={"T": ["float32"]}, attrs={"alpha": 1.0})
def IsoAffine(X, B, *, alpha=1.0):
    """Y = tanh(alpha X) * X + B, S = the row sums of Y."""
    y = np.tanh(np.float32(alpha) * X) * X + B
    return y, y.sum(axis=-1, keepdims=True)


MARKS: list[str] = []  # a file each crashing kernel appends to before it crashes (fork sees it)


def _mark():
    with open(MARKS[0], "a") as f:
        f.write("x\n")


def _segv(X):
    _mark()
    ctypes.string_at(0)  # reads address 0: SIGSEGV


def _abort(X):
    _mark()
    os.abort()


def _exit3(X):
    _mark()
    os._exit(3)


def _killed(X):
    _mark()
    os.kill(os.getpid(), signal.SIGKILL)


CRASHES = {
    "segv": (_segv, "killed by SIGSEGV"),
    "abort": (_abort, "killed by SIGABRT"),
    "exit": (_exit3, "exited with code 3"),
    "kill": (_killed, "killed by SIGKILL"),
}

RELU_MODEL = one_node(
    "IsoRelu", [("x", 1, [3, 5])], [("y", 1, [3, 5])], domain=DOMAIN
).SerializeToString()
X = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)


@pytest.fixture
def variant(tmp_path):
    """register(op, fn, name) -> name: a priority-10 variant, removed after the test."""
    saved = {op: list(op.variants) for op in (IsoRelu, IsoAffine)}
    MARKS[:] = [str(tmp_path / "marks")]

    def register(op, fn, name):
        op.kernel(name=name, priority=10)(fn)
        return name

    yield register
    for op, vs in saved.items():
        op.variants = vs


@pytest.fixture(autouse=True)
def no_worker_left_behind():
    yield
    gc.collect()  # a dropped session's finalizer stops its worker
    left = [p for p in multiprocessing.active_children() if p.name.startswith("opwarden-isolate")]
    assert not left, f"worker processes left running: {left}"


def _runs(path: str) -> int:
    return len(open(path).read().split()) if os.path.exists(path) else 0


def _gone(pid: int) -> bool:
    """The worker exited and was reaped (a zombie still answers signal 0)."""
    for _ in range(200):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.01)
    return False


@pytest.mark.parametrize("by", ["name", "custom"])
@pytest.mark.parametrize("kind", list(CRASHES))
def test_crash_is_a_fault_and_the_reference_answers(variant, kind, by):
    fn, reason = CRASHES[kind]
    name = variant(IsoRelu, fn, f"isorelu.cpu.{kind}")
    sess = ow.InferenceSession(RELU_MODEL, isolate=[name] if by == "name" else ["custom"])
    assert sess.explain()[0]["variant"] == name
    (y,) = sess.run(None, {"x": X})
    np.testing.assert_array_equal(y, np.maximum(X, 0))  # the reference's answer
    (f,) = sess.faults
    assert (f.node, f.op_type, f.variant, f.check, f.action) == (
        "n0", "IsoRelu", name, "crash", "fallback")
    assert reason in f.detail and "'n0'" in f.detail
    assert name in sess.health()["quarantine"]
    (again,) = sess.run(None, {"x": X})
    np.testing.assert_array_equal(again, np.maximum(X, 0))
    assert len(sess.faults) == 1
    # Run once: not again when the lean loop's run is redone under the guard, nor later.
    assert _runs(MARKS[0]) == 1
    assert sess._isolation.worker_pid is None  # the dead worker was reaped, none restarted
    sess.close()


@pytest.mark.parametrize("opts", [{"checks": []}, {"trace": True}, {"checks": "all"}])
def test_crash_on_every_run_path(variant, opts):
    name = variant(IsoRelu, _segv, "isorelu.cpu.segv")
    sess = ow.InferenceSession(RELU_MODEL, isolate="custom", **opts)
    (y,) = sess.run(None, {"x": X})
    np.testing.assert_array_equal(y, np.maximum(X, 0))
    assert [f.check for f in sess.faults] == ["crash"]
    assert name in sess.health()["quarantine"]
    if opts.get("trace"):
        (rec,) = sess.trace
        assert rec.status == "fallback" and "SIGSEGV" in rec.error


def _two_branches() -> bytes:
    """x -> IsoRelu (a) and x -> Neg -> IsoRelu (b), independent: one wavefront."""
    nodes = [
        helper.make_node("IsoRelu", ["x"], ["a"], name="a", domain=DOMAIN),
        helper.make_node("Neg", ["x"], ["nx"], name="neg"),
        helper.make_node("IsoRelu", ["nx"], ["b"], name="b", domain=DOMAIN),
    ]
    graph = helper.make_graph(
        nodes, "branches",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3, 5]) for n in ("a", "b")],
    )
    return helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)]).SerializeToString()


def test_crash_in_the_parallel_loop(variant):
    name = variant(IsoRelu, _segv, "isorelu.cpu.segv")
    sess = ow.InferenceSession(_two_branches(), isolate=[name], inter_op_num_threads=2)
    a, b = sess.run(None, {"x": X})
    np.testing.assert_array_equal(a, np.maximum(X, 0))
    np.testing.assert_array_equal(b, np.maximum(-X, 0))
    assert [f.check for f in sess.faults] == ["crash"] and sess.faults[0].node in ("a", "b")
    assert sess.program.levels is not None  # the wavefront loop ran it
    assert _runs(MARKS[0]) == 1  # the other branch, waiting for the worker, is not run
    sess.run(None, {"x": X})
    assert len(sess.faults) == 1


def test_on_fault_raise_names_node_and_crash(variant):
    variant(IsoRelu, _abort, "isorelu.cpu.abort")
    sess = ow.InferenceSession(RELU_MODEL, isolate="custom", on_fault="raise")
    with pytest.raises(ow.KernelError, match=r"node 'n0' \(IsoRelu\): check 'crash'.*SIGABRT"):
        sess.run(None, {"x": X})
    with pytest.raises(ow.KernelError, match="SIGABRT"):  # the session still answers
        sess.run(None, {"x": X})
    assert _runs(MARKS[0]) == 1


def _affine_model(b: np.ndarray) -> bytes:
    node = helper.make_node("IsoAffine", ["x", "b"], ["y", "s"], name="aff", domain=DOMAIN,
                            alpha=0.75)
    relu = helper.make_node("Relu", ["y"], ["r"], name="relu")
    graph = helper.make_graph(
        [node, relu], "affine",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 300])],
        [helper.make_tensor_value_info("r", TensorProto.FLOAT, [4, 300]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, [4, 1])],
        initializer=[numpy_helper.from_array(b, "b")],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                helper.make_opsetid(DOMAIN, 1)])
    return m.SerializeToString()


def _affine_fast(X, B, *, alpha=1.0):
    a = np.float32(alpha) * X
    y = np.tanh(a) * X
    y += B
    return y, y.sum(axis=-1, keepdims=True)


def test_well_behaved_isolated_kernel_is_bitwise_the_same(variant):
    name = variant(IsoAffine, _affine_fast, "isoaffine.cpu.fast")
    rng = np.random.default_rng(1)
    data = _affine_model(rng.standard_normal(300).astype(np.float32))
    x = rng.standard_normal((4, 300)).astype(np.float32)
    plain = ow.InferenceSession(data)
    iso = ow.InferenceSession(data, isolate=[name])
    want = plain.run(None, {"x": x})
    for _ in range(3):
        got = iso.run(None, {"x": x})
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            assert g.tobytes() == w.tobytes()
    assert not iso.faults
    # Only the custom variant went to the worker; the built-in Relu ran in-process.
    fns = {st.placement.node.name: st.fn.__name__ for st in iso.program.steps}
    assert fns["aff"] == f"isolated[{name}]" and not fns["relu"].startswith("isolated")
    pid = iso._isolation.worker_pid
    assert pid is not None
    iso.close()
    assert _gone(pid)
    np.testing.assert_array_equal(iso.run(None, {"x": x})[0], want[0])  # a fresh worker
    iso.close()


def _raises(X):
    raise RuntimeError("bad input for this kernel")


def _mutates(X):
    X[...] = 0
    return X


@pytest.mark.parametrize("fn, check, text", [
    (_raises, "exception", "RuntimeError: bad input for this kernel"),
    (_mutates, "mutation", "read-only"),
])
def test_python_errors_come_back_as_in_process(variant, fn, check, text):
    name = variant(IsoRelu, fn, "isorelu.cpu.pyerr")
    faults = []
    for opts in ({}, {"isolate": [name]}):
        sess = ow.InferenceSession(RELU_MODEL, **opts)
        (y,) = sess.run(None, {"x": X})
        np.testing.assert_array_equal(y, np.maximum(X, 0))
        (f,) = sess.faults
        faults.append(f.check)
        assert f.check == check and text in f.detail
        sess.close()
    assert faults[0] == faults[1]


def _sleeps(X):
    time.sleep(30)
    return np.maximum(X, 0)


def test_deadline_kills_the_worker(variant):
    name = variant(IsoRelu, _sleeps, "isorelu.cpu.sleeps")
    sess = ow.InferenceSession(RELU_MODEL, isolate=[name], op_timeout_ms={"IsoRelu": 200})
    pids = []
    orig = sess._isolation._start

    def start(need):
        orig(need)
        pids.append(sess._isolation.worker_pid)

    sess._isolation._start = start
    (y,) = sess.run(None, {"x": X})
    np.testing.assert_array_equal(y, np.maximum(X, 0))
    assert [f.check for f in sess.faults] == ["deadline"]
    assert _gone(pids[0]), "a kernel past its deadline is killed, not abandoned"
    sess.close()


def test_worker_killed_while_idle_is_restarted_without_blame(variant):
    name = variant(IsoAffine, _affine_fast, "isoaffine.cpu.fast")
    rng = np.random.default_rng(2)
    data = _affine_model(rng.standard_normal(300).astype(np.float32))
    x = rng.standard_normal((4, 300)).astype(np.float32)
    sess = ow.InferenceSession(data, isolate=[name])
    want = sess.run(None, {"x": x})
    pid = sess._isolation.worker_pid
    os.kill(pid, signal.SIGKILL)
    assert _gone_or_zombie(pid)
    # (until the whole thread group is gone the exit is not reported to waitpid, and the next
    # call could not tell the death from a crash of its own: wait for the report, as a later
    # call after a real idle death would find it)
    proc = sess._isolation._h.proc
    for _ in range(200):
        if not proc.is_alive():
            break
        time.sleep(0.01)
    got = sess.run(None, {"x": x})
    assert all(np.array_equal(g, w) for g, w in zip(got, want))
    assert not sess.faults and sess._isolation.worker_pid != pid
    sess.close()


def _gone_or_zombie(pid: int) -> bool:
    """Every thread of the process has exited (the leader turns zombie before its other threads,
    such as an idle BLAS thread, are gone and the pipe closes)."""
    for _ in range(200):
        try:
            states = []
            for t in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{t}/stat") as f:
                    states.append(f.read().rsplit(") ", 1)[1][0])
            if all(s in "ZX" for s in states):
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.01)
    return False


def test_large_inputs_and_outputs_grow_the_shared_memory(variant):
    name = variant(IsoRelu, lambda X: np.maximum(X, 0), "isorelu.cpu.lambda")
    model = one_node("IsoRelu", [("x", 11, ["n"])], [("y", 11, ["n"])], domain=DOMAIN)
    sess = ow.InferenceSession(model.SerializeToString(), isolate=[name])
    for n in (10, 300_000, 7, 1_000_000):  # 8 MB float64 each way: past the first 1 MiB map
        x = np.random.default_rng(n).standard_normal(n)
        (y,) = sess.run(None, {"x": x})
        np.testing.assert_array_equal(y, np.maximum(x, 0))
    assert not sess.faults
    sess.close()


def test_session_dropped_stops_its_worker(variant):
    name = variant(IsoRelu, lambda X: np.maximum(X, 0), "isorelu.cpu.lambda")
    sess = ow.InferenceSession(RELU_MODEL, isolate=[name])
    sess.run(None, {"x": X})
    pid = sess._isolation.worker_pid
    del sess
    gc.collect()
    assert _gone(pid)


def test_isolate_names_are_checked_at_session_creation(variant):
    variant(IsoRelu, _segv, "isorelu.cpu.segv")
    with pytest.raises(ow.OptionsError, match=r"'isorelu\.cpu\.segvv' is no registered.*"
                                              r"isorelu\.cpu\.segv"):
        ow.InferenceSession(RELU_MODEL, isolate=["isorelu.cpu.segvv"])
    with pytest.raises(ow.OptionsError, match="'isorelu.ref' is a reference kernel"):
        ow.InferenceSession(RELU_MODEL, isolate=["isorelu.ref"])
    with pytest.raises(ow.OptionsError, match="'isolate' must be"):
        ow.SessionOptions(isolate=3)
    with pytest.raises(ow.OptionsError, match="'isolate' must be"):
        ow.SessionOptions(isolate=["custom", 3])


def test_origin_tells_custom_from_builtin(variant):
    name = variant(IsoRelu, np.negative, "isorelu.cpu.numpy")  # a NumPy function, registered here
    relu = ow.ops.REGISTRY.latest("Relu")
    assert {v.origin for v in relu.variants} == {"builtin"}
    assert {v.name: v.origin for v in IsoRelu.variants}[name] == "custom"
    assert IsoRelu.variants[0].origin == "custom"  # the reference declared in this module


def test_relu_of_onnx_is_not_sent_by_custom():
    model = one_node("Relu", [("x", 1, [3, 5])], [("y", 1, [3, 5])])
    sess = ow.InferenceSession(model.SerializeToString(), isolate="custom")
    sess.run(None, {"x": X})
    assert sess._isolation.worker_pid is None  # nothing isolated: no worker was started


_ = onnx  # the models above are built with onnx.helper
