"""Feeds as onnxruntime takes them: Python lists and scalars converted to the input's type.

onnxruntime builds a tensor of the declared element type from a (nested) list: numbers of any
kind to a numeric type (1.5 to an int64 input is 1, as NumPy casts), numbers and strings to a
string input. A string for a numeric input, a ragged list or a Python int out of the type's
range is refused here as an `InputError` naming the input. NumPy arrays are never converted (a
float64 array for a float input is refused by `feed_check`, as onnxruntime refuses it);
OrtValues give their content.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from opwarden.dtypes import np_dtype_of
from opwarden.errors import InputError
from opwarden.ir.graph import Value
from opwarden.ort.values import OrtValue

_SCALARS = (bool, int, float, np.generic)


def convert_feeds(inputs: list[Value], feed: Any) -> Any:
    """`feed` with OrtValues unwrapped and lists/scalars for tensor inputs converted to the
    input's declared dtype; anything else is left for `feed_check` to judge."""
    if not isinstance(feed, Mapping):
        return feed
    by_name = {v.name: v for v in inputs}
    out = None
    for name, x in feed.items():
        y = x
        if isinstance(x, OrtValue):
            y = x.value()
        v = by_name.get(name)
        if v is not None and v.kind == "tensor" and isinstance(y, (list, tuple, *_SCALARS)):
            y = _tensor_from(name, y, v.fact.dtype)
        if y is not x:
            if out is None:
                out = dict(feed)
            out[name] = y
    return feed if out is None else out


def _tensor_from(name: str, x: Any, dtype: str | None) -> np.ndarray:
    if isinstance(x, np.generic) and (dtype is None or x.dtype.name == dtype):
        return np.asarray(x)
    try:
        probe = np.asarray(x)
    except (ValueError, TypeError) as e:
        raise InputError(f"input {name!r}: the {type(x).__name__} given is not a tensor "
                         f"(ragged or mixed): {e}") from None
    if dtype is None:
        return probe
    try:
        want = np_dtype_of(dtype)
    except KeyError:
        return probe
    if probe.dtype.kind in "USO" and want.kind != "O":
        raise InputError(f"input {name!r} expects {dtype} values; the {type(x).__name__} "
                         f"given holds strings")
    if want.kind == "O":
        return np.asarray(probe.astype(str), dtype=object) if probe.dtype.kind != "O" else probe
    try:
        if probe.dtype.kind in "iub" and want.kind in "iu":
            return np.array(x, dtype=want)  # Python ints out of range raise OverflowError
        with np.errstate(over="ignore", invalid="ignore"):
            return probe.astype(want)
    except (OverflowError, ValueError, TypeError) as e:
        raise InputError(f"input {name!r}: the {type(x).__name__} given cannot be a {dtype} "
                         f"tensor: {e}") from None
