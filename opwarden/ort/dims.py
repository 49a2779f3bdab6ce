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


def apply_initializers(proto: Any, values: dict[str, Any]) -> None:
    """Replace the named initializers of `proto`'s main graph by `values` (name -> array),
    as SessionOptions.add_initializer asks; ModelError for a name that is no initializer or a
    value of another type or shape."""
    if not values:
        return
    from onnx import numpy_helper

    from opwarden.dtypes import np_dtype
    from opwarden.errors import ModelError

    by_name = {t.name: t for t in proto.graph.initializer}
    for name, value in values.items():
        t = by_name.get(name)
        if t is None:
            raise ModelError(f"SessionOptions.add_initializer: the model has no initializer "
                             f"{name!r}")
        want = (np_dtype(t.data_type), tuple(t.dims))
        if (value.dtype, value.shape) != want:
            raise ModelError(f"SessionOptions.add_initializer({name!r}): the value is "
                             f"{value.dtype}{list(value.shape)}, the initializer "
                             f"{want[0]}{list(want[1])}")
        t.CopyFrom(numpy_helper.from_array(value, name))


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
