"""Step 1 of the layout pass: what a node is to layouts.

- S, layout-sensitive: an operator that declares which activation inputs carry a layout (Conv,
  pools, norms, Resize, ...; ``OpDef.layout_inputs``) on a device with an NHWC kernel for it;
  with it, how much the device wants NHWC: "must" (no NCHW kernel), "strong" (a profile that
  prefers NHWC) or "weak";
- A, layout-agnostic: elementwise (one tensor, or broadcasting ones whose other inputs are
  constants or size-1), Concat/Softmax/Split with a remapped axis, Pad with remapped pads;
- T: a model Transpose (the pass composes its permutation with the layout's);
- N: everything else, which needs ONNX's NCHW.

Only nodes whose output 0 carries a layout (a 3-5-D tensor, layout_axes.py) are S or A. The
channel shuffles (CH, CM, CT) are marked afterwards (layout_shuffle.py).
"""

from __future__ import annotations

from typing import Any

from opwarden.devices import Device
from opwarden.ir.graph import Node, Value
from opwarden.ops.select import sensitive_inputs
from opwarden.place.layout_axes import NCHW, NHWC, rank, size_one, tracked

UNARY = {
    "Relu", "Clip", "Sigmoid", "HardSwish", "HardSigmoid", "LeakyRelu", "Tanh", "Exp", "Log",
    "Abs", "Neg", "Sqrt", "Reciprocal", "Erf", "Elu", "Selu", "Celu", "Softplus", "Softsign",
    "Gelu", "Mish", "Identity", "Dropout", "Cast", "Floor", "Ceil", "Round", "Sign", "Not",
    "IsNaN", "IsInf", "ThresholdedRelu", "Sin", "Cos", "Tan", "Shrink", "DeviceCopy",
}
BROADCAST = {
    "Add", "Sub", "Mul", "Div", "Pow", "Sum", "Max", "Min", "Mean", "PRelu", "Equal", "Less",
    "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Where", "Mod",
    "FusedElementwise",
}
AXIS_OPS = {"Concat": 0, "Softmax": 13, "LogSoftmax": 13, "Hardmax": 13}  # op -> min opset


def node_kind(
    node: Node, dev: Device | None, quarantine: Any = None
) -> tuple[str, str | None]:
    """(kind, want): the node's kind on device `dev`, and for an S node how much it wants NHWC."""
    out0 = node.outputs[0] if node.outputs else None
    if not tracked(out0) or node.subgraphs():
        return "N", None
    r = rank(out0)
    sens = sensitive_inputs(node)
    if sens:
        return _sensitive(node, sens, r, dev, quarantine)
    if node.domain not in ("", "opwarden"):
        return "N", None
    return _agnostic(node, r), None


def _sensitive(
    node: Node, sens: tuple[int, ...], r: int, dev: Device | None, quarantine: Any
) -> tuple[str, str | None]:
    ins = [node.inputs[i] for i in sens if i < len(node.inputs)]
    if not ins or not tracked(ins[0]) or any(
        v is not None and (not tracked(v) or rank(v) != r) for v in ins
    ):
        return "N", None
    if dev is None:
        return "N", None  # without a device, only NCHW
    lays = dev.layouts_for(node, quarantine)
    if NHWC not in lays:
        return "N", None
    if NCHW not in lays:
        return "S", "must"
    if dev.kind == "profile" and dev.preferred_layout == NHWC:
        return "S", "strong"
    return "S", "weak"


def _agnostic(node: Node, r: int) -> str:
    """T, A or N for a standard-domain node with a rank-`r` output carrying a layout."""
    op = node.op_type
    ins = node.inputs
    x = ins[0] if ins else None
    if op == "Transpose" and tracked(x):
        return "T"
    if op in UNARY:
        if not tracked(x) or rank(x) != r:
            return "N"
        rest = [v for v in ins[1:] if v is not None]
        return "A" if all(v.const is not None or size_one(v) for v in rest) else "N"
    if op in BROADCAST:
        return "A" if _broadcasts(ins, r) else "N"
    if op in AXIS_OPS and node.opset >= AXIS_OPS[op]:
        if all(
            v is not None and (tracked(v) or v.const is not None) and v.fact.ndim == r
            for v in ins
        ) and any(v is not None and v.const is None for v in ins):
            return "A"
        return "N"
    if op == "Split" and tracked(x) and rank(x) == r and all(
        v is None or v.const is not None for v in ins[1:]
    ) and all(tracked(o) and rank(o) == r for o in node.outputs):
        return "A"  # every output carries the layout; the axis is remapped
    if op == "Slice" and node.opset >= 10 and tracked(x) and rank(x) == r and all(
        v is None or v.const is not None for v in ins[1:]
    ):
        return "A"  # constant starts/ends/axes/steps: the axes are remapped
    if op == "Pad" and tracked(x) and rank(x) == r:
        if node.opset < 11:
            return "A"
        others = [v for i, v in enumerate(ins) if i in (1, 3) and v is not None]
        return "A" if all(v.const is not None for v in others) else "N"
    return "N"


def _broadcasts(ins: list[Value | None], r: int) -> bool:
    """Can an elementwise node with these inputs run on rank-`r` NHWC data?"""
    if not any(tracked(v) and v.const is None for v in ins):
        return False
    for v in ins:
        if v is None:
            continue
        if tracked(v) and v.const is None and rank(v) == r:
            continue
        if v.const is not None and v.const.ndim <= r:
            continue
        if size_one(v):
            continue
        return False
    return True
