"""DeviceCopy: the explicit node placed on every edge between two devices.

For devices that live in host memory the copy is free (the same array); entering a device that
computes in fp16 it converts (rounds float tensors to fp16, kept in their dtype), which is where
an emulated device's input numerics come from.
"""

from __future__ import annotations

import numpy as np

from opwarden.contract import Contract
from opwarden.dtypes import FLOATS
from opwarden.ops.base import op

DOMAIN = "opwarden"
_ALL = sorted(FLOATS) + ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                         "uint64", "bool", "string"]


def round_to(x, dtype: str):
    """x rounded to `dtype` ("float16"/"bfloat16") and returned in its own dtype."""
    if not isinstance(x, np.ndarray) or x.dtype.kind != "f" or x.dtype.itemsize <= 2:
        return x
    if dtype == "bfloat16":
        import ml_dtypes

        target = np.dtype(ml_dtypes.bfloat16)
    else:
        target = np.dtype(np.float16)
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(target).astype(x.dtype)


def clamp_range(x, dtype: str):
    """x with `dtype`'s range emulated: overflow to +-inf, values too small for it to 0."""
    if not isinstance(x, np.ndarray) or x.dtype.kind != "f" or x.dtype.itemsize <= 2:
        return x
    if dtype != "float16":
        return x
    with np.errstate(invalid="ignore"):
        a = np.abs(x)
        big, tiny = a >= 65520.0, (a < 2.0**-25) & (a > 0)
    if big.any() or tiny.any():
        x = x.copy()
        x[big] = np.copysign(np.inf, x[big])
        x[tiny] = 0
    return x


@op(
    "DeviceCopy",
    domain=DOMAIN,
    since=1,
    inputs=["X: T"],
    outputs=["Y: T"],
    types={"T": _ALL},
    attrs={"src": "cpu", "dst": "cpu", "convert": ""},
    contract=Contract(may_alias=((0, 0),)),
)
def DeviceCopy(X, *, src="cpu", dst="cpu", convert=""):
    """Move X from device `src` to `dst`; `convert` names a dtype to round floats to."""
    return round_to(X, convert) if convert else X


@DeviceCopy.infer
def _copy_infer(x, **_):
    return x
