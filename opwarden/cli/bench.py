"""`opwarden bench`: our session against a peer runtime, runs alternated in one process.

Ours and the peer run in turn (ours, peer, ours, peer, ...) so that machine noise hits both alike;
the report gives medians, IQRs and the ratio ours/peer, then per op type the time (from separate
traced runs, so tracing never pollutes the timing), FLOPs, bytes moved and the share of the
roofline bound reached (compute peak and memory bandwidth measured once, cached on disk).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

from opwarden.cli.common import non_negative_int, positive_int, providers_list
from opwarden.errors import OptionsError

PEERS = ("onnxruntime", "reference")


# -- model and feeds --------------------------------------------------------------------------
def resolve_model(spec: str) -> tuple[bytes, str]:
    """(serialized model, label) for a path or a light-zoo name such as "resnet50"."""
    from opwarden.cli.common import model_bytes

    data, label, _ = model_bytes(spec)
    return data, label


def make_feeds(sess: Any, inputs: list[str] | None = None, seed: int = 0) -> dict[str, Any]:
    """Seeded random feeds for the session's inputs, overridden by NAME=FILE.npy items."""
    from opwarden.cli import feeds

    return feeds.make_feeds(sess, inputs, seed)


# -- runners ----------------------------------------------------------------------------------
def ours_session(data: bytes, threads: int, providers: list[str] | None = None, **opts: Any):
    """Our InferenceSession with `threads` intra-op threads and any other session options."""
    from opwarden.options import SessionOptions
    from opwarden.session import InferenceSession

    so = SessionOptions(intra_op_num_threads=threads, **opts)
    return InferenceSession(data, sess_options=so, providers=providers)


def require_peer(peer: str) -> None:
    """Raise OptionsError unless the named peer is known and importable."""
    if peer not in PEERS:
        raise OptionsError(f"--vs must be one of {', '.join(PEERS)}, got {peer!r}")
    if peer == "onnxruntime":
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            raise OptionsError(
                "--vs onnxruntime needs the onnxruntime package, which is not installed "
                "(pip install onnxruntime); run without --vs to benchmark opwarden alone"
            ) from None


def peer_runner(
    peer: str, data: bytes, threads: int, spinning: bool = False
) -> Callable[[dict[str, Any]], list[Any]]:
    """A callable feeds -> outputs for the named peer runtime (OptionsError if unavailable).
    `spinning`: leave onnxruntime's busy-waiting workers on (its default)."""
    require_peer(peer)
    if peer == "onnxruntime":
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        # Alternating in one process: ORT's worker threads must not keep spinning (busy-wait)
        # after its run, or they steal the cores our next run needs (and vice versa).
        if not spinning:
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        s = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
        return lambda feeds: s.run(None, feeds)
    import onnx
    from onnx.reference import ReferenceEvaluator

    ev = ReferenceEvaluator(onnx.load_from_string(data))
    return lambda feeds: list(ev.run(None, feeds))


def interleave(
    runners: dict[str, Callable[[], Any]], runs: int, warmup: int, bar: Any = None
) -> dict[str, list[float]]:
    """Seconds per run for each runner, runs alternated (a, b, a, b, ...) after warm-up;
    `bar` (common.progress) advances once per round."""
    for _ in range(warmup):
        for f in runners.values():
            f()
        if bar is not None:
            bar.advance()
    times: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(runs):
        for k, f in runners.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
        if bar is not None:
            bar.advance()
    return times


def summarize(times: list[float]) -> dict[str, Any]:
    """median/IQR/min/mean in ms of a list of seconds."""
    ms = np.asarray(times, dtype=np.float64) * 1e3
    q25, q50, q75 = np.percentile(ms, [25, 50, 75])
    return {
        "median_ms": round(float(q50), 4),
        "iqr_ms": round(float(q75 - q25), 4),
        "min_ms": round(float(ms.min()), 4),
        "mean_ms": round(float(ms.mean()), 4),
        "times_ms": [round(float(t), 4) for t in ms],
    }


def max_abs_diff(a: list[Any], b: list[Any]) -> float | None:
    """Largest |a - b| over the numeric outputs (None when nothing is comparable)."""
    worst = None
    for x, y in zip(a, b):
        if not (isinstance(x, np.ndarray) and isinstance(y, np.ndarray)):
            continue
        if x.shape != y.shape or x.dtype.kind not in "fiub" or x.size == 0:
            continue
        d = float(np.max(np.abs(x.astype(np.float64) - np.asarray(y, np.float64))))
        worst = d if worst is None or d > worst else worst
    return worst


# -- roofline ---------------------------------------------------------------------------------
def cache_dir() -> str:
    """~/.cache/opwarden (or $OPWARDEN_CACHE_DIR, or $XDG_CACHE_HOME/opwarden)."""
    if os.environ.get("OPWARDEN_CACHE_DIR"):
        return os.environ["OPWARDEN_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "opwarden")


def best_peaks(tries: int = 3) -> dict[str, float]:
    """The best of `tries` measurements by trace.report.machine_peaks (a busy machine reads low)."""
    from opwarden.trace import report

    best: dict[str, float] = {}
    for _ in range(tries):
        report._PEAKS.clear()  # machine_peaks memoizes; each try must measure afresh
        got = report.machine_peaks()
        best = {k: max(v, best.get(k, 0.0)) for k, v in got.items()}
    report._PEAKS.update(best)  # later roofline reports in this process see the best figures
    return best


def cached_peaks(refresh: bool = False) -> dict[str, Any]:
    """Machine compute peak (GFLOP/s) and memory bandwidth (GB/s), measured once per machine."""
    # The key changes when the machine or the BLAS behind NumPy could have changed, or the
    # measurement itself (v2: best single repetition of a 1024 sgemm, see machine_peaks).
    key = (f"{platform.node()}|{platform.machine()}|{os.cpu_count()}|numpy {np.__version__}"
           "|peaks v2")
    path = os.path.join(cache_dir(), "peaks.json")
    store: dict[str, Any] = {}
    try:
        with open(path, encoding="utf-8") as f:
            store = json.load(f)
    except (OSError, ValueError):
        store = {}
    hit = store.get(key) if isinstance(store, dict) else None
    if (
        not refresh
        and isinstance(hit, dict)
        and hit.get("gflops", 0) > 0
        and hit.get("gbps", 0) > 0
    ):
        return {"gflops": float(hit["gflops"]), "gbps": float(hit["gbps"]), "cached": path}
    peaks = best_peaks()
    store = store if isinstance(store, dict) else {}
    store[key] = {**peaks, "measured": time.strftime("%Y-%m-%d %H:%M:%S")}
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(store, f, indent=1)
    except OSError:
        pass  # a read-only home only costs a re-measurement next time
    return {"gflops": peaks["gflops"], "gbps": peaks["gbps"], "cached": None}


def flops_bytes(rec: Any) -> tuple[float, float]:
    """(FLOPs, bytes moved) of one op record: its operator's declared cost rule (OpDef.flops;
    a fused operator's is its base operator's), read by trace.report.estimate."""
    from opwarden.trace.report import estimate

    return estimate(rec)


def fault_summary(sess: Any) -> list[dict[str, Any]]:
    """The session's faults, one entry per (node, variant, check) with a count."""
    seen: dict[tuple, dict[str, Any]] = {}
    for f in sess.faults:
        key = (f.node, f.variant, f.check)
        if key not in seen:
            seen[key] = {"node": f.node, "op_type": f.op_type, "variant": f.variant,
                         "check": f.check, "detail": f.detail, "action": f.action, "count": 0}
        seen[key]["count"] += 1
    return list(seen.values())


def fault_line(f: dict[str, Any]) -> str:
    """One fault_summary entry as one line of text."""
    return (f"x{f['count']}: node {f['node']} ({f['op_type']}, {f['variant']}) {f['check']}: "
            f"{f['detail']} -> {f['action']}")


def _sig(x: float, digits: int = 6) -> float:
    return float(f"{x:.{digits}g}")


def op_table(records: list[Any], nruns: int, peaks: dict[str, Any]) -> list[dict[str, Any]]:
    """Per op type, per run: count, time, FLOPs, bytes, achieved rates, roofline bound and share."""
    groups: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in records:
        fl, by = flops_bytes(r)
        g = groups[r.op_type]
        g["count"] += 1
        g["us"] += r.exec_us
        g["flops"] += fl
        g["bytes"] += by
        g["compute_us"] += fl / (peaks["gflops"] * 1e3)
        g["memory_us"] += by / (peaks["gbps"] * 1e3)
        g["bound_us"] += max(fl / (peaks["gflops"] * 1e3), by / (peaks["gbps"] * 1e3))
    n = max(nruns, 1)
    total = sum(g["us"] for g in groups.values()) or 1.0
    rows = []
    for op, g in groups.items():
        t_us = g["us"] / n
        rows.append(
            {
                "op_type": op,
                "count": int(round(g["count"] / n)),
                "time_ms": _sig(t_us / 1e3),
                "share": round(g["us"] / total, 4),
                "flops": g["flops"] / n,
                "bytes": g["bytes"] / n,
                "gflop": _sig(g["flops"] / n / 1e9),
                "mbytes": _sig(g["bytes"] / n / 1e6),
                "gflops_per_s": round(g["flops"] / g["us"] / 1e3, 3) if g["us"] else 0.0,
                "gbytes_per_s": round(g["bytes"] / g["us"] / 1e3, 3) if g["us"] else 0.0,
                "roofline_ms": _sig(g["bound_us"] / n / 1e3),
                "roofline_share": round(g["bound_us"] / g["us"], 4) if g["us"] else 0.0,
                "bound": "view" if not g["flops"] and not g["bytes"]
                else "compute" if g["compute_us"] >= g["memory_us"] else "memory",
            }
        )
    return sorted(rows, key=lambda r: -r["time_ms"])


# -- the benchmark ----------------------------------------------------------------------------
def benchmark(
    model: str,
    *,
    vs: str | None = None,
    runs: int = 20,
    warmup: int = 3,
    threads: int = 2,
    providers: list[str] | None = None,
    trace_runs: int = 3,
    inputs: list[str] | None = None,
    session_options: dict[str, Any] | None = None,
    refresh_peaks: bool = False,
) -> dict[str, Any]:
    """Run the whole benchmark and return the result dict (the `--json` output)."""
    if runs < 1 or warmup < 0 or threads < 1 or trace_runs < 0:
        raise OptionsError(
            f"bench needs runs >= 1, warmup >= 0, threads >= 1, trace runs >= 0; got "
            f"runs={runs}, warmup={warmup}, threads={threads}, trace_runs={trace_runs}"
        )
    if vs:
        require_peer(vs)
    data, label = resolve_model(model)
    opts = dict(session_options or {})
    opts.setdefault("trace", False)
    from opwarden.cli.common import progress

    with progress("bench: loading", total=warmup + runs + (trace_runs + 1 if trace_runs else 0)
                  ) as bar:
        sess = ours_session(data, threads, providers, **opts)
        # Resolve the peer before timing anything: a missing peer must fail fast.
        peer = peer_runner(vs, data, threads) if vs else None
        feeds = make_feeds(sess, inputs)
        runners: dict[str, Callable[[], Any]] = {"ours": lambda: sess.run(None, feeds)}
        if peer is not None:
            runners["peer"] = lambda: peer(feeds)
        bar.describe("bench: timed runs" + (f" (alternated with {vs})" if vs else ""))
        times = interleave(runners, runs, warmup, bar)
        bar.describe("bench: traced runs")
        records = _traced(data, threads, providers, opts, feeds, trace_runs, bar)
    result: dict[str, Any] = {
        "model": label,
        "runs": runs,
        "warmup": warmup,
        "threads": threads,
        "providers": sess.get_providers(),
        "session_options": {k: v for k, v in opts.items() if k != "trace"},
        "ours": summarize(times["ours"]),
        "peer": None,
        "ratio": None,
    }
    if peer is not None:
        result["peer"] = {"name": vs, **summarize(times["peer"])}
        result["ratio"] = round(result["ours"]["median_ms"] / result["peer"]["median_ms"], 4)
        result["max_abs_diff"] = max_abs_diff(sess.run(None, feeds), peer(feeds))
    # A timing of a session whose guard reran nodes on the reference kernel is not the fast
    # path's: every fault (fallback) during the timed runs is reported with its reason.
    result["faults"] = fault_summary(sess)
    result["op_types"] = []
    if trace_runs:
        peaks = cached_peaks(refresh_peaks)
        result["peaks"] = {"gflops": round(peaks["gflops"], 2), "gbps": round(peaks["gbps"], 2)}
        result["trace_runs"] = trace_runs
        result["op_types"] = op_table(records, trace_runs, peaks)
    return result


def _traced(data: bytes, threads: int, providers: list[str] | None, opts: dict[str, Any],
            feeds: dict[str, Any], trace_runs: int, bar: Any) -> list[Any]:
    """Records of `trace_runs` traced runs of a separate session, after one unrecorded run
    (tracing never pollutes the timed session)."""
    if not trace_runs:
        return []
    traced = ours_session(data, threads, providers, **{**opts, "trace": True})
    traced.run(None, feeds)  # warm-up, not recorded
    bar.advance()
    records: list[Any] = []
    for _ in range(trace_runs):
        traced.run(None, feeds)
        records.extend(traced.trace)
        bar.advance()
    return records


# -- command line -----------------------------------------------------------------------------
def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add `bench` to the opwarden subcommands."""
    b = sub.add_parser(
        "bench",
        help="time a model against a peer (alternated runs): medians, ratio, roofline per op",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    b.add_argument("model", help="an .onnx path or a light-zoo name (resnet50, vgg19, ...)")
    b.add_argument("--vs", choices=PEERS, help="peer runtime to alternate with")
    b.add_argument("--runs", type=positive_int, default=20,
                   help="timed runs of each (default 20)")
    b.add_argument("--warmup", type=non_negative_int, default=3,
                   help="untimed runs of each first (default 3)")
    b.add_argument("--threads", type=positive_int, default=2,
                   help="intra-op threads each (default 2)")
    b.add_argument("--providers", type=providers_list,
                   help="comma-separated opwarden providers, e.g. torch,cpu")
    b.add_argument("--trace-runs", type=non_negative_int, default=3,
                   help="traced runs for the op table (default 3; 0: none)")
    b.add_argument("--checks", help="session checks (comma-separated, or 'none'); default: ours")
    b.add_argument("--optimization-level", type=int, choices=range(4), metavar="{0..3}",
                   help="opwarden's graph optimization level (default 3: every pass)")
    b.add_argument("--input", action="append", metavar="NAME=FILE.npy",
                   help="feed this input from a .npy file (repeatable; others are random)")
    b.add_argument("--refresh-peaks", action="store_true", help="re-measure the machine peaks")
    b.add_argument("--json", action="store_true", help="print the result as JSON")
    b.set_defaults(fn=cmd_bench)
    return b


def _options_from_args(args: argparse.Namespace) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if args.checks is not None:
        opts["checks"] = () if args.checks in ("", "none") else tuple(args.checks.split(","))
    if args.optimization_level is not None:
        opts["optimization_level"] = args.optimization_level
    return opts


def cmd_bench(args: argparse.Namespace) -> int:
    """`opwarden bench`: run the benchmark, print a rich report or JSON; returns the exit code."""
    result = benchmark(
        args.model,
        vs=args.vs,
        runs=args.runs,
        warmup=args.warmup,
        threads=args.threads,
        providers=args.providers,
        trace_runs=args.trace_runs,
        inputs=args.input,
        session_options=_options_from_args(args),
        refresh_peaks=args.refresh_peaks,
    )
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print_report(result)
    return 0


def print_report(result: dict[str, Any]) -> None:
    """The human report: timing summary and the per-op-type roofline table."""
    from rich.table import Table
    from rich.text import Text

    from opwarden.cli.common import console

    con = console()
    o, p = result["ours"], result["peer"]
    if p is not None:
        how = f"alternated runs after {result['warmup']} warm-up, {result['threads']} threads each"
    else:
        how = (f"runs after {result['warmup']} warm-up, {result['threads']} threads "
               "(no peer: add --vs onnxruntime)")
    t = Table(title=f"{result['model']}: {result['runs']} {how}")
    cols = ("runtime", "median ms", "IQR ms", "min ms") + (("ratio ours/peer",) if p else ())
    for col in cols:
        t.add_column(col, justify="left" if col == "runtime" else "right")
    t.add_row(
        f"opwarden ({','.join(result['providers'])})",
        f"{o['median_ms']:.2f}",
        f"{o['iqr_ms']:.2f}",
        f"{o['min_ms']:.2f}",
        *(("",) if p is not None else ()),
    )
    if p is not None:
        t.add_row(
            p["name"],
            f"{p['median_ms']:.2f}",
            f"{p['iqr_ms']:.2f}",
            f"{p['min_ms']:.2f}",
            f"[bold]{result['ratio']:.2f}x[/bold]",
        )
    con.print(t)
    if p is not None and result.get("max_abs_diff") is not None:
        con.print(f"outputs: max |ours - {p['name']}| = {result['max_abs_diff']:.3g}")
    for f in result.get("faults", []):
        con.print(Text.assemble(("fault", "bold red"),
                                f" {fault_line(f)}; the times above include those reruns"))
    if not result["op_types"]:
        return
    pk = result["peaks"]
    ot = Table(
        title=f"per op type, mean of {result['trace_runs']} traced run(s); roofline from "
        f"{pk['gflops']:.0f} GFLOP/s, {pk['gbps']:.1f} GB/s"
    )
    cols = (
        "op type",
        "count",
        "ms",
        "share",
        "GFLOP",
        "MB",
        "GFLOP/s",
        "GB/s",
        "roofline ms",
        "of roofline",
        "bound",
    )
    for col in cols:
        ot.add_column(col, justify="left" if col in ("op type", "bound") else "right")
    for r in result["op_types"]:
        ot.add_row(
            r["op_type"],
            str(r["count"]),
            f"{r['time_ms']:.3f}",
            f"{100 * r['share']:.1f}%",
            f"{r['gflop']:.3f}",
            f"{r['mbytes']:.2f}",
            f"{r['gflops_per_s']:.1f}",
            f"{r['gbytes_per_s']:.1f}",
            f"{r['roofline_ms']:.3f}",
            "-" if r["bound"] == "view" else f"{100 * r['roofline_share']:.1f}%",
            r["bound"],
        )
    con.print(ot)


def main(argv: list[str] | None = None) -> int:
    """`python -m opwarden.cli.bench ...`: the same as `opwarden bench ...`."""
    import sys

    from opwarden.cli.exits import Parser, run_cli

    def build() -> argparse.ArgumentParser:
        p = Parser(prog="opwarden")
        add_parser(p.add_subparsers(dest="cmd", required=True))
        return p

    return run_cli(build, ["bench", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
