"""A compiled region: maximal connected nodes placed on openvino, run as one OpenVINO model.

- Compiled once per shape signature of its non-constant inputs (an LRU of `LRU_SIZE`), each
  reshaped to static shapes, which OpenVINO's CPU plugin runs faster than dynamic ones; a region
  whose inputs are static compiles when the session is created.
- Feeds enter as shared-memory tensors, re-set only when their memory changes (a read-only
  feed is viewed writable when NumPy allows; OpenVINO never writes its inputs). OpenVINO
  writes a large output into a fresh NumPy array set as its output tensor; a small one
  (`_COPY_BYTES`) is copied out of OpenVINO's buffer, which costs less than re-setting.
- Precision: INFERENCE_PRECISION_HINT is always set, f32 unless the session asked for another
  (SessionOptions.precision): OpenVINO's own default on a CPU with AVX512_BF16 is bf16, a silent
  degrade. Threads: INFERENCE_NUM_THREADS from intra_op_num_threads, not pinned to cores.
- With tracing, PERF_COUNT is on and `provenance()` turns the last call's profiling info into
  per-node times (each runtime layer's time split over the ONNX nodes fused into it).
- `cpu(*inputs)` reruns the region node by node on the host kernels (the guard's fallback) and
  `blame(kind)` names the first node whose output went bad in OpenVINO's run.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from typing import Any

import numpy as np

from opwarden.errors import KernelError
from opwarden.ir.graph import Node, Value
from opwarden.kernels.openvino import convert as C
from opwarden.kernels.openvino import deviations as D

LRU_SIZE = 8
_COPY_BYTES = 16 << 10
PRECISIONS = {"f32": "f32", "bf16": "bf16", "f16": "f16"}
_POISON: set[str] = set()
_BREAK: set[str] = set()


@contextmanager
def inject_nan(*node_names: str):
    """Fault injection for tests: regions compiled inside this block compute NaN as the first
    output of these nodes, as a broken device kernel would."""
    _POISON.update(node_names)
    try:
        yield
    finally:
        _POISON.difference_update(node_names)


@contextmanager
def inject_compile_failure(*node_names: str):
    """Fault injection for tests: compiling a region holding one of these nodes inside this
    block fails in OpenVINO itself (it is handed a property value it refuses)."""
    _BREAK.update(node_names)
    try:
        yield
    finally:
        _BREAK.difference_update(node_names)


def ov_config(precision: str, threads: int, profile: bool) -> dict[str, Any]:
    """The compile properties: explicit precision, threads, latency, PERF_COUNT when tracing."""
    cfg: dict[str, Any] = {
        "INFERENCE_PRECISION_HINT": PRECISIONS[precision],
        "PERFORMANCE_HINT": "LATENCY",
        "PERF_COUNT": "YES" if profile else "NO",
        # LATENCY pins its threads to cores; a pinned thread cannot move off a core that
        # another process (or our own host kernels' threads) is using
        "ENABLE_CPU_PINNING": False,
    }
    if threads > 0:
        cfg["INFERENCE_NUM_THREADS"] = threads
    return cfg


def feed_order(ports: Any, names: list[str]) -> list[int]:
    """Which of `names` (the feeds, in order) each of OpenVINO's input `ports` reads: by name,
    as OpenVINO drops a parameter its operators ignore (Dropout's ratio at inference); a port
    it renamed (a parameter passed straight to an output takes the output's name) reads the
    first feed not matched otherwise."""
    pos = {n: k for k, n in enumerate(names)}
    got = [next((pos[n] for n in p.get_names() if n in pos), None) for p in ports]
    rest = iter(k for k in range(len(names)) if k not in got)
    return [k if k is not None else next(rest) for k in got]


class _Request:
    """One infer request and what is bound to it: per input the array it reads (kept alive,
    so its memory is the one the request points at), per small output OpenVINO's own buffer
    viewed as an array."""

    def __init__(self, req: Any, small: list[bool]) -> None:
        self.req = req
        self.fed: list[Any] = []
        self.own = [req.get_output_tensor(i).data if s else None for i, s in enumerate(small)]


class _Compiled:
    """One shape signature: the compiled model, idle infer requests, output specs, owners.

    An output of at most `_COPY_BYTES` is copied out of OpenVINO's own buffer (a copy that
    small costs less than handing OpenVINO a fresh array each call); a larger one is written
    straight into a fresh array set as the output tensor."""

    def __init__(self, compiled: Any, layers: dict[str, tuple[str, ...]]) -> None:
        self.compiled = compiled
        self.order: list[int] = list(range(len(compiled.inputs)))  # feed of each input
        self.layers = layers
        self.idle: list[_Request] = []
        self.lock = threading.Lock()
        self.outs = [(tuple(o.get_shape()), o.get_element_type().to_dtype())
                     for o in compiled.outputs]
        self.small = [int(np.prod(sh)) * np.dtype(dt).itemsize <= _COPY_BYTES
                      for sh, dt in self.outs]

    def request(self) -> _Request:
        with self.lock:
            if self.idle:
                return self.idle.pop()
        return _Request(self.compiled.create_infer_request(), self.small)

    def release(self, r: _Request) -> None:
        with self.lock:
            self.idle.append(r)


class Region:
    """The nodes of one region, its boundary values and its compiled models."""

    def __init__(
        self, name: str, nodes: list[Node], inputs: list[Value], outputs: list[Value],
        opsets: dict[str, int], precision: str = "f32", threads: int = 0,
        profile: bool = False, host_kernels: list[tuple[Any, dict[str, Any]]] | None = None,
    ) -> None:
        self.name, self.nodes, self.inputs, self.outputs = name, nodes, inputs, outputs
        self.feeds = [v for v in inputs if v.const is None]  # the step's inputs, in order
        self.opsets = opsets
        self.precision, self.threads, self.profile = precision, threads, profile
        self.poison = tuple(sorted(_POISON & {n.name for n in nodes}))
        self.broken = bool(_BREAK & {n.name for n in nodes})
        # int64 feeds: OpenVINO computes them in int32 (deviations.py), so each call checks
        self.wide = [i for i, v in enumerate(self.feeds) if v.fact.dtype == "int64"]
        self.host_runs = 0  # calls run on the host kernels for an int64 feed beyond int32
        self.big: dict[str, Any] = {}  # weights, passed to OpenVINO by memory (convert.read)
        self.onnx = C.graph_model(nodes, inputs, outputs, opsets, self.poison, self.big)
        self.key = hashlib.sha1(self.onnx[:1 << 20]).hexdigest()[:12]
        self.host_kernels = host_kernels or []
        self.owner = {v.name: n.name for n in nodes for v in n.outputs if v is not None}
        self.cache: OrderedDict[tuple, _Compiled] = OrderedDict()
        self.lock = threading.Lock()
        self.last: tuple[Any, _Compiled, float] | None = None  # (request, compiled, µs) traced
        self.cpu_times: dict[str, float] = {}
        self.cpu_env: dict[str, Any] = {}
        self.degrade: dict[str, Any] = {}  # the measured error of a precision degrade
        self.precision_note: str | None = None  # why the asked precision is not applied
        self.calib: dict[str, Any] | None = None  # set only while a calibration runs
        if all(v.fact.static for v in self.feeds):
            self.compiled_for(tuple(tuple(v.fact.shape) for v in self.feeds))

    # -- compiling ---------------------------------------------------------------------------
    def compiled_for(self, sig: tuple, precision: str | None = None,
                     outputs: list[Value] | None = None) -> _Compiled:
        """The compiled model for input shapes `sig` (LRU), or a one-off one for another
        precision or output list (calibration and diagnosis)."""
        if precision is None and outputs is None:
            with self.lock:
                hit = self.cache.get(sig)
                if hit is not None:
                    self.cache.move_to_end(sig)
                    return hit
        data = self.onnx if outputs is None else C.graph_model(
            self.nodes, self.inputs, outputs, self.opsets, self.poison, self.big)
        model = C.read(data, self.big)
        if self.feeds:
            order = feed_order(model.inputs, [v.name for v in self.feeds])
            model.reshape({p: list(sig[k]) for p, k in zip(model.inputs, order)})
        cfg = ov_config(precision or self.precision, self.threads, self.profile)
        if self.broken:
            cfg["INFERENCE_PRECISION_HINT"] = "not-a-precision"
        try:
            compiled = C.core().compile_model(model, "CPU", cfg)
        except Exception as e:  # noqa: BLE001 - the plugin's refusal, in words
            raise KernelError(f"OpenVINO region {self.name}: compile failed for input shapes "
                              f"{list(sig)}: {C.frontend_reason(e)}") from None
        layers = C.layer_owners(compiled, C.owners(model, self.owner)) if self.profile else {}
        entry = _Compiled(compiled, layers)
        entry.order = feed_order(compiled.inputs, [v.name for v in self.feeds])
        if precision is None and outputs is None:
            with self.lock:
                self.cache[sig] = entry
                while len(self.cache) > LRU_SIZE:
                    self.cache.popitem(last=False)
        return entry

    # -- running -----------------------------------------------------------------------------
    def run(self, *args: Any) -> tuple[Any, ...]:
        """The region's outputs for its feeds, computed by OpenVINO (one output: the array, as
        any one-output kernel returns it)."""
        if self.calib is not None:
            return self._calibrating(args)
        if self.wide and not all(D.int32_safe(np.asarray(args[i])) for i in self.wide):
            self.host_runs += 1
            return self.cpu(*args)
        outs = self._infer(self.compiled_for(tuple(np.shape(a) for a in args)), args)
        return outs[0] if len(outs) == 1 else outs

    def _infer(self, entry: _Compiled, args: tuple[Any, ...]) -> tuple[Any, ...]:
        import openvino as ov

        r = entry.request()
        req = r.req
        try:
            fed = r.fed
            for i, k in enumerate(entry.order):
                x = args[k]
                a, owner = C.shared(x)
                ptr = a.__array_interface__["data"][0]
                if i < len(fed):
                    prev = fed[i]
                    fed[i] = (a, owner, ptr)  # keeps the memory the request reads alive
                    if prev[2] == ptr and prev[0].shape == a.shape and prev[0].dtype == a.dtype:
                        continue  # the same memory: the request reads it already
                else:
                    fed.append((a, owner, ptr))
                req.set_input_tensor(i, ov.Tensor(a, shared_memory=True))
            outs: list[Any] = []
            for i, (shape, dt) in enumerate(entry.outs):
                if r.own[i] is None:
                    y = np.empty(shape, dt)
                    req.set_output_tensor(i, ov.Tensor(y, shared_memory=True))
                    outs.append(y)
                else:
                    outs.append(None)
            t0 = time.perf_counter()
            req.infer()
            if self.profile:
                self.last = (req, entry, (time.perf_counter() - t0) * 1e6)
            for i, own in enumerate(r.own):
                if own is not None:
                    outs[i] = own.copy()
        finally:
            entry.release(r)
        return tuple(outs)

    # -- calibrating a precision degrade -----------------------------------------------------
    def _calibrating(self, args: tuple[Any, ...]) -> Any:
        """run() during a calibration: the f32 compile when asked for, else the region's
        own, its inputs recorded."""
        sig = tuple(np.shape(a) for a in args)
        if self.calib is not None and self.calib.get("mode") == "f32":
            entry = self.calib.setdefault("f32", {}).get(sig)
            if entry is None:
                entry = self.calib["f32"][sig] = self.compiled_for(sig, precision="f32")
            outs = self._infer(entry, args)
        else:
            assert self.calib is not None
            self.calib["args"] = tuple(np.array(a, copy=True) for a in args)
            outs = self._infer(self.compiled_for(sig), args)
        return outs[0] if len(outs) == 1 else outs

    def measure(self, args: tuple[Any, ...], f32: Any = None) -> dict[str, Any]:
        """The error of this region's outputs at its precision against an f32 compile of the
        same region (`f32`, or one made here), on `args`: per output, and the largest (kept in
        `degrade`)."""
        sig = tuple(np.shape(a) for a in args)
        got = self._infer(self.compiled_for(sig), args)
        want = self._infer(f32 or self.compiled_for(sig, precision="f32"), args)
        rows = [error_row(v.name, y, w) for v, y, w in zip(self.outputs, got, want)]
        rows = [r for r in rows if r is not None]
        self.degrade = {"calibrated": True, "outputs": rows, **worst(rows)}
        return self.degrade

    def provenance(self, fallback: bool = False) -> list[dict[str, Any]]:
        """Per node of the region, its time in the last call (µs): OpenVINO's profiling info,
        or the host kernels' after a fallback; layers no node owns (layout reorders OpenVINO
        inserted) are listed under the region's name."""
        types = {n.name: n.op_type for n in self.nodes}
        if fallback or self.last is None:
            return [{"node": n.name, "op_type": n.op_type, "device": "cpu",
                     "exec_us": self.cpu_times.get(n.name, 0.0)} for n in self.nodes]
        req, entry, _ = self.last
        per = dict.fromkeys(types, 0.0)
        extra: dict[str, float] = {}
        for p in req.profiling_info:
            us = p.real_time.total_seconds() * 1e6
            nodes = entry.layers.get(p.node_name, ())
            if nodes:
                for n in nodes:
                    per[n] += us / len(nodes)
            elif us > 0:
                extra[p.node_type] = extra.get(p.node_type, 0.0) + us
        rows = [{"node": n, "op_type": types[n], "exec_us": t, "device": "openvino"}
                for n, t in per.items()]
        rows += [{"node": f"{self.name}/{k}", "op_type": f"OpenVINO.{k}", "exec_us": t,
                  "device": "openvino"} for k, t in extra.items()]
        return rows

    # -- the guard's fallback and diagnosis --------------------------------------------------
    def cpu(self, *args: Any) -> tuple[Any, ...]:
        """The region rerun node by node on the host's kernels (the CPU path)."""
        env: dict[str, Any] = {v.name: a for v, a in zip(self.feeds, args)}
        for v in self.inputs:
            if v.const is not None:
                env[v.name] = v.const
        times: dict[str, float] = {}
        for n, (fn, kw) in zip(self.nodes, self.host_kernels):
            ins = [env[v.name] if v is not None else None for v in n.inputs]
            t0 = time.perf_counter()
            res = fn(*ins, **kw)
            times[n.name] = (time.perf_counter() - t0) * 1e6
            res = res if type(res) is tuple else (res,)
            for v, r in zip(n.outputs, res):
                if v is not None:
                    env[v.name] = np.asarray(r) if isinstance(r, np.generic) else r
        self.cpu_times, self.cpu_env = times, env
        outs = tuple(env[v.name] for v in self.outputs)
        return outs[0] if len(outs) == 1 else outs

    def blame(self, kind: str, args: list[Any]) -> tuple[str, str, str] | None:
        """(node, op_type, what went bad) for the first node of the region whose output went
        bad in OpenVINO's run (for NaN/Inf: the first producing them from finite inputs;
        otherwise the first disagreeing with the CPU rerun), or None when none can be named."""
        inner = [v for n in self.nodes for v in n.outputs if v is not None]
        try:
            entry = self.compiled_for(tuple(np.shape(a) for a in args), outputs=inner)
            got = dict(zip((v.name for v in inner), self._infer(entry, tuple(args))))
        except Exception:  # noqa: BLE001 - no diagnosis model: the region stays the culprit
            return None
        got.update({v.name: a for v, a in zip(self.feeds, args)})
        for v in self.inputs:
            if v.const is not None:
                got[v.name] = v.const
        for n in self.nodes:
            ins = [got.get(v.name) for v in n.inputs if v is not None]
            outs = [got.get(v.name) for v in n.outputs if v is not None]
            why = _bad(kind, ins, outs, [self.cpu_env.get(v.name) for v in n.outputs
                                         if v is not None])
            if why:
                return n.name, n.op_type, f"{why} (node {n.name!r} in OpenVINO region " \
                                          f"{self.name} of {len(self.nodes)} nodes)"
        return None


def error_row(name: str, got: Any, want: Any) -> dict[str, Any] | None:
    """Max abs and relative error of `got` against `want` (a float tensor; else None), and how
    many times the zoo tolerance (1e-3 of the largest magnitude, + 1e-5) that is."""
    w = np.asarray(want)
    if w.dtype.kind != "f" or not w.size:
        return None
    d = np.abs(np.asarray(got, np.float64) - w.astype(np.float64))
    scale = float(np.abs(w).max())
    err = float(np.nanmax(d)) if np.isfinite(d).any() else float("inf")
    return {"output": name, "max_abs_error": err,
            "max_rel_error": err / scale if scale else err,
            "x_zoo_tolerance": err / (1e-3 * scale + 1e-5)}


def worst(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The largest errors over `rows` (error_row's)."""
    if not rows:
        return {}
    return {k: max(r[k] for r in rows)
            for k in ("max_abs_error", "max_rel_error", "x_zoo_tolerance")}


def _finite(x: Any) -> bool:
    return not (isinstance(x, np.ndarray) and x.dtype.kind in "fc") or bool(np.isfinite(x).all())


def _bad(kind: str, ins: list[Any], outs: list[Any], want: list[Any]) -> str:
    if kind in ("nan", "inf"):
        if all(_finite(x) for x in ins) and not all(_finite(y) for y in outs):
            n = sum(int(np.isnan(y).sum()) for y in outs if isinstance(y, np.ndarray)
                    and y.dtype.kind == "f")
            return f"OpenVINO computed {n} NaN (and Inf) from finite inputs"
        return ""
    for y, w in zip(outs, want):
        if not isinstance(y, np.ndarray) or not isinstance(w, np.ndarray):
            continue
        if y.shape != w.shape or y.dtype != w.dtype:
            return (f"OpenVINO output {y.dtype}{list(y.shape)}, the CPU path "
                    f"{w.dtype}{list(w.shape)}")
        if y.dtype.kind == "f" and not np.allclose(y, w, rtol=1e-3, atol=1e-4, equal_nan=True):
            err = float(np.nanmax(np.abs(y - w)))
            return f"OpenVINO output differs from the CPU path by {err:.3g}"
    return ""
