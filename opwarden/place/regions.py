"""Compiled regions: maximal connected groups of nodes on a device that compiles them whole.

A device with ``make_region`` (the openvino device) runs each group of nodes placed on it as
one compiled model and one executed step. This rewrite, after partitioning and the memory fit
and before copies and layouts, groups them and replaces each group in the graph by one region
node (``OpenVINORegion``) whose inputs and outputs are the group's boundary values; its
``origin`` is every model node it covers (explain, the trace).

Grouping goes in topological order: a node joins the region of one of its producers on the
same device unless a path from that region reaches it through a node outside the region
(merging would make a cycle); otherwise it starts a region. `finish` then gives each region
placement its compiled variant (one name per region, which the guard quarantines on a fault)
and the CPU rerun as its fallback, and lists each covered node's own placement for explain.
A group the device fails to compile moves to the next device, the compile error as its
reason, through the same path as a memory refusal (fit.py). `pass_options` keeps opwarden's
fusions (operators of its own domain, which such a device
cannot read) away from sessions that use one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from opwarden.errors import KernelError
from opwarden.ir.graph import Graph, Node, Value
from opwarden.ops.base import Variant
from opwarden.place.fit import _move as move_on
from opwarden.place.partition import Assign, Partitioner, Placement


@dataclass
class Region:
    """One region: its node in the graph, the nodes it covers, their assignments."""

    node: Node
    device: Any
    members: list[Node]
    assigns: list[Assign]
    compiled: Any = None


@dataclass
class RegionPlacement(Placement):
    """A region's placement: the compiled step, with the nodes it covers."""

    covers: list[CoveredPlacement] = field(default_factory=list)
    precision: str = "f32"

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["covers"] = [p.node.name for p in self.covers]
        d["precision"] = self.precision
        deg = getattr(self.node.attrs.get("region"), "degrade", None)
        if self.precision != "f32":
            d["degrade"] = {"from": "f32", "to": self.precision, **(deg or {})}
        unavailable = getattr(self.node.attrs.get("region"), "precision_note", None)
        if unavailable:
            d["precision_note"] = unavailable
        return d


@dataclass
class CoveredPlacement(Placement):
    """A model node inside a region (explain's row for it)."""

    region: str = ""
    note: str | None = None  # how the device's kernel departs from the node's contract

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["region"] = self.region
        if self.note:
            d["note"] = self.note
        return d


def compiles_regions(dev: Any) -> bool:
    return callable(getattr(dev, "make_region", None))


def pass_options(options: Any, providers: list[str]) -> Any:
    """`options` for the graph passes: without the fusing (level 2) passes when a device that
    compiles regions is in the session (it fuses on its own, and cannot read opwarden's fused
    operators); the caller's object is never changed."""
    from opwarden.devices import get_device

    if getattr(options, "optimization_level", 1) < 2:
        return options
    if not any(compiles_regions(get_device(p)) for p in providers):
        return options
    import copy

    opts = copy.copy(options)
    opts.optimization_level = 1
    return opts


def _groups(graph: Graph, assign: dict[int, Assign]) -> list[list[Node]]:
    """Maximal connected, cycle-free groups of nodes on region-compiling devices."""
    region_of: dict[int, int] = {}  # id(node) -> group index
    reach: dict[int, frozenset[int]] = {}  # id(node) -> groups some path into it leaves
    groups: list[list[Node]] = []
    for n in graph.nodes:
        prods = [v.producer for v in n.inputs if v is not None and v.producer is not None]
        dev = assign[id(n)].device
        into: frozenset[int] = frozenset().union(*(reach.get(id(p), frozenset()) for p in prods))
        into |= {region_of[id(p)] for p in prods if id(p) in region_of}
        if compiles_regions(dev):
            joined = None
            for p in prods:
                r = region_of.get(id(p))
                if r is None or assign[id(groups[r][0])].device is not dev:
                    continue
                if all(region_of.get(id(q)) == r or r not in reach.get(id(q), frozenset())
                       for q in prods):
                    joined = r
                    break
            if joined is None:
                joined = len(groups)
                groups.append([])
            groups[joined].append(n)
            region_of[id(n)] = joined
        reach[id(n)] = into
    return _merge(graph, groups, assign)


def _merge(graph: Graph, groups: list[list[Node]], assign: dict[int, Assign]
           ) -> list[list[Node]]:
    """`groups` with every two that touch (an edge between them, or a value both read) merged
    while no path between them leaves them (which would make a cycle). The greedy pass above
    never joins two groups that exist already: the Q, K and V projections of one input each
    start one, so an encoder's first layer would be split in four."""
    while len(groups) > 1:
        pair = _mergeable(graph, groups, assign)
        if pair is None:
            break
        a, b = pair
        groups[a] = groups[a] + groups[b]
        del groups[b]
    pos = {id(n): i for i, n in enumerate(graph.nodes)}
    return [sorted(g, key=lambda n: pos[id(n)]) for g in groups]


def _mergeable(graph: Graph, groups: list[list[Node]], assign: dict[int, Assign]
               ) -> tuple[int, int] | None:
    """The first pair (a < b) of groups on one device that touch and merge without a cycle."""
    vert: dict[int, int] = {}  # id(node) -> vertex: its group, or G + its index
    for k, g in enumerate(groups):
        for n in g:
            vert[id(n)] = k
    for i, n in enumerate(graph.nodes):
        vert.setdefault(id(n), len(groups) + i)
    succ: dict[int, set[int]] = {}
    readers: dict[int, set[int]] = {}  # id(value) -> groups reading it
    for n in graph.nodes:
        vn = vert[id(n)]
        for v in n.inputs:
            if v is None:
                continue
            if vn < len(groups) and v.const is None:
                readers.setdefault(id(v), set()).add(vn)
            if v.producer is not None and vert[id(v.producer)] != vn:
                succ.setdefault(vert[id(v.producer)], set()).add(vn)
    desc = _descendants(succ, sorted(set(vert.values())))
    dev = [assign[id(g[0])].device for g in groups]
    touching = {tuple(sorted((a, b))) for a in range(len(groups)) for b in succ.get(a, ())
                if b < len(groups)}
    for rs in readers.values():
        rs_l = sorted(rs)
        touching.update((x, y) for i, x in enumerate(rs_l) for y in rs_l[i + 1:])
    for a, b in sorted(touching):
        if dev[a] is not dev[b]:
            continue
        if any(desc.get(s, 0) >> b & 1 for s in succ.get(a, ()) if s != b):
            continue
        if any(desc.get(s, 0) >> a & 1 for s in succ.get(b, ()) if s != a):
            continue
        return a, b
    return None


def _descendants(succ: dict[int, set[int]], verts: list[int]) -> dict[int, int]:
    """Vertex -> bitset of the vertices reachable from it, in a reverse topological order of
    the contracted graph (a DAG: the groups were built cycle-free)."""
    indeg = dict.fromkeys(verts, 0)
    for v in verts:
        for s in succ.get(v, ()):
            indeg[s] += 1
    order, ready = [], [v for v in verts if indeg[v] == 0]
    while ready:
        v = ready.pop()
        order.append(v)
        for s in succ.get(v, ()):
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    desc: dict[int, int] = {}
    for v in reversed(order):
        bits = 0
        for s in succ.get(v, ()):
            bits |= (1 << s) | desc[s]
        desc[v] = bits
    return desc


def _boundary(members: list[Node], graph: Graph) -> tuple[list[Value], list[Value]]:
    inside = {id(n) for n in members}
    made = {id(v) for n in members for v in n.outputs if v is not None}
    outs = {id(v) for v in graph.outputs}
    ins: list[Value] = []
    seen: set[int] = set()
    for n in members:
        for v in n.inputs:
            if v is not None and id(v) not in made and id(v) not in seen:
                seen.add(id(v))
                ins.append(v)
    res = [v for n in members for v in n.outputs if v is not None and (
        id(v) in outs or any(id(u) not in inside for u, _ in v.uses))]
    return ins, res


def _toposort(nodes: list[Node], graph: Graph) -> list[Node]:
    """`nodes` in an order where each runs after its producers (stable otherwise)."""
    made = {id(v): n for n in nodes for v in n.outputs if v is not None}
    order: list[Node] = []
    done: set[int] = set()
    state: dict[int, Any] = {}
    for root in nodes:
        stack = [(root, False)]
        while stack:
            n, ready = stack.pop()
            if id(n) in done:
                continue
            if ready:
                done.add(id(n))
                order.append(n)
                continue
            if state.get(id(n)):
                continue
            state[id(n)] = True
            stack.append((n, True))
            for v in reversed(n.inputs):
                p = made.get(id(v)) if v is not None else None
                if p is not None and id(p) not in done:
                    stack.append((p, False))
    return order


def group_regions(graph: Graph, part: Partitioner, options: Any, opsets: dict[str, int]
                  ) -> list[Region]:
    """Replace each group of nodes on a region-compiling device by its region node."""
    if not any(compiles_regions(d) for d in part.devs):
        return []
    regions: list[Region] = []
    replaced: dict[int, Node] = {}
    for k, members in enumerate(_groups(graph, part.assign)):
        dev = part.assign[id(members[0])].device
        ins, outs = _boundary(members, graph)
        name = f"{dev.name}_region_{k}"
        try:
            compiled = dev.make_region(  # type: ignore[attr-defined]
                name, members, ins, outs, opsets, options, part.quarantine)
        except KernelError as e:  # the device refused to compile it: the next device runs it
            for m in members:
                move_on(m, dev, f"{dev.name}: {e}", part)
            continue
        rop = dev.region_opdef  # type: ignore[attr-defined]  # a region device's (compiles_regions)
        produced: list[Value | None] = list(outs)
        node = Node(rop.op_type, rop.domain, name, [v for v in ins if v.const is None],
                    produced, {"region": compiled}, 1, opdef=rop, schema=rop.custom_schema)
        node.origin = [o for m in members for o in m.origins]
        regions.append(Region(node, dev, members, [part.assign[id(m)] for m in members],
                              compiled))
        part.assign[id(node)] = Assign(dev)
        for m in members:
            replaced[id(m)] = node
    if not regions:
        return []
    seq: list[Node] = []
    for n in graph.nodes:
        r = replaced.get(id(n), n)
        if r is n or r not in seq:
            seq.append(r)
    graph.nodes = _toposort(seq, graph)
    graph.rebuild_uses()
    return regions


def finish(out: list[Placement], regions: list[Region]) -> None:
    """Region placements get their compiled variant, the CPU rerun and their covered nodes."""
    by_node = {id(r.node): r for r in regions}
    for i, p in enumerate(list(out)):
        r = by_node.get(id(p.node))
        if r is None:
            continue
        c = r.compiled
        var = Variant(name=f"openvino.region.{c.key}", op=p.variant.op, fn=c.run,
                      device=r.device.name)
        var.provenance = c.provenance  # type: ignore[attr-defined]
        ref = Variant(name=f"openvino.region.{c.key}.cpu", op=p.variant.op, fn=c.cpu,
                      device="cpu", reference=True)
        ref.blame = c.blame  # type: ignore[attr-defined]
        note = getattr(r.device, "note", None)
        covers = [CoveredPlacement(m, r.device.name, var, {}, list(a.rejected),
                                   a.decomposed_from, a.reason(), region=r.node.name,
                                   note=note(m) if note else None)
                  for m, a in zip(r.members, r.assigns)]
        out[i] = RegionPlacement(p.node, p.device, var, {}, list(p.rejected),
                                 None, None, "region", "NCHW", False, ref, covers=covers,
                                 precision=c.precision)
    k = 0
    while k < len(out):
        p = out[k]
        if isinstance(p, RegionPlacement):
            out[k:k] = p.covers
            k += len(p.covers)
        k += 1


def calibrate(placements: list[Placement], run: Any, names: list[str] | None = None
              ) -> dict[str, Any]:
    """Measure every precision degrade on one calibration run: `run()` runs the session on
    the calibration feed. Each degraded region's outputs are compared with an f32 compile of
    the same region on the same inputs (kept in its `degrade`, which explain shows), and the
    model's outputs with those of a run whose degraded regions all compute in f32 (kept in
    the placement report, which the explain summary states); `names`: the outputs'."""
    import numpy as np

    regs = [p.node.attrs["region"] for p in placements
            if isinstance(p, RegionPlacement) and p.precision != "f32"]
    if not regs:
        return {"regions": [], "outputs": []}
    for r in regs:
        r.calib = {"mode": "capture"}
    try:
        got = run()
        for r in regs:
            r.calib["mode"] = "f32"
        want = run()
    finally:
        calibs = [r.calib for r in regs]
        for r in regs:
            r.calib = None
    per_region = []
    for r, c in zip(regs, calibs):
        if "args" not in c:
            continue  # not reached by this run (an If branch): nothing measured
        f32 = c.get("f32", {}).get(tuple(np.shape(a) for a in c["args"]))
        per_region.append({"region": r.name, "precision": r.precision,
                           **r.measure(c["args"], f32)})
    from opwarden.kernels.openvino.region import error_row, worst

    names = names or [f"output {i}" for i in range(len(got))]
    outs = [e for e in (error_row(n, g, w) for n, g, w in zip(names, got, want))
            if e is not None]
    result = {"regions": per_region, "outputs": outs, **worst(outs)}
    report = getattr(placements, "report", None)
    if isinstance(report, dict):
        report["calibration"] = result
    return result


def degrade_text(rows: list[dict[str, Any]], report: dict[str, Any]) -> str:
    """The explain summary's sentence on precision degrades ('' when none was asked for)."""
    degs = [r for r in rows if r.get("degrade")]
    notes = sorted({r["precision_note"] for r in rows if r.get("precision_note")})
    if notes:
        return f". Precision asked for but NOT APPLIED: {'; '.join(notes)}"
    if not degs:
        return ""
    to = sorted({r["degrade"]["to"] for r in degs})
    text = f". PRECISION DEGRADED to {', '.join(to)} in {len(degs)} region(s) (asked for)"
    cal = report.get("calibration")
    if cal and cal.get("outputs"):
        text += (f"; on the calibration feed the outputs differ from f32 by up to "
                 f"{cal['max_abs_error']:.3g} ({cal['x_zoo_tolerance']:.3g}x the zoo "
                 "tolerance)")
    else:
        text += "; not calibrated (session.calibrate(feed) measures it)"
    return text
