"""Isolated kernels: chosen variants run in a worker process, so a native crash is a fault.

``SessionOptions(isolate=[variant names, or "custom"])``: the steps of those variants call a
forwarding function instead of their kernel. It copies the array inputs into a shared memory
file, sends the step's number and the inputs' offsets, shapes and dtypes over a pipe (anything
else, pickled), and the worker, a fork of the session's process, runs the kernel on views of
that memory, writes the outputs after the inputs and answers with their layout. When the worker
dies during the call (a signal such as SIGSEGV or SIGABRT, ``os._exit``, killed from outside),
the call raises `KernelCrash`; the guard records it as a "crash" fault of the node, reruns the
node on the reference kernel and quarantines the variant, and the next call starts a fresh
worker. A kernel's Python exception comes back as that exception, as if it ran in-process.

Why fork, through ``multiprocessing.get_context("fork")``: the worker inherits every registered
kernel (defined in ``__main__``, a test, a closure made by ``Variant.specialize``) and every
initializer of the model without importing or pickling anything, so what runs is exactly what
would have run in-process; multiprocessing adds the reaping, exit codes and the termination of
daemonic workers at interpreter exit. Forking a process that has threads is safe here because
the worker only runs the kernel: glibc's malloc and OpenBLAS (which stops its pool before a
fork) prepare for fork, and the worker sets BLAS to one thread so it never starts a pool of its
own. The worker is forked lazily at the first isolated call, once the session's step table is
complete, and again after a crash.

Why a memfd (``os.memfd_create``) rather than ``multiprocessing.shared_memory``: it has no name
and no resource tracker (nothing can leak in /dev/shm when either side is killed), the fork
inherits it, and either side can grow it with ftruncate and map the larger size, so no call is
refused or restarted for being large.
"""

from __future__ import annotations

import difflib
import mmap
import os
import pickle
import signal
import sys
import threading
import traceback
import weakref
from typing import Any

import numpy as np

from opwarden.errors import KernelError, OptionsError

_ALIGN = 64
_MIN_REGION = 1 << 20
_PICKLE = pickle.HIGHEST_PROTOCOL
_NOT_SENT = ("out", "workspace")
_ABSENT = object()


class KernelCrash(KernelError):
    """The worker process running an isolated kernel died during the call."""


def _align(n: int) -> int:
    return (n + _ALIGN - 1) & ~(_ALIGN - 1)


def _region_size(need: int) -> int:
    return max(_MIN_REGION, 1 << max(need - 1, 1).bit_length())


def _shippable(x: Any) -> bool:
    """Arrays whose bytes are the value (no Python objects inside) travel through shared memory;
    empty ones and everything else are pickled."""
    return isinstance(x, np.ndarray) and not x.dtype.hasobject and x.nbytes > 0


def _dt(d: np.dtype) -> Any:
    """A dtype for the pipe: NumPy's own by its code (pickling a dtype object costs ~5 us)."""
    return d.str if d.isbuiltin == 1 else d


def _same_array(a: Any, c: np.ndarray) -> bool:
    """`a` is the constant `c` itself or a view of all of it (the guard passes read-only views)."""
    if a is c:
        return True
    return (
        type(a) is np.ndarray
        and a.shape == c.shape
        and a.strides == c.strides
        and a.dtype == c.dtype
        and a.__array_interface__["data"][0] == c.__array_interface__["data"][0]
    )


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "closed its pipe and was killed"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


class _Entry:
    """One isolated step as the worker runs it (inherited through fork, never pickled)."""

    __slots__ = ("fn", "attrs", "consts", "label", "variant", "deadline_s")

    def __init__(self, fn, attrs, consts, label, variant, deadline_s) -> None:
        self.fn = fn
        self.attrs = attrs
        self.consts = consts  # input position -> the initializer the worker already holds
        self.label = label
        self.variant = variant
        self.deadline_s = deadline_s


class _Handles:
    """The process-level resources of one Isolation, closable without a reference to it."""

    def __init__(self) -> None:
        self.proc: Any = None
        self.conn: Any = None
        self.fd = -1

    def stop_worker(self, kill: bool = False) -> None:
        proc, conn = self.proc, self.conn
        self.proc = self.conn = None
        if conn is not None:
            if not kill:
                try:
                    conn.send_bytes(pickle.dumps(None))
                except OSError:
                    pass
            conn.close()
        if proc is not None:
            proc.join(0 if kill else 1.0)
            if proc.exitcode is None:
                proc.kill()
                proc.join(5.0)

    def close(self) -> None:
        self.stop_worker()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def isolation_for(options: Any, guard: Any) -> Isolation | None:
    """The session's Isolation for `options.isolate`, or None when nothing is isolated.

    Raises OptionsError for a name that is no registered variant, a reference kernel (the
    guard's fallback, which runs in-process), or a platform without fork and memfd.
    """
    raw = options.isolate
    names = [raw] if isinstance(raw, str) else list(raw or ())
    if not names:
        return None
    from opwarden.ops import REGISTRY

    variants = {v.name: v for o in REGISTRY.all() for v in o.variants}
    for n in names:
        if n == "custom":
            continue
        v = variants.get(n)
        if v is None:
            close = difflib.get_close_matches(n, list(variants), n=3)
            hint = f"; close matches: {close}" if close else ""
            raise OptionsError(
                f"session option 'isolate': {n!r} is no registered kernel variant (give "
                f"variant names as in `opwarden ops`, or 'custom'){hint}"
            )
        if v.reference:
            raise OptionsError(
                f"session option 'isolate': {n!r} is a reference kernel, the guard's fallback, "
                "which runs in-process; isolate the variants that may crash"
            )
    import multiprocessing

    if "fork" not in multiprocessing.get_all_start_methods() or not hasattr(os, "memfd_create"):
        raise OptionsError(
            f"session option 'isolate' needs the fork start method and memfd_create (Linux); "
            f"not available on {sys.platform}"
        )
    return Isolation(names, guard)


class Isolation:
    """The isolated steps of one session and the worker process that runs them."""

    def __init__(self, names: list[str], guard: Any) -> None:
        self.names = frozenset(n for n in names if n != "custom")
        self.custom = "custom" in names
        self.guard = guard
        self.entries: list[_Entry] = []
        self._lock = threading.Lock()
        self._h = _Handles()
        self._mm: mmap.mmap | None = None
        self._size = 0
        self._forked_entries = 0
        self._crashed: dict[str, str] = {}  # variant -> what its crash was
        weakref.finalize(self, self._h.close)

    # -- session creation --------------------------------------------------------------------
    def selects(self, var: Any) -> bool:
        if var.reference:
            return False
        # Placement wraps variants for a layout or a device profile ("name@nhwc"): judge the
        # variant the user registered.
        base_name = var.name.split("@", 1)[0]
        if var.name in self.names or base_name in self.names:
            return True
        if not self.custom:
            return False
        base = next((v for v in var.op.variants if v.name == base_name), var)
        return base.origin == "custom"

    def wrap(self, st: Any, program: Any) -> Any:
        """The step's kernel: a forwarder to the worker when the variant is isolated."""
        var = st.placement.variant
        if not self.selects(var):
            return st.fn
        node = st.placement.node
        if st.graphs:
            raise OptionsError(
                f"session option 'isolate': node {node.label} (variant {var.name}) takes graph "
                f"attributes {sorted(st.graphs)}, which cannot run in a worker process"
            )
        consts = {}
        for i, s in enumerate(st.ins):
            c = program.template[s] if s >= 0 else None
            if _shippable(c):
                consts[i] = c
        limit = self.guard.deadline_ms(node.op_type)
        index = len(self.entries)
        self.entries.append(
            _Entry(st.fn, dict(st.kwargs), consts, node.label, var.name,
                   None if limit is None else limit / 1000.0)
        )

        # Weak: module-level caches keyed by kernel function (plan.lifetimes) outlive the
        # session; they must not keep its worker process alive with them.
        ref = weakref.ref(self)

        def isolated(*args: Any, **kw: Any) -> Any:
            iso = ref()
            if iso is None:
                raise KernelError(f"node {node.label}: its session's isolation was closed")
            return iso.call(index, args, kw)

        isolated.__name__ = f"isolated[{var.name}]"
        isolated.__wrapped__ = st.fn  # inspect.signature: the planner sees its parameters
        return isolated

    # -- the worker --------------------------------------------------------------------------
    def _map(self, size: int) -> None:
        have = os.fstat(self._h.fd).st_size
        if size > have:
            os.ftruncate(self._h.fd, size)
        size = max(size, have)
        # The old mapping goes when the last array over it does (no explicit close: a view
        # may still be alive, and mmap refuses to close under one).
        self._mm = mmap.mmap(self._h.fd, size)
        self._size = size

    def _start(self, need: int) -> None:
        import multiprocessing

        self._h.stop_worker(kill=True)
        if self._h.fd < 0:
            self._h.fd = os.memfd_create("opwarden-isolate")
        self._map(max(self._size, _region_size(need)))
        ctx = multiprocessing.get_context("fork")
        parent, child = ctx.Pipe(duplex=True)
        proc = ctx.Process(
            target=_serve,
            args=(child, parent, self._h.fd, self._size, self.entries, os.getpid()),
            name=f"opwarden-isolate-{os.getpid()}",
            daemon=True,
        )
        proc.start()
        child.close()
        self._h.proc, self._h.conn = proc, parent
        self._forked_entries = len(self.entries)

    def prestart(self) -> None:
        """Fork the worker now, if one is needed and none runs: called before a run's kernels
        start, so the fork does not happen while this session's threads run BLAS."""
        if self._h.proc is not None or len(self._crashed) >= len(self.entries):
            return  # running, or nothing (left) to isolate
        if not any(e.variant not in self._crashed and e.variant not in self.guard.quarantine
                   for e in self.entries):
            return
        with self._lock:
            if self._h.proc is None:
                self._start(0)

    def close(self) -> None:
        """Stop the worker (a later call starts a fresh one)."""
        with self._lock:
            self._h.stop_worker()

    @property
    def worker_pid(self) -> int | None:
        proc = self._h.proc
        return proc.pid if proc is not None else None

    # -- one call ----------------------------------------------------------------------------
    def call(self, index: int, args: tuple, kw: dict[str, Any]) -> Any:
        e = self.entries[index]
        with self._lock:
            crash = self._crashed.get(e.variant)
            if crash is not None:
                # The same run goes on under the guard after a crash in the lean loop: the
                # variant is not run again, its crash is what the guard records.
                raise KernelCrash(crash)
            descs: list[tuple] = []
            copies: list[tuple[int, np.ndarray]] = []
            end = 0
            for i, a in enumerate(args):
                c = e.consts.get(i)
                if c is not None and _same_array(a, c):
                    descs.append(("c", i))
                elif _shippable(a):
                    off = _align(end)
                    descs.append(("a", off, a.shape, _dt(a.dtype), bool(a.flags.writeable)))
                    copies.append((off, a))
                    end = off + a.nbytes
                else:
                    descs.append(("o", a))
            extra = {k: v for k, v in kw.items()
                     if k not in _NOT_SENT and e.attrs.get(k, _ABSENT) is not v}
            ws = kw.get("workspace")
            ws_desc = (ws.shape, ws.dtype) if isinstance(ws, np.ndarray) else None
            h = self._h
            # A worker that died idle (killed from outside) is not this call's fault: its end of
            # the pipe reads as closed (poll) before its exit status can be collected.
            if h.proc is not None and (index >= self._forked_entries or h.conn.poll(0)
                                       or not h.proc.is_alive()):
                h.stop_worker(kill=True)
            if h.proc is None:
                self._start(2 * end)
            elif end > self._size:
                self._map(_region_size(2 * end))
            mm = self._mm
            for off, a in copies:
                np.copyto(np.ndarray(a.shape, a.dtype, mm, off), a, casting="no")
            msg = pickle.dumps((index, descs, extra, ws_desc, self._size), _PICKLE)
            try:
                h.conn.send_bytes(msg)
                if e.deadline_s is not None and not h.conn.poll(e.deadline_s):
                    h.stop_worker(kill=True)
                    from opwarden.guard.faults import DeadlineExceeded

                    raise DeadlineExceeded(
                        f"kernel ran past its {e.deadline_s * 1000:g} ms deadline (its isolated "
                        "worker process was killed)"
                    )
                data = h.conn.recv_bytes()
            except (EOFError, OSError):
                raise self._crash(e) from None
            except BaseException:
                # Interrupted (KeyboardInterrupt, a deadline): the worker may still answer this
                # call later, so it must not serve another.
                h.stop_worker(kill=True)
                raise
            status, payload, size = pickle.loads(data)
            if size > self._size:
                self._map(size)  # the worker grew the file for its outputs
            if status == "err":
                raise _remote_error(*payload)
            return self._results(payload, kw.get("out"))

    def _crash(self, e: _Entry) -> KernelCrash:
        h = self._h
        proc = h.proc
        pid = proc.pid if proc is not None else "?"
        if proc is not None:
            proc.join(5.0)
        code = proc.exitcode if proc is not None else None
        h.stop_worker(kill=True)
        msg = (
            f"isolated kernel {e.variant} of node {e.label} crashed its worker process "
            f"(pid {pid}): {_exit_reason(code)}"
        )
        self._crashed[e.variant] = msg
        return KernelCrash(msg)

    def _results(self, payload: tuple, out: Any) -> Any:
        is_tuple, descs = payload
        mm = self._mm
        res = []
        for k, d in enumerate(descs):
            if d[0] == "o":
                res.append(d[1])
                continue
            _, off, shape, dtype = d
            view = np.ndarray(shape, dtype, mm, off)
            if k == 0 and isinstance(out, np.ndarray) and out.shape == shape and out.dtype == dtype:
                np.copyto(out, view)  # the planned buffer, as the kernel itself would write it
                res.append(out)
            else:
                res.append(view.copy())
        return tuple(res) if is_tuple else res[0]


def _remote_error(blob: bytes | None, text: str, tb: str) -> BaseException:
    """The worker's exception as raised there, its traceback as a note."""
    exc: BaseException | None = None
    if blob is not None:
        try:
            exc = pickle.loads(blob)
        except Exception:  # noqa: BLE001 - an exception class that cannot be rebuilt here
            exc = None
    if not isinstance(exc, BaseException):
        exc = RuntimeError(text)
    if tb:
        exc.add_note(f"in the isolated worker process:\n{tb.rstrip()}")
    return exc


# -- the worker process ------------------------------------------------------------------------
def _worker_setup() -> None:
    import faulthandler

    # The parent reports the crash; a traceback dump and a core file per crash would be noise.
    if faulthandler.is_enabled():
        faulthandler.disable()
    try:
        import resource

        _, hard = resource.getrlimit(resource.RLIMIT_CORE)
        resource.setrlimit(resource.RLIMIT_CORE, (0, hard))
    except (ImportError, ValueError, OSError):
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    from opwarden.blas import set_blas_threads

    set_blas_threads(1)


def _serve(conn, parent_end, fd: int, size: int, entries: list[_Entry], ppid: int) -> None:
    parent_end.close()
    _worker_setup()
    mm = mmap.mmap(fd, size)
    while True:
        while not conn.poll(1.0):
            if os.getppid() != ppid:
                return  # orphaned: the parent died without closing us
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return
        msg = pickle.loads(data)
        if msg is None:
            return
        index, descs, extra, ws_desc, psize = msg
        if psize > len(mm):
            mm = mmap.mmap(fd, psize)
        try:
            reply, mm = _run_one(entries[index], descs, extra, ws_desc, mm, fd)
        except BaseException as exc:  # noqa: BLE001 - every kernel failure goes to the parent
            try:
                blob: bytes | None = pickle.dumps(exc, _PICKLE)
            except Exception:  # noqa: BLE001
                blob = None
            text = f"{type(exc).__name__}: {exc}"
            reply = pickle.dumps(("err", (blob, text, traceback.format_exc()), len(mm)), _PICKLE)
        conn.send_bytes(reply)


def _run_one(e: _Entry, descs, extra, ws_desc, mm: mmap.mmap, fd: int):
    args = []
    end = 0
    for d in descs:
        tag = d[0]
        if tag == "c":
            args.append(e.consts[d[1]])
        elif tag == "a":
            _, off, shape, dtype, writeable = d
            x = np.ndarray(shape, dtype, mm, off)
            if not writeable:
                x.flags.writeable = False
            args.append(x)
            end = max(end, off + x.nbytes)
        else:
            args.append(d[1])
    kw = dict(e.attrs)
    kw.update(extra)
    if ws_desc is not None:
        kw["workspace"] = np.empty(*ws_desc)
    res = e.fn(*args, **kw)
    is_tuple = type(res) is tuple
    outs = res if is_tuple else (res,)
    out_descs: list[tuple] = []
    copies = []
    off = _align(end)
    for o in outs:
        if isinstance(o, np.generic):
            o = np.asarray(o)
        if _shippable(o):
            off = _align(off)
            out_descs.append(("a", off, o.shape, _dt(o.dtype)))
            copies.append((off, o))
            off += o.nbytes
        else:
            out_descs.append(("o", o))
    if off > len(mm):
        new = _region_size(off)
        os.ftruncate(fd, new)
        mm = mmap.mmap(fd, new)
    for o_off, o in copies:
        np.copyto(np.ndarray(o.shape, o.dtype, mm, o_off), o, casting="no")
    return pickle.dumps(("ok", (is_tuple, out_descs), len(mm)), _PICKLE), mm
