"""File order made executable: a graph's NodeProtos in a stable topological order.

Also what that order must see of a node: the subgraphs its attributes hold (`subgraphs`) and
the outer values those read (`free_names`), on which the node depends as on its inputs.
"""

from __future__ import annotations

import heapq

import onnx

from opwarden.errors import ModelError


def free_names(g: onnx.GraphProto) -> set[str]:
    """Names a subgraph reads but does not define (outer-scope references)."""
    defined = {i.name for i in g.input} | {i.name for i in g.initializer}
    used: set[str] = set()
    for n in g.node:
        used.update(x for x in n.input if x)
        for a in n.attribute:
            for sub in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
                used |= free_names(sub)
        defined.update(o for o in n.output if o)
    used.update(o.name for o in g.output)
    return used - defined


def subgraphs(n: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs a node's attributes hold (If branches, Loop/Scan bodies)."""
    return [sub for a in n.attribute
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs))]


def toposort(nodes: list[onnx.NodeProto], available: set[str], graph_name: str):
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
        for sub in subgraphs(n):
            names |= free_names(sub)
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
