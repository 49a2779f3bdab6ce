"""Device profiles: accelerators described by TOML data files, executed by a host with emulation.

A profile file::

    [device]
    name = "edge-npu"
    description = "..."
    host = "cpu"                 # which provider executes its kernels
    preferred_layout = "NHWC"
    compute_dtype = "float16"    # every float output is rounded to it (emulated numerics)
    memory = "64 MiB"            # activation memory; a partition needing more is refused
    concurrent = false

    [defaults]                   # applied to every [[ops]] entry that does not say otherwise
    dtypes = ["float32", "float16"]
    layouts = ["NHWC"]           # for layout-sensitive operators (Conv, pools, norms, Resize)

    [[ops]]
    op = "Resize"
    constraints = [{ attr = "mode", values = ["nearest"] }]

Several entries for one operator are its variants, tried in order. Constraints are
``{attr, values}``, ``{attr, min, max}`` or ``{predicate}`` (see devices/constraints.py).
"""

from __future__ import annotations

import os
import re
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the tomli backport, when installed
    import tomli as tomllib  # type: ignore[no-redef]

from opwarden.devices.base import Device, OpCapability, register_device
from opwarden.devices.constraints import Constraint
from opwarden.errors import OptionsError
from opwarden.ops.select import layout_inputs

PROFILE_DIR = os.path.join(os.path.dirname(__file__), "profiles")
_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20,
          "gib": 2**30}
_LAYOUTS = ("any", "NCHW", "NHWC")
ROUNDING = ("inputs", "weights", "outputs", "exit", "range")


def parse_bytes(v: Any, where: str) -> int | None:
    """64 MiB, "512 KB", 1048576 -> bytes."""
    if v is None:
        return None
    if isinstance(v, int) and v > 0:
        return v
    m = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", str(v))
    if not m or m.group(2).lower() not in _UNITS:
        raise OptionsError(f"{where}: memory must be bytes or like '64 MiB', got {v!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def load_profile(path: str, register: bool = True) -> Device:
    """Read a profile file into a Device (registered under its name unless register=False)."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise OptionsError(f"device profile {path!r} cannot be read: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise OptionsError(f"device profile {path!r} is not valid TOML: {e}") from None
    dev = profile_from_dict(data, path)
    return register_device(dev) if register else dev


def profile_from_dict(data: dict[str, Any], where: str = "profile") -> Device:
    """Build a profile Device from the parsed TOML tables."""
    unknown = set(data) - {"device", "defaults", "ops"}
    if unknown:
        raise OptionsError(f"{where}: unknown tables {sorted(unknown)} (expected device, ops)")
    d = dict(data.get("device", {}))
    name = d.pop("name", None)
    if not isinstance(name, str) or not name:
        raise OptionsError(f"{where}: [device] needs a name")
    preferred = d.pop("preferred_layout", "NCHW")
    if preferred not in ("NCHW", "NHWC"):
        raise OptionsError(f"{where}: preferred_layout must be NCHW or NHWC, got {preferred!r}")
    compute = d.pop("compute_dtype", None)
    rounding = tuple(d.pop("rounding", ("inputs", "weights", "outputs")))
    for r in rounding:
        if r not in ROUNDING:
            raise OptionsError(f"{where}: rounding entries are {', '.join(ROUNDING)}; got {r!r}")
    if compute not in (None, "float16", "bfloat16", "float32"):
        raise OptionsError(f"{where}: compute_dtype must be float16, bfloat16 or float32")
    dev = Device(
        name,
        kind="profile",
        description=str(d.pop("description", "")),
        preferred_layout=preferred,
        memory_bytes=parse_bytes(d.pop("memory", d.pop("memory_bytes", None)), where),
        concurrent=bool(d.pop("concurrent", False)),
        simulated=True,
        host=str(d.pop("host", "cpu")),
        aliases=tuple(d.pop("aliases", ())),
        compute_dtype=compute,
        rounding=rounding,
        source=os.path.abspath(where) if os.path.exists(where) else where,
        ops=[],
    )
    if d:
        raise OptionsError(f"{where}: unknown [device] keys {sorted(d)}")
    defaults = dict(data.get("defaults", {}))
    bad = set(defaults) - {"dtypes", "layouts"}
    if bad:
        raise OptionsError(f"{where}: unknown [defaults] keys {sorted(bad)}")
    for i, entry in enumerate(data.get("ops", [])):
        assert dev.ops is not None
        dev.ops.append(_capability(entry, defaults, f"{where}: ops[{i}]", dev.name))
    return dev


def _capability(entry: dict[str, Any], defaults: dict, where: str, device: str) -> OpCapability:
    e = dict(entry)
    op = e.pop("op", None)
    if not isinstance(op, str) or not op:
        raise OptionsError(f"{where}: needs op = \"OpType\"")
    dtypes = e.pop("dtypes", defaults.get("dtypes"))
    # Layouts concern the activation tensor of layout-sensitive operators only.
    sensitive = layout_inputs(op, str(e.get("domain", "")))
    default_layouts = defaults.get("layouts", ["any"]) if sensitive else ["any"]
    layouts = tuple(e.pop("layouts", default_layouts))
    for lay in layouts:
        if lay not in _LAYOUTS:
            raise OptionsError(f"{where} ({op}): layout {lay!r} not one of {_LAYOUTS}")
    cons = tuple(
        Constraint.from_dict(c, f"{where} ({op})") for c in e.pop("constraints", ())
    )
    cap = OpCapability(
        op_type=op,
        domain=str(e.pop("domain", "")),
        name=str(e.pop("name", f"{device}.{op.lower()}")),
        dtypes=tuple(dtypes) if dtypes is not None else None,
        layouts=layouts,
        constraints=cons,
        note=str(e.pop("note", "")),
    )
    if e:
        raise OptionsError(f"{where} ({op}): unknown keys {sorted(e)}")
    return cap


def load_builtin_profiles() -> None:
    """Register every profile shipped in opwarden/devices/profiles/."""
    if not os.path.isdir(PROFILE_DIR):
        return
    for fn in sorted(os.listdir(PROFILE_DIR)):
        if fn.endswith(".toml"):
            load_profile(os.path.join(PROFILE_DIR, fn))
