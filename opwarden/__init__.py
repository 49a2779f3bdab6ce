"""opwarden: an ONNX runtime in which every operator is a verifiable contract."""

from __future__ import annotations

import os as _os
import sys as _sys

# NumPy's OpenBLAS keeps its worker threads busy-waiting for ~0.1 s after every call unless told
# otherwise, so a finished run goes on holding the cores that whatever runs next needs (another
# runtime, the user's code, torch's OpenMP workers). 2^20 cycles (~0.4 ms) still bridges the gaps
# between the GEMMs of one run. An explicit setting wins. (Measurements: benchmarks/NOTES.md.)
_BLAS_TIMEOUT_OURS = "OPENBLAS_THREAD_TIMEOUT" not in _os.environ
_os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")
if _BLAS_TIMEOUT_OURS and "numpy" in _sys.modules:
    # NumPy came first (`import numpy as np` above `import opwarden`): its OpenBLAS read the
    # environment when it loaded, so its workers are restarted to take the setting up.
    from opwarden.blas import restart_blas_threads as _restart

    _BLAS_RESTARTED = _restart()
else:
    _BLAS_RESTARTED = False

# The built-in operators, then the fast kernels registered on them, before anything else
# (custom ops, `opwarden check`, sessions) looks at the registry.
from opwarden import ops as _ops  # noqa: E402, F401
from opwarden.kernels import registry as _builtin_kernels  # noqa: E402, F401

# isort: split
from opwarden import ort as _ort  # noqa: E402
from opwarden import verify  # noqa: E402
from opwarden.autograd import grad  # noqa: E402
from opwarden.contract import Contract  # noqa: E402
from opwarden.devices import devices  # noqa: E402
from opwarden.errors import (  # noqa: E402
    ContractError,
    InputError,
    KernelError,
    MemoryLimitError,
    ModelError,
    OptionsError,
    OpwardenError,
    OpwardenWarning,
    PrecisionWarning,
    ProviderError,
    ProviderFallbackWarning,
    RunTerminated,
    RunTimeoutError,
    UnsupportedOpError,
)
from opwarden.ops import Sample, kernel, op  # noqa: E402
from opwarden.options import (  # noqa: E402
    ExecutionMode,
    ExecutionOrder,
    GraphOptimizationLevel,
    SessionOptions,
)
from opwarden.ort import *  # noqa: E402, F403 - onnxruntime's surface, listed once in ort
from opwarden.session import InferenceSession, NodeArg  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "Contract",
    "ContractError",
    "ExecutionMode",
    "ExecutionOrder",
    "GraphOptimizationLevel",
    "InferenceSession",
    "InputError",
    "KernelError",
    "MemoryLimitError",
    "ModelError",
    "NodeArg",
    "OptionsError",
    "OpwardenError",
    "OpwardenWarning",
    "ProviderError",
    "PrecisionWarning",
    "ProviderFallbackWarning",
    "RunTerminated",
    "RunTimeoutError",
    "Sample",
    "SessionOptions",
    "UnsupportedOpError",
    "grad",
    "devices",
    "kernel",
    "op",
    "verify",
] + _ort.__all__
