"""Schemas declared in Python for custom-domain operators (`@opwarden.op(..., inputs=...)`)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opwarden.errors import ContractError
from opwarden.ops.schema import AttrSpec, Param, Schema

_PY_TO_ATTR = {int: "INT", float: "FLOAT", str: "STRING", bool: "INT"}
_LIST_TO_ATTR = {int: "INTS", float: "FLOATS", str: "STRINGS"}
_ATTR_TYPES = {"INT", "FLOAT", "STRING", "INTS", "FLOATS", "STRINGS", "TENSOR", "GRAPH"}


def _param(text: str, where: str) -> Param:
    spec = text.strip()
    option = "single"
    if spec.startswith("*"):
        option, spec = "variadic", spec[1:]
    name, _, type_str = spec.partition(":")
    name, type_str = name.strip(), type_str.strip() or "T"
    if name.endswith("?"):
        option, name = "optional", name[:-1]
    if not name.isidentifier():
        raise ContractError(f"{where}: bad formal parameter {text!r} (expected 'NAME: T')")
    return Param(name, type_str, option)


def _attr(name: str, spec: Any) -> AttrSpec:
    if isinstance(spec, tuple) and len(spec) == 2 and spec[0] in _ATTR_TYPES:
        return AttrSpec(name, spec[0], False, spec[1], True)
    if isinstance(spec, str) and spec in _ATTR_TYPES:
        return AttrSpec(name, spec, True)
    if isinstance(spec, type):
        if spec not in _PY_TO_ATTR:
            raise ContractError(f"attribute {name!r}: unsupported type {spec.__name__}")
        return AttrSpec(name, _PY_TO_ATTR[spec], True)
    if isinstance(spec, (list, tuple)):
        kinds = {type(v) for v in spec} or {int}
        kind = float if kinds == {int, float} else kinds.pop() if len(kinds) == 1 else None
        if kind not in _LIST_TO_ATTR:
            raise ContractError(f"attribute {name!r}: cannot infer a type from {spec!r}")
        return AttrSpec(name, _LIST_TO_ATTR[kind], False, list(spec), True)
    if type(spec) in _PY_TO_ATTR:
        return AttrSpec(name, _PY_TO_ATTR[type(spec)], False, spec, True)
    raise ContractError(f"attribute {name!r}: cannot infer a type from default {spec!r}")


def build_schema(
    op_type: str,
    domain: str,
    since: int,
    inputs: list[str] | None,
    outputs: list[str] | None,
    types: Mapping[str, Iterable[str]] | None,
    attrs: Mapping[str, Any] | None,
    fn: Callable[..., Any],
) -> Schema:
    """Build and cross-check a Schema from the declaration and the kernel's signature."""
    where = f"{domain}::{op_type}"
    if not domain:
        raise ContractError(f"{op_type}: custom operators need a domain (e.g. 'example.ops')")
    if inputs is None or outputs is None:
        raise ContractError(f"{where}: declare inputs=[...] and outputs=[...]")
    ins = tuple(_param(s, where) for s in inputs)
    outs = tuple(_param(s, where) for s in outputs)
    tcs = {k: frozenset([v] if isinstance(v, str) else v) for k, v in (types or {}).items()}
    for p in ins + outs:
        if p.type_str not in tcs and not p.type_str.startswith("tensor("):
            raise ContractError(f"{where}: {p.name} uses type {p.type_str!r}, not in types={{...}}")
    aspecs = {k: _attr(k, v) for k, v in (attrs or {}).items()}
    sig = inspect.signature(fn)
    kwonly = {n for n, p in sig.parameters.items() if p.kind is p.KEYWORD_ONLY}
    var_kw = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    missing = set(aspecs) - kwonly
    if missing and not var_kw:
        raise ContractError(
            f"{where}: attributes {sorted(missing)} must be keyword-only parameters of the kernel"
        )
    n_req = sum(p.option == "single" for p in ins)
    variadic = any(p.option == "variadic" for p in ins)
    return Schema(
        op_type=op_type,
        domain=domain,
        since=since,
        inputs=ins,
        outputs=outs,
        type_constraints=tcs,
        attrs=aspecs,
        min_inputs=n_req,
        max_inputs=2**31 - 1 if variadic else len(ins),
        min_outputs=sum(p.option == "single" for p in outs),
        max_outputs=2**31 - 1 if any(p.option == "variadic" for p in outs) else len(outs),
        doc=(fn.__doc__ or "").strip().split("\n")[0],
    )
