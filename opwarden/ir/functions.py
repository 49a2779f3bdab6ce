"""Inlining FunctionProtos (model-local functions and ONNX function bodies) into NodeProtos."""

from __future__ import annotations

import itertools

import onnx

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
