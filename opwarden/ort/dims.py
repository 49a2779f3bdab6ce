"""Free dimension overrides (SessionOptions.add_free_dimension_override_by_name/_by_denotation)
applied to the ModelProto before it is loaded, so the dims are fixed everywhere after: the
inputs report them, feeds are checked against them, shape inference and the memory plan use them.

By name, a symbol is fixed wherever the main graph declares it (inputs, outputs, value_info: one
symbol is one size throughout a model); by denotation, the input dims that carry it.
"""

from __future__ import annotations

from typing import Any


def _dims(vi: Any) -> list[Any]:
    t = vi.type
    if t.WhichOneof("value") != "tensor_type" or not t.tensor_type.HasField("shape"):
        return []
    return list(t.tensor_type.shape.dim)


def apply_dim_overrides(proto: Any, by_name: dict[str, int], by_denotation: dict[str, int]) -> int:
    """Fix the overridden dims of `proto`'s main graph in place; returns how many changed."""
    if not by_name and not by_denotation:
        return 0
    g = proto.graph
    changed = 0
    inits = {t.name for t in g.initializer}
    for vi in [*g.input, *g.output, *g.value_info]:
        is_input = any(vi is i for i in g.input)
        if is_input and vi.name in inits:
            continue
        for d in _dims(vi):
            value = None
            if d.WhichOneof("value") == "dim_param" and d.dim_param in by_name:
                value = by_name[d.dim_param]
            elif is_input and d.denotation and d.denotation in by_denotation:
                value = by_denotation[d.denotation]
            if value is not None:
                d.dim_value = value  # clears dim_param (a oneof)
                changed += 1
    return changed
