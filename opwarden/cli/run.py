"""`opwarden run [MODEL] [--input NAME=FILE.npy] [--runs N] [--seed S] [--json]`.

Loads the model (default: the embedded light ResNet-50), feeds seeded random tensors for the
inputs not given, runs it and prints load time, the median run time and a summary of each
output (dtype, shape, first values, argmax and NaN count of float outputs).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np

from opwarden.cli.common import console, model_source
from opwarden.cli.feeds import parse_inputs, random_feeds


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add `run` to the opwarden subcommands."""
    r = sub.add_parser("run", help="run a model (default: embedded light ResNet-50)")
    r.add_argument("model", nargs="?", help="model path or light-zoo name (default ResNet-50)")
    r.add_argument("--input", action="append", metavar="NAME=FILE.npy")
    r.add_argument("--runs", type=int, default=1)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--json", action="store_true")
    r.set_defaults(fn=cmd_run)
    return r


def cmd_run(args: argparse.Namespace) -> int:
    from opwarden.session import InferenceSession

    source, label = model_source(args.model)
    t0 = time.perf_counter()
    sess = InferenceSession(source)
    t_load = time.perf_counter() - t0
    feeds = random_feeds(sess, args.seed)
    feeds.update(parse_inputs(args.input or []))
    times = []
    outs: list[Any] = []
    for _ in range(max(1, args.runs)):
        t0 = time.perf_counter()
        outs = sess.run(None, feeds)
        times.append(time.perf_counter() - t0)
    result = {
        "model": label,
        "load_ms": round(t_load * 1e3, 3),
        "run_ms_median": round(float(np.median(times)) * 1e3, 3),
        "runs": len(times),
        "outputs": [_summary(a.name, o) for a, o in zip(sess.get_outputs(), outs)],
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    con = console()
    con.print(
        f"[bold]{label}[/bold]: loaded in {result['load_ms']:.1f} ms, "
        f"run median {result['run_ms_median']:.1f} ms over {len(times)} run(s)"
    )
    for o in result["outputs"]:
        con.print(
            f"  {o['name']}: {o['dtype']}{o['shape']}  first values {o['values']}"
            + (f"  argmax {o['argmax']}" if "argmax" in o else "")
        )
    return 0


def _summary(name: str, x: Any) -> dict[str, Any]:
    if not isinstance(x, np.ndarray):
        return {"name": name, "dtype": type(x).__name__, "shape": [], "values": str(x)[:80]}
    flat = x.reshape(-1)
    out = {
        "name": name,
        "dtype": str(x.dtype),
        "shape": list(x.shape),
        "values": [v.item() if hasattr(v, "item") else v for v in flat[:5]],
    }
    if x.dtype.kind == "f" and flat.size:
        out["argmax"] = int(np.argmax(flat))
        out["nan_count"] = int(np.isnan(flat).sum())
    return out
