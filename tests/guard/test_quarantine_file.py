"""The quarantine file: shared by processes and sessions without losses; odd files refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import numpy as np
import pytest
from onnx import TensorProto

import opwarden as ow
from opwarden.guard.faults import QUARANTINE_MAX_BYTES, Quarantine, read_quarantine_file
from opwarden.ops import REGISTRY
from tests.models import one_node

F32 = TensorProto.FLOAT
X = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _model(op: str) -> bytes:
    return one_node(op, [("x", F32, [3, 4])], [("y", F32, [3, 4])]).SerializeToString()


@pytest.fixture
def bad_kernels():
    """Relu and Abs variants that always raise, preferred over the real ones; removed after."""
    calls: list[str] = []
    saved = {}
    for op in ("Relu", "Abs"):
        opdef = REGISTRY.latest(op)
        saved[op] = list(opdef.variants)

        def bad(X, _op=op):
            calls.append(_op)
            raise RuntimeError("simulated driver failure")

        ow.kernel(op, priority=100, name=f"{op.lower()}.cpu.bad_qfile")(bad)
    yield calls
    for op, variants in saved.items():
        REGISTRY.latest(op).variants = variants


def _entries(path) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)["variants"]


# -- real sessions -------------------------------------------------------------------------------


def test_a_fault_lands_in_the_file_and_the_next_session_avoids_the_variant(bad_kernels, tmp_path):
    path = str(tmp_path / "q.json")
    sess = ow.InferenceSession(_model("Relu"), quarantine_file=path)
    np.testing.assert_array_equal(sess.run(None, {"x": X})[0], np.maximum(X, 0))
    assert "relu.cpu.bad_qfile" in _entries(path)
    assert sess.health()["quarantine_file_error"] is None
    again = ow.InferenceSession(_model("Relu"), quarantine_file=path)
    assert again.explain()[0]["variant"] != "relu.cpu.bad_qfile"


def test_two_sessions_in_one_process_keep_each_others_entries(bad_kernels, tmp_path):
    path = str(tmp_path / "q.json")
    a = ow.InferenceSession(_model("Relu"), quarantine_file=path)
    b = ow.InferenceSession(_model("Abs"), quarantine_file=path)  # both read an empty file
    a.run(None, {"x": X})
    np.testing.assert_array_equal(b.run(None, {"x": X})[0], np.abs(X))
    assert set(_entries(path)) == {"relu.cpu.bad_qfile", "abs.cpu.bad_qfile"}


def test_two_quarantine_objects_on_one_path_merge(tmp_path):
    path = str(tmp_path / "q.json")
    one, two = Quarantine(path), Quarantine(path)
    for i in range(20):
        one.add(f"one.{i}", "r")
        two.add(f"two.{i}", "r")
    assert set(_entries(path)) == {f"{w}.{i}" for w in ("one", "two") for i in range(20)}
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


def test_a_missing_folder_is_created_at_session_creation(tmp_path):
    path = str(tmp_path / "a" / "b" / "q.json")
    ow.InferenceSession(_model("Relu"), quarantine_file=path)
    assert os.path.isdir(tmp_path / "a" / "b")


def test_a_file_in_the_folders_way_fails_at_session_creation(tmp_path):
    (tmp_path / "plain").write_text("x")
    path = str(tmp_path / "plain" / "q.json")
    with pytest.raises(ow.OptionsError, match="cannot be created") as e:
        ow.InferenceSession(_model("Relu"), quarantine_file=path)
    assert path in str(e.value)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root ignores modes")
def test_a_read_only_folder_fails_at_session_creation(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(ow.OptionsError, match="writable"):
            ow.InferenceSession(_model("Relu"), quarantine_file=str(folder / "q.json"))
    finally:
        folder.chmod(0o755)


def test_a_write_failure_at_fault_time_warns_and_the_run_goes_on(bad_kernels, tmp_path):
    folder = tmp_path / "gone"
    path = str(folder / "q.json")
    sess = ow.InferenceSession(_model("Relu"), quarantine_file=path)
    shutil.rmtree(folder)  # removed between session creation and the first fault
    with pytest.warns(RuntimeWarning, match="not updated"):
        (y,) = sess.run(None, {"x": X})
    np.testing.assert_array_equal(y, np.maximum(X, 0))
    health = sess.health()
    assert "relu.cpu.bad_qfile" in health["quarantine"]
    assert "q.json" in health["quarantine_file_error"]
    n = len(bad_kernels)
    sess.run(None, {"x": X})
    assert len(bad_kernels) == n, "still quarantined in memory"


@pytest.mark.skipif(sys.platform == "win32", reason="flock")
def test_a_lock_held_too_long_warns_and_a_later_add_saves_everything(tmp_path, monkeypatch):
    import fcntl

    from opwarden.guard import faults

    monkeypatch.setattr(faults, "_LOCK_TIMEOUT_S", 0.2)
    path = str(tmp_path / "q.json")
    q = Quarantine(path)
    holder = os.open(path + ".lock", os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another writer that hangs while holding the lock
    try:
        with pytest.warns(RuntimeWarning, match="held for over"):
            q.add("first", "r")
        assert "first" in q and q.persist_error and not os.path.exists(path)
    finally:
        os.close(holder)
    q.add("second", "r")
    assert q.persist_error is None
    assert set(_entries(path)) == {"first", "second"}


# -- odd files -----------------------------------------------------------------------------------


def _deep(folder):
    p = folder / "q.json"
    p.write_text('{"variants": ' + "[" * 200_000 + "]" * 200_000 + "}")
    return p


def _zero(folder):
    p = folder / "q.json"
    os.symlink("/dev/zero", p)
    return p


def _fifo(folder):
    p = folder / "q.json"
    os.mkfifo(p)
    return p


def _directory(folder):
    p = folder / "q.json"
    p.mkdir()
    return p


def _huge(folder):
    p = folder / "q.json"
    with open(p, "wb") as f:
        f.truncate(QUARANTINE_MAX_BYTES + 1)  # sparse: nothing to write, too big to read
    return p


def _text(content: bytes):
    def make(folder):
        p = folder / "q.json"
        p.write_bytes(content)
        return p

    return make


ODD = {
    "deep_json": (_deep, "deeper"),
    "symlink_to_dev_zero": (_zero, "character device"),
    "fifo": (_fifo, "FIFO"),
    "directory": (_directory, "directory"),
    "huge": (_huge, "at most"),
    "invalid_utf8": (_text(b'{"variants": {"\xff\xfe": "x"}}'), "not UTF-8"),
    "invalid_json": (_text(b'{"variants": {"a": '), "not valid JSON"),
    "a_list": (_text(b'["relu.cpu"]'), "got a JSON list"),
    "variants_a_list": (_text(b'{"variants": ["relu.cpu"]}'), "variants as list"),
    "reason_a_number": (_text(b'{"variants": {"relu.cpu": 3}}'), "not a string"),
    "unknown_key": (_text(b'{"variants": {}, "extra": 1}'), "unknown keys"),
}


def _create_in_thread(path: str, timeout: float = 20.0):
    """Session creation in a thread, so a blocking open fails the test instead of hanging it."""
    box: list = []

    def create():
        try:
            box.append(ow.InferenceSession(_model("Relu"), quarantine_file=path))
        except BaseException as e:  # noqa: BLE001 - handed to the test to judge
            box.append(e)

    t = threading.Thread(target=create, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        if os.path.exists(path):  # a reader stuck on a FIFO: give it a writer and EOF
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        pytest.fail(f"InferenceSession(quarantine_file={path!r}) still blocked after {timeout} s")
    return box[0]


@pytest.mark.parametrize("kind", list(ODD))
def test_an_odd_quarantine_file_is_an_options_error_at_session_creation(kind, tmp_path):
    make, what = ODD[kind]
    path = str(make(tmp_path))
    got = _create_in_thread(path)
    assert isinstance(got, ow.OptionsError), f"{type(got).__name__}: {got}"
    assert path in str(got) and what in str(got)
    # nothing created beside a refused file, nor beside what a link points at
    assert not [n for n in os.listdir(tmp_path) if n.endswith((".lock", ".tmp"))]
    assert not os.path.lexists(os.path.realpath(path) + ".lock")


def test_an_empty_or_touched_file_is_an_empty_quarantine(tmp_path):
    p = tmp_path / "q.json"
    p.write_bytes(b"")
    assert read_quarantine_file(str(p)) == {}
    p.write_bytes(b'{"variants": {"a": "nan [1, 2] {x}"}}')
    assert read_quarantine_file(str(p)) == {"a": "nan [1, 2] {x}"}


# -- two processes -------------------------------------------------------------------------------

WRITER = textwrap.dedent(
    """
    import sys, time
    from opwarden.guard.faults import Quarantine
    path, tag, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    q = Quarantine(path)
    print("ready", flush=True)
    sys.stdin.readline()
    end, n = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        q.add(f"{tag}.{n}", f"found by {tag}")
        n += 1
        if q.persist_error:
            raise SystemExit(f"write failed: {q.persist_error}")
    print(n, flush=True)
    """
)


def test_two_processes_writing_one_file_lose_nothing(tmp_path):
    path = str(tmp_path / "shared" / "q.json")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [
        subprocess.Popen(
            [sys.executable, "-W", "error::RuntimeWarning", "-c", WRITER, path, tag, "3"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=env,
        )
        for tag in ("p0", "p1")
    ]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready", p.stderr.read()
        for p in procs:  # both start writing together
            p.stdin.write("go\n")
            p.stdin.flush()
        # a reader meanwhile: never a half-written or unreadable file
        bad: list[str] = []
        while any(p.poll() is None for p in procs):
            try:
                read_quarantine_file(path)
            except ow.OptionsError as e:
                bad.append(str(e))
            time.sleep(0.002)
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    counts = [int(out.split()[-1]) for out, _ in outs]
    assert min(counts) > 0
    want = {f"p{i}.{n}" for i, c in enumerate(counts) for n in range(c)}
    got = _entries(path)
    assert want - set(got) == set(), f"{len(want - set(got))} of {len(want)} entries lost"
    assert not bad, bad[:3]
    assert not [n for n in os.listdir(tmp_path / "shared") if n.endswith(".tmp")]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert set(Quarantine(path).entries) == want
