"""The inputs and outputs of `opwarden batch`: a folder of .npy/.npz files or one Parquet file.

A folder's files (sorted by name; other files are counted, not read) are one item each, a whole
feed: an .npy file is a one-input model's feed, an .npz file holds one array per input name
(or one array for a one-input model). Each output is written as ``DIR/<stem>.npy`` (one
output) or ``DIR/<stem>.npz`` (one array per output name), through a temporary file so a
stopped run leaves no half-written output. A Parquet file's rows are items too (rows of a Ray
Data batch: samples or whole feeds, `rows.RowRunner`); their outputs go to
``DIR/<stem>.parquet`` with a ``row`` column giving each output row's input row.
"""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from opwarden.errors import InputError

BAD_FILE_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError)


@dataclass
class Item:
    """One input: a file (`kind` "feed") or a Parquet row ("row"), loaded on demand."""

    name: str
    kind: str
    path: str
    row: int = -1
    data: dict[str, Any] | None = None


@dataclass
class Inputs:
    """What INPUTS holds: the items, where outputs go, and files not read."""

    items: list[Item]
    parquet: str | None = None  # the Parquet file's stem (its outputs form one file)
    ignored: list[str] = field(default_factory=list)


def discover(path: str, input_names: list[str]) -> Inputs:
    """The items of INPUTS (InputError when it is neither a folder nor a Parquet file)."""
    if os.path.isdir(path):
        items, ignored = [], []
        for entry in sorted(os.listdir(path)):
            full = os.path.join(path, entry)
            ext = os.path.splitext(entry)[1].lower()
            if ext in (".npy", ".npz") and not os.path.isdir(full):
                items.append(Item(entry, "feed", full))
            else:
                ignored.append(entry)
        return Inputs(items, None, ignored)
    if os.path.isfile(path) and path.lower().endswith((".parquet", ".pq")):
        return Inputs(_parquet_rows(path, input_names), _stem(path))
    if not os.path.exists(path):
        raise InputError(f"INPUTS {path!r} does not exist")
    raise InputError(f"INPUTS {path!r} must be a folder of .npy/.npz files or a .parquet file")


def _stem(path: str) -> str:
    return os.path.splitext(os.path.basename(path))[0]


def load_feed(item: Item, input_names: list[str]) -> dict[str, np.ndarray]:
    """An .npy/.npz file's feed (InputError or a BAD_FILE_ERRORS error naming what is wrong)."""
    if item.path.lower().endswith(".npy"):
        if len(input_names) != 1:
            raise InputError(f"{item.name}: an .npy file feeds a one-input model; this one has "
                             f"inputs {input_names} (use .npz with one array per input)")
        return {input_names[0]: np.load(item.path, allow_pickle=False)}
    with np.load(item.path, allow_pickle=False) as z:
        keys = list(z.files)
        if len(input_names) == 1 and len(keys) == 1:
            return {input_names[0]: z[keys[0]]}
        missing = [n for n in input_names if n not in keys]
        extra = [k for k in keys if k not in input_names]
        if missing or extra:
            raise InputError(f"{item.name}: arrays {keys}; the model's inputs are "
                             f"{input_names}" + (f" (missing {missing})" if missing else "")
                             + (f" (unknown {extra})" if extra else ""))
        return {k: z[k] for k in input_names}


def _parquet_rows(path: str, input_names: list[str]) -> list[Item]:
    """Every row of a Parquet file, its columns decoded to arrays (InputError for the file)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise InputError("reading Parquet needs pyarrow (pip install pyarrow)") from None
    _register_ray_tensors()
    try:
        table = pq.read_table(path)
    except Exception as e:  # noqa: BLE001 - pyarrow raises its own hierarchy
        raise InputError(f"{path}: not a readable Parquet file: {type(e).__name__}: {e}") \
            from None
    cols = {}
    for name in table.column_names:
        cols[name] = _column_rows(table.column(name), name, path)
    stem = os.path.basename(path)
    items = []
    for i in range(table.num_rows):
        items.append(Item(f"{stem}[row {i}]", "row", path, i,
                          {k: v[i] for k, v in cols.items()}))
    return items


def _register_ray_tensors() -> None:
    # Ray Data writes tensor columns with its own Arrow extension type; registering it (when
    # Ray is installed) lets pyarrow hand them back as tensors.
    try:
        import ray.air.util.tensor_extensions.arrow  # noqa: F401
    except Exception:  # noqa: BLE001 - without Ray, its columns read as their storage
        pass


def _column_rows(col: Any, name: str, path: str) -> list[Any]:
    """One value per row: an array, or None for a null."""
    import pyarrow as pa

    arr = col.combine_chunks()
    if isinstance(arr.type, pa.FixedShapeTensorType):
        vals = arr.to_numpy_ndarray()
        return [None if not arr[i].is_valid else vals[i] for i in range(len(arr))]
    if isinstance(arr, pa.ExtensionArray) and hasattr(arr, "to_numpy"):
        try:  # Ray's tensor arrays
            vals = arr.to_numpy()
            return [None if not arr[i].is_valid else np.asarray(vals[i]) for i in range(len(arr))]
        except Exception:  # noqa: BLE001 - read as its storage below
            arr = arr.storage
    leaf = arr.type
    while pa.types.is_list(leaf) or pa.types.is_large_list(leaf) or \
            pa.types.is_fixed_size_list(leaf):
        leaf = leaf.value_type
    try:
        dtype = np.dtype(leaf.to_pandas_dtype())
    except (NotImplementedError, TypeError):
        raise InputError(f"{path}: column {name!r} holds {arr.type}, not numbers or "
                         "lists of numbers") from None
    out: list[Any] = []
    for v in arr.to_pylist():
        if v is None:
            out.append(None)
            continue
        try:
            out.append(np.asarray(v, dtype=dtype))
        except (ValueError, TypeError):
            out.append(ValueError(f"column {name!r} holds a ragged list"))
    return out


def check_row(item: Item) -> dict[str, np.ndarray]:
    """A Parquet row's arrays (InputError naming a null or ragged cell)."""
    data = item.data or {}
    for k, v in data.items():
        if v is None:
            raise InputError(f"{item.name}: column {k!r} is null")
        if isinstance(v, Exception):
            raise InputError(f"{item.name}: {v}")
    return data


def output_path(out_dir: str, item: Item, n_outputs: int) -> str:
    """Where a file item's outputs go."""
    return os.path.join(out_dir, _stem(item.name) + (".npy" if n_outputs == 1 else ".npz"))


def write_outputs(path: str, outs: dict[str, Any]) -> None:
    """Write one item's outputs (.npy: the only one; .npz: by name), replacing atomically."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            if path.endswith(".npy"):
                np.save(f, np.asarray(next(iter(outs.values()))), allow_pickle=False)
            else:
                np.savez(f, **{k: np.asarray(v) for k, v in outs.items()})
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_parquet(path: str, rows: list[tuple[int, dict[str, Any]]], names: list[str]) -> None:
    """The outputs of a Parquet file's rows, in row order, with their input row numbers."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = sorted(rows, key=lambda r: r[0])
    cols: dict[str, Any] = {"row": pa.array([r for r, _ in rows], pa.int64())}
    for k in names:
        vals = [np.asarray(o[k]) for _, o in rows]
        shapes = {v.shape for v in vals}
        if vals and len(shapes) == 1 and vals[0].ndim >= 1:
            cols[k] = pa.FixedShapeTensorArray.from_numpy_ndarray(np.stack(vals))
        elif vals and len(shapes) == 1:
            cols[k] = pa.array(np.stack(vals))
        else:
            cols[k] = pa.array([v.tolist() for v in vals])
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        pq.write_table(pa.table(cols), tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
