"""The case registry of the family benchmark and its on-disk model cache.

A `Case` names one model of one family: how to build its ONNX bytes (from a config with seeded
random weights, never a download), how to draw its feeds at a batch size, which packages the
builder imports, and what kind of numerics it has (which decides the tolerance against ORT).
Built models are cached under ~/.cache/opwarden/families/ (or $OPWARDEN_CACHE_DIR/families),
keyed by the case name and a hash of its config and the builder libraries' versions.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Bump when a builder changes in a way its config does not show (init, export arguments).
BUILDER_VERSION = 1

Feeds = dict[str, np.ndarray]


@dataclass(frozen=True)
class Case:
    """One benchmark model: `build()` returns serialized ONNX; `feeds(batch, seed)` its inputs.

    `kind` is "f32", "quant", "fp16" or "tree" (see runner.tolerance). `needs` lists the modules
    the builder imports; a case whose modules are missing is skipped with that reason. `config`
    is what the cache key hashes (with the versions of `needs`). `smoke` cases are the tiny
    models of --smoke; `batches` the batch sizes the case runs at."""

    name: str
    family: str
    build: Callable[[], bytes]
    feeds: Callable[[int, int], Feeds]
    needs: tuple[str, ...] = ()
    kind: str = "f32"
    config: dict[str, Any] = field(default_factory=dict)
    batches: tuple[int, ...] = (1,)
    smoke: bool = False
    cache: bool = True
    note: str = ""


CASES: dict[str, Case] = {}


def register(case: Case) -> Case:
    """Add a case to the registry (names are unique)."""
    if case.name in CASES:
        raise ValueError(f"duplicate family case {case.name!r}")
    CASES[case.name] = case
    return case


def missing_modules(case: Case) -> list[str]:
    """The modules among `case.needs` that are not installed here."""

    def absent(m: str) -> bool:
        try:
            return importlib.util.find_spec(m) is None
        except (ImportError, ValueError):  # ValueError: blocked in sys.modules (None)
            return True

    return [m for m in case.needs if absent(m)]


def _version(module: str) -> str:
    dist = {"sklearn": "scikit-learn", "onnxconverter_common": "onnxconverter-common"}
    try:
        return importlib.metadata.version(dist.get(module, module))
    except importlib.metadata.PackageNotFoundError:
        return "?"


def cache_root() -> str:
    """~/.cache/opwarden/families (or $OPWARDEN_CACHE_DIR/families, $XDG_CACHE_HOME/...)."""
    if os.environ.get("OPWARDEN_CACHE_DIR"):
        base = os.environ["OPWARDEN_CACHE_DIR"]
    else:
        home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(home, "opwarden")
    return os.path.join(base, "families")


def cache_key(case: Case) -> str:
    """name-<12 hex>: the hash covers the config, the builder version and library versions."""
    blob = json.dumps(
        {
            "config": case.config,
            "builder": BUILDER_VERSION,
            "versions": {m: _version(m) for m in sorted({*case.needs, "onnx", "onnxruntime"})},
        },
        sort_keys=True,
        default=str,
    )
    return f"{case.name}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def model_bytes(case: Case, log: Callable[[str], None] = print) -> tuple[bytes, dict[str, Any]]:
    """The case's ONNX bytes, from the cache when present; and {cached, build_s, path}."""
    if not case.cache:
        t0 = time.perf_counter()
        data = case.build()
        return data, {"cached": False, "build_s": round(time.perf_counter() - t0, 2), "path": None}
    path = os.path.join(cache_root(), cache_key(case) + ".onnx")
    if os.path.exists(path):
        with open(path, "rb") as f:
            return f.read(), {"cached": True, "build_s": 0.0, "path": path}
    log(f"  building {case.name} (not cached: {path})")
    t0 = time.perf_counter()
    if os.environ.get(_CHILD) != "1":
        # In a child process: torch (and its OpenMP runtime and threads), imported by the
        # builders, stays out of the timing process (in-process, it made the first run's
        # figures wrong: dynamic-quantized BERT-base 2.73x ORT built in-process, 1.21x cached).
        _build_in_child(case.name)
        if os.path.exists(path):
            with open(path, "rb") as f:
                return f.read(), {"cached": False, "path": path,
                                  "build_s": round(time.perf_counter() - t0, 2)}
    data = case.build()
    build_s = round(time.perf_counter() - t0, 2)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)  # a crash mid-write leaves no truncated model under the real name
    return data, {"cached": False, "build_s": build_s, "path": path}


_CHILD = "OPWARDEN_FAMILIES_BUILD_CHILD"


def _build_in_child(name: str) -> None:
    """Build and cache case `name` in a fresh interpreter (its failure: the caller builds
    in-process, where the error is raised with its traceback)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = ("import sys; sys.path[:0] = [sys.argv[1]]; import families; "
            "from families.base import CASES, model_bytes; model_bytes(CASES[sys.argv[2]])")
    subprocess.run([sys.executable, "-c", code, here, name], check=False,
                   env={**os.environ, _CHILD: "1"})


def base_bytes(name: str) -> bytes:
    """The (cached) bytes of another registered case: derived models start from these."""
    data, _ = model_bytes(CASES[name], log=lambda s: print(s, flush=True))
    return data


# -- feeds -------------------------------------------------------------------------------------
def rng_for(seed: int, salt: str) -> np.random.Generator:
    """A generator seeded by (seed, salt): feeds differ per input name, repeat per seed."""
    return np.random.default_rng([seed, int(hashlib.md5(salt.encode()).hexdigest()[:8], 16)])


def normal(shape: tuple[int, ...], seed: int, salt: str, scale: float = 1.0) -> np.ndarray:
    """float32 N(0, scale^2) of a shape."""
    return (rng_for(seed, salt).standard_normal(shape) * scale).astype(np.float32)


def padded_tokens(batch: int, seq: int, vocab: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, attention_mask) int64 [batch, seq]: each row keeps a random length in
    [seq/2, seq] (the first row the full length), the rest is padding (id 0, mask 0)."""
    r = rng_for(seed, "tokens")
    ids = r.integers(1, vocab, size=(batch, seq), dtype=np.int64)
    lengths = r.integers(seq // 2, seq + 1, size=batch)
    lengths[0] = seq
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64)
    return ids * mask, mask


def spread(y: np.ndarray) -> float:
    """How much an output varies across the batch, relative to its overall spread: the mean
    over elements of the std over the batch axis, over the std of all values (0: the model
    maps every input to the same output; NaN for a batch of one)."""
    y = np.asarray(y, np.float64)
    if y.ndim == 0 or y.shape[0] < 2:
        return float("nan")
    total = float(y.std())
    return float(y.std(axis=0).mean() / total) if total > 0 else 0.0
