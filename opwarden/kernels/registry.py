"""Importing this module registers every fast kernel variant on the built-in operators, in this
order, and hands the devices layer the optional torch provider (imported on first need only)."""

from __future__ import annotations

from opwarden.devices import base as _devices
from opwarden.kernels.cpu import (
    activation,
    conv,
    conv_dw_native,
    elementwise,
    fused,
    linalg,
    ml,
    norm,
    pool,
    quant,
    quant_nbits,
    select,
    shape,
    shuffle,
    silu_native,
)

for _module in (conv, pool, norm, linalg, elementwise, activation, fused, conv_dw_native, select,
                shape, shuffle, quant, quant_nbits, ml, silu_native):
    _module.register()


def _try_torch() -> None:
    """Register the torch provider when PyTorch is importable."""
    import importlib.util

    if _devices.has_device("torch") or importlib.util.find_spec("torch") is None:
        return
    try:
        from opwarden.kernels.torch import provider  # noqa: F401
    except ImportError:
        pass


_devices.add_optional_provider(_try_torch)


def _try_openvino() -> None:
    """Register the openvino provider when OpenVINO is importable."""
    import importlib.util

    if _devices.has_device("openvino") or importlib.util.find_spec("openvino") is None:
        return
    try:
        from opwarden.kernels.openvino import provider  # noqa: F401
    except ImportError:
        pass


_devices.add_optional_provider(_try_openvino)
