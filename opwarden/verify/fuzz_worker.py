"""The fuzzer's oracle and the worker process that applies it.

``check_example`` loads and runs one example in this process: it must succeed or raise an
OpwardenError (else it escapes; with ``compare_ort`` a difference from ONNX Runtime is a
mismatch). ``worker`` (``python -m opwarden.verify.fuzz --worker``) builds the corpus and runs
a range of examples under RLIMIT_AS, announcing each on the report pipe before it starts, so
the parent (fuzz.campaign) knows which example a crash or a hang belongs to; faulthandler
writes the stack of a hang before the parent kills it.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from opwarden.verify.fuzz_corpus import Example, build_corpus
from opwarden.verify.fuzz_mutate import make_example


def _well_formed(out: Any) -> bool:
    if out is None or isinstance(out, (np.ndarray, np.generic)):
        return True
    if isinstance(out, list):
        return all(_well_formed(o) for o in out)
    if isinstance(out, dict):
        return all(_well_formed(o) for o in out.values())
    return False


def _innermost(tb: Any) -> str:
    """file:function of the innermost frame inside opwarden, else the innermost frame."""
    frames = traceback.extract_tb(tb)
    ours = [f for f in frames if f"{os.sep}opwarden{os.sep}" in f.filename]
    f = (ours or frames or [None])[-1]
    if f is None:
        return "?"
    return f"{rel_path(f.filename)}:{f.name}"


def rel_path(path: str) -> str:
    k = path.rfind(f"{os.sep}opwarden{os.sep}")
    return path[k + 1 :] if k >= 0 else os.path.basename(path)


# Operators whose iterations the model or the feeds set (a trip count of 2**63-1, a condition
# that stays true, a scan over a 2**20-row broadcast feed): such a run may legitimately go on
# far past the per-example timeout, so their sessions get a run deadline, the documented
# defence (SessionOptions.run_timeout_ms), and passing it is a refusal. Other
# examples run without one: a deadline takes the guarded path, and the lean path must be
# fuzzed too.
ITERATING_OPS = frozenset({"Loop", "Scan", "SequenceMap"})
RUN_TIMEOUT_MS = 2000.0


def _iterates(model: bytes) -> bool:
    """Whether the model (any graph, subgraph or function body) holds an iterating operator."""
    import onnx

    m = onnx.ModelProto()
    try:
        m.ParseFromString(model)
    except Exception:  # noqa: BLE001 - a model that does not parse is refused at load
        return False
    stack = [m.graph, *m.functions]
    while stack:
        g = stack.pop()
        for n in g.node:
            if n.op_type in ITERATING_OPS:
                return True
            for a in n.attribute:
                if a.HasField("g"):
                    stack.append(a.g)
                stack.extend(a.graphs)
    return False


def check_example(
    ex: Example,
    memory_limit: int,
    compare_ort: bool = False,
    on_phase: Callable[[str], None] | None = None,
    run_timeout_ms: float | None = RUN_TIMEOUT_MS,
) -> dict[str, Any]:
    """Run one example in this process; a dict with status ok/refused/escape/mismatch.
    Models with iterating operators run under `run_timeout_ms` (see ITERATING_OPS)."""
    import opwarden as ow

    res: dict[str, Any] = {"status": "ok"}
    outs = None
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            opts = ow.SessionOptions(memory_limit_bytes=memory_limit, intra_op_num_threads=1)
            if run_timeout_ms is not None and _iterates(ex.model):
                opts.run_timeout_ms = run_timeout_ms
            res["phase"] = "load"
            sess = ow.InferenceSession(ex.model, opts)
            res["phase"] = "run"
            outs = sess.run(None, ex.feeds)
        if not isinstance(outs, list) or not all(_well_formed(o) for o in outs):
            kinds = sorted({type(o).__name__ for o in (outs if isinstance(outs, list) else [outs])})
            res.update(status="escape", error="BadOutput", where="session.run",
                       message=f"run returned non-array outputs: {kinds}")  # fmt: skip
    except KeyboardInterrupt:
        raise
    except ow.OpwardenError as e:
        res.update(status="refused", error=type(e).__name__, message=str(e)[:300])
    except BaseException as e:  # noqa: BLE001 - the oracle: anything else escapes
        res.update(
            status="escape",
            error=type(e).__name__,
            message=str(e)[:300],
            where=_innermost(e.__traceback__),
            traceback="".join(traceback.format_exception(type(e), e, e.__traceback__))[-3000:],
        )
    if res["status"] == "ok" and compare_ort and ex.deterministic:
        res["phase"] = "ort"
        if on_phase is not None:
            on_phase("ort")  # a crash or hang from here on is ONNX Runtime's
        diff = _compare_ort(ex, outs)
        if diff:
            res.update(status="mismatch", error="Mismatch", message=diff, where="ort")
    return res


def _compare_ort(ex: Example, ours: Any) -> str | None:
    """A description of the first difference from ONNX Runtime, where ORT also runs it."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    if not all(
        isinstance(v, np.ndarray) and v.dtype != object and v.dtype.isnative
        for v in ex.feeds.values()
    ):
        return None  # ORT reads non-native byte orders as native ones
    try:
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.log_severity_level = 4
        s = ort.InferenceSession(ex.model, so, providers=["CPUExecutionProvider"])
        theirs = s.run(None, ex.feeds)
    except Exception:  # noqa: BLE001 - where ORT refuses there is nothing to compare
        return None
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray):
            continue
        if a.shape != b.shape:
            return f"output {i}: shape {list(a.shape)} vs ORT {list(b.shape)}"
        if a.dtype != b.dtype:
            return f"output {i}: dtype {a.dtype} vs ORT {b.dtype}"
        if a.dtype.kind in "fc":
            close = np.isclose(a, b, rtol=1e-3, atol=1e-4, equal_nan=True)
            if not close.all():
                k = int(np.argmin(close.reshape(-1)))
                bad = int((~close).sum())
                return f"output {i}: {bad} values differ (e.g. {a.flat[k]} vs {b.flat[k]})"
        elif a.dtype.kind in "biu" and not np.array_equal(a, b):
            return f"output {i}: integer values differ"
    return None


def worker(args: Any) -> int:
    """Loop over examples, announcing each on the report pipe before it starts."""
    import faulthandler
    import resource

    if args.as_limit:
        resource.setrlimit(resource.RLIMIT_AS, (args.as_limit, args.as_limit))
    faulthandler.enable(file=sys.stderr)
    os.nice(5)  # the parent, and whatever else shares the machine, comes first
    pipe = os.fdopen(args.report_fd, "w", buffering=1)
    cfg = json.loads(args.config)
    corpus = build_corpus(cfg["extra_seeds"], cfg["node_suite"])
    pipe.write(json.dumps({"ready": len(corpus)}) + "\n")
    inject = {int(k): v for k, v in cfg.get("inject", {}).items()}
    for k in range(args.start, args.stop):
        # a stack for a hang, written before the parent's kill
        faulthandler.dump_traceback_later(max(args.timeout - 1.0, 0.5), exit=False)
        try:
            ex = make_example(corpus, args.seed, k)
        except Exception as e:  # noqa: BLE001 - a generator bug is reported, not fatal
            pipe.write(json.dumps({"start": k, "seed_name": "?", "mutations": []}) + "\n")
            pipe.write(json.dumps({"done": k, "status": "generator", "error": type(e).__name__,
                                   "message": str(e)[:300]}) + "\n")  # fmt: skip
            continue
        pipe.write(
            json.dumps({"start": k, "seed_name": ex.seed_name, "mutations": ex.mutations}) + "\n"
        )
        if inject.get(k) == "crash":
            os.abort()
        if inject.get(k) == "hang":
            time.sleep(3600)
        def phase(name: str, k: int = k) -> None:
            pipe.write(json.dumps({"entering": name, "index": k}) + "\n")

        res = check_example(ex, cfg["memory_limit"], cfg["compare_ort"], phase)
        faulthandler.cancel_dump_traceback_later()
        res["done"] = k
        pipe.write(json.dumps(res, default=str) + "\n")
    return 0

