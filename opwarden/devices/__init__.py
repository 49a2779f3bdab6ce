"""Devices: what each execution target declares it can run, and device profiles (TOML)."""

from __future__ import annotations

from opwarden.devices.base import (
    Device,
    OpCapability,
    devices,
    get_device,
    register_device,
    sensitive_inputs,
)
from opwarden.devices.constraints import PREDICATES, Constraint
from opwarden.devices.profile import load_builtin_profiles, load_profile

load_builtin_profiles()

__all__ = [
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
