"""Importing this module registers every fast kernel variant on the built-in operators, in this
order, and hands the devices layer the optional torch provider (imported on first need only)."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable

from opwarden.devices import base as _devices
from opwarden.kernels.cpu import (
    activation,
    attention,
    cast,
    conv,
    conv1d,
    conv_dw_native,
    elementwise,
    fused,
    linalg,
    matmul_packed,
    ml,
    norm,
    pool,
    quant,
    quant_native,
    quant_nbits,
    select,
    shape,
    shuffle,
    silu_native,
)

for _module in (conv, pool, norm, linalg, elementwise, activation, fused, conv1d, conv_dw_native,
                select, shape, shuffle, quant, quant_native, quant_nbits, ml, silu_native,
                attention, cast, matmul_packed):
    _module.register()


def _optional_provider(device: str, package: str, module: str) -> Callable[[], None]:
    """A loader that registers `device` by importing `module`, when `package` is importable."""

    def load() -> None:
        if _devices.has_device(device) or importlib.util.find_spec(package) is None:
            return
        try:
            importlib.import_module(module)
        except ImportError:
            pass

    return load


_devices.add_optional_provider(_optional_provider("torch", "torch",
                                                  "opwarden.kernels.torch.provider"),
                               names=("torch", "pytorch"))
_devices.add_optional_provider(_optional_provider("openvino", "openvino",
                                                  "opwarden.kernels.openvino.provider"),
                               names=("openvino",))
