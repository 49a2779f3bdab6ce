"""Structure-aware fuzzing of the whole session (load -> run), crash- and hang-proof.

Examples are seed models whose graph STRUCTURE is edited through protobuf (ops swapped,
inputs rewired, nodes dropped or duplicated, attributes retyped, element types, shapes and
opsets changed, initializers corrupted, subgraphs nested, functions broken) plus mutated feeds.
Every example is a pure function of ``(seed, index)`` and the corpus, so any result can be
rebuilt with :func:`make_example`.

The oracle: ``InferenceSession(model_bytes)`` and ``run`` either succeed or raise an
``OpwardenError`` subclass. Anything else escapes: another exception type, malformed outputs, a
crash of the interpreter or a hang. :func:`campaign` runs the examples in a worker subprocess
(``python -m opwarden.verify.fuzz --worker``) that reports each example before it starts over a
pipe; the parent kills a worker that overruns the per-example timeout, records the example as
hung (with the worker's stack from faulthandler) or crashed, and starts a new worker on the
next example. The worker runs under ``RLIMIT_AS`` and a session memory limit, so a memory bomb
becomes a failure, not a dead machine.

The pieces: fuzz_corpus.py (seed models), fuzz_scope.py, fuzz_mutate.py and fuzz_values.py
(the mutations, ``make_example``), fuzz_worker.py (the oracle and the worker loop); this module
is the driver: the watched worker subprocesses (``campaign``), results, ``matches`` against
known-open lists, and the command line.

Reproduce one example: ``python -m opwarden.verify.fuzz --seed S --index K [--save m.onnx]``.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import re
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from opwarden.verify.fuzz_corpus import Example, Seed, build_corpus, load_extra_seed
from opwarden.verify.fuzz_mutate import MUTATORS, WEIGHTS, make_example
from opwarden.verify.fuzz_values import mutate_feeds
from opwarden.verify.fuzz_worker import (
    ITERATING_OPS,
    RUN_TIMEOUT_MS,
    _iterates,  # noqa: F401 - tests call it as fuzz._iterates
    check_example,
    rel_path,
    worker,
)

__all__ = [
    "ITERATING_OPS", "MUTATORS", "RUN_TIMEOUT_MS", "WEIGHTS", "Example", "Report", "Result",
    "Seed", "build_corpus", "campaign", "check_example", "load_extra_seed", "main",
    "make_example", "matches", "mutate_feeds", "reproduce",
]  # fmt: skip


# --------------------------------------------------------------------------------------------
# the parent: a watched worker subprocess


@dataclass
class Result:
    index: int
    status: str  # ok | refused | escape | mismatch | hang | crash | generator | peer
    seed_name: str = ""
    mutations: list[str] = field(default_factory=list)
    error: str = ""
    message: str = ""
    where: str = ""
    phase: str = ""
    detail: str = ""  # traceback or the worker's last stderr lines
    stack: list[str] = field(default_factory=list)  # opwarden frames of a hang or crash

    @property
    def signature(self) -> str:
        """What known-open lists match on: ``status:error@where``."""
        return f"{self.status}:{self.error}@{self.where}"

    @property
    def failed(self) -> bool:
        return self.status in ("escape", "mismatch", "hang", "crash")


@dataclass
class Report:
    seed: int
    results: list[Result]
    seconds: float
    extra_seeds: tuple[str, ...] = ()

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results:
            out[r.status] = out.get(r.status, 0) + 1
        return out

    @property
    def failures(self) -> list[Result]:
        return [r for r in self.results if r.failed]

    def format(self, results: Iterable[Result] | None = None, tracebacks: bool = False) -> str:
        lines = []
        extra = "".join(f" --extra-seed {s!r}" for s in self.extra_seeds)
        for r in self.failures if results is None else results:
            lines.append(
                f"[{self.seed}/{r.index}] {r.signature} on seed model {r.seed_name!r}"
                f" ({r.phase}): {r.message}"
            )
            for m in r.mutations:
                lines.append(f"    - {m}")
            lines.append(
                f"    reproduce: python -m opwarden.verify.fuzz --seed {self.seed} "
                f"--index {r.index}{extra}"
            )
            if tracebacks and r.detail:
                lines.append("    " + r.detail.strip().replace("\n", "\n    "))
        return "\n".join(lines)


_FRAME = re.compile(r'File "([^"]+)", line (\d+) in (\S+)')
_DUMP = re.compile(r"^(?:Timeout \(|Fatal Python error)", re.M)
_FUZZER = re.compile(r"verify[/\\]fuzz\w*\.py$")  # the fuzzer's own frames are not the finding


def _stack(text: str) -> tuple[str, list[str]]:
    """Innermost frame and opwarden frames (innermost first) of the last faulthandler dump."""
    starts = [m.start() for m in _DUMP.finditer(text)]
    block = text[starts[-1] :] if starts else text
    block = block.split("\n\n")[0] if "Thread" in block or "thread" in block else block
    frames = _FRAME.findall(block)
    ours = [
        f"{rel_path(p)}:{fn}"
        for p, _line, fn in frames
        if f"{os.sep}opwarden{os.sep}" in p and not _FUZZER.search(p)
    ]
    where = ours[0] if ours else (f"{rel_path(frames[0][0])}:{frames[0][2]}" if frames else "?")
    return where, ours


def campaign(
    seed: int = 0,
    count: int = 300,
    start: int = 0,
    *,
    timeout: float = 10.0,
    extra_seeds: Sequence[str] = (),
    node_suite: bool = True,
    memory_limit: int = 256 << 20,
    as_limit: int = 4 << 30,
    compare_ort: bool = False,
    inject: dict[int, str] | None = None,
    progress: Callable[[Result], None] | None = None,
    cwd: str | None = None,
) -> Report:
    """Examples ``start .. start+count`` of campaign ``seed``, in watched worker processes."""
    cfg = json.dumps({
        "extra_seeds": list(extra_seeds), "node_suite": node_suite, "memory_limit": memory_limit,
        "compare_ort": compare_ort, "inject": {str(k): v for k, v in (inject or {}).items()},
    })  # fmt: skip
    env = dict(os.environ)
    # one core: BLAS and OpenMP single-threaded, the worker niced below the parent
    env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (cwd or os.getcwd(), env.get("PYTHONPATH")) if p)
    results: list[Result] = []
    t0 = time.monotonic()
    k, stop = start, start + count
    while k < stop:
        k = _run_worker(seed, k, stop, timeout, cfg, as_limit, env, cwd, results, progress)
    return Report(seed, results, time.monotonic() - t0, tuple(extra_seeds))


def _run_worker(
    seed: int, k: int, stop: int, timeout: float, cfg: str, as_limit: int,
    env: dict[str, str], cwd: str | None, results: list[Result],
    progress: Callable[[Result], None] | None,
) -> int:  # fmt: skip
    """One worker from example k; returns the next example to start from."""
    rfd, wfd = os.pipe()
    err = tempfile.TemporaryFile()
    cmd = [sys.executable, "-m", "opwarden.verify.fuzz", "--worker", "--report-fd", str(wfd),
           "--seed", str(seed), "--start", str(k), "--stop", str(stop), "--timeout", str(timeout),
           "--as-limit", str(as_limit), "--config", cfg]  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, pass_fds=(wfd,),
        env=env, cwd=cwd,
    )
    os.close(wfd)
    reader = os.fdopen(rfd, "r")
    current: dict[str, Any] | None = None
    nxt: int | None = None  # the example after the last one done, once the worker is ready
    deadline = time.monotonic() + max(120.0, timeout)  # the corpus builds first
    buf = ""
    try:
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([reader], [], [], max(left, 0))
            if not ready:  # a hang: faulthandler wrote the stack to err
                proc.kill()
                proc.wait()
                if current is None and nxt is None:
                    raise RuntimeError("fuzz worker did not start: " + _tail(err))
                if current is None:  # building the example itself hung
                    current = {"start": nxt, "seed_name": "?", "mutations": ["(generator)"]}
                results.append(_lost(current, "hang", f"no answer within {timeout} s", err))
                _emit(results, progress)
                return current["start"] + 1
            chunk = os.read(reader.fileno(), 1 << 16).decode("utf-8", "replace")
            if not chunk:  # EOF: the worker died or finished
                rc = proc.wait()
                if current is None and (nxt is None or rc != 0):
                    if nxt is None:
                        raise RuntimeError(f"fuzz worker exited with {rc}: " + _tail(err))
                    current = {"start": nxt, "seed_name": "?", "mutations": ["(generator)"]}
                if current is None:
                    return stop
                results.append(_lost(current, "crash", f"worker died with exit status {rc}", err))
                _emit(results, progress)
                return current["start"] + 1
            buf += chunk
            *lines, buf = buf.split("\n")
            for line in lines:
                msg = json.loads(line)
                if "ready" in msg:
                    nxt = k
                    deadline = time.monotonic() + timeout
                elif "entering" in msg and current is not None:
                    current["phase"] = msg["entering"]
                elif "start" in msg:
                    current = msg
                    deadline = time.monotonic() + timeout
                elif "done" in msg:
                    results.append(_finished(current or {}, msg))
                    _emit(results, progress)
                    current = None
                    nxt = msg["done"] + 1
                    deadline = time.monotonic() + timeout
                    if msg["done"] + 1 >= stop:
                        proc.wait()
                        return stop
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.close()
        err.close()


def _emit(results: list[Result], progress: Callable[[Result], None] | None) -> None:
    if progress is not None:
        progress(results[-1])


def _tail(err: Any, n: int = 4000) -> str:
    err.flush()
    err.seek(0)
    return err.read().decode("utf-8", "replace")[-n:]


def _lost(current: dict[str, Any], status: str, message: str, err: Any) -> Result:
    text = _tail(err)
    where, stack = _stack(text)
    phase = current.get("phase", "ours")
    if phase == "ort":  # ONNX Runtime's crash or hang, not ours
        message = f"ONNX Runtime {status}: {message}"
        status = "peer"
    return Result(
        current["start"], status, current.get("seed_name", ""), current.get("mutations", []),
        error="Hang" if status == "hang" else "Crash", message=message,
        where=where, phase=phase, detail=text, stack=stack,
    )  # fmt: skip


def _finished(current: dict[str, Any], msg: dict[str, Any]) -> Result:
    return Result(
        msg["done"], msg["status"], current.get("seed_name", ""), current.get("mutations", []),
        error=msg.get("error", ""), message=msg.get("message", ""), where=msg.get("where", ""),
        phase=msg.get("phase", ""), detail=msg.get("traceback", ""),
    )  # fmt: skip


def matches(result: Result, patterns: Iterable[str]) -> bool:
    """Whether a result matches one of the fnmatch patterns: ``SIGNATURE`` or
    ``SIGNATURE via FRAME`` (FRAME: one of the opwarden frames of a hang's or crash's stack)."""
    for p in patterns:
        sig, _, via = p.partition(" via ")
        if not fnmatch.fnmatchcase(result.signature, sig):
            continue
        if not via or any(fnmatch.fnmatchcase(f, via) for f in result.stack):
            return True
    return False


def reproduce(
    seed: int, index: int, extra_seeds: Sequence[str] = (), node_suite: bool = True
) -> Example:
    """Rebuild one example in this process (the same bytes and feeds the worker ran)."""
    return make_example(build_corpus(extra_seeds, node_suite), seed, index)


# --------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m opwarden.verify.fuzz", description=__doc__)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--index", type=int, help="reproduce one example in this process")
    p.add_argument("--count", type=int, default=0, help="run a campaign of this many examples")
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--stop", type=int, default=0)
    p.add_argument("--timeout", type=float, default=10.0)
    p.add_argument("--extra-seed", action="append", default=[], dest="extra_seeds")
    p.add_argument("--no-node-suite", action="store_true")
    p.add_argument("--compare-ort", action="store_true")
    p.add_argument("--save", help="write the reproduced model here")
    p.add_argument("--json", help="write the campaign's failures as JSON lines here")
    p.add_argument("--all", action="store_true", help="--json gets every result, not only failures")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--report-fd", type=int, help=argparse.SUPPRESS)
    p.add_argument("--as-limit", type=int, default=4 << 30, help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.index is not None:
        ex = reproduce(args.seed, args.index, args.extra_seeds, not args.no_node_suite)
        print(f"seed model {ex.seed_name!r}")
        for m in ex.mutations:
            print(f"  - {m}")
        print("feeds:", {k: _feed_str(v) for k, v in ex.feeds.items()})
        if args.save:
            with open(args.save, "wb") as f:
                f.write(ex.model)
        print(json.dumps(check_example(ex, 256 << 20, args.compare_ort), indent=1, default=str))
        return 0
    count = args.count or 300

    def show(r: Result) -> None:
        if r.failed:
            print(f"[{args.seed}/{r.index}] {r.signature}: {r.message[:160]}", flush=True)

    rep = campaign(
        args.seed, count, args.start, timeout=args.timeout, extra_seeds=args.extra_seeds,
        node_suite=not args.no_node_suite, compare_ort=args.compare_ort, progress=show,
    )  # fmt: skip
    print(f"{len(rep.results)} examples in {rep.seconds:.1f} s: {rep.counts()}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            for r in rep.results if args.all else rep.failures:
                f.write(json.dumps(dataclasses.asdict(r) | {"signature": r.signature}) + "\n")
    return 1 if rep.failures else 0


def _feed_str(v: Any) -> str:
    if isinstance(v, np.ndarray):
        return f"array{list(v.shape)} {v.dtype}"
    return repr(v)[:60]


if __name__ == "__main__":
    sys.exit(main())
