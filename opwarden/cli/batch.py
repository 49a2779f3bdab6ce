"""`opwarden batch MODEL INPUTS --output DIR [--batch-size B] [--workers N] [--ray [ADDRESS]]`.

Runs every input of INPUTS (a folder of .npy/.npz files or a Parquet file, `batch.files`)
and writes each output under DIR with its input's name, showing a progress bar with items per
second on stderr. Without --ray the batches run in this process on N threads, one session
each; --ray starts a local Ray cluster (or joins the one at ADDRESS) and runs them on N actors.
At the end it prints the fleet's merged health report. A bad input file is named and skipped.

Exit status: 0 every input done; 1 some inputs failed; 2 usage; 3 the model, INPUTS or DIR
cannot be used.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from opwarden.cli.common import EXIT_OK, EXIT_VERDICT, console, model_source, positive_int


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add `batch` to the opwarden subcommands."""
    b = sub.add_parser("batch", help="run a model on a folder of .npy/.npz files or a Parquet "
                                     "file, in-process or on Ray")
    b.add_argument("model", help="model path or light-zoo name")
    b.add_argument("inputs", help="folder of .npy/.npz files, or a .parquet file")
    b.add_argument("--output", "-o", required=True, metavar="DIR", help="output folder")
    b.add_argument("--batch-size", type=positive_int, default=8, metavar="B",
                   help="inputs per batch (default 8)")
    b.add_argument("--workers", type=positive_int, default=None, metavar="N",
                   help="sessions (threads, or Ray actors); default: CPUs, at most 4 "
                        "in-process")
    b.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="run on Ray: a local cluster, or join the one at ADDRESS")
    b.add_argument("--setup", metavar="MODULE[:FUNCTION]",
                   help="run in each worker before its session is made (custom kernels)")
    b.add_argument("--json", action="store_true", help="print the report as JSON")
    b.set_defaults(fn=cmd_batch)
    return b


def cmd_batch(args: argparse.Namespace) -> int:
    """Run the job; the exit status (errors go up to run_cli: the model, INPUTS or DIR wrong is
    3, a bad option 2)."""
    result, health = _run(args)
    _report(args, result, health)
    return EXIT_VERDICT if result.failed else EXIT_OK


def _run(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    from opwarden.batch import files
    from opwarden.batch.fleet import HealthBoard, run_setup
    from opwarden.batch.runner import local_workers, run_items
    from opwarden.errors import ModelError
    from opwarden.session import InferenceSession

    source, _ = model_source(args.model)
    if isinstance(source, str) and not os.path.exists(source):
        raise ModelError(f"model {source!r} does not exist (a path or a light-zoo name)")
    run_setup(args.setup)  # the driver reads the model too: its custom ops must be known
    probe = InferenceSession(source)
    in_names = [a.name for a in probe.get_inputs()]
    out_names = [a.name for a in probe.get_outputs()]
    inputs = files.discover(args.inputs, in_names)
    kw = {"setup": args.setup}
    with _Progress(len(inputs.items)) as bar:
        if args.ray is None:
            n = args.workers or min(4, os.cpu_count() or 1)
            board = HealthBoard()
            workers = local_workers(source, n, board, **kw)
            execs = [w.run_items for w in workers]
            result = run_items(inputs, args.output, execs, input_names=in_names,
                               output_names=out_names, batch_size=args.batch_size,
                               progress=bar.update)
            return result, board.health()
        from opwarden.ray.jobs import RayJob

        job = RayJob(args.ray or None)
        try:
            n = args.workers or job.cluster_cpus()
            execs = job.executors(source, n, 1, **kw)
            result = run_items(inputs, args.output, execs, input_names=in_names,
                               output_names=out_names, batch_size=args.batch_size,
                               threads=2 * n, progress=bar.update)
            return result, job.health()
        finally:
            job.close()


class _Progress:
    """A rich progress bar on stderr: done/total, failed, items per second."""

    def __init__(self, total: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self.shown = sys.stderr.isatty()  # never in pipes, logs or captured output
        self.progress = Progress(TextColumn("batch"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[rate]} items/s"),
                                 TextColumn("{task.fields[bad]}"),
                                 console=Console(stderr=True), transient=False)
        self.task = self.progress.add_task("batch", total=total, rate="-", bad="")

    def __enter__(self) -> _Progress:
        if self.shown:
            self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.shown:
            self.progress.stop()

    def update(self, done: int, failed: int) -> None:
        if not self.shown:
            return
        t = self.progress.tasks[0]
        rate = done / t.elapsed if t.elapsed else 0.0
        self.progress.update(self.task, completed=done + failed, rate=f"{rate:.1f}",
                             bad=f"{failed} failed" if failed else "")


def _report(args: argparse.Namespace, result: Any, health: dict[str, Any]) -> None:
    from rich.markup import escape

    rate = result.done / result.seconds if result.seconds else 0.0
    if args.json:
        print(json.dumps({"done": result.done, "total": result.total,
                          "failed": [{"input": n, "error": e} for n, e in result.failed],
                          "ignored": result.ignored, "seconds": round(result.seconds, 3),
                          "items_per_s": round(rate, 2), "health": health}, default=str))
        return
    con = console()
    con.print(f"[bold]{result.done}/{result.total}[/bold] inputs done in "
              f"{result.seconds:.2f} s ({rate:.1f} items/s); outputs in {args.output}")
    for name, why in result.failed:
        con.print(f"  [red]failed[/red] {escape(name)}: {escape(why)}", highlight=False)
    if result.ignored:
        con.print(f"  ignored {len(result.ignored)} file(s) that are not .npy/.npz: "
                  f"{escape(', '.join(result.ignored[:5]))}"
                  f"{' ...' if len(result.ignored) > 5 else ''}", highlight=False)
    _print_health(con, health)


def _print_health(con: Any, health: dict[str, Any]) -> None:
    from rich.markup import escape

    con.print("[bold]fleet health[/bold]")
    for name, w in sorted(health.get("workers", {}).items()):
        con.print(f"  worker {name} on {w['node']}: {w['batches']} batches, {w['rows']} items")
    faulty = {k: v for k, v in health.get("variants", {}).items()
              if v["faults"] or v["fallbacks"]}
    for name, v in sorted(faulty.items()):
        con.print(f"  variant {name}: {v['calls']} calls, {v['fallbacks']} fallbacks, "
                  f"faults {v['faults']}", highlight=False)
    for f in health.get("faults", [])[:20]:
        con.print(escape(f"  fault: {f['variant']} at graph node {f['node']!r} ({f['check']}: "
                         f"{f['detail']}) in worker {f['worker']} on {f['cluster_node']}"),
                  highlight=False)
    for name, q in sorted(health.get("quarantine", {}).items()):
        con.print(escape(f"  quarantined {name} (found by {q['worker']} on {q['node']}): "
                         f"{q['reason']}"), highlight=False)
    if not faulty and not health.get("faults"):
        con.print("  no faults")
