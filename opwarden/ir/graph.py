"""The in-memory graph: Values with a producer and uses, Nodes, Graphs (with subgraphs), Model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from opwarden.contract import TensorFact
from opwarden.errors import ModelError


@dataclass(eq=False)
class Value:
    """A named value: a graph input, an initializer (``const``), or a node output."""

    name: str
    fact: TensorFact = field(default_factory=lambda: TensorFact(None, None))
    kind: str = "tensor"  # tensor | sequence | optional | map | sparse | unknown
    const: np.ndarray | None = None
    producer: Node | None = None
    uses: list[tuple[Node, int]] = field(default_factory=list)
    graph: Graph | None = None
    layout: str | None = None  # physical layout set by the layout pass ("NCHW", "NHWC")
    # A sequence/map/optional graph input's declared onnx TypeProto (its element types, which
    # the fact does not hold), for checking feeds; None for tensors.
    type_proto: Any = None

    def __repr__(self) -> str:
        return f"Value({self.name!r}, {self.fact})"


@dataclass(eq=False)
class Node:
    """One operator application. Missing optional inputs/outputs are None."""

    op_type: str
    domain: str
    name: str
    inputs: list[Value | None]
    outputs: list[Value | None]
    attrs: dict[str, Any]
    opset: int
    graph: Graph | None = None
    # Set by validation: the operator object (None when only a decomposition can run it)
    # and the governing schema.
    opdef: Any = None
    schema: Any = None
    # The model nodes this node computes (explain, the trace): None for a node as the model
    # wrote it (itself); a rewrite sets the union of what it replaces, [] for an inserted copy.
    origin: list[str] | None = None

    @property
    def origins(self) -> list[str]:
        """Names of the model nodes this node stands for (its own name if the model wrote it)."""
        return [self.name] if self.origin is None else list(self.origin)

    @property
    def label(self) -> str:
        """How errors and reports name this node: 'name (OpType)'."""
        return f"{self.name!r} ({self.op_type})" if self.name else f"<unnamed {self.op_type}>"

    def link(self) -> None:
        """Record this node as a use of each input and the producer of each output."""
        for i, x in enumerate(self.inputs):
            if x is not None:
                x.uses.append((self, i))
        for o in self.outputs:
            if o is not None:
                o.producer = self

    def subgraphs(self) -> list[Graph]:
        out: list[Graph] = []
        for v in self.attrs.values():
            if isinstance(v, Graph):
                out.append(v)
            elif isinstance(v, list) and v and isinstance(v[0], Graph):
                out.extend(v)
        return out


@dataclass(eq=False)
class Graph:
    """A topologically ordered list of nodes with its inputs, outputs and initializers.

    A subgraph (If/Loop/Scan body) has ``outer`` set; names it does not define resolve to outer
    values, which are listed in ``captures``.
    """

    name: str
    nodes: list[Node] = field(default_factory=list)
    inputs: list[Value] = field(default_factory=list)
    outputs: list[Value] = field(default_factory=list)
    initializers: dict[str, Value] = field(default_factory=dict)
    values: dict[str, Value] = field(default_factory=dict)
    outer: Graph | None = None
    captures: list[Value] = field(default_factory=list)
    # Model nodes no node stands for any more: name -> the pass or placement step that removed
    # them (constant folding, dead code, a cancelled transpose), for explain.
    removed: dict[str, str] = field(default_factory=dict)
    # ids of `captures`: a body reading thousands of outer values must not search the list
    _captured: set[int] = field(default_factory=set, repr=False)

    def lookup(self, name: str) -> Value | None:
        """Find a value by name here or in an enclosing graph (recording the capture)."""
        v = self.values.get(name)
        if v is not None:
            return v
        if self.outer is None:
            return None
        v = self.outer.lookup(name)
        if v is not None and id(v) not in self._captured:
            self._captured.add(id(v))
            self.captures.append(v)
        return v

    def add_value(self, name: str, **kw: Any) -> Value:
        if name in self.values:
            raise ModelError(f"graph {self.name!r}: value {name!r} is defined twice")
        v = Value(name, graph=self, **kw)
        self.values[name] = v
        return v

    def rebuild_uses(self) -> None:
        """Recompute producer/uses links after a rewrite."""
        for v in self.values.values():
            v.uses.clear()
            v.producer = None
        for v in self.captures:
            v.uses[:] = [(n, i) for n, i in v.uses if n.graph is not self]
        for n in self.nodes:
            n.graph = self
            n.link()

    def all_nodes(self):
        """Every node, including those inside subgraphs (depth-first)."""
        for n in self.nodes:
            yield n
            for g in n.subgraphs():
                yield from g.all_nodes()


@dataclass(eq=False)
class Model:
    """A loaded model: main graph, opset imports per domain, metadata."""

    graph: Graph
    opsets: dict[str, int]
    ir_version: int
    producer: str = ""
    base_dir: str | None = None
    functions: dict[tuple[str, str], Any] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    buffer: Any = None  # the memory-mapped model file the weights are views of (or None)
    # What loading found wrong with the model's declarations (value_info, graph output types
    # contradicting shape inference), one line per value; load() warns each once.
    notes: list[str] = field(default_factory=list)
    # Graph outputs whose declared shape says more than inference could check: name -> the
    # declared shape (the session warns once when a run's output differs, as ORT does).
    declared: dict[str, tuple] = field(default_factory=dict)

    def release_pages(self) -> None:
        """Let the OS drop the model file's resident pages (weights re-read on next touch).

        Passes that rewrite weights (Conv+BatchNorm folding) read the originals once; their
        file pages would otherwise stay counted in this process's memory next to the copies.
        """
        import mmap

        if isinstance(self.buffer, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
            try:
                self.buffer.madvise(mmap.MADV_DONTNEED)
            except (OSError, ValueError):
                pass
