"""The device model: a named execution target with enumerable capabilities.

A device answers three questions a program can ask before touching hardware: which operators it
runs (``capabilities()``: per operator, variants with dtypes, layouts and attribute constraints),
whether it runs one particular node (``accepts(node)`` -> ok, reason in plain words) and in which
layouts (``layouts_for(node)``). A fused node a profile does not name is accepted when every
operator it computes is (``fused_pieces``: the decomposition its operator declares, ops/fused.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from opwarden.devices.constraints import Constraint
from opwarden.errors import OptionsError
from opwarden.native import status as _native_status
from opwarden.ops.base import REGISTRY
from opwarden.ops.select import sensitive_inputs


def data_dtype(node: Any) -> str | None:
    """The dtype a node computes in: input 0's (output 0's when it has no inputs)."""
    for v in node.inputs[:1]:
        if v is not None:
            return v.fact.dtype
    if node.outputs and node.outputs[0] is not None:
        return node.outputs[0].fact.dtype
    return None


_FLOATS = {"float16", "float32", "float64", "bfloat16"}


@dataclass
class OpCapability:
    """One way a device runs an operator: its dtypes, layouts and attribute constraints."""

    op_type: str
    domain: str = ""
    name: str = ""
    dtypes: tuple[str, ...] | None = None
    layouts: tuple[str, ...] = ("any",)
    constraints: tuple[Constraint, ...] = ()
    note: str = ""

    def check(self, node: Any, device: str) -> str | None:
        """None when this variant runs `node`, else why not (plain words)."""
        if self.dtypes is not None:
            dt = data_dtype(node)
            if dt is None:
                return f"{node.op_type}: dtype unknown before running; {device} needs a known dtype"
            if dt not in self.dtypes:
                return f"{node.op_type} dtype {dt}: {device} supports {', '.join(self.dtypes)} only"
            for i, v in enumerate(node.inputs[1:], 1):
                # Other float tensors (weights, scales) must also be in the device's dtypes;
                # integer inputs are shapes or indices, which every device reads.
                if v is not None and v.fact.dtype in _FLOATS and v.fact.dtype not in self.dtypes:
                    if _is_param(node, i):
                        continue
                    return (
                        f"{node.op_type} input {i} dtype {v.fact.dtype}: {device} supports "
                        f"{', '.join(self.dtypes)} only"
                    )
        for c in self.constraints:
            why = c.check(node, device)
            if why is not None:
                return why
        return None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dtypes": list(self.dtypes) if self.dtypes is not None else "any",
            "layouts": list(self.layouts),
            "constraints": [c.as_dict() for c in self.constraints],
            "note": self.note,
        }


def _is_param(node: Any, index: int) -> bool:
    """Is input `index` a parameter (Resize scales, ...) rather than data of the compute type?"""
    sch = node.schema
    if sch is None:
        return False
    p0, p = sch.input_param(0), sch.input_param(index)
    return p0 is not None and p is not None and p.type_str != p0.type_str


@dataclass
class Device:
    """An execution target.

    - ``kind``: "host" (runs NumPy variants registered for ``name``), "torch" (PyTorch variants),
      or "profile" (an accelerator described by a data file, executed by ``host`` with its
      numerics emulated, hence ``simulated``).
    - ``preferred_layout``: the layout its convolution-like kernels want ("NCHW" or "NHWC").
    - ``memory_bytes``: activation memory available (None: bounded by the host).
    - ``concurrent``: whether it runs independent operators at the same time.
    - ``ops``: for profiles, the operators it runs (several entries for one op are variants,
      tried in order); None for host/torch devices, whose capabilities are their registered
      kernel variants.
    - ``compute_dtype``: floats are computed in this dtype (profiles emulate it by rounding).
    - ``host_memory``: its tensors are host arrays (the torch device on the CPU): edges
      between it and the host need no DeviceCopy node, as no data moves.
    - ``defers``: for a device that shares host memory, the nodes it accepts but hands to a
      host device later in the session's provider list because the host kernels run them
      faster: node -> the reason in plain words (measured figures), or None to keep the node.
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
    ops: list[OpCapability] | None = None
    compute_dtype: str | None = None
    source: str | None = None
    defers: Callable[[Any], str | None] | None = None
    host_memory: bool = False
    # Where an emulated compute dtype is applied: "inputs" (tensors entering the device),
    # "weights" (constants, once at upload), "outputs" (every float output of every node),
    # "exit" (tensors leaving the device), "range" (every output keeps the dtype's range:
    # overflow to inf, underflow to 0, without rounding the mantissa).
    rounding: tuple[str, ...] = ("inputs", "weights", "outputs")

    # -- enumeration ---------------------------------------------------------------------------
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
            "compute_dtype": self.compute_dtype,
            "rounding": list(self.rounding) if self.compute_dtype else [],
            "source": self.source,
            "aliases": list(self.aliases),
            "host_memory": self.holds_host_arrays,
            "defers": self.defers is not None,
            "op_count": len({(o["domain"], o["op"]) for o in self.capabilities()}),
        }

    def capabilities(self) -> list[dict[str, Any]]:
        """Per operator: its variants on this device with dtypes, layouts and constraints."""
        if self.ops is not None:
            by_op: dict[tuple[str, str], list[OpCapability]] = {}
            for c in self.ops:
                by_op.setdefault((c.domain, c.op_type), []).append(c)
            return [
                {"op": op, "domain": dom or "ai.onnx", "variants": [c.as_dict() for c in cs]}
                for (dom, op), cs in by_op.items()
            ]
        rows: dict[tuple[str, str], dict[str, Any]] = {}
        for o in REGISTRY.all():
            for v in o.variants:
                if v.device != self.name:
                    continue
                row = rows.setdefault(
                    (o.domain, o.op_type),
                    {"op": o.op_type, "domain": o.domain or "ai.onnx", "variants": []},
                )
                d = v.describe()
                row["variants"].append(
                    {
                        "name": v.name,
                        "since": o.since,
                        "dtypes": d["dtypes"],
                        "layouts": [v.layout],
                        "constraints": (
                            [{"description": "a when-predicate on input facts and attributes"}]
                            if v.when is not None
                            else []
                        )
                        + [
                            {"attr": k, "description": a.describe()}
                            for k, a in o.contract.allowed.items()
                        ],
                        "reference": v.reference,
                    }
                )
        return list(rows.values())

    # -- decisions -----------------------------------------------------------------------------
    def accepts(self, node: Any, quarantine: Any = None) -> tuple[bool, str]:
        """(True, "") when this device runs `node` whole, else (False, reason in plain words)."""
        if self.ops is None:
            return self._host_accepts(node, quarantine)
        caps = [c for c in self.ops if c.op_type == node.op_type and c.domain == node.domain]
        if not caps:
            pieces = fused_pieces(node)
            if pieces is not None:
                return self._fused_accepts(node, pieces, quarantine)
            dom = f"{node.domain}::" if node.domain else ""
            return False, f"{self.name} does not run {dom}{node.op_type}"
        why = ""
        for c in caps:
            why = c.check(node, self.name) or ""
            if not why:
                break
        if why:
            return False, why
        host = get_device(self.host or "cpu")
        ok, hwhy = host.accepts(node, quarantine)
        if not ok:
            return False, f"{self.name} runs on {host.name}, which cannot: {hwhy}"
        if quarantine is not None:
            from opwarden.ops.select import select

            var, _ = select(node, host.name, "NCHW", quarantine)
            if var is not None and f"{var.name}@{self.name}" in quarantine:
                qname = f"{var.name}@{self.name}"
                return False, f"{qname} quarantined as unstable: {quarantine.reason(qname)}"
        return True, ""

    @property
    def holds_host_arrays(self) -> bool:
        """Are its tensors host arrays (the host itself, or ``host_memory``)?"""
        return self.kind == "host" or self.host_memory

    def shares_memory_with(self, other: Device) -> bool:
        """Do tensors cross between the two as they are (host arrays on both sides, no
        rounding on either)?"""
        return all(d.holds_host_arrays and not d.compute_dtype for d in (self, other))

    def deferral(self, node: Any) -> str | None:
        """Why this device hands `node` (which it accepts) to a later host device, or None."""
        return self.defers(node) if self.defers is not None else None

    def _host_accepts(self, node: Any, quarantine: Any) -> tuple[bool, str]:
        if self.layouts_for(node, quarantine):
            return True, ""
        from opwarden.ops.select import select

        if node.opdef is None:
            return False, f"no implementation of {node.op_type} at opset {node.opset}"
        mine = [v for v in node.opdef.variants if v.device == self.name]
        if not mine:
            return False, f"{self.name} has no kernel for {node.op_type}"
        _, rejected = select(node, self.name, "NCHW", quarantine)
        reasons = [f"{n}: {r}" for n, r in rejected if not r.startswith("device ")]
        return False, "; ".join(reasons) or f"no {self.name} variant accepts it"

    def layouts_for(self, node: Any, quarantine: Any = None) -> tuple[str, ...]:
        """Layouts in which this device can run `node`'s activation tensor (best first)."""
        sens = sensitive_inputs(node)
        if self.ops is not None:
            if not sens:
                return ("NCHW",)
            caps = [c for c in self.ops if c.op_type == node.op_type and c.domain == node.domain]
            lays = {lay for c in caps for lay in c.layouts} or {"any"}
            out = [lay for lay in ("NHWC", "NCHW") if lay in lays or "any" in lays]
            out.sort(key=lambda lay: lay != self.preferred_layout)
            return tuple(out)
        from opwarden.ops.select import select

        out = []
        for lay in ("NHWC", "NCHW") if sens else ("NCHW",):
            var, _ = select(node, self.name, lay, quarantine)
            if var is not None:
                out.append(lay)
        return tuple(out)

    def _fused_accepts(self, node: Any, pieces: list[Any], quarantine: Any) -> tuple[bool, str]:
        """A fused node runs here when each operator it fuses does."""
        for op_type, attrs, inputs in pieces:
            piece = _Probe(node, op_type, attrs, inputs)
            ok, why = self.accepts(piece, quarantine)
            if not ok:
                return False, f"{node.op_type} fuses {piece.op_type}: {why}"
        return True, ""

    def rounds(self, where: str) -> bool:
        """Does this (emulated) device round floats to its compute dtype at `where`?"""
        return (
            self.kind == "profile"
            and self.compute_dtype in ("float16", "bfloat16")
            and where in self.rounding
        )


class _Probe:
    """A stand-in node for one operator inside a fused node (capability checks only)."""

    def __init__(self, node: Any, op_type: str, attrs: dict[str, Any], inputs: list[Any]):
        self.op_type, self.domain, self.name = op_type, "", node.name
        self.opset = max(node.opset, 13)
        self.attrs = attrs
        self.inputs = inputs
        self.outputs = node.outputs[:1]
        try:
            self.opdef, self.schema = REGISTRY.resolve(op_type, "", self.opset)
        except Exception:  # noqa: BLE001 - an unknown piece is refused by the capability check
            self.opdef, self.schema = None, None

    @property
    def label(self) -> str:
        return f"{self.name!r} ({self.op_type})"


def fused_pieces(node: Any) -> list[Any] | None:
    """The operators a fused node computes, [(op_type, attrs, inputs)], as its operator
    declares them (OpDef.pieces, ops/fused.py); None for an operator that declares none."""
    opdef = REGISTRY.latest(node.op_type, node.domain)
    if opdef is None or opdef.pieces_fn is None:
        return None
    return opdef.pieces_fn(node)


_DEVICES: dict[str, Device] = {}


def register_device(dev: Device) -> Device:
    """Add (or replace) a device; its name and aliases become valid provider names."""
    _DEVICES[dev.name] = dev
    return dev


def _find(key: str) -> Device | None:
    for dev in _DEVICES.values():
        if dev.name.lower() == key or key in (a.lower() for a in dev.aliases):
            return dev
    return None


# Loaders of optional providers (the torch one), added by `opwarden/devices/__init__.py`: their
# modules import this registry, so the registry never imports them itself.
_OPTIONAL: list[tuple[tuple[str, ...], Callable[[], None]]] = []


def has_device(name: str) -> bool:
    """Is a device of this name registered (optional providers not tried)?"""
    return name in _DEVICES


def add_optional_provider(load: Callable[[], None], names: tuple[str, ...] = ()) -> None:
    """`load()` registers an optional provider when it can; called on first need, repeatedly.
    `names` (lower case, aliases included) are the devices it can provide: asking for one of
    them loads only this provider (importing torch takes seconds); empty: any name."""
    _OPTIONAL.append((tuple(n.lower() for n in names), load))


def _try_optional(name: str | None = None) -> None:
    for names, load in _OPTIONAL:
        if name is None or not names or name in names:
            load()


def get_device(name: str) -> Device:
    """The device called `name` (case-insensitive, aliases accepted)."""
    key = name.lower()
    dev = _find(key)
    if dev is None:
        _try_optional(key)
        dev = _find(key)
    if dev is None:
        raise OptionsError(f"unknown device {name!r}; available: {', '.join(_DEVICES)}")
    return dev


def devices() -> list[Device]:
    """Every device available in this process, in registration order."""
    _try_optional()
    return list(_DEVICES.values())


register_device(
    Device(
        "cpu",
        kind="host",
        description="NumPy on the host CPU (always present); kernel path: {reason}; BLAS "
        "threads: {blas_pool_reason}; integer GEMM: {qgemm_isa}; packed float GEMM: "
        "{sgemm_packed}".format(**_native_status()),
        aliases=("CPUExecutionProvider",),
    )
)
