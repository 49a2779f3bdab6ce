"""`opwarden run [MODEL] [--input NAME=FILE.npy] [--warmup W] [--runs N] [--providers a,b] ...`.

Loads the model (a path, a light-zoo name, or by default the embedded light ResNet-50), feeds
seeded random tensors for the inputs not given, runs it `--warmup` times untimed (the first run
packs weights and binds the plan, which a steady-state timing must not include), then `--runs`
timed runs, and prints the load time, the median run time with its IQR and minimum, and a
summary of each output (dtype, shape, first values, argmax and NaN count of float outputs).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np

from opwarden.cli.common import (
    add_model_arg,
    console,
    model_source,
    non_negative_int,
    positive_int,
    progress,
    providers_list,
)
from opwarden.cli.feeds import make_feeds, parse_dims


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add `run` to the opwarden subcommands."""
    r = sub.add_parser("run", help="run a model: load time, median run time, outputs",
                       description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arg(r)
    r.add_argument("--input", action="append", metavar="NAME=FILE.npy",
                   help="feed this input from a .npy file (repeatable; others are random)")
    r.add_argument("--dim", action="append", metavar="NAME=N",
                   help="size of a symbolic input dimension for random feeds (default 1)")
    r.add_argument("--warmup", type=non_negative_int, default=1,
                   help="untimed runs first (default 1: the cold first run is not timed)")
    r.add_argument("--runs", type=positive_int, default=10, help="timed runs (default 10)")
    r.add_argument("--providers", type=providers_list,
                   help="comma-separated devices in priority order, e.g. torch,cpu")
    r.add_argument("--seed", type=int, default=0, help="seed of the random feeds (default 0)")
    r.add_argument("--json", action="store_true", help="print the result as JSON")
    r.set_defaults(fn=cmd_run)
    return r


def timing(times: list[float]) -> dict[str, float]:
    """median, IQR (75th - 25th percentile), min and max of run times in seconds, as ms."""
    ms = np.asarray(times, dtype=np.float64) * 1e3
    q25, q50, q75 = np.percentile(ms, [25, 50, 75])
    return {"median_ms": round(float(q50), 3), "iqr_ms": round(float(q75 - q25), 3),
            "min_ms": round(float(ms.min()), 3), "max_ms": round(float(ms.max()), 3)}


def cmd_run(args: argparse.Namespace) -> int:
    """Run the model and print (or --json) its timing and outputs."""
    from opwarden.session import InferenceSession

    source, label = model_source(args.model)
    t0 = time.perf_counter()
    sess = InferenceSession(source, providers=args.providers)
    t_load = time.perf_counter() - t0
    feeds = make_feeds(sess, args.input, args.seed, dims=parse_dims(args.dim))
    times = []
    outs: list[Any] = []
    with progress("run", total=args.warmup + args.runs) as bar:
        for _ in range(args.warmup):
            outs = sess.run(None, feeds)
            bar.advance()
        for _ in range(args.runs):
            t0 = time.perf_counter()
            outs = sess.run(None, feeds)
            times.append(time.perf_counter() - t0)
            bar.advance()
    result = {
        "model": label,
        "providers": sess.get_providers(),
        "load_ms": round(t_load * 1e3, 3),
        "warmup": args.warmup,
        "runs": len(times),
        **timing(times),
        "times_ms": [round(t * 1e3, 4) for t in times],
        "outputs": [_summary(a.name, o) for a, o in zip(sess.get_outputs(), outs)],
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    _print(result)
    return 0


def _print(result: dict[str, Any]) -> None:
    from rich.markup import escape

    con = console()
    con.print(
        f"[bold]{escape(result['model'])}[/bold] on {','.join(result['providers'])}: loaded in "
        f"{result['load_ms']:.1f} ms; run median {result['median_ms']:.2f} ms "
        f"(IQR {result['iqr_ms']:.2f}, min {result['min_ms']:.2f}) over {result['runs']} "
        f"run(s) after {result['warmup']} warm-up"
    )
    for o in result["outputs"]:
        con.print(
            f"  {escape(o['name'])}: {o['dtype']}{o['shape']}  first values "
            f"{escape(str(o['values']))}"
            + (f"  argmax {o['argmax']}" if "argmax" in o else "")
            + (f"  [red]{o['nan_count']} NaN[/red]" if o.get("nan_count") else "")
        )


def _summary(name: str, x: Any) -> dict[str, Any]:
    if not isinstance(x, np.ndarray):
        return {"name": name, "dtype": type(x).__name__, "shape": [], "values": str(x)[:80]}
    flat = x.reshape(-1)
    out: dict[str, Any] = {
        "name": name,
        "dtype": str(x.dtype),
        "shape": list(x.shape),
        "values": [_plain(v) for v in flat[:5]],
    }
    if x.dtype.kind == "f" and flat.size:
        out["argmax"] = int(np.argmax(flat))
        out["nan_count"] = int(np.isnan(flat).sum())
    return out


def _plain(v: Any) -> Any:
    """A JSON-ready scalar (bytes decoded, NumPy scalars as Python ones)."""
    v = v.item() if hasattr(v, "item") else v
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return v if isinstance(v, (int, float, str, bool)) or v is None else str(v)
