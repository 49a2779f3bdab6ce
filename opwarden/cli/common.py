"""What several `opwarden` subcommands share: the model a command runs, the console, the
progress bar, validated argument types and the exit codes.

A model argument is a path, a light-zoo name (``resnet50`` or ``light_resnet50``) or nothing,
for the embedded default (the light ResNet-50 with seeded weights). Feeds are in feeds.py.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# Exit codes of every command (documented in `opwarden --help` and the README).
EXIT_OK = 0
EXIT_VERDICT = 1  # check / compare / conformance found a problem
EXIT_USAGE = 2  # a bad command line or option value (argparse's own code)
EXIT_INPUT = 3  # the model, a feed or a user path is wrong
EXIT_INTERNAL = 4  # a bug in opwarden: an unexpected exception
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), as shells report it

EXIT_CODES_TEXT = """exit codes:
  0  ok
  1  a verdict: check, compare or conformance found a problem
  2  usage: a bad command line or option value
  3  the model, an input or a file named on the command line is wrong
  4  internal error in opwarden (rerun with --debug for the traceback)
  130  interrupted (Ctrl-C)"""

# Width for output that goes to a file or a pipe: tables keep their natural width there
# instead of being wrapped at rich's default of 80 columns.
PIPE_WIDTH = 1000


def console(stderr: bool = False, file: Any = None):
    """A rich Console on stdout (or stderr, or `file`): the terminal's width on a terminal,
    unwrapped (PIPE_WIDTH) when the output goes to a file or a pipe."""
    from rich.console import Console

    con = Console(stderr=stderr, file=file)
    if not con.is_terminal:
        con = Console(stderr=stderr, file=file, width=PIPE_WIDTH, soft_wrap=True)
    return con


class _Bar:
    """A task of a rich Progress: ``advance()``, ``describe(text)``, ``total(n)``."""

    def __init__(self, progress: Any = None, task: Any = None) -> None:
        self._p, self._t = progress, task

    def advance(self, n: float = 1) -> None:
        if self._p is not None:
            self._p.advance(self._t, n)

    def describe(self, text: str) -> None:
        if self._p is not None:
            self._p.update(self._t, description=text)

    def total(self, n: float | None) -> None:
        if self._p is not None:
            self._p.update(self._t, total=n)


@contextmanager
def progress(description: str, total: float | None = None) -> Iterator[_Bar]:
    """A transient progress bar on stderr while the block runs, shown only when stderr is a
    terminal (never in pipes, logs or `--json` captures); ``total=None``: an open-ended bar."""
    if not sys.stderr.isatty():
        yield _Bar()
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    cols = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
            MofNCompleteColumn(), TimeElapsedColumn()]  # fmt: skip
    with Progress(*cols, console=Console(stderr=True), transient=True) as bar:
        yield _Bar(bar, bar.add_task(description, total=total))


# -- argument types (argparse turns their ArgumentTypeError into a usage error, exit 2) -------
def positive_int(text: str) -> int:
    """An int >= 1."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """An int >= 0."""
    return _int_at_least(text, 0)


def _int_at_least(text: str, low: int) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v < low:
        raise argparse.ArgumentTypeError(f"must be >= {low}, got {v}")
    return v


def non_negative_float(text: str) -> float:
    """A finite float >= 0."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not v >= 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return v


def providers_list(text: str) -> list[str]:
    """Comma-separated provider (device) names, e.g. "torch,cpu"."""
    items = [p.strip() for p in text.split(",") if p.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"expected comma-separated device names, got {text!r}")
    return items


def writable_file(path: str, option: str, suffixes: tuple[str, ...] = ()) -> str:
    """`path` checked before any work is done: its suffix (OptionsError: a usage error) and
    that its folder exists (FileNotFoundError, an OSError: exit 3)."""
    from opwarden.errors import OptionsError

    if suffixes and not path.lower().endswith(suffixes):
        raise OptionsError(f"{option} expects a file ending in {' or '.join(suffixes)}, "
                           f"got {path!r}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(2, f"{option}: no such folder {folder!r}", path)
    return path


def writable_dir(path: str, option: str) -> str:
    """`path` created as a folder now, before the work it will receive (OSError: exit 3)."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise OSError(e.errno, f"{option}: cannot create folder {path!r}: {e.strerror}") \
            from None
    if not os.access(path, os.W_OK):
        raise PermissionError(13, f"{option}: folder {path!r} is not writable", path)
    return path


# -- the model a command works on ---------------------------------------------------------------
def load_default() -> tuple[bytes, str]:
    """The embedded default model's bytes and label."""
    from opwarden import zoo

    return zoo.build("resnet50", seed=0).SerializeToString(), "light ResNet-50 (seeded weights)"


def zoo_name(arg: str) -> str | None:
    """The light-zoo model `arg` names ("resnet50" or "light_resnet50"), or None."""
    from opwarden import zoo

    name = arg[len("light_"):] if arg.startswith("light_") else arg
    return name if name in zoo.LIGHT_MODELS else None


def model_source(arg: str | None) -> tuple[Any, str]:
    """(source for InferenceSession, label) for a model path, a light-zoo name or nothing (the
    embedded default). A name that is neither a file nor a zoo model is a ModelError."""
    from opwarden import zoo
    from opwarden.errors import ModelError

    if not arg:
        return load_default()
    if os.path.exists(arg):
        return arg, arg
    name = zoo_name(arg)
    if name is not None:
        return zoo.build(name, seed=0).SerializeToString(), f"light {name} (seeded weights)"
    if os.sep in arg or "." in os.path.basename(arg):
        raise ModelError(f"model file not found: {arg!r}")
    raise ModelError(
        f"model {arg!r} is neither a file nor a light-zoo name "
        f"(one of {', '.join(zoo.LIGHT_MODELS)})"
    )


def model_bytes(arg: str | None) -> tuple[bytes, str, str | None]:
    """(serialized model, label, its folder for external data or None) for a model argument."""
    source, label = model_source(arg)
    if isinstance(source, bytes):
        return source, label, None
    try:
        with open(source, "rb") as f:
            data = f.read()
    except OSError as e:
        raise OSError(e.errno, f"cannot read model {source!r}: {e.strerror}") from None
    return data, label, os.path.dirname(os.path.abspath(source))


def add_model_arg(p: argparse.ArgumentParser, required: bool = False) -> None:
    """The MODEL positional every model command takes."""
    if required:
        p.add_argument("model", help="an .onnx path or a light-zoo name (resnet50, vgg19, ...)")
    else:
        p.add_argument("model", nargs="?",
                       help="an .onnx path or a light-zoo name (default: light ResNet-50)")
