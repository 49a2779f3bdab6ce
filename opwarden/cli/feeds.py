"""Feeds for a session from the command line: NAME=FILE.npy items and seeded random tensors.

Shared by the `opwarden` subcommands and `opwarden bench`, which both import it (one way).
"""

from __future__ import annotations

import numpy as np

from opwarden.errors import InputError


def parse_inputs(items: list[str]) -> dict[str, np.ndarray]:
    feeds = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep:
            raise InputError(f"--input expects NAME=FILE.npy, got {item!r}")
        try:
            feeds[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise InputError(f"--input {name}: cannot read {path!r}: {e}") from None
    return feeds


def random_feeds(sess, seed: int = 0, batch: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for a in sess.get_inputs():
        if not a.type.startswith("tensor("):
            raise InputError(f"input {a.name!r} is a {a.type}; pass it with --input")
        dims = [d if isinstance(d, int) else batch for d in (a.shape or [])]
        dt = a.type[7:-1]
        dt = {"float": "float32", "double": "float64"}.get(dt, dt)
        if dt.startswith("float") or dt == "bfloat16":
            feeds[a.name] = rng.standard_normal(dims).astype(dt)
        elif dt == "bool":
            feeds[a.name] = rng.integers(0, 2, dims).astype(bool)
        elif dt == "string":
            feeds[a.name] = np.full(dims, "a", dtype=object)
        else:
            feeds[a.name] = rng.integers(0, 10, dims).astype(dt)
    return feeds
