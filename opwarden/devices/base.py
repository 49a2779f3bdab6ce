"""The device model: a named execution target with enumerable capabilities."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import OptionsError


@dataclass
class Device:
    """An execution target.

    - ``kind``: "host" (runs NumPy variants registered for ``name``), "torch" (PyTorch variants),
      or "profile" (an accelerator described by a data file, executed by ``host`` with its
      numerics emulated, hence ``simulated``).
    - ``preferred_layout``: the layout its convolution-like kernels want ("NCHW" or "NHWC").
    - ``memory_bytes``: activation memory available (None: bounded by the host).
    - ``concurrent``: whether it runs independent operators at the same time.
    """

    name: str
    kind: str = "host"
    description: str = ""
    preferred_layout: str = "NCHW"
    memory_bytes: int | None = None
    concurrent: bool = False
    simulated: bool = False
    host: str | None = None
    aliases: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "description": self.description,
            "preferred_layout": self.preferred_layout,
            "memory_bytes": self.memory_bytes,
            "concurrent": self.concurrent,
            "simulated": self.simulated,
            "host": self.host,
        }


_DEVICES: dict[str, Device] = {}


def register_device(dev: Device) -> Device:
    """Add (or replace) a device; its name and aliases become valid provider names."""
    _DEVICES[dev.name] = dev
    return dev


def get_device(name: str) -> Device:
    """The device called `name` (case-insensitive, aliases accepted)."""
    key = name.lower()
    for dev in _DEVICES.values():
        if dev.name.lower() == key or key in (a.lower() for a in dev.aliases):
            return dev
    raise OptionsError(f"unknown device {name!r}; available: {', '.join(_DEVICES)}")


def devices() -> list[Device]:
    """Every device available in this process, in registration order."""
    return list(_DEVICES.values())


register_device(
    Device(
        "cpu",
        kind="host",
        description="NumPy on the host CPU (always present)",
        aliases=("CPUExecutionProvider",),
    )
)
