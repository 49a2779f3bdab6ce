"""Devices: what each execution target declares it can run (issue 6 fills this room)."""

from __future__ import annotations

from .base import Device, devices, get_device, register_device

__all__ = ["Device", "devices", "get_device", "register_device"]
