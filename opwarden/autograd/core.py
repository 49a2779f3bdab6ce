"""The backward-rule protocol: the context a rule receives and the checked call of a rule.

The rules themselves live beside their operators in the ops files (see opwarden/ops/grad.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from opwarden.errors import ContractError, UnsupportedOpError
from opwarden.ops.grad import is_float


@dataclass
class GradContext:
    """What a backward rule sees: the forward's inputs, outputs and attributes (and the op)."""

    inputs: list[Any]
    outputs: list[Any]
    attrs: dict[str, Any] = field(default_factory=dict)
    op: Any = None  # the OpDef (built-in rules use its reference kernel); None if unknown
    node: str = ""  # how errors name the node, e.g. "'conv1' (Conv)"

    @property
    def where(self) -> str:
        if self.node:
            return f"node {self.node}"
        return f"operator {self.op.qualname}" if self.op is not None else "backward rule"


def upstream(outputs: Sequence[Any], grads: Sequence[Any | None]) -> list[Any]:
    """dY per forward output: the given gradient, zeros for a float output without one,
    None for a non-float output (rules never need to test for a missing float gradient)."""
    dys: list[Any] = []
    for i, y in enumerate(outputs):
        g = grads[i] if i < len(grads) else None
        if g is None and is_float(y):
            g = np.zeros(np.shape(y), dtype=np.asarray(y).dtype)
        dys.append(g if is_float(y) else None)
    return dys


def call_rule(opdef: Any, ctx: GradContext, dys: Sequence[Any], *, strict_dtype: bool = False):
    """Run `opdef`'s backward rule and check the result: one entry per input, shapes matching.

    Gradients come back in each input's dtype (cast here unless `strict_dtype`, where a rule
    that returns another dtype is a ContractError: gradcheck uses that to hold rules to it).
    """
    fn = getattr(opdef, "grad_fn", None)
    if fn is None:
        raise UnsupportedOpError(
            f"{ctx.where}: operator {opdef.qualname if opdef is not None else '?'} has no "
            "backward rule (.grad); it cannot be differentiated"
        )
    res = fn(ctx, *dys, **ctx.attrs)
    if not isinstance(res, (tuple, list)):
        res = (res,)
    name = opdef.qualname + (f" at {ctx.where}" if ctx.node else "")
    if len(res) != len(ctx.inputs):
        raise ContractError(
            f"backward rule of {name} returned {len(res)} gradient(s), expected "
            f"exactly one per input: {len(ctx.inputs)} (use None for a non-differentiable input)"
        )
    out: list[Any] = []
    for i, (g, x) in enumerate(zip(res, ctx.inputs)):
        if g is None or x is None:
            out.append(None)
            continue
        g = np.asarray(g)
        xs = np.shape(x)
        if g.shape != xs:
            raise ContractError(
                f"backward rule of {name}: gradient of input {i} has shape "
                f"{list(g.shape)}, the input has shape {list(xs)}"
            )
        xdt = np.asarray(x).dtype
        if g.dtype != xdt:
            if strict_dtype:
                raise ContractError(
                    f"backward rule of {name}: gradient of input {i} has dtype "
                    f"{g.dtype}, the input has dtype {xdt}"
                )
            g = g.astype(xdt)
        out.append(g)
    return out
