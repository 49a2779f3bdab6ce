"""opwarden: an ONNX runtime in which every operator is a verifiable contract."""

from __future__ import annotations

import os as _os

# NumPy's OpenBLAS keeps its worker threads busy-waiting for 2^28 cycles (~0.1 s) after every
# call unless told otherwise, so a finished run goes on occupying the cores that whatever runs
# next (another runtime, the user's own code) needs: ONNX Runtime alternated with us ran 20-30%
# slower (ResNet-50 36 -> 47 ms). 2^20 cycles (~0.4 ms) still bridges the gaps between the
# GEMMs of one run (our own times unchanged within noise). Read when NumPy loads OpenBLAS, so
# this only applies when opwarden is imported before NumPy; an explicit setting wins.
_os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")

from . import verify  # noqa: E402
from .autograd import grad  # noqa: E402
from .contract import Contract  # noqa: E402
from .devices import devices  # noqa: E402
from .errors import (  # noqa: E402
    ContractError,
    InputError,
    KernelError,
    MemoryLimitError,
    ModelError,
    OptionsError,
    OpwardenError,
    UnsupportedOpError,
)
from .ops import Sample, kernel, op  # noqa: E402
from .runtime.options import SessionOptions  # noqa: E402
from .runtime.session import InferenceSession, NodeArg  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "Contract",
    "ContractError",
    "InferenceSession",
    "InputError",
    "KernelError",
    "MemoryLimitError",
    "ModelError",
    "NodeArg",
    "OptionsError",
    "OpwardenError",
    "Sample",
    "SessionOptions",
    "UnsupportedOpError",
    "grad",
    "devices",
    "kernel",
    "op",
    "verify",
]
