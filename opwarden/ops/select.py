"""Which variant of a node's operator runs it on a device, in a layout: `select`.

Devices consult it to say what they accept (`Device.accepts`, `layouts_for`); placement
(`place.partition`) consults it to choose. It reads only the node, its operator's variants and
the inputs each operator says a layout places (`sensitive_inputs`, from ``OpDef.layout_inputs``:
the memory limits, the layout pass and the devices read it here), so both import it one way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opwarden.contract import TensorFact
from opwarden.ops.base import REGISTRY

if TYPE_CHECKING:
    from opwarden.ir.graph import Node
    from opwarden.ops.base import Variant


def layout_inputs(op_type: str, domain: str = "") -> tuple[int, ...]:
    """Indices of the activation inputs whose channel axis a layout (NCHW / NHWC) places, as
    the operator declares them (``@op(..., layout_inputs=...)``); empty for other operators."""
    o = REGISTRY.latest(op_type, domain)
    return o.layout_inputs if o is not None else ()


def sensitive_inputs(node: Any) -> tuple[int, ...]:
    """Activation input indices of a layout-sensitive node (empty for other nodes)."""
    return layout_inputs(node.op_type, node.domain)


def kernel_kwargs(node: Node) -> dict[str, Any]:
    """Attributes for the kernel call: the node's, plus the schema's defaults."""
    kw = {name: spec.default for name, spec in node.schema.attrs.items() if spec.has_default}
    kw.update(node.attrs)
    return kw


def _dtype_key(node: Node, dtypes: Any) -> tuple[bool, str]:
    """Does the node's dtype binding satisfy a variant's dtype declaration? (ok, why-not)."""
    if dtypes is None:
        return True, ""
    facts = [v.fact.dtype if v is not None else None for v in node.inputs]
    if isinstance(dtypes, Mapping):
        for param, allowed in dtypes.items():
            for i, dt in enumerate(facts):
                p = node.schema.input_param(i)
                if p is not None and p.type_str == param and dt is not None and dt not in allowed:
                    return False, f"{param}={dt} not in {sorted(allowed)}"
        return True, ""
    first = next((d for d in facts if d is not None), None)
    if first is None and node.outputs and node.outputs[0] is not None:
        first = node.outputs[0].fact.dtype
    if first is None:
        return False, "dtype unknown before running"
    if first not in dtypes:
        return False, f"dtype {first} not in {sorted(dtypes)}"
    return True, ""


def _layout_ok(var: Variant, node: Node, layout: str) -> bool:
    if var.layout == layout:
        return True
    # A layout-free variant of a layout-sensitive op follows ONNX, i.e. NCHW.
    return var.layout == "any" and (layout == "NCHW" or not sensitive_inputs(node))


def select(
    node: Node, device: str, layout: str = "NCHW", quarantine: Any = None
) -> tuple[Variant | None, list]:
    """The winning variant of `node` on `device` (or None) and (name, reason) for each loser."""
    rejected: list[tuple[str, str]] = []
    candidates: list[Variant] = []
    if node.opdef is None:
        return None, rejected
    kw = kernel_kwargs(node)
    facts = [v.fact if v is not None else None for v in node.inputs]
    for var in node.opdef.variants:
        if var.device != device:
            rejected.append((var.name, f"device {var.device}, not {device}"))
            continue
        if quarantine is not None and var.name in quarantine and not var.reference:
            rejected.append((var.name, f"quarantined as unstable: {quarantine.reason(var.name)}"))
            continue
        ok, why = _dtype_key(node, var.dtypes)
        if not ok:
            rejected.append((var.name, why))
            continue
        if not _layout_ok(var, node, layout):
            rejected.append((var.name, f"layout {var.layout}, tensor is {layout}"))
            continue
        if var.when is not None:
            try:
                passed = bool(var.when(*[f or TensorFact(None) for f in facts], **kw))
            except Exception as e:  # noqa: BLE001 - a predicate that cannot decide rejects
                rejected.append((var.name, f"when-predicate raised {type(e).__name__}: {e}"))
                continue
            if not passed:
                rejected.append((var.name, "when-predicate is false for this node"))
                continue
        candidates.append(var)
    candidates.sort(key=lambda v: (-v.priority, v.name))
    if not candidates:
        return None, rejected
    win = candidates[0]
    for lost in candidates[1:]:
        rejected.append((lost.name, f"priority {lost.priority} < {win.name} ({win.priority})"))
    return win, rejected
