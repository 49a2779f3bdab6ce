"""Where the fuzzer's mutations edit: every graph, subgraph and function body of a model.

A ``Scope`` is one of them, with the values visible in it (its own and those a subgraph may
capture from the outer ones); ``scopes_of`` walks a model; ``on_a_node`` turns a mutation of one
node into a mutation of a model (a node picked at random in any scope); ``pick`` draws from a
sequence with the example's generator.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Scope:
    """A graph, subgraph or function body that mutations edit in place."""

    where: str
    proto: Any
    is_function: bool = False
    parent: Scope | None = None

    @property
    def nodes(self) -> Any:
        return self.proto.node

    def input_names(self) -> list[str]:
        return list(self.proto.input) if self.is_function else [v.name for v in self.proto.input]

    def output_names(self) -> list[str]:
        if self.is_function:
            return list(self.proto.output)
        return [v.name for v in self.proto.output]

    def local_values(self) -> list[str]:
        names = self.input_names()
        if not self.is_function:
            names += [t.name for t in self.proto.initializer]
        for n in self.proto.node:
            names += [o for o in n.output if o]
        return names

    def values(self) -> list[str]:
        """Values of this scope and the outer ones a subgraph may capture."""
        names: list[str] = []
        s: Scope | None = self
        while s is not None:
            names += s.local_values()
            s = s.parent
        return names


def scopes_of(model: Any) -> list[Scope]:
    import onnx

    out: list[Scope] = []

    def walk(g: Any, where: str, parent: Scope | None, is_fn: bool) -> None:
        s = Scope(where, g, is_fn, parent)
        out.append(s)
        for i, n in enumerate(g.node):
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g, f"{where}/{n.op_type}#{i}.{a.name}", s, False)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for j, sg in enumerate(a.graphs):
                        walk(sg, f"{where}/{n.op_type}#{i}.{a.name}[{j}]", s, False)

    walk(model.graph, "main", None, False)
    for f in model.functions:
        walk(f, f"function {f.domain}/{f.name}", None, True)
    return out


def pick(rng: np.random.Generator, seq: Sequence[Any]) -> Any:
    return seq[int(rng.integers(len(seq)))]


def node_scope(model: Any, rng: np.random.Generator) -> tuple[Scope, int] | None:
    scopes = [s for s in scopes_of(model) if len(s.nodes)]
    if not scopes:
        return None
    s = pick(rng, scopes)
    return s, int(rng.integers(len(s.nodes)))


def on_a_node(fn: Any) -> Any:
    """A mutator of one node, picked at random in any graph scope (None: there is none)."""

    @functools.wraps(fn)
    def mutate(model: Any, rng: np.random.Generator) -> str | None:
        got = node_scope(model, rng)
        return None if got is None else fn(model, rng, *got)

    return mutate

