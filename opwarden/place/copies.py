"""DeviceCopy insertion: explicit copies on every edge between devices.

After partitioning, each value lives where its producer ran (graph inputs and weights on the
host). A node reading a value from elsewhere reads it through a DeviceCopy node (one per value
and destination), run by the accelerator side of the edge and converting floats to the
device's compute dtype on the way in (or rounding them on the way out of a device that rounds
at exit). Weights a device keeps in its compute dtype are uploaded once, already rounded, as
new initializers. Where both sides hold host arrays (the torch device on the CPU and the host)
nothing moves and no copy is made. A graph output produced off the host keeps its name and is
produced on the host by a final copy.
"""

from __future__ import annotations

import numpy as np

from opwarden.devices import Device, get_device
from opwarden.devices.copy import round_to
from opwarden.ir.graph import Graph, Node, Value
from opwarden.ops import REGISTRY
from opwarden.place.partition import HOST, Assign


def fresh_value_name(graph: Graph, name: str) -> str:
    """`name`, or `name_2`, `name_3`, ... : the first no value of `graph` has."""
    base, k = name, 1
    while name in graph.values:
        k += 1
        name = f"{base}_{k}"
    return name


def fresh_node_name(graph: Graph, name: str) -> str:
    """`name`, or `name_2`, `name_3`, ... : the first no node of `graph` has."""
    taken = {n.name for n in graph.nodes}
    base, k = name, 1
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    return name


def copy_device(src: str, dst: str) -> str:
    """The device that performs a copy: the accelerator side of a host <-> device edge."""
    return src if dst == HOST else dst


def is_data(node: Node, i: int) -> bool:
    """Is input i of the node's compute type (input 0's type), as opposed to a parameter?"""
    if i == 0 or node.schema is None:
        return True
    p0, p = node.schema.input_param(0), node.schema.input_param(i)
    return p0 is None or p is None or p.type_str == p0.type_str


class _Copies:
    """One insertion over one graph; `inserted`: {id(copy node): reason}."""

    def __init__(self, graph: Graph, assign: dict[int, Assign]) -> None:
        self.g = graph
        self.assign = assign
        self.home: dict[int, str] = {}  # id(value) -> the device holding it
        self.copies: dict[tuple[int, str], Value] = {}
        self.uploads: dict[tuple[int, str], Value] = {}
        self.inserted: dict[int, str] = {}
        self.new_nodes: list[Node] = []
        self.opdef, self.schema = REGISTRY.resolve("DeviceCopy", "opwarden", 1)

    def copy(self, v: Value, src: str, dst: Device, out: Value | None = None) -> Value:
        """A DeviceCopy of `v` from device `src` to `dst` (into `out`, else a new value)."""
        g = self.g
        if out is None:
            out = g.add_value(fresh_value_name(g, f"{v.name}@{dst.name}"), fact=v.fact,
                              kind=v.kind)
        srcdev = get_device(src)
        convert = ""
        if dst.rounds("inputs"):
            convert = dst.compute_dtype or ""
        elif srcdev.rounds("exit"):
            convert = srcdev.compute_dtype or ""
        attrs = {"src": src, "dst": dst.name, "convert": convert or ""}
        node = Node("DeviceCopy", "opwarden", fresh_node_name(g, f"{v.name}/to_{dst.name}"),
                    [v], [out], attrs, 1, graph=g, opdef=self.opdef, schema=self.schema,
                    origin=[])
        out.producer = node
        self.assign[id(node)] = Assign(get_device(copy_device(src, dst.name)))
        conv = f", rounding floats to {convert}" if convert else ""
        self.inserted[id(node)] = f"copy: {v.name!r} moves from {src} to {dst.name}{conv}"
        self.new_nodes.append(node)
        return out

    def upload(self, v: Value, dev: Device) -> Value:
        """Weight `v` as `dev` holds it: uploaded once, in the device's compute dtype."""
        key = (id(v), dev.name)
        if key not in self.uploads:
            up = self.g.add_value(fresh_value_name(self.g, f"{v.name}@{dev.name}"), fact=v.fact)
            up.const = round_to(np.asarray(v.const), dev.compute_dtype or "float16")
            self.g.initializers[up.name] = up
            self.uploads[key] = up
        return self.uploads[key]

    def inputs(self, node: Node) -> None:
        """Point `node`'s inputs at copies (or uploads) of the values held elsewhere."""
        dev = self.assign[id(node)].device
        for i, v in enumerate(node.inputs):
            if v is None:
                continue
            src = self.home.get(id(v), HOST)
            if src == dev.name:
                continue
            if v.const is not None and v.producer is None:
                if dev.rounds("weights") and is_data(node, i) and v.fact.dtype in ("float32",
                                                                                 "float64"):
                    node.inputs[i] = self.upload(v, dev)
                continue
            if dev.shares_memory_with(get_device(src)):
                continue  # host arrays on both sides: nothing moves
            key = (id(v), dev.name)
            if key not in self.copies:
                self.copies[key] = self.copy(v, src, dev)
            node.inputs[i] = self.copies[key]

    def outputs(self) -> None:
        """Graph outputs produced off the host: produced on the host by a copy, same name."""
        host = get_device(HOST)
        for v in list(self.g.outputs):
            src = self.home.get(id(v), HOST)
            if src == HOST or v.producer is None or host.shares_memory_with(get_device(src)):
                continue
            nv = self.g.add_value(fresh_value_name(self.g, f"{v.name}@{src}"), fact=v.fact,
                                  kind=v.kind)
            for n in self.new_nodes:
                n.inputs = [nv if x is v else x for x in n.inputs]
                n.outputs = [nv if x is v else x for x in n.outputs]
            self.copy(nv, src, host, out=v)


def insert_copies(graph: Graph, assign: dict[int, Assign]) -> dict[int, str]:
    """DeviceCopy nodes on every edge between devices; returns {id(copy node): reason}.
    `assign` gains the copy nodes (on the accelerator side of their edge)."""
    c = _Copies(graph, assign)
    for node in graph.nodes:
        c.inputs(node)
        c.new_nodes.append(node)
        dev = assign[id(node)].device
        for o in node.outputs:
            if o is not None:
                c.home[id(o)] = dev.name
    c.outputs()
    graph.nodes = c.new_nodes
    graph.rebuild_uses()
    return c.inserted
