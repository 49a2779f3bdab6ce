"""Attribute constraints a device states per operator: allowed values, ranges, named predicates.

Each rule checks one node and, when it refuses, says why in plain words naming the attribute:
``Resize mode='linear': edge-npu supports mode='nearest' only``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from opwarden.errors import OptionsError


def node_attr(node: Any, name: str) -> Any:
    """The node's value of attribute `name`, or the schema default (None when neither)."""
    if name in node.attrs:
        return node.attrs[name]
    spec = node.schema.attrs.get(name) if node.schema is not None else None
    if spec is not None and spec.has_default:
        return spec.default
    return None


def _show(v: Any) -> str:
    if isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
    if isinstance(v, np.ndarray):
        v = v.tolist()
    if isinstance(v, tuple):
        v = list(v)
    return repr(v)


def _const_input(node: Any, index: int) -> tuple[bool, Any]:
    """(present, value) of optional input `index`; value is None when it is not a constant."""
    if index >= len(node.inputs) or node.inputs[index] is None:
        return False, None
    v = node.inputs[index]
    return True, (np.asarray(v.const) if v.const is not None else None)


# -- named predicates ---------------------------------------------------------------------------
# name -> (check(node) -> None | (attribute, shown value, requirement words), description)


def _symmetric_pads(node: Any) -> tuple[str, str, str] | None:
    need = "symmetric pads only"
    if node.opset < 11 or "pads" in node.attrs:
        pads = node_attr(node, "pads") or node_attr(node, "paddings")
    else:
        present, pads = _const_input(node, 1)
        if not present:
            return None
        if pads is None:
            return "pads", "(computed at run time)", need
    if pads is None:
        return None
    p = [int(x) for x in np.asarray(pads).reshape(-1)]
    half = len(p) // 2
    if p[:half] != p[half:]:
        return "pads", _show(p), need
    return None


def _groups_one_or_c(node: Any) -> tuple[str, str, str] | None:
    g = node_attr(node, "num_groups")
    x = node.inputs[0] if node.inputs else None
    shape = x.fact.shape if x is not None else None
    c = shape[1] if shape is not None and len(shape) > 1 else None
    if g == 1:
        return None
    if not isinstance(c, int):
        return "num_groups", _show(g), "num_groups in {1, C} only (C is unknown before running)"
    if g != c:
        return "num_groups", _show(g), f"num_groups in {{1, C}} (C={c}) only"
    return None


def _inference_only(node: Any) -> tuple[str, str, str] | None:
    need = f"{node.op_type} for inference only"
    if node_attr(node, "is_test") == 0 and node.op_type == "Dropout":
        return "is_test", "0", need
    if node_attr(node, "training_mode"):
        return "training_mode", _show(node_attr(node, "training_mode")), need
    if node.op_type == "BatchNormalization":
        if node.opset < 14 and len([o for o in node.outputs if o is not None]) > 1:
            return "outputs", str(len(node.outputs)), need + " (one output)"
        return None
    if node.op_type != "Dropout" or node.opset < 12:
        return None
    present, mode = _const_input(node, 2)
    if present and (mode is None or bool(np.asarray(mode).reshape(-1)[0])):
        shown = "(computed at run time)" if mode is None else "True"
        return "training_mode", shown, need
    return None


def _no_dilation(node: Any) -> tuple[str, str, str] | None:
    d = node_attr(node, "dilations")
    if d and any(int(x) != 1 for x in d):
        return "dilations", _show(list(d)), "dilations of 1 only"
    return None


PREDICATES: dict[str, tuple[Callable[[Any], tuple[str, str, str] | None], str]] = {
    "symmetric_pads": (_symmetric_pads, "symmetric pads only (begin == end on every axis)"),
    "num_groups_1_or_C": (_groups_one_or_c, "num_groups in {1, C} (C = channels)"),
    "inference_only": (_inference_only, "inference only (no training_mode)"),
    "no_dilation": (_no_dilation, "dilations of 1 only"),
}


@dataclass(frozen=True)
class Constraint:
    """One rule on a node: ``values`` (allowed set), ``min``/``max`` (range) or ``predicate``."""

    attr: str = ""
    values: tuple = ()
    min: float | None = None
    max: float | None = None
    predicate: str = ""

    def __post_init__(self) -> None:
        if self.predicate and self.predicate not in PREDICATES:
            raise OptionsError(
                f"unknown constraint predicate {self.predicate!r}; known: {sorted(PREDICATES)}"
            )
        if not self.predicate and not self.attr:
            raise OptionsError("a constraint needs an 'attr' (with values/min/max) or a predicate")

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "") -> Constraint:
        unknown = set(d) - {"attr", "values", "min", "max", "predicate"}
        if unknown:
            raise OptionsError(f"{where}: unknown constraint keys {sorted(unknown)}")
        vals = d.get("values", ())
        return cls(
            attr=str(d.get("attr", "")),
            values=tuple(tuple(v) if isinstance(v, list) else v for v in vals),
            min=d.get("min"),
            max=d.get("max"),
            predicate=str(d.get("predicate", "")),
        )

    def check(self, node: Any, device: str) -> str | None:
        """None when the node satisfies the rule, else the reason in plain words."""
        op = node.op_type
        if self.predicate:
            fn, _ = PREDICATES[self.predicate]
            bad = fn(node)
            if bad is None:
                return None
            attr, shown, need = bad
            return f"{op} {attr}={shown}: {device} supports {need}"
        value = node_attr(node, self.attr)
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        if self.values:
            v = tuple(value) if isinstance(value, list) else value
            if v not in self.values:
                allowed = (
                    f"{self.attr}={_show(self.values[0])}"
                    if len(self.values) == 1
                    else f"{self.attr} in {{{', '.join(_show(x) for x in self.values)}}}"
                )
                return f"{op} {self.attr}={_show(value)}: {device} supports {allowed} only"
        if self.min is not None or self.max is not None:
            nums = list(value) if isinstance(value, (list, tuple)) else [value]
            for x in nums:
                if x is None or (self.min is not None and x < self.min) or (
                    self.max is not None and x > self.max
                ):
                    lo = "-inf" if self.min is None else f"{self.min:g}"
                    hi = "inf" if self.max is None else f"{self.max:g}"
                    return (
                        f"{op} {self.attr}={_show(value)}: {device} supports "
                        f"{self.attr} in [{lo}, {hi}] only"
                    )
        return None

    def describe(self) -> str:
        """The rule in words, for listings."""
        if self.predicate:
            return PREDICATES[self.predicate][1]
        parts = []
        if self.values:
            parts.append(f"{self.attr} in {{{', '.join(_show(v) for v in self.values)}}}")
        if self.min is not None or self.max is not None:
            lo = "-inf" if self.min is None else f"{self.min:g}"
            hi = "inf" if self.max is None else f"{self.max:g}"
            parts.append(f"{self.attr} in [{lo}, {hi}]")
        return " and ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"description": self.describe()}
        if self.predicate:
            out["predicate"] = self.predicate
        else:
            out["attr"] = self.attr
            if self.values:
                out["values"] = [list(v) if isinstance(v, tuple) else v for v in self.values]
            if self.min is not None:
                out["min"] = self.min
            if self.max is not None:
                out["max"] = self.max
        return out
