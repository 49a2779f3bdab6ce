"""Fault records, per-variant counters and the quarantine of unstable variants."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
import threading
import time
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from opwarden.errors import OptionsError

try:
    import fcntl
except ImportError:  # Windows: only threads of one process exclude each other
    fcntl = None  # type: ignore[assignment]


class DeadlineExceeded(Exception):
    """A kernel ran past its deadline: raised by the guard's deadline worker and by an isolated
    kernel's worker (guard/isolate.py), recorded as a "deadline" fault."""


@dataclass
class FaultRecord:
    """Everything known about one operator fault."""

    node: str
    op_type: str
    variant: str
    device: str
    check: str  # exception | nan | inf | shape | dtype | mutation | alias | deadline | outputs
    detail: str
    input_shapes: list[Any]
    input_dtypes: list[str]
    attrs: dict[str, Any]
    time: float = field(default_factory=time.time)
    action: str = "fallback"  # fallback | raise | recorded

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class VariantStats:
    calls: int = 0
    fallbacks: int = 0
    faults: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {"calls": self.calls, "fallbacks": self.fallbacks, "faults": dict(self.faults)}


# A quarantine file holds a few hundred short entries at most; anything near this is not ours.
QUARANTINE_MAX_BYTES = 16 << 20
# The schema nests two levels; deeper text is refused before json.loads could recurse on it.
_MAX_DEPTH = 64
_LOCK_TIMEOUT_S = 10.0
# A whole string literal, or (an unterminated one) everything from its quote on: one linear pass
# either way, where a pattern that could fail would be retried at every later quote.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|"[\s\S]*')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def _nesting_too_deep(text: str) -> bool:
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text)).encode("ascii")
    if len(brackets) <= 2 * _MAX_DEPTH:
        return False
    b = np.frombuffer(brackets, np.uint8)
    steps = 1 - 2 * ((b >> 2) & 1).astype(np.int32)  # [ { -> +1, ] } -> -1 (bit 2 marks closers)
    return int(np.cumsum(steps).max()) > _MAX_DEPTH


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def read_quarantine_file(path: str, shown: str | None = None) -> dict[str, str] | None:
    """The entries of a quarantine file; None when it does not exist.

    Refuses (OptionsError naming the file) anything but a regular file of at most
    QUARANTINE_MAX_BYTES holding ``{"variants": {name: reason}}`` with string names and reasons.
    """
    shown = shown or path
    where = f"quarantine_file {shown!r}"
    try:
        # stat first so a device is never even opened; fstat below closes the race.
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None  # not there yet (a file in the folder's way is the caller's to report)
    except OSError as e:
        raise OptionsError(f"{where} cannot be read: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise OptionsError(f"{where} must be a regular file, got {_kind(st.st_mode)}")
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    flags |= getattr(os, "O_NOCTTY", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)  # O_NONBLOCK: a FIFO swapped in cannot block the open
    except FileNotFoundError:
        return None
    except OSError as e:
        raise OptionsError(f"{where} cannot be read: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OptionsError(f"{where} must be a regular file, got {_kind(st.st_mode)}")
        if st.st_size > QUARANTINE_MAX_BYTES:
            raise OptionsError(
                f"{where} is {st.st_size} bytes; a quarantine file holds at most "
                f"{QUARANTINE_MAX_BYTES} bytes"
            )
        chunks, got = [], 0
        while got <= QUARANTINE_MAX_BYTES:  # the file may grow after fstat
            b = os.read(fd, min(1 << 20, QUARANTINE_MAX_BYTES + 1 - got))
            if not b:
                break
            chunks.append(b)
            got += len(b)
        if got > QUARANTINE_MAX_BYTES:
            raise OptionsError(f"{where} grew past {QUARANTINE_MAX_BYTES} bytes while read")
    except OSError as e:
        raise OptionsError(f"{where} cannot be read: {e.strerror or e}") from None
    finally:
        os.close(fd)
    return _parse(b"".join(chunks), where)


def _parse(raw: bytes, where: str) -> dict[str, str]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise OptionsError(f"{where} is not UTF-8: byte {e.start}: {e.reason}") from None
    if not text.strip():
        return {}  # an empty (touched) file: nothing quarantined yet
    if _nesting_too_deep(text):
        raise OptionsError(f"{where} nests deeper than {_MAX_DEPTH} levels; expected "
                           '{"variants": {name: reason}}')
    try:
        data = json.loads(text)
    except RecursionError:
        raise OptionsError(f"{where} nests too deeply to parse") from None
    except ValueError as e:
        raise OptionsError(f"{where} is not valid JSON: {e}") from None
    expected = 'expected {"variants": {name: reason}}'
    if not isinstance(data, dict):
        raise OptionsError(f"{where}: {expected}, got a JSON {type(data).__name__}")
    extra = sorted(k for k in data if k != "variants")
    if extra:
        raise OptionsError(f"{where}: {expected}, got unknown keys {extra}")
    variants = data.get("variants", {})
    if not isinstance(variants, dict):
        raise OptionsError(f"{where}: {expected}, got variants as {type(variants).__name__}")
    for k, v in variants.items():
        if not isinstance(v, str):
            raise OptionsError(
                f"{where}: {expected}; the reason for {k!r} is a {type(v).__name__}, not a string"
            )
    return dict(variants)


class _FileLock:
    """An flock on a sidecar file: held by one writer (exclusive) across processes.

    The lock file never changes, unlike the data file that os.replace swaps out, so every writer
    locks the same inode. Without fcntl (Windows) only this process's threads are excluded.
    """

    _local: dict[str, threading.Lock] = {}
    _local_guard = threading.Lock()

    def __init__(self, path: str) -> None:
        self.path = path
        with self._local_guard:
            self._thread_lock = self._local.setdefault(path, threading.Lock())
        self._fd = -1

    def open(self) -> int:
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
        flags |= getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
        fd = os.open(self.path, flags, 0o666)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, f"lock file {self.path!r} is not a regular file")
        return fd

    def __enter__(self) -> _FileLock:
        if not self._thread_lock.acquire(timeout=_LOCK_TIMEOUT_S):
            raise TimeoutError(f"lock {self.path!r} held by another thread")
        try:
            fd = self.open()
            if fcntl is not None:
                self._flock(fd)
            self._fd = fd
        except BaseException:
            self._thread_lock.release()
            raise
        return self

    def _flock(self, fd: int) -> None:
        """Take the flock, waiting at most _LOCK_TIMEOUT_S; on failure fd is no longer ours.

        A blocking flock is woken as soon as the holder lets go (polling lets a busy writer
        starve the others), but cannot time out by itself: it waits in a helper thread, so a
        holder that hangs (a stopped process) cannot hang a run. On a timeout the helper keeps
        the descriptor and closes it once its flock returns, which drops the lock at once.
        """
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        except BaseException:
            os.close(fd)
            raise
        state = {"abandoned": False, "error": None}
        decided = threading.Lock()
        done = threading.Event()

        def wait() -> None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as e:
                state["error"] = e
            with decided:
                done.set()
                if state["abandoned"] or state["error"] is not None:
                    os.close(fd)

        try:
            threading.Thread(target=wait, name="opwarden-quarantine-lock", daemon=True).start()
        except RuntimeError as e:  # no thread to spare
            os.close(fd)
            raise OSError(errno.EAGAIN, f"cannot wait for lock {self.path!r}: {e}") from None
        try:
            done.wait(_LOCK_TIMEOUT_S)
        finally:  # a timeout or an interrupt: the helper closes fd whenever its flock returns
            with decided:
                state["abandoned"] = not done.is_set()
        if state["abandoned"]:
            raise TimeoutError(f"lock {self.path!r} held for over {_LOCK_TIMEOUT_S:g} s")
        if state["error"] is not None:
            raise state["error"]

    def __exit__(self, *exc: Any) -> None:
        self._release()

    def _release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = -1
        self._thread_lock.release()


class Quarantine:
    """Variants marked unstable (name -> reason); optionally persisted to a JSON file.

    The file may be shared by sessions and processes. Every write happens under an flock of
    ``<path>.lock``, re-reads the file, merges this object's own additions into it and
    replaces it atomically from a temp file of its own, so writers never drop each other's
    entries and readers (who take no lock) see either the old or the new file, never a part.
    Odd files (not regular, too big, too deep, bad schema) and an unusable folder are
    OptionsError at construction, i.e. at session creation; a failed write later only warns
    and is kept in ``persist_error``, since the in-memory quarantine still protects the session.
    """

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self.entries: dict[str, str] = {}
        self.persist_error: str | None = None
        self._added: dict[str, str] = {}  # what this object found: written on every save
        self._lock = threading.Lock()
        if path is None:
            return
        where = f"quarantine_file {path!r}"
        if not path:
            raise OptionsError(f"{where}: the path is empty")
        # Resolved once, so different links to one file share its lock and a link stays a link.
        self._real = os.path.realpath(path)
        # Read (and refuse odd files) first: nothing is created next to what is refused.
        entries = read_quarantine_file(self._real, path) or {}
        folder = os.path.dirname(self._real)
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as e:
            raise OptionsError(
                f"{where}: its folder {folder!r} cannot be created: {e.strerror or e}"
            ) from None
        if not os.path.isdir(folder):
            raise OptionsError(f"{where}: {folder!r} is not a folder")
        self._file_lock = _FileLock(self._real + ".lock")
        try:  # fail now, not at the first fault, where the folder cannot hold the lock file
            os.close(self._file_lock.open())
        except OSError as e:
            raise OptionsError(
                f"{where}: lock file {self._file_lock.path!r} cannot be created "
                f"(the folder must be writable): {e.strerror or e}"
            ) from None
        self.entries = entries

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def reason(self, name: str) -> str:
        return self.entries.get(name, "")

    def add(self, name: str, reason: str) -> None:
        with self._lock:
            self.entries[name] = reason
            self._added[name] = reason
            if self.path:
                self._save()

    def merge(self, entries: dict[str, str]) -> list[str]:
        """Adopt entries found elsewhere (another process, a fleet's board); returns the names
        new here. They protect this object from now on but are not its own findings, so they
        are never written to its file."""
        with self._lock:
            new = [k for k in entries if k not in self.entries]
            for k in new:
                self.entries[k] = entries[k]
            return new

    def _save(self) -> None:
        try:
            with self._file_lock:
                on_disk = read_quarantine_file(self._real, self.path) or {}
                merged = {**on_disk, **self._added}
                if merged != on_disk:
                    self._write(merged)
            self.persist_error = None
        except (OSError, OptionsError) as e:  # TimeoutError is an OSError
            # Someone else's unreadable file is left alone; the next session reports it.
            self.persist_error = f"{type(e).__name__}: {e}"
            warnings.warn(
                f"quarantine_file {self.path!r} not updated ({self.persist_error}); the "
                f"variants stay quarantined in this session only",
                RuntimeWarning,
                stacklevel=3,
            )

    def _write(self, entries: dict[str, str]) -> None:
        folder, base = os.path.split(self._real)
        data = json.dumps({"variants": entries}, indent=1, sort_keys=True).encode("ascii")
        if len(data) > QUARANTINE_MAX_BYTES:  # no session could read it back
            raise OptionsError(
                f"quarantine_file {self.path!r} would grow to {len(data)} bytes, over the "
                f"{QUARANTINE_MAX_BYTES} a quarantine file may hold"
            )
        tag = f"{os.getpid()}.{threading.get_ident()}.{os.urandom(4).hex()}"
        tmp = os.path.join(folder, f".{base}.{tag}.tmp")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(tmp, flags | getattr(os, "O_BINARY", 0), 0o666)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)  # the data is on disk before the name points at it
            finally:
                os.close(fd)
            os.replace(tmp, self._real)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        if hasattr(os, "O_DIRECTORY"):  # the rename itself survives a crash
            with contextlib.suppress(OSError):
                dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
