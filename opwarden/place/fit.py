"""Memory fit: a device with limited activation memory refuses a partition that would not fit.

A partition is a run of consecutive nodes on one device. Its need is the peak of live
activation bytes while it runs (`activation_bytes`, the one place that estimate is made: the
memory planner may later give a tighter number). A partition past its device's ``memory_bytes``
moves, node by node, to the next device in the session's order that accepts it; each move is
recorded as a rejection with the numbers. Moving nodes splits and merges partitions, so the
check repeats until nothing moves (at most once per device, plus one).
"""

from __future__ import annotations

import numpy as np

from opwarden.contract import declared_value
from opwarden.devices import Device
from opwarden.dtypes import np_dtype_of
from opwarden.errors import UnsupportedOpError
from opwarden.ir.graph import Graph, Node, Value
from opwarden.place.partition import Assign, Partitioner


def _nbytes(v: Value, compute_dtype: str | None) -> int:
    shape = v.fact.shape
    if v.kind != "tensor" or shape is None or v.fact.dtype in (None, "string"):
        return 0
    n = 1
    for d in shape:
        d = declared_value(d)  # an estimate: a declaration counts as what it says
        n *= d if isinstance(d, int) else 1  # symbolic dims count as 1: a lower bound
    if compute_dtype is not None and v.fact.dtype in ("float32", "float64"):
        item = np.dtype(np.float16).itemsize if compute_dtype != "float32" else 4
    else:
        try:
            item = np_dtype_of(v.fact.dtype).itemsize
        except Exception:  # noqa: BLE001 - exotic dtypes count one byte
            item = 1
    return n * item


def activation_bytes(
    nodes: list[Node], compute_dtype: str | None = None, outputs: set[int] | None = None
) -> tuple[int, str]:
    """Peak of live activation bytes while `nodes` run in order, and the node at the peak.

    An activation is live from the first of these nodes that touches it to the last that reads
    it (to the end when the graph outputs it or a node outside reads it); weights (constants)
    are not activations.
    """
    inside = {id(n) for n in nodes}
    outputs = outputs or set()
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    size: dict[int, int] = {}
    for i, n in enumerate(nodes):
        for v in list(n.inputs) + list(n.outputs):
            if v is None or v.const is not None:
                continue
            first.setdefault(id(v), i)
            last[id(v)] = i
            size[id(v)] = _nbytes(v, compute_dtype)
            if id(v) in outputs or any(id(u) not in inside for u, _ in v.uses):
                last[id(v)] = len(nodes) - 1
    delta = [0] * (len(nodes) + 1)
    for k, b in size.items():
        delta[first[k]] += b
        delta[last[k] + 1] -= b
    peak, at, live = 0, "", 0
    for i, n in enumerate(nodes):
        live += delta[i]
        if live > peak:
            peak, at = live, n.name
    return peak, at


def fmt_bytes(n: int) -> str:
    """A byte count in words: '3.4 MiB', '840.8 KiB', '12 bytes'."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f}".rstrip("0").rstrip(".") + f" {unit}"
    return f"{n} bytes"


def runs(graph: Graph, assign: dict[int, Assign]) -> list[tuple[Device, list[Node]]]:
    """The partitions of `graph`: (device, its consecutive nodes), in order."""
    out: list[tuple[Device, list[Node]]] = []
    for n in graph.nodes:
        dev = assign[id(n)].device
        if out and out[-1][0] is dev:
            out[-1][1].append(n)
        else:
            out.append((dev, [n]))
    return out


def fit_memory(graph: Graph, p: Partitioner) -> None:
    """Move every partition that would not fit its device's memory to the next device."""
    outs = {id(v) for v in graph.outputs}
    for _ in range(len(p.devs) + 1):
        moved = False
        for dev, nodes in runs(graph, p.assign):
            if dev.memory_bytes is None:
                continue
            peak, at = activation_bytes(nodes, dev.compute_dtype, outs)
            if peak <= dev.memory_bytes:
                continue
            why = (
                f"{dev.name}: its partition of {len(nodes)} nodes ({nodes[0].name} .. "
                f"{nodes[-1].name}) needs {fmt_bytes(peak)} of activation memory at its "
                f"peak (node {at}), more than its {fmt_bytes(dev.memory_bytes)}"
            )
            for n in nodes:
                _move(n, dev, why, p)
            moved = True
        if not moved:
            return


def _move(n: Node, dev: Device, why: str, p: Partitioner) -> None:
    """Node `n` leaves `dev` (for `why`) for the first later device that accepts it."""
    a = p.assign[id(n)]
    a.rejected.append((dev.name, why))
    for d in p.devs[p.devs.index(dev) + 1 :]:
        ok, w = d.accepts(n, p.quarantine)
        if ok:
            a.device = d
            return
        a.rejected.append((d.name, w))
    raise UnsupportedOpError(
        f"node {n.label}: no device can run it: "
        + "; ".join(f"{d}: {r}" for d, r in a.rejected)
    )
