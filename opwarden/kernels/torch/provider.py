"""The torch device: operators run through PyTorch (its CPU, or CUDA when present).

Variants take and return NumPy arrays (kernels.torch.tensors: free on the CPU, uploads and
downloads on CUDA). Operators with a layout (convolutions, pools, normalizations) have an "NCHW"
and an "NHWC" variant, the NHWC one on channels-last views; fused operators (domain "opwarden")
apply their bias, residual and activation in place on the fresh output. Anything a variant
cannot express in torch (an attribute torch lacks, training mode, an extra output) is handed to
the operator's reference kernel, so every variant is exact on every input the reference accepts.

Importing this module imports torch and registers the device (`register()`, idempotent) with the
variants of every family module (activation, elementwise, linalg, movement, conv, pool,
normalization; the package docstring lists what each holds); `configure` sizes torch's thread
pool. On the CPU the device defers to a host device in the session the op types the host's NumPy
kernels run faster (`_HOST_FASTER`, Device.defers): LRN (one running window sum over channels);
with passive OpenMP waiting, where torch runs small work on one thread, also the pools and
Concat.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from opwarden.devices.base import Device, register_device
from opwarden.kernels.torch import (
    activation,
    conv,
    elementwise,
    linalg,
    movement,
    normalization,
    pool,
)

# The names tests and benchmarks reach through the provider (they live in the family modules).
from opwarden.kernels.torch.conv_plan import (  # noqa: F401
    _BRANCH_SPLIT_MIN_C,
    _GEMM_MAX_FLOPS,
    _GROUPED_OUT_MIN_ROWS,
    _POINTWISE,
    _conv_plan,
)
from opwarden.kernels.torch.elementwise import _ew_compile  # noqa: F401
from opwarden.kernels.torch.movement import _channel_shuffle, _inner_gather  # noqa: F401
from opwarden.kernels.torch.pool import _pool_plan  # noqa: F401
from opwarden.kernels.torch.runtime import (  # noqa: F401 - _SERIAL_FLOPS, _Mode re-exported
    _CUDA,
    _PASSIVE,
    _SERIAL_FLOPS,
    DEVICE_NAME,
    _Mode,
)

_FAMILIES = (activation, elementwise, linalg, movement, conv, pool, normalization)

# Deferral: work the host's NumPy kernels run faster than torch's on the CPU (see Device.defers).
# Measured in-model against torch: with torch's workers spinning (the default) the host won only
# LRN; pools and Concat stay on torch there, where deferring them cost whole models time. With
# passive waiting the host also won pools and Concat.
_HOST_FASTER = {"LRN": "the host's LRN (one running window sum over channels) measured "
                       "1.1-1.3x faster"}
if _PASSIVE:
    _PASSIVE_WHY = "with passive OpenMP waiting the host's {} measured {} faster"
    _HOST_FASTER.update({
        "LRN": _PASSIVE_WHY.format("LRN", "1.2-4.4x"),
        "MaxPool": _PASSIVE_WHY.format("max pool", "1.2-3.6x"),
        "AveragePool": _PASSIVE_WHY.format("average pool", "1-2x"),
        "GlobalAveragePool": _PASSIVE_WHY.format("global pools", "~1.5x"),
        "GlobalMaxPool": _PASSIVE_WHY.format("global pools", "~1.5x"),
        "Concat": _PASSIVE_WHY.format("Concat", "1.6-4x"),
    })


def _defers(node: Any) -> str | None:
    """Why torch (on the CPU) leaves `node` to a host device in the session, or None."""
    return _HOST_FASTER.get(node.op_type) if node.domain == "" else None


def configure(intra_op_num_threads: int = 0) -> None:
    """Size torch's thread pool: the session's intra_op_num_threads, else leave torch's default.

    torch's default is the number of physical cores, as onnxruntime's is.
    """
    n = int(intra_op_num_threads or 0)
    if n > 0 and torch.get_num_threads() != n:
        torch.set_num_threads(n)


def register() -> Device:
    """Add the torch device and its variants (idempotent: variants replace same-named ones)."""
    where = "CUDA " + torch.cuda.get_device_name(0) if _CUDA else "its CPU"
    dev = register_device(
        Device(
            DEVICE_NAME,
            kind="torch",
            description=f"PyTorch {torch.__version__} on {where}; channels-last convolutions",
            preferred_layout="NHWC",
            concurrent=False,
            aliases=("pytorch",),
            defers=None if _CUDA else _defers,
            host_memory=not _CUDA,
            extra={"torch_version": torch.__version__, "cuda": _CUDA,
                   "threads": torch.get_num_threads(), "cores": os.cpu_count()},
        )
    )
    for family in _FAMILIES:
        family.register()
    return dev


# Importing the module is how the device registry brings the provider in (on first need).
register()
