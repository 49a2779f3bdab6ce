"""Fact completion: the output facts ONNX shape inference left unknown, before placement.

Function operators such as GroupNormalization-21 come out of shape inference without an output
type; a device profile checks dtypes, layouts and memory, so their facts are filled first: from
the operator's `.infer` rule, else from shape inference over the node alone, else over its
function body's pieces (decompose.py). What none of them decides stays unknown.
"""

from __future__ import annotations

from opwarden.contract import TensorFact
from opwarden.ir.build import type_fact
from opwarden.ir.graph import Graph, Node, Value
from opwarden.ops.select import kernel_kwargs
from opwarden.place.decompose import decomposition, node_proto, piece_types


def complete_facts(graph: Graph, opsets: dict[str, int]) -> None:
    """Fill the unknown output facts of `graph`'s nodes whose input dtypes are all known."""
    for node in graph.nodes:
        missing = [
            v for v in node.outputs
            if v is not None
            and v.kind == "tensor"
            and (v.fact.dtype is None or v.fact.shape is None)
        ]
        if not missing or node.subgraphs():
            continue
        if not all(v is None or v.fact.dtype is not None for v in node.inputs):
            continue
        facts = _ruled_facts(node) or _inferred_facts(node, missing, opsets)
        for v in missing:
            f = facts.get(v.name)
            if f is not None:
                v.fact = TensorFact(
                    v.fact.dtype or f.dtype, v.fact.shape if v.fact.shape is not None else f.shape
                )


def _ruled_facts(node: Node) -> dict[str, TensorFact]:
    """Output facts by name from the operator's `.infer` rule (empty when it has none)."""
    if node.opdef is None or node.opdef.infer_fn is None:
        return {}
    try:
        res = node.opdef.infer_fn(
            *[v.fact if v is not None else None for v in node.inputs], **kernel_kwargs(node)
        )
        res = list(res) if isinstance(res, (tuple, list)) else [res]
        return {
            v.name: f for v, f in zip(node.outputs, res)
            if v is not None and isinstance(f, TensorFact)
        }
    except Exception:  # noqa: BLE001 - a rule that cannot decide leaves facts unknown
        return {}


def _inferred_facts(
    node: Node, missing: list[Value], opsets: dict[str, int]
) -> dict[str, TensorFact]:
    """Facts of the `missing` outputs by ONNX shape inference over the node, else its body."""
    facts: dict[str, TensorFact] = {}
    for attempt in ("node", "body"):
        if facts:
            break
        try:
            protos = [node_proto(node)] if attempt == "node" else decomposition(node)
        except Exception:  # noqa: BLE001 - no body: the facts stay unknown
            protos = None
        if protos:
            types = piece_types(node, protos, opsets)
            for v in missing:
                if v.name in types:
                    f = type_fact(types[v.name])[1]
                    if f.dtype is not None:
                        facts[v.name] = f
    return facts
