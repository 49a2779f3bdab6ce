"""Which inputs of an operator are activation tensors whose layout (NCHW / NHWC) matters.

An operator fact, not a device's: the memory limits, the layout pass and the devices all read
it, so it sits below them.
"""

from __future__ import annotations

from typing import Any

# Operators whose activation tensor has a channel axis that a layout (NCHW/NHWC) places:
# op_type -> indices of the activation inputs. Output 0 is the activation output.
LAYOUT_SENSITIVE: dict[str, tuple[int, ...]] = {
    "Conv": (0,),
    "ConvTranspose": (0,),
    "MaxPool": (0,),
    "AveragePool": (0,),
    "LpPool": (0,),
    "GlobalAveragePool": (0,),
    "GlobalMaxPool": (0,),
    "GlobalLpPool": (0,),
    "BatchNormalization": (0,),
    "InstanceNormalization": (0,),
    "GroupNormalization": (0,),
    "LRN": (0,),
    "Resize": (0,),
    "Upsample": (0,),
    "DepthToSpace": (0,),
    "SpaceToDepth": (0,),
    "FusedConv": (0, 3),
}


def sensitive_inputs(node: Any) -> tuple[int, ...]:
    """Activation input indices of a layout-sensitive node (empty for other nodes)."""
    if node.domain == "opwarden":
        return LAYOUT_SENSITIVE["FusedConv"] if node.op_type == "FusedConv" else ()
    if node.domain or node.op_type == "FusedConv":
        return ()
    return LAYOUT_SENSITIVE.get(node.op_type, ())
