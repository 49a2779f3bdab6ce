"""opwarden: an ONNX runtime in which every operator is a verifiable contract."""

from __future__ import annotations

from . import verify
from .autograd import grad
from .contract import Contract
from .devices import devices
from .errors import (
    ContractError,
    InputError,
    KernelError,
    MemoryLimitError,
    ModelError,
    OptionsError,
    OpwardenError,
    UnsupportedOpError,
)
from .ops import kernel, op
from .runtime.options import SessionOptions
from .runtime.session import InferenceSession, NodeArg

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
    "SessionOptions",
    "UnsupportedOpError",
    "grad",
    "devices",
    "kernel",
    "op",
    "verify",
]
