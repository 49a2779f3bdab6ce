"""`spatial_mean_pool` (level 2): a ReduceMean over the spatial axes of an image as
GlobalAveragePool.

Squeeze-excite blocks (EfficientNet, MobileNetV3, RegNetY as timm exports them) start with
``x.mean((2, 3), keepdim=True)``, a ReduceMean over axes 2 and 3 with keepdims. ReduceMean
has no NHWC kernel, so in a network the layout pass runs in NHWC each one cost a transpose to
NCHW, the generic reduction and a transpose back into the excite convolution; as
GlobalAveragePool (the same mean of each channel over H x W, its output [N, C, 1, 1]) it
stays in NHWC with the channel-vector pooling kernel. Only 4-D floating tensors with both
spatial axes reduced and keepdims on (the pool's output shape); axes given as an attribute
(ReduceMean < 18) or a constant input (18+).
"""

from __future__ import annotations

from opwarden.ir.graph import Node
from opwarden.passes.match import FLOAT, is_std, kernel_kwargs
from opwarden.passes.rewrite import PassResult, Rewriter

SPATIAL = {2, 3}


def _spatial_axes(rw: Rewriter, node: Node) -> bool:
    """Whether the ReduceMean reduces exactly axes 2 and 3 of a 4-D input, keeping them."""
    x = node.inputs[0] if node.inputs else None
    if x is None or x.fact.ndim != 4 or x.fact.dtype not in FLOAT:
        return False
    kw = kernel_kwargs(node)
    if not int(kw.get("keepdims", 1)):
        return False
    if node.opdef is not None and node.opdef.since >= 18:
        axes_in = node.inputs[1] if len(node.inputs) > 1 else None
        if axes_in is None:
            return False  # (no axes: all of them, or none with noop_with_empty_axes)
        k = rw.const(axes_in)
        if k is None:
            return False
        axes = [int(a) for a in k.reshape(-1)]
    else:
        axes = [int(a) for a in kw.get("axes") or ()]
    return len(axes) == 2 and {a % 4 for a in axes} == SPATIAL


def spatial_mean_pool(rw: Rewriter) -> PassResult:
    """ReduceMean(x, axes=[2, 3], keepdims=1) of a 4-D float x -> GlobalAveragePool(x)."""
    res = PassResult()
    if rw.model.opsets.get("", 0) < 1:
        return res
    for node in rw.graph.nodes:
        if (not is_std(node, "ReduceMean") or id(node) in rw.removed or node.opdef is None
                or len(node.outputs) != 1 or not _spatial_axes(rw, node)):
            continue
        pool = rw.make_node("GlobalAveragePool", [node.inputs[0]], [node.outputs[0]], {},
                            name=node.name, parts=[node], domain="",
                            opset=rw.model.opsets[""])
        rw.remove(node)
        rw.place(pool, node)
        res.details["ReduceMean as GlobalAveragePool"] += 1
        res.changes += 1
    return res
