"""Devices: what each execution target declares it can run, and device profiles (TOML)."""

from __future__ import annotations

from opwarden.contract.layout import LAYOUT_SENSITIVE
from opwarden.devices.base import _DEVICES, Device, OpCapability, add_optional_provider, devices, get_device, register_device, sensitive_inputs
from opwarden.devices.constraints import PREDICATES, Constraint
from opwarden.devices.profile import load_builtin_profiles, load_profile


def _try_torch() -> None:
    """Register the torch provider when PyTorch is importable (imported on first need only)."""
    import importlib.util

    if "torch" in _DEVICES or importlib.util.find_spec("torch") is None:
        return
    try:
        from opwarden.devices import torch_provider  # noqa: F401
    except ImportError:
        pass


add_optional_provider(_try_torch)
load_builtin_profiles()

__all__ = [
    "LAYOUT_SENSITIVE",
    "PREDICATES",
    "Constraint",
    "Device",
    "OpCapability",
    "devices",
    "get_device",
    "load_profile",
    "register_device",
    "sensitive_inputs",
]
