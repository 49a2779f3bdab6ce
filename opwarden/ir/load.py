"""Load an ONNX model (path, bytes or ModelProto) into the IR, with facts from shape inference."""

from __future__ import annotations

import functools
import heapq
import mmap
import os
import warnings
from dataclasses import dataclass, field
from typing import Any

import onnx
from google.protobuf.message import DecodeError
from onnx import numpy_helper

from opwarden.contract import TensorFact, declared_value, has_declared, mark_declared
from opwarden.dtypes import dtype_name, np_dtype
from opwarden.errors import ModelError
from opwarden.ir.functions import inline
from opwarden.ir.graph import Graph, Model, Node, Value
from opwarden.ir.tensors import payload_array, to_array
from opwarden.ir.wire import Payload, split_payloads
from opwarden.ops.schema import attr_value, canonical_domain

MAX_FUNCTION_DEPTH = 32
# Inlining model-local functions turns a few written nodes into many: functions that each call
# the next twice double the count per level, so a 2 KB file can ask for 2^depth nodes, and each
# costs ~50-150 us to load. Refused: more than MAX_INLINED_NODES in all, or more than
# MAX_INLINE_GROWTH times the nodes the model writes once past INLINE_GROWTH_FLOOR (real models
# that reuse functions stay far below both: a 100-layer network calling one layer function
# grows about 100-fold but to a few 10^4 nodes).
MAX_INLINED_NODES = 1_000_000
MAX_INLINE_GROWTH = 100
INLINE_GROWTH_FLOOR = 100_000


@dataclass
class Source:
    """A parsed model and where its bytes came from."""

    proto: onnx.ModelProto
    base_dir: str | None = None
    owned: bool = False  # the loader parsed the protobuf itself (raw bytes may be moved out)
    buffer: Any = None  # the serialized model (mmap or bytes) that `payloads` point into
    payloads: dict[str, Payload] = field(default_factory=dict)


def _read_buffer(source: Any) -> tuple[Any, str | None]:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return (source if isinstance(source, bytes) else bytes(source)), None
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if not os.path.exists(path):
            raise ModelError(f"model file not found: {path!r}")
        if os.path.isdir(path):
            raise ModelError(f"model path is a directory, not a file: {path!r}")
        base_dir = os.path.dirname(os.path.abspath(path))
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return b"", base_dir
            # Weights become views over this read-only mapping: pages are shared with the page
            # cache and only what the run touches becomes resident.
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), base_dir
    raise ModelError(
        f"cannot load a model from {type(source).__name__}; "
        "expected a path, bytes or onnx.ModelProto"
    )


def read_source(source: Any) -> Source:
    """Parse a path, bytes or ModelProto, leaving large weight payloads in the source buffer."""
    if isinstance(source, onnx.ModelProto):
        return Source(source)
    buf, base_dir = _read_buffer(source)
    payloads: dict[str, Payload] = {}
    data: Any = buf
    try:
        split = split_payloads(buf)
    except ModelError:
        split = None  # let the protobuf parser give its own diagnosis
    if split is not None:
        data, payloads = split
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data if isinstance(data, bytes) else bytes(data))
    except (DecodeError, ValueError, RuntimeError) as e:
        raise ModelError(f"not a valid ONNX model (protobuf parse failed: {e})") from None
    if not proto.HasField("graph"):
        raise ModelError("not a valid ONNX model: it has no graph (empty, truncated or not ONNX)")
    if proto.ir_version <= 0:
        raise ModelError(f"not a valid ONNX model: ir_version is {proto.ir_version}")
    return Source(proto, base_dir, True, buf if payloads else None, payloads)


def type_fact(tp: onnx.TypeProto) -> tuple[str, TensorFact]:
    """(kind, fact) of a TypeProto."""
    which = tp.WhichOneof("value")
    if which == "tensor_type" or which == "sparse_tensor_type":
        tt = getattr(tp, which)
        dtype = None
        if tt.elem_type:
            try:
                dtype = dtype_name(np_dtype(tt.elem_type))
            except KeyError:
                dtype = None
        shape = None
        if tt.HasField("shape"):
            shape = tuple(
                d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                for d in tt.shape.dim
            )
        return ("tensor" if which == "tensor_type" else "sparse"), TensorFact(dtype, shape)
    kinds = {"sequence_type": "sequence", "optional_type": "optional", "map_type": "map"}
    return kinds.get(which or "", "unknown"), TensorFact(None, None)


SMALL_INITIALIZER = 4096  # elements; larger weights are given to shape inference as typed inputs


def _light_copy(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The model without big weight payloads, for shape inference (which serializes it)."""
    light = onnx.ModelProto()
    light.ir_version = max(proto.ir_version, 4)
    light.opset_import.extend(proto.opset_import)
    light.functions.extend(proto.functions)
    src, g = proto.graph, light.graph
    g.name = src.name
    g.node.extend(src.node)
    g.output.extend(src.output)
    g.value_info.extend(src.value_info)
    declared = {i.name for i in src.input}
    g.input.extend(src.input)
    for t in src.initializer:
        n = 1
        for d in t.dims:
            n *= d
        if n <= SMALL_INITIALIZER and t.data_location != onnx.TensorProto.EXTERNAL:
            g.initializer.append(t)
        elif t.name not in declared:
            g.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return light


@dataclass
class Inferred:
    """What shape inference tells about a model's values, and how its declarations fared.

    `types`: the verified types by name: inferred from the graph inputs, initializers and each
    operator's shape rule, with the declared value_info and graph-output shapes left out
    (declared element types kept). `hints`: the facts planning and the passes see where the
    declarations say more than inference could check (a custom operator without a rule, a dim
    inference left unknown), those dims marked declared-only (DeclaredDim). `notes`: one line
    per declaration that contradicts inference (the inferred fact wins, as in ONNX Runtime's
    lenient merge). `declared`: graph outputs whose declared shape is more than was verified."""

    types: dict[str, onnx.TypeProto]
    hints: dict[str, tuple] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    declared: dict[str, tuple] = field(default_factory=dict)


def _tensor_shape(tp: onnx.TypeProto | None) -> tuple | None:
    """A tensor type's shape as type_fact reads it (None: not a tensor, or no shape)."""
    which = tp.WhichOneof("value") if tp is not None else None
    if which not in ("tensor_type", "sparse_tensor_type"):
        return None
    tt = getattr(tp, which)
    if not tt.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                 for d in tt.shape.dim)


def _strip_declared(g: onnx.GraphProto) -> dict[str, tuple]:
    """Clear the shapes of `g`'s value_info and outputs (element types stay: inference needs
    them where it cannot tell, custom operators); returns the declared shapes by name."""
    declared: dict[str, tuple] = {}
    for vi in list(g.value_info) + list(g.output):
        which = vi.type.WhichOneof("value")
        if which not in ("tensor_type", "sparse_tensor_type"):
            continue
        tt = getattr(vi.type, which)
        if tt.HasField("shape"):
            declared.setdefault(vi.name, _tensor_shape(vi.type))
            tt.ClearField("shape")
    return declared


def _set_shape(g: onnx.GraphProto, name: str, elem: int, shape) -> None:
    """Give inference `shape` for `name` (a graph output's type, else a value_info entry)."""
    vi = onnx.helper.make_tensor_value_info(name, elem, list(shape))
    outs = [vo for vo in g.output if vo.name == name]
    if outs:
        outs[0].CopyFrom(vi)
        return
    kept = [v for v in g.value_info if v.name != name]
    del g.value_info[:]
    g.value_info.extend(kept)
    g.value_info.append(vi)


def _run_inference(light: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    return _types(onnx.shape_inference.infer_shapes(
        light, check_type=False, strict_mode=False).graph)


def _merge_declared(decl: tuple, inf: tuple | None) -> tuple[str, tuple | None]:
    """How a declared shape compares with the inferred one: ("conflict", None) when they
    cannot both hold; ("adds", merged) when the declaration gives dims inference left
    unknown (merged: inferred dims, declared ones where inference knows none); ("refines",
    None) when it only pins inferred symbols ('N' -> 7: the symbol, bound from the feeds, is
    the checked fact); ("agrees", None) otherwise."""
    if inf is None:
        return "adds", decl
    if len(decl) != len(inf):
        return "conflict", None
    merged, adds, refines = [], False, False
    for d, i in zip(decl, inf):
        if isinstance(i, int):
            if isinstance(d, int) and d != i:
                return "conflict", None
            merged.append(i)
        elif isinstance(i, str):
            refines = refines or isinstance(d, int)
            merged.append(i)
        else:
            adds = adds or d is not None
            merged.append(d)
    if adds:
        return "adds", tuple(merged)
    return ("refines" if refines else "agrees"), None


def _infer(proto: onnx.ModelProto) -> Inferred:
    """Types of every value shape inference can tell (failures leave facts unknown), checked
    against the model's declarations (see Inferred)."""
    try:
        light = _light_copy(proto)
        declared = _strip_declared(light.graph)
        types = _run_inference(light)
    except Exception:  # noqa: BLE001 - onnx's inference raises on many malformed models
        # Nothing verified: every declaration stands, as a hint only.
        from opwarden.contract import mark_declared

        types = _types(proto.graph)
        hints = {vi.name: mark_declared(_tensor_shape(vi.type))
                 for vi in list(proto.graph.value_info) + list(proto.graph.output)
                 if _tensor_shape(vi.type) is not None}
        return Inferred(types, hints)
    fixes = _ceil_pool_fixes(light.graph, types)
    if fixes:
        # Inference again with the pools' true shapes given: everything after them follows.
        for name, (elem, shape) in fixes.items():
            _set_shape(light.graph, name, elem, shape)
        try:
            types = _run_inference(light)
        except Exception:  # noqa: BLE001 - keep the first answer; the builder corrects the pools
            pass
    return _check_declared(types, declared, {o.name for o in proto.graph.output})


def _check_declared(types: dict[str, onnx.TypeProto], declared: dict[str, tuple],
                    outputs: set[str]) -> Inferred:
    """Compare the declarations with the verified `types`. Declared dims inference left
    unknown become hints (not propagated by a second inference: nothing plans from a hint,
    and exporters declare the values that follow too)."""
    from opwarden.contract import mark_declared

    out = Inferred(types)
    adds: dict[str, tuple] = {}
    for name, decl in declared.items():
        if decl is None:
            continue
        inf = _tensor_shape(types.get(name))
        verdict, merged = _merge_declared(decl, inf)
        if verdict == "conflict":
            what = "graph output" if name in outputs else "value"
            out.notes.append(
                f"{what} {name!r}: the model declares shape {list(decl)}, but shape inference "
                f"gives {list(inf)}; the inferred shape is used")
            continue
        if verdict == "adds":
            adds[name] = merged
        if name in outputs and verdict in ("adds", "refines"):
            out.declared[name] = decl
    for name, shape in adds.items():
        inf = _tensor_shape(types.get(name))
        axes = None if inf is None else {k for k, i in enumerate(inf) if i is None}
        out.hints[name] = mark_declared(shape, axes)
    return out


def _types(g: onnx.GraphProto) -> dict[str, onnx.TypeProto]:
    return {vi.name: vi.type for vi in list(g.input) + list(g.value_info) + list(g.output)
            if vi.HasField("type")}


# The attribute types pool geometry reads; others (tensors, which could name external files)
# are left for the builder and validation.
_GEOMETRY_ATTRS = (onnx.AttributeProto.INT, onnx.AttributeProto.INTS, onnx.AttributeProto.STRING)


def _ceil_pool_fixes(g: onnx.GraphProto, types: dict) -> dict[str, tuple[int, list[int]]]:
    """Outputs of ceil_mode pools whose inferred shape is not the kernels' (see
    _pool_ceil_facts): name -> (element type, shape)."""
    fixes: dict[str, tuple[int, list[int]]] = {}
    for n in g.node:
        if canonical_domain(n.domain) != "" or n.op_type not in _POOLS or not n.input:
            continue
        t = types.get(n.input[0])
        if t is None or not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
            continue
        dims = t.tensor_type.shape.dim
        if any(not d.HasField("dim_value") for d in dims):
            continue
        a = {at.name: attr_value(at) for at in n.attribute if at.type in _GEOMETRY_ATTRS}
        shape = _ceil_pool_shape(a, [d.dim_value for d in dims])
        if shape is None:
            continue
        shape = list(shape)
        for k, o in enumerate(n.output):
            ot = types.get(o) if o else None
            if ot is None or not ot.HasField("tensor_type"):
                continue
            have = [d.dim_value if d.HasField("dim_value") else None
                    for d in ot.tensor_type.shape.dim]
            if have != shape:
                elem = ot.tensor_type.elem_type or (
                    onnx.TensorProto.INT64 if k else t.tensor_type.elem_type)
                fixes[o] = (elem, shape)
    return fixes


def _free_names(g: onnx.GraphProto) -> set[str]:
    """Names a subgraph reads but does not define (outer-scope references)."""
    defined = {i.name for i in g.input} | {i.name for i in g.initializer}
    used: set[str] = set()
    for n in g.node:
        used.update(x for x in n.input if x)
        for a in n.attribute:
            for sub in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
                used |= _free_names(sub)
        defined.update(o for o in n.output if o)
    used.update(o.name for o in g.output)
    return used - defined


def _calls(n: onnx.NodeProto) -> list[onnx.GraphProto]:
    return [sub for a in n.attribute
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs))]


def inlined_size(
    nodes, functions: dict[tuple[str, str], onnx.FunctionProto], memo: dict | None = None,
    active: tuple = (),
) -> int:
    """How many nodes `nodes` become once every model-local function call is inlined,
    subgraphs included. Each function is counted once (memo), so this is linear in the model's
    size even when inlining it is exponential; ModelError for a function that calls itself."""
    memo = {} if memo is None else memo
    total = 0
    for n in nodes:
        key = (n.domain, n.op_type)
        fn = functions.get(key)
        if fn is None:
            total += 1 + sum(inlined_size(sub.node, functions, memo, active)
                             for sub in _calls(n))
            continue
        if key in active:
            chain = " -> ".join(f"{d}::{o}" for d, o in (*active, key))
            raise ModelError(f"model-local function {key[0]}::{key[1]} calls itself ({chain})")
        if key not in memo:
            memo[key] = inlined_size(fn.node, functions, memo, (*active, key))
        total += memo[key]
    return total


def _written(nodes) -> int:
    return sum(1 + sum(_written(sub.node) for sub in _calls(n)) for n in nodes)


def check_inlined_size(proto: onnx.ModelProto) -> int:
    """Refuse, before inlining anything, a model whose function calls expand past
    MAX_INLINED_NODES, or grow it more than MAX_INLINE_GROWTH-fold beyond
    INLINE_GROWTH_FLOOR nodes. Returns the node count after inlining (0: no functions)."""
    functions = {(f.domain, f.name): f for f in proto.functions}
    if not functions:
        return 0
    memo: dict = {}
    total = inlined_size(proto.graph.node, functions, memo)
    written = _written(proto.graph.node) + sum(_written(f.node) for f in proto.functions)
    limit = min(MAX_INLINED_NODES, max(INLINE_GROWTH_FLOOR, MAX_INLINE_GROWTH * written))
    if total > limit:
        key, size = max(memo.items(), key=lambda kv: kv[1])
        raise ModelError(
            f"inlining the model-local functions would turn the {written:,} nodes the model "
            f"writes into {total:,}, more than the limit of {limit:,}; function "
            f"{key[0]}::{key[1]} alone expands to {size:,} nodes per call"
        )
    return total


def _expand_functions(
    nodes: list[onnx.NodeProto],
    functions: dict[tuple[str, str], onnx.FunctionProto],
    depth: int = 0,
    budget: list[int] | None = None,
) -> list[onnx.NodeProto]:
    """`nodes` with model-local function calls inlined. `budget` ([nodes left]) is shared by
    every graph of one load: the backstop behind check_inlined_size for what it cannot see
    (graph attributes a call passes into a function body)."""
    out: list[onnx.NodeProto] = []
    for n in nodes:
        fn = functions.get((n.domain, n.op_type))
        if fn is None:
            out.append(n)
            continue
        if depth >= MAX_FUNCTION_DEPTH:
            raise ModelError(f"model-local function {n.domain}::{n.op_type} recurses too deeply")
        if budget is not None:
            budget[0] -= len(fn.node)
            if budget[0] < 0:
                raise ModelError(
                    f"inlining model-local function {n.domain}::{n.op_type} (node "
                    f"{n.name or n.op_type!r}) goes past the limit of {MAX_INLINED_NODES:,} "
                    "inlined nodes"
                )
        out.extend(_expand_functions(inline(n, fn), functions, depth + 1, budget))
    return out


def _toposort(nodes: list[onnx.NodeProto], available: set[str], graph_name: str):
    """Stable topological order; raises ModelError on cycles or values produced twice.

    Kahn's algorithm over a heap of ready indices: among the nodes whose inputs are ready the
    earliest in file order goes first, so file order is kept wherever the dependencies allow
    (and a file already in order comes back unchanged), in O(n log n)."""
    producer: dict[str, int] = {}
    for i, n in enumerate(nodes):
        for o in n.output:
            if o:
                if o in producer or o in available:
                    raise ModelError(
                        f"graph {graph_name!r}: value {o!r} is produced twice "
                        f"(by node {n.name or n.op_type!r})"
                    )
                producer[o] = i
    waiting = [0] * len(nodes)  # producers not yet placed
    users: list[list[int]] = [[] for _ in nodes]
    for i, n in enumerate(nodes):
        names = {x for x in n.input if x}
        for sub in _calls(n):
            names |= _free_names(sub)
        deps = {producer[x] for x in names if x in producer}
        waiting[i] = len(deps)
        for d in deps:
            users[d].append(i)
    ready = [i for i, w in enumerate(waiting) if w == 0]  # ascending: already a heap
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(order) < len(nodes):
        stuck = nodes[next(i for i, w in enumerate(waiting) if w)]
        raise ModelError(
            f"graph {graph_name!r} has a cycle through node {stuck.name or stuck.op_type!r}"
        )
    return [nodes[i] for i in order]


class GraphBuilder:
    def __init__(
        self, opsets: dict[str, int], functions, base_dir, owned, inferred: Inferred | dict,
        source=None
    ) -> None:
        if not isinstance(inferred, Inferred):  # types alone (decompositions, runtime.place)
            inferred = Inferred(inferred)
        self.opsets = opsets
        self.functions = functions
        self.base_dir = base_dir
        self.owned = owned
        self.types = inferred.types
        self.hints = inferred.hints
        self.notes = list(inferred.notes)
        self.source = source
        self.names: set[str] = set()
        self.budget = [MAX_INLINED_NODES]

    def _tensor_reader(self, held: str):
        """A tensor attribute's converter: external data from the model's folder only (onnx's
        own reader would resolve it against the current directory), the rest as before."""
        def read(t: onnx.TensorProto):
            if t.data_location == onnx.TensorProto.EXTERNAL:
                return to_array(t, self.base_dir, where=f"{held}, tensor {t.name!r}")
            return numpy_helper.to_array(t)
        return read

    def graph(self, gp: onnx.GraphProto, outer: Graph | None) -> Graph:
        g = Graph(gp.name or "graph", outer=outer)
        payloads = self.source.payloads if self.source is not None and outer is None else {}
        where = "" if outer is None else f" of graph {g.name!r}"
        for t in gp.initializer:
            pl = payloads.get(t.name)
            if pl is not None:
                arr = payload_array(t, self.source.buffer, pl)
            else:
                arr = to_array(t, self.base_dir, self.owned, f"initializer {t.name!r}{where}")
            g.add_value(t.name, const=arr, fact=TensorFact(dtype_name(arr.dtype), arr.shape))
        for st in gp.sparse_initializer:
            arr = _sparse_to_dense(st, self.base_dir,
                                   f"sparse initializer {st.values.name!r}{where}")
            g.add_value(
                st.values.name, const=arr, fact=TensorFact(dtype_name(arr.dtype), arr.shape)
            )
        for vi in gp.input:
            if vi.name in g.values:
                g.initializers[vi.name] = g.values[vi.name]
                g.inputs.append(g.values[vi.name])
                continue
            kind, fact = type_fact(vi.type)
            tp = None
            if kind != "tensor":  # a copy: a submessage would keep the whole model alive
                tp = onnx.TypeProto()
                tp.CopyFrom(vi.type)
            g.inputs.append(g.add_value(vi.name, kind=kind, fact=fact, type_proto=tp))
        for name, v in g.values.items():
            if v.const is not None:
                g.initializers[name] = v
        # The main graph's declared value_info was checked against inference (self.types,
        # self.hints); a subgraph's is read as declared, its dims declared-only.
        local_types = {vi.name: vi.type for vi in gp.value_info} if outer is not None else {}
        protos = _expand_functions(list(gp.node), self.functions, budget=self.budget)
        avail = set(g.values)
        corrected: set[int] = set()
        for i, n in enumerate(_toposort(protos, avail, g.name)):
            g.nodes.append(self.node(n, g, i, local_types))
            _pool_ceil_facts(g.nodes[-1], corrected)
            _custom_infer(g.nodes[-1], self.notes)
            _check_dims(g.nodes[-1])
        for vo in gp.output:
            v = g.lookup(vo.name)
            if v is None:
                raise ModelError(
                    f"graph {g.name!r}: output {vo.name!r} is not produced by any node"
                )
            kind, fact = type_fact(vo.type)
            if v.fact.dtype is None and fact.dtype is not None:
                # only the declaration knows it (the main graph's went through _infer)
                v.fact = TensorFact(fact.dtype, mark_declared(fact.shape))
                v.kind = kind
            g.outputs.append(v)
        g.rebuild_uses()
        return g

    def node(
        self, n: onnx.NodeProto, g: Graph, index: int, local_types, reuse: bool = False
    ) -> Node:
        for field_ in (n.op_type, n.domain, n.name, *n.input, *n.output):
            if not isinstance(field_, str):
                raise ModelError(
                    f"node {index} of graph {g.name!r} has a name or type that is not valid "
                    f"UTF-8: {field_!r}"
                )
        domain = canonical_domain(n.domain)
        name = n.name or f"{n.op_type}_{index}"
        if name in self.names:
            name = f"{name}__{index}"
        self.names.add(name)
        if domain not in self.opsets:
            raise ModelError(
                f"node {name!r} ({n.op_type}) uses domain {n.domain or 'ai.onnx'!r}, "
                f"which the model does not import (opset_import has {sorted(self.opsets)})"
            )
        inputs: list[Value | None] = []
        for x in n.input:
            if not x:
                inputs.append(None)
                continue
            v = g.lookup(x)
            if v is None:
                raise ModelError(
                    f"node {name!r} ({n.op_type}) reads {x!r}, which is not a graph input, an "
                    "initializer or the output of an earlier node"
                )
            inputs.append(v)
        attrs: dict[str, Any] = {}
        for a in n.attribute:
            if a.name in attrs:
                raise ModelError(f"node {name!r} ({n.op_type}): attribute {a.name!r} given twice")
            held = f"node {name!r} ({n.op_type}) attribute {a.name!r}"
            val = attr_value(a, self._tensor_reader(held))
            if a.type == onnx.AttributeProto.SPARSE_TENSOR:
                val = _sparse_embedded(val, self.base_dir, held)
            elif a.type == onnx.AttributeProto.GRAPH:
                val = self.graph(val, g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                val = [self.graph(sub, g) for sub in val]
            attrs[a.name] = val
        node = Node(n.op_type, domain, name, inputs, [], attrs, self.opsets[domain], graph=g)
        node.attr_types = {a.name: a.type for a in n.attribute}  # type: ignore[attr-defined]
        for o in n.output:
            if not o:
                node.outputs.append(None)
                continue
            tp = local_types.get(o)
            if tp is not None:
                kind, fact = type_fact(tp)
                fact = TensorFact(fact.dtype, mark_declared(fact.shape))
            else:
                tp = self.types.get(o)
                kind, fact = type_fact(tp) if tp is not None else ("tensor", TensorFact(None, None))
                hint = self.hints.get(o)
                if hint is not None:
                    fact = TensorFact(fact.dtype, hint)
            v = g.values.get(o) if reuse else None
            if v is None:
                v = g.add_value(o, kind=kind, fact=fact)
            v.producer = node
            node.outputs.append(v)
        return node


_POOLS = ("MaxPool", "AveragePool", "LpPool")


def _ceil_pool_shape(attrs: dict, xs) -> tuple[int, ...] | None:
    """The output shape the pooling kernels give a ceil_mode pool over a static input of shape
    `xs` (ops.pool's own geometry); None without ceil_mode or with invalid attributes, which
    validation reports."""
    from opwarden.ops.pool import pool_geometry

    if not int(attrs.get("ceil_mode", 0)):
        return None
    try:
        out = pool_geometry(tuple(xs), attrs.get("kernel_shape"), attrs.get("strides"),
                     attrs.get("dilations"), attrs.get("pads"),
                     attrs.get("auto_pad", "NOTSET"), 1)[5]
    except Exception:  # noqa: BLE001 - invalid attributes are validation's to report
        return None
    return tuple(xs[:2]) + tuple(out)


def _pool_ceil_facts(node: Node, corrected: set[int]) -> None:
    """Correct onnx's shape inference for pools with ceil_mode (onnx 1.23 keeps a last window
    that starts inside the end padding; the spec's reference, ORT and our kernels drop it):
    planned buffers are sized from these facts, and an elementwise kernel would broadcast a
    smaller result into the larger buffer. _infer already reran inference with the true shapes
    (main graph); this is the net for what that missed (subgraphs, a failed second run): values
    downstream of a pool corrected here get unknown shapes (sized at run time) unless a custom
    operator's own rule fills them in."""
    if any(v is not None and id(v) in corrected for v in node.inputs):
        for v in node.outputs:
            if v is not None and v.fact.shape is not None:
                v.fact = TensorFact(v.fact.dtype, None)
                corrected.add(id(v))
        return
    if node.domain or node.op_type not in _POOLS:
        return
    x = node.inputs[0] if node.inputs else None
    shape = None if x is None or not x.fact.static else _ceil_pool_shape(node.attrs,
                                                                         x.fact.shape)
    if shape is None:
        return
    for v in node.outputs:
        if v is not None and v.fact.shape is not None and tuple(v.fact.shape) != shape:
            v.fact = TensorFact(v.fact.dtype, shape)
            corrected.add(id(v))


def _custom_infer(node: Node, notes: list[str] | None = None) -> None:
    """Fill unknown output facts of a custom-domain node from its operator's `.infer` rule; a
    rule's shape also replaces one only the declaration gave (a conflict is noted). Dims the
    rule derives from declared-only input dims stay declared-only."""
    from opwarden.errors import OpwardenError
    from opwarden.ops import REGISTRY
    from opwarden.ops.schema import STANDARD_DOMAINS

    if node.domain in STANDARD_DOMAINS:
        return
    try:
        opdef, schema = REGISTRY.resolve(node.op_type, node.domain, node.opset)
    except OpwardenError:
        return  # unknown operators are reported by validation
    if opdef is None or opdef.infer_fn is None:
        return
    facts = [v.fact if v is not None else None for v in node.inputs]
    kw = {k: a.default for k, a in schema.attrs.items() if a.has_default}
    kw.update(node.attrs)
    try:
        res = opdef.infer_fn(*facts, **kw)
    except OpwardenError as e:
        raise ModelError(f"node {node.label}: shape rule of {opdef.qualname}: {e}") from None
    except Exception:  # noqa: BLE001 - a rule that cannot decide leaves the facts unknown
        return
    res = list(res) if isinstance(res, (tuple, list)) else [res]
    tainted = any(v is not None and has_declared(v.fact.shape) for v in node.inputs)
    for v, fact in zip(node.outputs, res):
        if v is None or not isinstance(fact, TensorFact):
            continue
        cur, ruled = v.fact.shape, fact.shape
        if ruled is not None and tainted:
            ruled = mark_declared(ruled)
        if ruled is not None and has_declared(cur):
            if notes is not None and _contradicts(cur, ruled):
                notes.append(
                    f"value {v.name!r}: the model declares shape {list(cur)}, but the shape "
                    f"rule of {opdef.qualname} gives {list(ruled)}; the rule's shape is used")
            cur = None
        if v.fact.dtype is None or cur is None:
            v.fact = TensorFact(v.fact.dtype or fact.dtype, cur if cur is not None else ruled)


def _contradicts(a: tuple, b: tuple) -> bool:
    """Can no tensor have both shapes (rank, or a static dim, differs)?"""
    a, b = [declared_value(d) for d in a], [declared_value(d) for d in b]
    return len(a) != len(b) or any(
        isinstance(x, int) and isinstance(y, int) and x != y for x, y in zip(a, b))


def _sparse_to_dense(st: onnx.SparseTensorProto, base_dir: str | None = None,
                     where: str = "sparse tensor"):
    import numpy as np

    vals = to_array(st.values, base_dir, where=f"{where} values")
    idx = to_array(st.indices, base_dir, where=f"{where} indices").astype(np.int64)
    dims = tuple(int(d) for d in st.dims)
    dense = np.zeros(int(np.prod(dims)), dtype=vals.dtype)
    if idx.ndim == 2:
        idx = np.ravel_multi_index(tuple(idx.T), dims)
    dense[idx] = vals
    return dense.reshape(dims)


def _sparse_embedded(sp: onnx.SparseTensorProto, base_dir: str | None, held: str):
    """A sparse tensor attribute with its external values/indices read (confined to the model's
    folder) into the message, so the kernel never resolves a location itself."""
    parts = [f for f in ("values", "indices")
             if getattr(sp, f).data_location == onnx.TensorProto.EXTERNAL]
    if not parts:
        return sp
    out = onnx.SparseTensorProto()
    out.CopyFrom(sp)
    for f in parts:
        t = getattr(sp, f)
        arr = to_array(t, base_dir, where=f"{held}, sparse {f} {t.name!r}")
        getattr(out, f).CopyFrom(numpy_helper.from_array(arr.copy(), t.name))
    return out


def _check_dims(node: Node) -> None:
    """A negative dimension in an output's fact (shape inference's answer for, say, a Conv
    kernel larger than its static input) is a model no feed can run; refused here, before
    memory is planned from it."""
    for k, v in enumerate(node.outputs):
        shape = v.fact.shape if v is not None else None
        if not shape:
            continue
        for axis, d in enumerate(shape):
            if isinstance(d, int) and d < 0:
                raise ModelError(
                    f"node {node.label}: output {k} ({v.name!r}) has inferred shape "
                    f"{list(shape)}, dimension {axis} is {d}; the node cannot produce it from "
                    "its inputs' shapes"
                )


def load(source: Any) -> Model:
    """Parse and convert a model; raises ModelError (never another type) on malformed input."""
    src = read_source(source)
    try:
        model = _convert(src)
    except ModelError:
        raise
    except (RecursionError, MemoryError) as e:
        raise ModelError(f"model cannot be loaded: {type(e).__name__}") from None
    except Exception as e:  # noqa: BLE001 - corrupt protobufs surface as assorted errors
        raise ModelError(f"model cannot be loaded: {type(e).__name__}: {e}") from None
    for note in model.notes:
        # ONNX Runtime's "Error merging shape info ... Falling back to lenient merge"
        warnings.warn(f"opwarden: {note}", RuntimeWarning, stacklevel=2)
    return model


# Domains whose versions onnx defines: a model importing a later version than the installed
# onnx knows would otherwise run with the newest schemas onnx has, which may not mean the same.
_ONNX_DOMAINS = ("", "ai.onnx.ml", "ai.onnx.training", "ai.onnx.preview.training",
                 "ai.onnx.preview")


@functools.cache
def known_opsets() -> dict[str, int]:
    """The highest opset version of each onnx-defined domain the installed onnx knows."""
    import onnx.defs

    known = {d: 1 for d in _ONNX_DOMAINS}
    for s in onnx.defs.get_all_schemas_with_history():
        d = canonical_domain(s.domain)
        if d in known:
            known[d] = max(known[d], s.since_version)
    known[""] = max(known[""], onnx.defs.onnx_opset_version())
    # (release, IR version, ai.onnx, ai.onnx.ml, ai.onnx.training) rows
    for row in onnx.helper.VERSION_TABLE:
        for d, v in zip(("", "ai.onnx.ml", "ai.onnx.training"), row[2:]):
            if v is not None:
                known[d] = max(known[d], int(v))
    return known


def _check_versions(proto: onnx.ModelProto, opsets: dict[str, int]) -> None:
    if proto.ir_version <= 0:  # (a parsed file was checked already; a ModelProto was not)
        raise ModelError(f"not a valid ONNX model: ir_version is {proto.ir_version}")
    if proto.ir_version > onnx.IR_VERSION:
        raise ModelError(
            f"model has IR version {proto.ir_version}; the installed onnx "
            f"{onnx.__version__} knows IR versions up to {onnx.IR_VERSION}"
        )
    known = known_opsets()
    for d, v in opsets.items():
        if d in known and v > known[d]:
            raise ModelError(
                f"model imports domain {d or 'ai.onnx'!r} at opset {v}, but the highest "
                f"version the installed onnx {onnx.__version__} defines is {known[d]}"
            )


def _convert(src: Source) -> Model:
    proto, base_dir, owned = src.proto, src.base_dir, src.owned
    opsets: dict[str, int] = {}
    for imp in proto.opset_import:
        opsets[canonical_domain(imp.domain)] = int(imp.version)
    if not proto.opset_import:
        opsets[""] = 1 if proto.ir_version < 3 else 0
    if opsets.get("", 1) <= 0:
        raise ModelError("model imports the default domain at opset 0 or below")
    _check_versions(proto, opsets)
    functions = {(f.domain, f.name): f for f in proto.functions}
    check_inlined_size(proto)
    from opwarden.ir.validate import sanity_before_inference  # what would crash onnx's inference

    sanity_before_inference(proto)
    inferred = _infer(proto)
    builder = GraphBuilder(opsets, functions, base_dir, owned, inferred, src)
    graph = builder.graph(proto.graph, None)
    return Model(
        graph=graph,
        opsets=opsets,
        ir_version=int(proto.ir_version),
        producer=proto.producer_name,
        base_dir=base_dir,
        functions=functions,
        metadata={p.key: p.value for p in proto.metadata_props},
        buffer=src.buffer,
        notes=builder.notes,
        declared=inferred.declared,
    )
