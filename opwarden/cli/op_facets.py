"""Every facet of one operator, each with the file and line where it lives (`opwarden ops NAME`).

``facets(name)`` gathers, per registered version of the operator (an OpDef), its ONNX schema
(since-versions, domain, inputs and outputs, type constraints, attributes with the values the
contract allows), its contract, reference kernel, shape rule, backward rule, cost (FLOPs) rule,
for a fused operator the operators it computes (pieces), decomposition (the schema's function
body) and its variants; and per device (``opwarden.devices.devices()``) how
it runs the operator: a host or torch device by the variants registered for it, a profile
device by the entries of its TOML file and their constraints, executed by its host.

Locations are read from the objects themselves (``inspect``), never assumed: a rule moved to
another file is found where it now lives. ``location`` gives the line of the ``def`` (not of
its decorators); ONNX schemas give the line in the ONNX source tree that onnx.defs reports.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import os
import re
import sys
from typing import Any

import opwarden
from opwarden.errors import UnsupportedOpError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(opwarden.__file__)))


# -- locations ------------------------------------------------------------------------------


def shown(path: str, line: int) -> str:
    """path:line, relative to the directory holding the opwarden package when inside it."""
    rel = os.path.relpath(path, ROOT)
    return f"{path if rel.startswith('..') else rel}:{line}"


def _unwrap(obj: Any) -> Any:
    while True:
        if isinstance(obj, functools.partial):
            obj = obj.func
        elif inspect.ismethod(obj):
            obj = obj.__func__
        elif hasattr(obj, "__wrapped__"):
            obj = obj.__wrapped__
        else:
            return obj


def location(obj: Any) -> dict[str, Any] | None:
    """{"file", "line", "at"} of a function's (or class's) definition, its ``def`` line; None
    for what has no Python source (NumPy ufuncs, builtins)."""
    fn = _unwrap(obj)
    if not (inspect.isfunction(fn) or inspect.isclass(fn)):
        fn = type(fn) if callable(fn) and not inspect.isbuiltin(fn) else fn
    try:
        path = inspect.getsourcefile(fn)
        lines, first = inspect.getsourcelines(fn)
    except (TypeError, OSError):
        return None
    if path is None:
        return None
    name = fn.__code__.co_name if inspect.isfunction(fn) else fn.__name__
    line = first
    head = re.compile(rf"^\s*(async\s+def|def|class)\s+{re.escape(name)}\b")
    for k, text in enumerate(lines):
        if head.match(text):
            line = first + k
            break
    path = os.path.abspath(path)
    return {"file": path, "line": line, "at": shown(path, line)}


def _line_of(path: str, pattern: str, start: int = 1) -> dict[str, Any] | None:
    """The first line at or after `start` of `path` that matches `pattern`."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except OSError:
        return None
    rx = re.compile(pattern)
    for k in range(max(start, 1) - 1, len(lines)):
        if rx.search(lines[k]):
            return {"file": path, "line": k + 1, "at": shown(path, k + 1)}
    return None


def _onnx_source(schema: Any) -> dict[str, Any]:
    """Where onnx.defs says a schema is defined (a file of the ONNX source tree, not installed)."""
    path = str(schema.file or "")
    k = path.rfind("onnx/defs/")
    rel = path[k:] if k >= 0 else path
    return {"file": rel, "line": int(schema.line), "at": f"{rel}:{int(schema.line)}",
            "tree": "onnx source"}  # fmt: skip


# -- the operator -------------------------------------------------------------------------------


def resolve(name: str) -> list[Any]:
    """The registered versions (OpDefs) of ``[DOMAIN::]OP_TYPE``; an UnsupportedOpError (with
    close names) when there are none."""
    from opwarden.ops import REGISTRY
    from opwarden.ops.schema import canonical_domain

    dom, sep, op_type = name.rpartition("::")
    everything = REGISTRY.all()
    if sep:
        found = REGISTRY.versions(op_type, canonical_domain(dom))
    else:
        found = REGISTRY.versions(op_type)
        if not found:
            domains = sorted({o.domain for o in everything if o.op_type == op_type})
            if len(domains) > 1:
                raise UnsupportedOpError(
                    f"{op_type!r} is registered in several domains ({', '.join(domains)}); "
                    f"name one as DOMAIN::{op_type}"
                )
            found = [o for o in everything if o.op_type == op_type]
    if found:
        return found
    names = sorted({o.op_type for o in everything} | {f"{o.domain}::{o.op_type}"
                                                       for o in everything if o.domain})
    close = difflib.get_close_matches(name, names, n=4)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise UnsupportedOpError(f"no operator {name!r} is registered{hint} (`opwarden ops` lists all)")


def _since_versions(op_type: str, domain: str) -> list[tuple[int, Any]]:
    """(since_version, onnx OpSchema) of every version ONNX defines, oldest first."""
    import onnx.defs

    out: list[tuple[int, Any]] = []
    version = 10**6
    while version >= 1:
        try:
            s = onnx.defs.get_schema(op_type, version, domain)
        except onnx.defs.SchemaError:
            break
        out.append((s.since_version, s))
        version = s.since_version - 1
    return out[::-1]


def _param(p: Any) -> dict[str, Any]:
    return {"name": p.name, "type": p.type_str, "option": p.option}


def schema_facet(opdef: Any, implements: list[tuple[int, Any]]) -> dict[str, Any]:
    """The schema governing the op's newest implemented version, and where each version lives."""
    from opwarden.ops import schema as S

    latest = implements[-1][0] if implements else opdef.since
    sch = opdef.schema_for(latest)
    allowed = opdef.contract.allowed
    attrs = [
        {"name": a.name, "type": a.type, "required": a.required, "has_default": a.has_default,
         "default": _plain(a.default) if a.has_default else None,
         "allowed": allowed[a.name].describe() if a.name in allowed else None}
        for a in sch.attrs.values()
    ]  # fmt: skip
    out: dict[str, Any] = {
        "domain": sch.domain or "ai.onnx",
        "since_versions": [v for v, _ in implements] or [opdef.since],
        "inputs": [_param(p) for p in sch.inputs],
        "outputs": [_param(p) for p in sch.outputs],
        "type_constraints": {k: sorted(v) if v is not None else "any"
                             for k, v in sch.type_constraints.items()},
        "attrs": attrs,
    }  # fmt: skip
    if opdef.custom_schema is not None:
        out["source"] = "declared with @opwarden.op"
        out["location"] = _decorator_line(opdef.reference, r"@(\w+\.)?op\(")
    else:
        out["source"] = "onnx.defs"
        out["locations"] = {str(v): _onnx_source(s) for v, s in implements}
        out["reader"] = location(S.from_onnx)
    return out


def _decorator_line(fn: Any, pattern: str) -> dict[str, Any] | None:
    """The line of `fn`'s decorators (or its def) that matches `pattern`."""
    try:
        path = inspect.getsourcefile(fn)
        _, first = inspect.getsourcelines(fn)
    except (TypeError, OSError):
        return None
    return _line_of(os.path.abspath(path), pattern, first) if path else None


def contract_facet(opdef: Any) -> dict[str, Any]:
    """Every Contract field (workspace: its rule and, when a function, where it lives)."""
    import dataclasses

    c = opdef.contract
    out: dict[str, Any] = {}
    for f in dataclasses.fields(c):
        v = getattr(c, f.name)
        if f.name == "allowed":
            v = {k: a.describe() for k, a in v.items()}
        elif f.name == "workspace_bytes" and callable(v):
            v = rule_facet(v)
        out[f.name] = _plain(v)
    out["location"] = _decorator_line(opdef.reference, r"contract\s*=")
    out["defined"] = _contract_definition(opdef)
    return out


def _contract_definition(opdef: Any) -> dict[str, Any] | None:
    """Where a named contract (``contract=_CONV_CONTRACT``, ``UNARY``) is assigned."""
    fn = _unwrap(opdef.reference)
    scope = getattr(fn, "__globals__", {})
    names = [k for k, v in scope.items() if v is opdef.contract]
    mods = [sys.modules.get(scope.get("__name__", "")), sys.modules.get("opwarden.contract")]
    mods += [m for k, m in sorted(sys.modules.items()) if k.startswith("opwarden.")]
    for name in names:
        for m in mods:
            if m is None or getattr(m, name, None) is not opdef.contract:
                continue
            path = getattr(m, "__file__", None)
            hit = _line_of(path, rf"^{re.escape(name)}\s*(:[^=]*)?=") if path else None
            if hit is not None:
                return {"name": name, **hit}
    return None


def rule_facet(fn: Any) -> dict[str, Any] | None:
    """A rule function: its name and location, and the functions its closure wraps (a rule
    made by a factory, e.g. a unary derivative) with theirs."""
    if fn is None:
        return None
    out: dict[str, Any] = {"function": getattr(fn, "__name__", repr(fn)), "location": location(fn)}
    code = getattr(_unwrap(fn), "__code__", None)
    if code is not None and code.co_name != out["function"]:
        out["code"] = code.co_name  # the name its def says (a factory renames what it makes)
    cells = getattr(_unwrap(fn), "__closure__", None) or ()
    names = getattr(getattr(_unwrap(fn), "__code__", None), "co_freevars", ())
    via = []
    for name, cell in zip(names, cells):
        try:
            v = cell.cell_contents
        except ValueError:
            continue
        if inspect.isfunction(v) and v.__module__.startswith("opwarden"):
            via.append({"name": name, "function": v.__name__, "location": location(v)})
    if via:
        out["via"] = via
    return out


def decomposition_facet(opdef: Any, implements: list[tuple[int, Any]]) -> list[dict[str, Any]]:
    """The ONNX function bodies (decompositions) of the implemented versions that have one."""
    from opwarden.ops import schema as S

    out = []
    for v, s in implements:
        if s.has_function:
            body = opdef.function_body(v)
            nodes = [n.op_type for n in body.node] if body is not None else []
            out.append({"opset": v, "kind": "function body", "nodes": nodes,
                        "location": _onnx_source(s), "reader": location(S.onnx_function_body)})
        elif getattr(s, "has_context_dependent_function", False):
            out.append({"opset": v, "kind": "context-dependent (built per node from its input "
                        "types)", "nodes": [], "location": _onnx_source(s),
                        "reader": location(S.context_function_body)})  # fmt: skip
    return out


def variant_facet(v: Any) -> dict[str, Any]:
    """A variant: its dtypes, layout, priority, kernel, `when`, workspace rule and locations."""
    d = v.describe()
    ws = v.workspace_bytes
    if ws is None:
        rule = v.op.contract.workspace_bytes
        workspace: dict[str, Any] = {"rule": "the contract's", "value": None if callable(rule)
                                     else rule, "location": location(rule) if callable(rule)
                                     else None}  # fmt: skip
    elif callable(ws):
        workspace = {"rule": getattr(ws, "__name__", "f(shapes)"), "location": location(ws)}
    else:
        workspace = {"rule": "constant", "value": ws, "location": None}
    return {
        "name": v.name, "device": v.device, "dtypes": d["dtypes"], "layout": v.layout,
        "priority": v.priority, "reference": v.reference, "origin": v.origin,
        "accepts_out": v.accepts_out, "kernel": rule_facet(v.fn),
        "when": rule_facet(v.when), "workspace": workspace,
        "specialize": rule_facet(v.specialize), "in_place_when": rule_facet(v.in_place_when),
    }  # fmt: skip


def cost_facet(opdef: Any) -> dict[str, Any]:
    """The cost rule (OpDef.flops) and the function that reads it for the trace report and
    `opwarden bench`; without one, what they count instead."""
    from opwarden.trace.report import op_flops

    rule = rule_facet(opdef.flops_fn) or {"function": "one FLOP per output element (no .flops "
                                                      "rule)"}  # fmt: skip
    return {**rule, "reader": location(op_flops)}


def pieces_facet(opdef: Any) -> dict[str, Any] | None:
    """A fused operator's pieces rule (OpDef.pieces) and the function that reads it for the
    devices' capability checks; None for an operator that declares none."""
    from opwarden.devices.base import fused_pieces

    rule = rule_facet(opdef.pieces_fn)
    return None if rule is None else {**rule, "reader": location(fused_pieces)}


def version_facet(opdef: Any, implements: list[tuple[int, Any]]) -> dict[str, Any]:
    """Every facet of one registered version."""
    return {
        "qualname": opdef.qualname,
        "since": opdef.since,
        "schema": schema_facet(opdef, implements),
        "contract": contract_facet(opdef),
        "reference": rule_facet(opdef.reference),
        "shape_rule": rule_facet(opdef.infer_fn) or {"function": "onnx shape inference"
                                                     if opdef.custom_schema is None
                                                     else "none (no .infer rule)"},
        "gradient": rule_facet(opdef.grad_fn),
        "gradcheck_cases": rule_facet(getattr(opdef, "grad_cases_fn", None)),
        "samples": rule_facet(getattr(opdef, "samples_fn", None)),
        "cost": cost_facet(opdef),
        "pieces": pieces_facet(opdef),
        "decomposition": decomposition_facet(opdef, implements),
        "variants": [variant_facet(v) for v in opdef.variants],
    }  # fmt: skip


# -- devices ----------------------------------------------------------------------------------


def _profile_entry(dev: Any, cap: Any) -> dict[str, Any]:
    """One [[ops]] entry of a profile, with its line in the TOML file and its constraints."""
    from opwarden.devices.constraints import PREDICATES

    assert dev.ops is not None
    where = None
    if dev.source and os.path.exists(dev.source):
        k, start = dev.ops.index(cap), 1
        for _ in range(k + 1):
            hit = _line_of(dev.source, r"^\s*\[\[ops\]\]", start)
            start = hit["line"] + 1 if hit else start
        where = _line_of(dev.source, r"^\s*op\s*=", start) if hit else None
    cons = []
    for c in cap.constraints:
        at = (location(PREDICATES[c.predicate][0]) if c.predicate
              else _line_of(dev.source, rf"\battr\s*=\s*\"{re.escape(c.attr)}\"",
                            where["line"]) if where else None)  # fmt: skip
        cons.append({"description": c.describe(), "location": at})
    return {
        "name": cap.name, "dtypes": list(cap.dtypes) if cap.dtypes is not None else "any",
        "layouts": list(cap.layouts), "note": cap.note, "location": where, "constraints": cons,
    }  # fmt: skip


def device_facet(dev: Any, opdefs: list[Any]) -> dict[str, Any]:
    """How `dev` runs the operator: its variants (host, torch) or profile entries."""
    out: dict[str, Any] = {"device": dev.name, "kind": dev.kind,
                           "preferred_layout": dev.preferred_layout,
                           "compute_dtype": dev.compute_dtype}  # fmt: skip
    if dev.ops is None:
        out["variants"] = [v.name for o in opdefs for v in o.variants if v.device == dev.name]
        out["constraints"] = [
            {"attr": k, "description": a.describe(), "location": where}
            for o in opdefs[-1:] for k, a in o.contract.allowed.items()
            for where in [_contract_definition(o) or _decorator_line(o.reference, r"contract\s*=")]
        ]  # fmt: skip
        out["runs"] = bool(out["variants"])
        return out
    o = opdefs[-1]
    caps = [c for c in dev.ops if c.op_type == o.op_type and c.domain == o.domain]
    out["source"] = dev.source
    out["host"] = dev.host or "cpu"
    out["entries"] = [_profile_entry(dev, c) for c in caps]
    if not caps and o.pieces_fn is not None:
        out["fused"] = {"rule": "runs when each operator it fuses runs here",
                        "location": location(o.pieces_fn)}  # fmt: skip
    out["runs"] = bool(caps) or "fused" in out
    return out


def facets(name: str) -> dict[str, Any]:
    """Every facet of the operator called `name` (``[DOMAIN::]OP_TYPE``)."""
    from opwarden.devices import devices

    devs = devices()  # first: optional providers register their variants on load
    opdefs = resolve(name)
    o0 = opdefs[0]
    history = _since_versions(o0.op_type, o0.domain) if o0.custom_schema is None else []
    versions = []
    for k, o in enumerate(opdefs):
        nxt = opdefs[k + 1].since if k + 1 < len(opdefs) else 10**9
        versions.append(version_facet(o, [(v, s) for v, s in history if o.since <= v < nxt]))
    return {
        "op": o0.op_type,
        "domain": o0.domain or "ai.onnx",
        "versions": versions,
        "devices": [device_facet(d, opdefs) for d in devs],
    }


def _plain(v: Any) -> Any:
    """A JSON-ready value (tuples as lists, arrays as lists, bytes as text)."""
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if hasattr(v, "tolist"):
        return v.tolist()
    return v
