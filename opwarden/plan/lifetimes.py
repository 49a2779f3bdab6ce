"""Lifetime analysis of a compiled program: which tensors need memory, from when to when.

Rules:
- Graph inputs, captured outer values and constants are not planned (they live outside).
- Graph outputs are never planned: they are handed to the caller (or, in a loop body, carried to
  the next iteration) and must not be overwritten by the next run; any tensor a graph output is
  a view of is excluded with it.
- A view operator's output (contract ``must_alias``, or ``view_when`` holding for the input's
  static shape: Reshape, a Transpose that keeps the order of the non-1 dims) shares its input's
  buffer: the two are one group whose lifetime covers both.
- In place: a variant that accepts ``out=`` and whose contract allows (input i, output 0) to alias
  writes into input i's buffer when that input dies at this step and has the same size.
- Concat slices: a Concat whose output is planned gets each input that a planned step of a
  ``strided_out`` variant produces (as its output 0, read once by this Concat, neither a graph
  output nor part of a view group) bound as a slice of its own output along the concat axis:
  the producer writes straight into it and the Concat copies only the other inputs. The slices
  are part of the Concat's buffer, which then lives from the earliest producer to the last read
  of the Concat or of any slice. Concats nest (an input that is itself a Concat output becomes a
  slice, and its own slices slices of that). Slices never take part in in-place reuse.
- Values read by a subgraph (If/Loop/Scan bodies) live until the step that runs the subgraph.
- A tensor whose size depends on data (unknown or unresolved dims) is left to the kernel and
  listed as dynamic.
"""

from __future__ import annotations

import inspect
import math
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from opwarden.contract import Declared
from opwarden.dtypes import np_dtype_of
from opwarden.errors import ModelError
from opwarden.plan.planner import Buffer, MemoryPlan, align, build_plan


def resolve_shape(shape: Any, dims: dict[str, int]) -> tuple[int, ...] | None:
    """A concrete shape from a fact shape and bound symbolic dims (None if any is unknown)."""
    if shape is None:
        return None
    out = []
    for d in shape:
        if type(d) is Declared:  # sizes a buffer; its kernel gets it once a run confirms it
            d = d.value  # (Program.bind)
        if isinstance(d, int):
            out.append(d)
        elif isinstance(d, str) and d in dims:
            out.append(dims[d])
        else:
            return None
    return tuple(out)


def tensor_bytes(fact: Any, dims: dict[str, int]) -> tuple[int, tuple[int, ...], Any] | None:
    """(bytes, shape, numpy dtype) of a value with this fact, or None if not statically known."""
    if fact.dtype is None or fact.dtype == "string":
        return None
    shape = resolve_shape(fact.shape, dims)
    if shape is None:
        return None
    try:
        dt = np_dtype_of(fact.dtype)
    except (KeyError, TypeError):
        return None
    # Python ints: an int64 product of huge dims would wrap to a small size
    return math.prod(shape) * dt.itemsize, shape, dt


# Weak: a step's kernel may be a `specialize` closure holding packed weights, which must go
# with its session. Kernels that cannot be weakly referenced (builtins) are cached strongly;
# they live as long as their module anyway.
_WS_CACHE: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
_WS_STRONG: dict[Any, bool] = {}


def takes_workspace(fn: Any) -> bool:
    """Does a kernel function accept a ``workspace=`` keyword?"""
    try:
        got = _WS_CACHE.get(fn)
        weak = True
    except TypeError:  # not weakly referenceable (or unhashable)
        got = _WS_STRONG.get(fn) if getattr(fn, "__hash__", None) is not None else None
        weak = False
    if got is None:
        try:
            got = "workspace" in inspect.signature(fn).parameters
        except (TypeError, ValueError):
            got = False
        try:
            if weak:
                _WS_CACHE[fn] = got
            else:
                _WS_STRONG[fn] = got
        except TypeError:
            pass  # unhashable: asked again next time
    return got


# (bytes, shape, numpy dtype) of a statically sized tensor
Sized = tuple[int, tuple[int, ...], Any]


@dataclass
class Binding:
    """A plan made concrete for the executor: per step, where output 0 and workspace go.

    `out_region[step]` is (byte offset, shape, dtype, slices): the array of `shape` at the
    offset, then indexed by each (axis, start, stop) of `slices` in turn (empty unless output
    0 is a slice of a Concat's output).
    """

    plan: MemoryPlan
    out_region: dict[int, tuple[int, tuple[int, ...], Any, tuple]] = field(default_factory=dict)
    ws_region: dict[int, tuple[int, int]] = field(default_factory=dict)
    # steps that read an arena tensor but do not write into the arena: their results are
    # checked for being undeclared views of arena memory (those are copied out)
    view_checks: set[int] = field(default_factory=set)


def _reads(st: Any) -> list[int]:
    """Slots a step reads: its inputs and what its subgraphs capture."""
    out = [s for s in st.ins if s >= 0]
    for g in st.graphs.values():
        for _, caps in g if isinstance(g, list) else [g]:
            out.extend(caps)
    return out


def _views(st: Any, sized: dict[int, Sized]) -> list[tuple[int, int]]:
    """The (input, output) pairs of step st whose output is planned as a view of the input:
    its contract's ``must_alias`` pairs, or (0, 0) where ``view_when`` holds for input 0's
    static shape."""
    contract = st.placement.variant.op.contract
    views = contract.views(len(st.outs))
    if (not views and contract.view_when is not None and st.ins and st.ins[0] in sized
            and st.outs and st.outs[0] in sized
            and sized[st.ins[0]][0] == sized[st.outs[0]][0]
            and contract.view_when(st.placement.node.attrs, sized[st.ins[0]][1])):
        views = [(0, 0)]
    return views


class _Groups:
    def __init__(self) -> None:
        self.parent: dict[int, int] = {}

    def find(self, s: int) -> int:
        p = self.parent.setdefault(s, s)
        while p != self.parent.setdefault(p, p):
            p = self.parent[p]
        self.parent[s] = p
        return p

    def union(self, a: int, b: int) -> int:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra
        return ra


def analyze(program: Any, dims: dict[str, int], signature: tuple = ()) -> Binding:
    """Plan the intermediate tensors of `program` for the bound symbolic dims."""
    steps = program.steps
    values = program.values  # slot -> Value
    external = set(program.input_slots) | set(program.capture_slots)
    external |= {s for s, c in enumerate(program.template) if c is not None}
    outputs = set(program.output_slots)
    times = program.step_time  # step index, or wavefront when wavefronts run in parallel

    first, last = _live_ranges(steps, times, external)
    sized, dynamic = _sizes(values, first, dims)
    groups, members, bad_roots = _view_groups(steps, external, first, outputs, sized)
    # Concat slices (before in place, which then leaves the slices alone).
    slice_of = _concat_slices(steps, external, sized, groups, members, bad_roots)
    _in_place(program, external, first, last, sized, groups, members, bad_roots, slice_of)
    buffers, slot_buf = _group_buffers(values, first, last, sized, members, bad_roots, slice_of)
    ws_steps = _workspaces(steps, times, values, dims)
    buffers.extend(ws_steps.values())

    outputs_bytes = 0
    for s in outputs:
        v = values[s]
        tb = tensor_bytes(v.fact, dims) if v is not None and v.kind == "tensor" else None
        outputs_bytes += tb[0] if tb else 0

    plan = build_plan(
        buffers,
        [st.placement.node.name for st in steps],
        signature,
        dynamic,
        outputs_bytes,
    )
    plan.slices = {values[s].name: values[p].name for s, (p, *_r) in slice_of.items()}
    return _bind_regions(plan, steps, sized, slot_buf, ws_steps, slice_of)


def _live_ranges(steps: list[Any], times: list[int],
                 external: set[int]) -> tuple[dict[int, int], dict[int, int]]:
    """(slot -> time of its producer, slot -> time of its last reader) of every planned slot."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i0, st in enumerate(steps):
        i = times[i0]
        for s in st.outs:
            if s >= 0 and s not in external:
                first.setdefault(s, i)
                last.setdefault(s, i)
        for s in st.ins:
            if s >= 0 and s in first:
                last[s] = i
        for g in st.graphs.values():
            for _, caps in g if isinstance(g, list) else [g]:
                for s in caps:
                    if s in first:
                        last[s] = i
    return first, last


def _sizes(values: list[Any], first: dict[int, int],
           dims: dict[str, int]) -> tuple[dict[int, Sized], list[str]]:
    """(slot -> (bytes, shape, dtype) of the statically sized slots, names of the others)."""
    sized: dict[int, Sized] = {}
    dynamic: list[str] = []
    for s in first:
        v = values[s]
        tb = tensor_bytes(v.fact, dims) if v is not None and v.kind == "tensor" else None
        if tb is None:
            dynamic.append(v.name if v is not None else f"slot{s}")
        else:
            if any(d < 0 for d in tb[1]):
                # A fact written after loading (which refuses static negatives) resolved
                # negative for these dims; a view of that shape cannot exist.
                who = v.producer.label if v.producer is not None else "the graph"
                raise ModelError(
                    f"node {who}: output {v.name!r} would have shape {list(tb[1])} "
                    f"(fact {list(v.fact.shape)}) for input dims {dims}; a dimension is "
                    "negative"
                )
            sized[s] = tb
    return sized, dynamic


def _view_groups(
    steps: list[Any], external: set[int], first: dict[int, int], outputs: set[int],
    sized: dict[int, Sized],
) -> tuple[_Groups, dict[int, list[int]], set[int]]:
    """(the view groups, root -> member slots, roots of the groups kept out of the arena).

    An output that is a view of its input shares the input's buffer; a group holding a graph
    output, a slot of unknown size or a view of memory the plan does not own is not planned.
    """
    groups = _Groups()
    tainted: set[int] = set()
    for st in steps:
        for i, o in _views(st, sized):
            if i < len(st.ins) and o < len(st.outs) and st.ins[i] >= 0 and st.outs[o] >= 0:
                a, b = st.ins[i], st.outs[o]
                if a in external:
                    tainted.add(b)  # a view of memory we do not own
                    continue
                groups.union(a, b)
    for s in list(first):
        if s in outputs or s not in sized:
            tainted.add(s)
    bad_roots = {groups.find(s) for s in tainted}
    members: dict[int, list[int]] = {}
    for s in first:
        members.setdefault(groups.find(s), []).append(s)
    return groups, members, bad_roots


def _in_place(
    program: Any, external: set[int], first: dict[int, int], last: dict[int, int],
    sized: dict[int, Sized], groups: _Groups, members: dict[int, list[int]],
    bad_roots: set[int], slice_of: dict[int, tuple[int, int, int, int]],
) -> None:
    """In place: a step's output 0 joins the group of an input that dies at that step
    (`groups` and `members` updated)."""
    # The last step of each group, kept current as in place merges groups (a chain run in
    # place is one group of every value: recomputing it per step was quadratic).
    g_last = {root: max(last[m] for m in ms) for root, ms in members.items()}
    times = program.step_time
    for i0, st in enumerate(program.steps):
        i = times[i0]
        if program.level_width[i] != 1:
            continue  # a concurrent step of the same wavefront may still read the input
        var = st.placement.variant
        if not var.accepts_out or not st.outs or st.outs[0] < 0:
            continue
        if var.in_place_when is not None and not var.in_place_when(st.placement.node.attrs):
            continue
        o = st.outs[0]
        ro = groups.find(o)
        if ro in bad_roots or len(members.get(ro, ())) != 1:
            continue
        for a_i, b_o in var.op.contract.may_alias:
            if b_o != 0 or a_i >= len(st.ins) or st.ins[a_i] < 0:
                continue
            a = st.ins[a_i]
            if a in external or a not in first or a in slice_of:
                continue
            if any(s == a and (j, 0) not in var.op.contract.may_alias
                   for j, s in enumerate(st.ins)):
                # The same value also feeds an input that may not share the output (a
                # convolution of s plus the residual s): writing over it would change what
                # that input reads.
                continue
            ra = groups.find(a)
            if ra in bad_roots or g_last[ra] != i:
                continue
            if sized[a][0] != sized[o][0] or sized[a][2] != sized[o][2]:
                continue
            root = groups.union(ra, ro)
            merged = members.pop(ra)
            merged.extend(members.pop(ro))  # in place: the group grows by one per step
            members[root] = merged
            g_last[root] = max(g_last.pop(ra), g_last.pop(ro))
            break


def _group_buffers(
    values: list[Any], first: dict[int, int], last: dict[int, int], sized: dict[int, Sized],
    members: dict[int, list[int]], bad_roots: set[int],
    slice_of: dict[int, tuple[int, int, int, int]],
) -> tuple[list[Buffer], dict[int, Buffer]]:
    """(one buffer per clean group, by first use; slot -> its group's buffer)."""
    slot_buf: dict[int, Buffer] = {}
    buffers: list[Buffer] = []
    for root, ms in sorted(members.items(), key=lambda kv: min(first[m] for m in kv[1])):
        if root in bad_roots:
            continue
        ms = sorted(ms, key=lambda m: first[m])
        head = ms[0]
        if head in slice_of:  # a Concat's buffer: named and shaped after the outermost Concat
            head = _slice_chain(head, slice_of)[0]
        nbytes, shape, dt = sized[head]
        size = max(sized[m][0] for m in ms)
        prod = values[head].producer.name if values[head].producer is not None else "?"
        b = Buffer(
            name=values[head].name,
            producer=prod,
            nbytes=align(max(size, 1)),
            first=min(first[m] for m in ms),
            last=max(last[m] for m in ms),
            values=[values[m].name for m in ms],
            shape=shape,
            dtype=np.dtype(dt).name,
        )
        buffers.append(b)
        for m in ms:
            slot_buf[m] = b
    return buffers, slot_buf


def _workspaces(steps: list[Any], times: list[int], values: list[Any],
                dims: dict[str, int]) -> dict[int, Buffer]:
    """step -> its workspace buffer, for each step whose kernel asks for one (live for that
    step only)."""
    ws_steps: dict[int, Buffer] = {}
    for i, st in enumerate(steps):
        t = times[i]
        fn = st.fn
        if not takes_workspace(fn):
            continue
        shapes: list[tuple[int, ...]] = []
        for s in st.ins:
            if s < 0:
                shapes.append(())
                continue
            v = values[s]
            shp = resolve_shape(v.fact.shape, dims) if v is not None else None
            if shp is None:
                break
            shapes.append(shp)
        else:
            try:
                ws = st.placement.variant.workspace(shapes, st.kwargs)
            except Exception:  # noqa: BLE001 - a rule that cannot evaluate gives no workspace
                ws = 0
            if ws > 0:
                ws_steps[i] = Buffer(
                    name=f"{st.placement.node.name}:workspace",
                    producer=st.placement.node.name,
                    nbytes=align(ws),
                    first=t,
                    last=t,
                    kind="workspace",
                    materialized=True,
                    shape=(ws,),
                    dtype="uint8",
                )
    return ws_steps


def _bind_regions(
    plan: MemoryPlan, steps: list[Any], sized: dict[int, Sized], slot_buf: dict[int, Buffer],
    ws_steps: dict[int, Buffer], slice_of: dict[int, tuple[int, int, int, int]],
) -> Binding:
    """The placed plan as the executor binds it: per step, its output 0 and workspace regions,
    and the steps whose results are checked for undeclared views of the arena."""
    binding = Binding(plan)
    for i, st in enumerate(steps):
        var = st.placement.variant
        if (var.accepts_out and st.outs and st.outs[0] >= 0 and st.outs[0] in slot_buf
                and (0, 0) not in _views(st, sized)):
            o = st.outs[0]
            b = slot_buf[o]
            top, chain = _slice_chain(o, slice_of)
            binding.out_region[i] = (b.offset, sized[top][1], sized[o][2], chain)
            b.materialized = True
        elif any(s in slot_buf for s in _reads(st)):
            binding.view_checks.add(i)
        if i in ws_steps:
            wb = ws_steps[i]
            binding.ws_region[i] = (wb.offset, wb.nbytes)
    # Views of a buffer only come from declared view ops, which are grouped: no check needed.
    for i, st in enumerate(steps):
        if i in binding.view_checks:
            views = _views(st, sized)
            if views and all(st.ins[a] in slot_buf for a, _ in views
                             if a < len(st.ins) and st.ins[a] >= 0):
                binding.view_checks.discard(i)
    return binding


def _slice_chain(s: int, slice_of: dict[int, tuple[int, int, int, int]]) -> tuple[int, tuple]:
    """(outermost Concat output holding slot s, the (axis, start, stop) slices from it to s)."""
    chain: tuple = ()
    while s in slice_of:
        s, axis, lo, hi = slice_of[s]
        chain = ((axis, lo, hi),) + chain
    return s, chain


def _concat_slices(
    steps: list[Any],
    external: set[int],
    sized: dict[int, Sized],
    groups: _Groups,
    members: dict[int, list[int]],
    bad_roots: set[int],
) -> dict[int, tuple[int, int, int, int]]:
    """slot -> (Concat output slot, axis, start, stop): the Concat inputs bound as slices of its
    output. Merges each slice's group into the Concat's (`groups`, `members` updated)."""
    producer: dict[int, Any] = {}
    for st in steps:
        if st.outs and st.outs[0] >= 0:
            producer[st.outs[0]] = st
    # Slots alone in their view group (no Identity/view of them and they view nothing).
    solo = {ms[0] for ms in members.values() if len(ms) == 1 and ms[0] not in bad_roots}
    slice_of: dict[int, tuple[int, int, int, int]] = {}
    for st in steps:  # program order: inner Concats are claimed before the outer ones
        node, var = st.placement.node, st.placement.variant
        if node.op_type != "Concat" or node.domain not in ("", "ai.onnx"):
            continue
        if not var.accepts_out or not st.outs or st.outs[0] < 0 or st.outs[0] not in sized:
            continue
        c = st.outs[0]
        if groups.find(c) in bad_roots:
            continue
        _, cshape, cdt = sized[c]
        rank = len(cshape)
        axis = st.kwargs.get("axis", 1)
        if not isinstance(axis, int) or not -rank <= axis < rank:
            continue
        axis %= rank
        pos = 0
        picked: list[tuple[int, int, int]] = []
        for x in st.ins:
            tb = sized.get(x) if x >= 0 else None
            if tb is None or len(tb[1]) != rank:
                picked = []
                break  # the layout of the output is not statically known: leave it alone
            n = tb[1][axis]
            p = producer.get(x)
            if (n and x in solo and x not in slice_of and x not in external
                    and st.ins.count(x) == 1 and tb[2] == cdt
                    and p is not None and p.placement.variant.strided_out):
                picked.append((x, pos, pos + n))
            pos += n
        if pos != cshape[axis]:
            continue
        for x, lo, hi in picked:
            slice_of[x] = (c, axis, lo, hi)
            rc, rx = groups.find(c), groups.find(x)
            root = groups.union(rc, rx)
            merged = members.pop(rc, [])
            merged.extend(members.pop(rx, []))  # a Concat of many slices: no recopying
            members[root] = merged
    return slice_of
