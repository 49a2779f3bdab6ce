"""Partitioning: a device and a kernel variant for every node, with the reasons in words.

For each node, devices are tried in the session's order (``providers``): the first whose
capability accepts it (operator, dtype, attributes; see opwarden/devices) gets it, unless it
defers the node to a host device later in the list. A device that refuses a node may still run
it through its ONNX function body when it accepts every piece (decompose.py); otherwise the
node falls back to the next device, and each refusal is recorded in plain words. With
``fallback="forbid"`` one error lists every node that would leave the first device.

Once copies and layouts are settled (copies.py, layout.py), each node gets its kernel variant:
on its device, filtered by dtype, layout and `when` predicate, highest priority first (ties by
name). Profile devices run their host's variant wrapped to emulate their numerics (fp16
rounding) and, when the host has no NHWC kernel, an NHWC adapter. The order of the rewrites is
place_model's, in place/__init__.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from opwarden.devices import Device, get_device, sensitive_inputs
from opwarden.devices.copy import clamp_range, round_to
from opwarden.errors import UnsupportedOpError
from opwarden.ir.graph import Graph, Node
from opwarden.ops.base import Variant
from opwarden.ops.select import kernel_kwargs, select
from opwarden.place.decompose import (
    MAX_DECOMPOSE_DEPTH,
    build_pieces,
    decomposition,
    piece_types,
)
from opwarden.place.layout_axes import to_first, to_last

HOST = "cpu"
# Operators whose outputs only rearrange or select their inputs: on a device whose values are
# already rounded to its compute dtype they need no rounding.
EXACT_OPS = {
    "Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Concat", "Identity", "Dropout",
    "MaxPool", "GlobalMaxPool", "Relu", "Split", "Slice", "DepthToSpace", "SpaceToDepth",
    "DeviceCopy", "Gather", "Expand", "Tile",
}


@dataclass
class Placement:
    """Where and how one node runs, with the reasons behind the choice.

    ``rejected``: (variant or device, reason) for every candidate that lost; ``reason``: the
    plain-words reason this node is not on the first device, was decomposed, or was inserted;
    ``inserted``: "copy", "transpose" or "view" for nodes placement added; ``layout``: the
    layout of its activation tensor; ``ref_variant``: what a guard falls back to (the reference
    kernel, adapted to this node's layout and device numerics).
    """

    node: Node
    device: str
    variant: Variant
    kwargs: dict[str, Any]
    rejected: list[tuple[str, str]] = field(default_factory=list)
    decomposed_from: str | None = None
    reason: str | None = None
    inserted: str | None = None
    layout: str = "NCHW"
    simulated: bool = False
    ref_variant: Variant | None = None

    def describe(self) -> dict[str, Any]:
        return {
            "node": self.node.name,
            "name": self.node.name,
            "op_type": self.node.op_type,
            "domain": self.node.domain,
            "opset": self.node.opset,
            "device": self.device,
            "variant": self.variant.name,
            "reason": self.reason,
            "layout": self.layout,
            "inserted": self.inserted,
            "simulated": self.simulated,
            "rejected": [{"variant": n, "reason": r} for n, r in self.rejected],
            "decomposed_from": self.decomposed_from,
            "origin": self.node.origins,
        }


class Placements(list[Placement]):
    """The placements of a model, in order, plus ``report`` (partition, layout, copies)."""

    report: dict[str, Any]


# -- partitioning -------------------------------------------------------------------------------


@dataclass
class Assign:
    """A node's device so far, the (device, reason) refusals behind it, and what it is a piece
    of (the decomposed node's name, and why it was decomposed)."""

    device: Device
    rejected: list[tuple[str, str]] = field(default_factory=list)
    decomposed_from: str | None = None
    decomposed_why: str | None = None

    def reason(self) -> str | None:
        """The refusals and the decomposition in words (None: the first device took it)."""
        parts = []
        if self.rejected:
            parts.append("; ".join(r for _, r in self.rejected))
        if self.decomposed_why:
            parts.append(f"part of {self.decomposed_from}: {self.decomposed_why}")
        return " | ".join(parts) or None


class Partitioner:
    """Assigns every node of one graph to a device, decomposing where that lets a device run it."""

    def __init__(self, devs: list[Device], opsets: dict[str, int], quarantine: Any) -> None:
        self.devs = devs
        self.opsets = opsets
        self.quarantine = quarantine
        self.assign: dict[int, Assign] = {}

    def graph(self, graph: Graph) -> None:
        new_nodes: list[Node] = []
        for node in graph.nodes:
            new_nodes.extend(self.node(node, graph, 0))
        graph.nodes = new_nodes
        graph.rebuild_uses()

    def node(self, node: Node, graph: Graph, depth: int) -> list[Node]:
        """`node` assigned (its pieces when it is decomposed), at decomposition depth `depth`."""
        rejected: list[tuple[str, str]] = []
        protos: list[onnx.NodeProto] | None = None
        tried = False  # whether `protos` (and `trial`) were computed
        trial: list[Node] | None = None
        for k, dev in enumerate(self.devs):
            ok, why = dev.accepts(node, self.quarantine)
            if ok:
                deferred = self._deferred_to(node, k)
                if deferred is not None:
                    host, reason = deferred
                    rejected.append((dev.name, f"deferred to {host.name}: {reason}"))
                    dev = host
                self.assign[id(node)] = Assign(dev, rejected)
                return [node]
            rejected.append((dev.name, why))
            if depth >= MAX_DECOMPOSE_DEPTH:
                continue
            if not tried:
                tried = True
                protos = decomposition(node)
                trial = self._trial(node, protos, graph) if protos else None
            if protos and trial and all(dev.accepts(p, self.quarantine)[0] for p in trial):
                return self._expand(node, protos, graph, depth, rejected, dev)
        if not tried and depth < MAX_DECOMPOSE_DEPTH:
            protos = decomposition(node)
        if not protos:
            raise _unsupported(node, self.devs, rejected)
        return self._expand(node, protos, graph, depth, rejected, None)

    def _trial(
        self, node: Node, protos: list[onnx.NodeProto], graph: Graph
    ) -> list[Node] | None:
        """The pieces built into a scratch copy of the graph's names (for asking devices), or
        None when they cannot be built."""
        types = piece_types(node, protos, self.opsets)
        scratch = Graph(graph.name, values=dict(graph.values), outer=graph.outer)
        try:
            return build_pieces(protos, scratch, self.opsets, types)
        except Exception:  # noqa: BLE001 - a body we cannot build is no option
            return None

    def _deferred_to(self, node: Node, k: int) -> tuple[Device, str] | None:
        """(the host device after devs[k] in the list that takes `node`, devs[k]'s reason) when
        devs[k] defers it (see Device.defers), else None."""
        reason = self.devs[k].deferral(node)
        if reason is None:
            return None
        for host in self.devs[k + 1:]:
            if host.kind == "host" and host.accepts(node, self.quarantine)[0]:
                return host, reason
        return None

    def _expand(
        self, node: Node, protos: list[onnx.NodeProto], graph: Graph, depth: int,
        rejected: list[tuple[str, str]], dev: Device | None,
    ) -> list[Node]:
        """`node` decomposed into `graph`, each piece assigned in turn; `dev`: the device that
        runs every piece (None: no device runs the node whole)."""
        types = piece_types(node, protos, self.opsets)
        pieces = build_pieces(protos, graph, self.opsets, types)
        for p in pieces:  # each piece computes part of what the node stood for
            p.origin = node.origins
        if dev is not None:
            why = (
                f"{rejected[-1][1]}; decomposed through its ONNX function body, "
                f"which {dev.name} runs"
            )
        else:
            refused = "; ".join(f"{d}: {r}" for d, r in rejected)
            why = f"no device runs it whole ({refused}); decomposed through its ONNX function body"
        out: list[Node] = []
        for p in pieces:
            for q in self.node(p, graph, depth + 1):
                a = self.assign[id(q)]
                a.decomposed_from = a.decomposed_from or node.name
                a.decomposed_why = a.decomposed_why or why
                out.append(q)
        return out


def _unsupported(
    node: Node, devs: list[Device], rejected: list[tuple[str, str]]
) -> UnsupportedOpError:
    dts = [v.fact.dtype if v is not None else "-" for v in node.inputs]
    names = [d.name for d in devs]
    why = "; ".join(f"{d}: {r}" for d, r in rejected) or "no variant accepts it"
    if node.opdef is None and not rejected:
        why = "no implementation of this version"
    return UnsupportedOpError(
        f"node {node.label}: cannot run {node.domain + '::' if node.domain else ''}"
        f"{node.op_type} at opset {node.opset} with input dtypes {dts} on {names}: {why}; "
        "and ONNX defines no function body to decompose it"
    )


def forbid_fallback(graph: Graph, devs: list[Device], assign: dict[int, Assign]) -> None:
    """With fallback="forbid": one error listing every node that would leave the first device
    (after the memory fit), with its reason."""
    first = devs[0].name
    off = [n for n in graph.nodes if assign[id(n)].device.name != first]
    if not off:
        return
    lines = []
    for n in off:
        a = assign[id(n)]
        why = "; ".join(r for d, r in a.rejected if d == first) or a.reason() or "?"
        if a.decomposed_from:
            why = f"(piece of {a.decomposed_from}) {why}"
        lines.append(f"  - {n.label} -> {a.device.name}: {why}")
    raise UnsupportedOpError(
        f"fallback='forbid': {len(off)} of {len(graph.nodes)} nodes cannot run on {first}:\n"
        + "\n".join(lines)
    )


# -- variants -----------------------------------------------------------------------------------


def _emulated(var: Variant, node: Node, dev: Device, adapt: bool, layout: str) -> Variant:
    """`var` run for device `dev`: NHWC adapter (when the host kernel is NCHW) and rounding."""
    sens = sensitive_inputs(node) if adapt else ()
    exact = node.op_type in EXACT_OPS and dev.rounds("inputs") and dev.rounds("weights")
    rounding = dev.compute_dtype if dev.rounds("outputs") and not exact else ""
    ranged = (
        dev.compute_dtype
        if dev.rounds("range") and not rounding and node.op_type not in EXACT_OPS
        else ""
    )
    fn = var.fn
    if not sens and not rounding and not ranged:
        return var

    def run(*args: Any, **kw: Any) -> Any:
        if sens:
            args = tuple(
                np.transpose(a, to_first(a.ndim))
                if k in sens and isinstance(a, np.ndarray)
                else a
                for k, a in enumerate(args)
            )
        res = fn(*args, **kw)
        if sens:
            if isinstance(res, tuple):
                y = res[0]
                res = (np.ascontiguousarray(np.transpose(y, to_last(y.ndim))), *res[1:])
            else:
                res = np.ascontiguousarray(np.transpose(res, to_last(res.ndim)))
        if rounding:
            if isinstance(res, tuple):
                res = tuple(round_to(r, rounding) for r in res)
            else:
                res = round_to(res, rounding)
        elif ranged:
            if isinstance(res, tuple):
                res = tuple(clamp_range(r, ranged) for r in res)
            else:
                res = clamp_range(res, ranged)
        return res

    suffix = f"@{dev.name}" if dev.kind == "profile" else "@nhwc"
    return Variant(
        name=f"{var.name}{suffix}",
        op=var.op,
        fn=run,
        device=dev.name,
        dtypes=var.dtypes,
        layout=layout if sens else var.layout,
        priority=var.priority,
        when=var.when,
        reference=var.reference,
        accepts_out=False,
        wants_noutputs=var.wants_noutputs,
    )


def _choose(
    node: Node, dev: Device, layout: str, quarantine: Any, inserted: bool = False
) -> tuple[Variant, Variant, list]:
    """(variant, reference fallback, rejected) for a node on its device in its layout."""
    ref = next(v for v in node.opdef.variants if v.reference)
    if inserted and dev.kind != "profile":
        # Copies and layout conversions a device lacks a kernel for run on the host.
        var, rej = select(node, dev.name, layout, quarantine)
        return (var or ref), ref, rej
    if dev.kind == "profile":
        host = get_device(dev.host or HOST)
        var, rej = select(node, host.name, layout, quarantine)
        adapt = False
        if var is None and layout == "NHWC":
            var, rej2 = select(node, host.name, "NCHW", quarantine)
            rej = rej + rej2
            adapt = True
        if var is None:
            raise _unsupported(node, [dev], [(v, r) for v, r in rej])
        emu = _emulated(var, node, dev, adapt, layout)
        if quarantine is not None and emu.name in quarantine and var is not ref:
            rej.append((emu.name, f"quarantined as unstable: {quarantine.reason(emu.name)}"))
            emu, adapt = _emulated(ref, node, dev, layout == "NHWC", layout), layout == "NHWC"
        return emu, _emulated(ref, node, dev, layout == "NHWC", layout), rej
    var, rej = select(node, dev.name, layout, quarantine)
    if var is None:
        raise _unsupported(node, [dev], rej)
    fallback = ref
    if layout == "NHWC" and sensitive_inputs(node):
        fallback = _emulated(ref, node, dev, True, layout)
    return var, fallback, rej


# -- the entry point ----------------------------------------------------------------------------

def placements(
    graph: Graph, device_of: dict[int, Device], layouts: dict[int, str],
    assign: dict[int, Assign], copies: dict[int, str], conversions: dict[int, str],
    quarantine: Any,
) -> list[Placement]:
    """The placement of every node of `graph` on its device in its layout; `copies` and
    `conversions` (layout Transposes and views) are the inserted nodes, by id, with why."""
    out = []
    for node in graph.nodes:
        dev = device_of[id(node)]
        lay = layouts.get(id(node), "NCHW")
        var, ref, rej = _choose(
            node, dev, lay, quarantine, id(node) in copies or id(node) in conversions
        )
        a = assign.get(id(node))
        inserted: str | None = None
        reason: str | None
        if id(node) in copies:
            inserted, reason = "copy", copies[id(node)]
        elif id(node) in conversions:
            inserted = "transpose" if node.op_type == "Transpose" else "view"
            reason = conversions[id(node)]
        else:
            reason = a.reason() if a is not None else None
        out.append(
            Placement(
                node, dev.name, var, kernel_kwargs(node),
                (a.rejected if a is not None else []) + rej,
                a.decomposed_from if a is not None else None,
                reason, inserted, lay, dev.simulated, ref,
            )
        )
    return out


def place_graph(
    graph: Graph, devices: list[str], opsets: dict[str, int], depth: int = 0, quarantine: Any = None
) -> list[Placement]:
    """Place every node of `graph` on host devices in NCHW (subgraphs); placements in order."""
    devs = [get_device(d) for d in devices]
    devs = [d for d in devs if d.kind != "profile"] or [get_device(HOST)]
    part = Partitioner(devs, opsets, quarantine)
    part.graph(graph)
    out = []
    for node in graph.nodes:
        a = part.assign[id(node)]
        var, ref, rej = _choose(node, a.device, "NCHW", quarantine)
        out.append(
            Placement(node, a.device.name, var, kernel_kwargs(node), a.rejected + rej,
                      a.decomposed_from, a.reason(), ref_variant=ref)
        )
    return out
