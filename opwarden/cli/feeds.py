"""Feeds for a session from the command line: NAME=FILE.npy items and seeded random tensors.

Shared by the `opwarden` subcommands and `opwarden bench`, which both import it (one way).
Random feeds follow each input's declared shape; a symbolic dimension takes its value from
``--dim NAME=N`` when given, else the command's default (``--batch`` where there is one, else 1).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opwarden.errors import InputError, OptionsError


def parse_inputs(items: list[str]) -> dict[str, np.ndarray]:
    """{name: array} from NAME=FILE.npy items (InputError naming the item that is wrong)."""
    feeds = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise InputError(f"--input expects NAME=FILE.npy, got {item!r}")
        try:
            feeds[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as e:
            raise InputError(f"--input {name}: cannot read {path!r}: {e}") from None
        if not isinstance(feeds[name], np.ndarray):  # an .npz archive
            raise InputError(f"--input {name}: {path!r} holds several arrays (.npz); "
                             "give one array saved with numpy.save")
    return feeds


def parse_dims(items: list[str] | None) -> dict[str, int]:
    """{symbolic dim name: size} from NAME=N items (OptionsError on a malformed one)."""
    dims: dict[str, int] = {}
    for item in items or ():
        name, sep, val = item.partition("=")
        try:
            n = int(val)
        except ValueError:
            n = -1
        if not sep or not name or n < 0:
            raise OptionsError(f"--dim expects NAME=N with N >= 0, got {item!r}")
        dims[name] = n
    return dims


def check_names(sess: Any, given: dict[str, Any]) -> None:
    """InputError for a --input name the model has no input of."""
    names = [a.name for a in sess.get_inputs()]
    extra = [n for n in given if n not in names]
    if extra:
        raise InputError(f"--input {extra[0]!r}: the model has no such input; "
                         f"its inputs: {', '.join(names) or '(none)'}")


def random_feeds(
    sess: Any, seed: int = 0, batch: int = 1, dims: dict[str, int] | None = None,
    skip: Any = (),
) -> dict[str, np.ndarray]:
    """Seeded random tensors of each input's declared shape and type (see the module doc),
    but for the inputs named in `skip` (given by the user)."""
    rng = np.random.default_rng(seed)
    dims = dims or {}
    feeds = {}
    for a in sess.get_inputs():
        if a.name in skip:
            continue
        if not a.type.startswith("tensor("):
            raise InputError(f"input {a.name!r} is a {a.type}; pass it with --input")
        shape = [d if isinstance(d, int) else dims.get(str(d), batch) for d in (a.shape or [])]
        dt = a.type[7:-1]
        dt = {"float": "float32", "double": "float64"}.get(dt, dt)
        feeds[a.name] = random_tensor(rng, shape, dt)
    return feeds


def random_tensor(rng: np.random.Generator, shape: list[int], dt: str) -> np.ndarray:
    """A seeded random tensor: normal floats, 0/1 bools, small non-negative integers."""
    if dt.startswith("float") or dt == "bfloat16":
        import ml_dtypes  # noqa: F401 - registers bfloat16 and the float8 names with NumPy

        return rng.standard_normal(shape).astype(dt)
    if dt == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if dt == "string":
        return np.full(shape, "a", dtype=object)
    if dt.startswith("complex"):
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    return rng.integers(0, 10, shape).astype(dt)


def make_feeds(sess: Any, inputs: list[str] | None, seed: int = 0, batch: int = 1,
               dims: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """Random feeds for the inputs not given, given ones (NAME=FILE.npy) read and checked."""
    given = parse_inputs(inputs or [])
    check_names(sess, given)
    feeds = random_feeds(sess, seed, batch, dims, skip=given)
    feeds.update(given)
    return feeds
