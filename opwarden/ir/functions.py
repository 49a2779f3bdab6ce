"""Inlining FunctionProtos (model-local functions and ONNX function bodies) into NodeProtos.

`inline` expands one call; `expand_functions` every model-local call of a graph, within
the limits `check_inlined_size` checks first on the whole model (before anything is inlined).
"""

from __future__ import annotations

import itertools

import onnx

from opwarden.errors import ModelError
from opwarden.ir.toposort import subgraphs

_counter = itertools.count()


def _subst_attrs(node: onnx.NodeProto, call_attrs: dict[str, onnx.AttributeProto]) -> None:
    keep = []
    for a in node.attribute:
        if a.ref_attr_name:
            if a.ref_attr_name in call_attrs:
                b = onnx.AttributeProto()
                b.CopyFrom(call_attrs[a.ref_attr_name])
                b.name = a.name
                keep.append(b)
            # an unset reference means "attribute absent"
        else:
            keep.append(a)
    del node.attribute[:]
    node.attribute.extend(keep)


def _rename_graph(g: onnx.GraphProto, rename: dict[str, str]) -> None:
    """Rename free references to function-internal names inside a subgraph body."""
    local = {i.name for i in g.input} | {i.name for i in g.initializer}
    for n in g.node:
        local.update(o for o in n.output if o)
    for n in g.node:
        for i, name in enumerate(n.input):
            if name and name not in local and name in rename:
                n.input[i] = rename[name]
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                _rename_graph(a.g, {k: v for k, v in rename.items() if k not in local})
    for o in g.output:
        if o.name not in local and o.name in rename:
            o.name = rename[o.name]


def inline(node: onnx.NodeProto, fn: onnx.FunctionProto) -> list[onnx.NodeProto]:
    """The nodes of `fn`, bound to `node`'s inputs, outputs and attributes."""
    prefix = f"{node.name or node.op_type}/{fn.name}#{next(_counter)}/"
    rename: dict[str, str] = {}
    for formal, actual in zip(fn.input, node.input):
        rename[formal] = actual
    for formal in fn.input[len(node.input) :]:
        rename[formal] = ""
    for formal, actual in zip(fn.output, node.output):
        rename[formal] = actual
    call_attrs = {a.name: a for a in node.attribute}
    for a in fn.attribute_proto:  # defaults declared by the function
        call_attrs.setdefault(a.name, a)
    out = []
    for inner in fn.node:
        n = onnx.NodeProto()
        n.CopyFrom(inner)
        n.name = prefix + (inner.name or inner.op_type)
        for i, name in enumerate(n.input):
            if name:
                n.input[i] = rename.get(name, prefix + name)
        for i, name in enumerate(n.output):
            if name:
                n.output[i] = rename.setdefault(name, prefix + name)
        _subst_attrs(n, call_attrs)
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                _rename_graph(a.g, rename)
        out.append(n)
    return out


MAX_FUNCTION_DEPTH = 32
# Inlining model-local functions turns a few written nodes into many: functions that each call
# the next twice double the count per level, so a 2 KB file can ask for 2^depth nodes, each
# of which costs load time and memory. Refused: more than MAX_INLINED_NODES in all, or more than
# MAX_INLINE_GROWTH times the nodes the model writes once past INLINE_GROWTH_FLOOR (real models
# that reuse functions stay far below both: a 100-layer network calling one layer function
# grows about 100-fold but to a few 10^4 nodes).
MAX_INLINED_NODES = 1_000_000
MAX_INLINE_GROWTH = 100
INLINE_GROWTH_FLOOR = 100_000


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
                             for sub in subgraphs(n))
            continue
        if key in active:
            chain = " -> ".join(f"{d}::{o}" for d, o in (*active, key))
            raise ModelError(f"model-local function {key[0]}::{key[1]} calls itself ({chain})")
        if key not in memo:
            memo[key] = inlined_size(fn.node, functions, memo, (*active, key))
        total += memo[key]
    return total


def _written(nodes) -> int:
    return sum(1 + sum(_written(sub.node) for sub in subgraphs(n)) for n in nodes)


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


def expand_functions(
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
        out.extend(expand_functions(inline(n, fn), functions, depth + 1, budget))
    return out
