"""What every torch kernel module shares: the target device, the inference-mode guard, the
serial bounds, and the registration helpers.

`_Mode` wraps every kernel body: inference mode (no autograd bookkeeping), and with `serial` one
torch thread until it exits. Work below `_SERIAL_FLOPS` (compute-bound: convolutions, GEMMs) or
`_SERIAL_ELEMENTS` (memory-bound) runs serial only when the OpenMP workers wait passively
(`OMP_WAIT_POLICY=PASSIVE` or `GOMP_SPINCOUNT=0`): waking a sleeping worker costs more than it
saves on small work. With spinning workers (the package's default) both bounds are 0 and torch's
own grain sizes decide.

`_add(opdef, fn, name, ...)` registers a variant on the torch device; `_each(op_type)` lists the
operator's versions. Each family module's `register()` uses them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from opwarden.ops import REGISTRY

DEVICE_NAME = "torch"
FLOATS = ("float32", "float64")
NUMERIC = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")
INTS = ("int32", "int64")

_CUDA = torch.cuda.is_available()
_TARGET = torch.device("cuda") if _CUDA else torch.device("cpu")

# A cheap inference-mode guard: the C++ guard costs well under half the context-manager class
# per call; both switch off autograd bookkeeping (version counters, views tracking).
_InferenceMode: Callable[[bool], Any] = getattr(torch._C, "_InferenceMode", None) or (
    lambda _on: torch.inference_mode()
)

# The serial bounds apply only under passive waiting (see the module docstring).
_PASSIVE = os.environ.get("OMP_WAIT_POLICY", "").strip().upper() == "PASSIVE" or (
    os.environ.get("GOMP_SPINCOUNT", "").strip() == "0"
)
_SERIAL_FLOPS = 40e6 if _PASSIVE else 0.0
_SERIAL_ELEMENTS = (1 << 21) if _PASSIVE else 0


class _Mode:
    """Inference mode for a kernel body; with `serial`, torch on one thread until exit."""

    __slots__ = ("_guard", "_restore", "_serial")

    def __init__(self, serial: bool = False) -> None:
        self._serial = serial
        self._restore = 0

    def __enter__(self) -> _Mode:
        self._guard = _InferenceMode(True)
        self._guard.__enter__()
        if self._serial and not _CUDA:
            n = torch.get_num_threads()
            if n > 1:
                torch.set_num_threads(1)
                self._restore = n
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._restore:
            torch.set_num_threads(self._restore)
            self._restore = 0
        self._guard.__exit__(*exc)


def _small(*xs: Any) -> bool:
    """Whether memory-bound work over these inputs is too small to split across threads."""
    return max(np.size(x) for x in xs) < _SERIAL_ELEMENTS


def _add(opdef: Any, fn: Callable[..., Any], name: str, *, dtypes=FLOATS, layout="any",
         accepts_out=False, specialize=None) -> None:
    opdef.kernel(
        device=DEVICE_NAME, dtypes=dtypes, layout=layout, name=name, accepts_out=accepts_out,
        specialize=specialize,
    )(fn)


def _each(op_type: str, domain: str = ""):
    return REGISTRY.versions(op_type, domain)


def _add_simple(table: dict[str, tuple[Callable[..., Any], tuple, bool]]) -> None:
    """Variant `<op_type>.torch` on every version of each op type: {op_type: (kernel, dtypes,
    accepts_out)}."""
    for op_type, (fn, dts, acc) in table.items():
        for o in _each(op_type):
            _add(o, fn, f"{op_type.lower()}.torch", dtypes=dts, accepts_out=acc)
