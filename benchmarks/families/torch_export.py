"""PyTorch side of the builders: import timm/transformers offline, set init scales, calibrate
BatchNorm, export with the TorchScript exporter (dynamo=False) and a dynamic batch axis."""

from __future__ import annotations

import io
import sys
import warnings
from typing import Any

OPSET = 17


def import_torchvision() -> None:
    """Import torchvision even when its compiled ops do not load (PyPI's Linux wheel is built
    against CUDA torch; with the CPU torch its _C fails and torchvision's fake-kernel
    registration for nms then raises). timm imports torchvision only for pure-Python pieces,
    so declaring the two op schemas it registers against lets that import finish; calling
    those ops would still fail loudly. The proper fix is torchvision's CPU build for this
    torch."""
    import torch

    try:
        import torchvision  # noqa: F401
    except RuntimeError as e:
        if "torchvision::nms" not in str(e):
            raise
        lib = torch.library.Library("torchvision", "DEF")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _KEEP.append(lib)  # the schemas live as long as the Library object
        for k in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
            del sys.modules[k]
        import torchvision  # noqa: F401


_KEEP: list[Any] = []


def lift_norm_scales(model: Any, seed: int = 0) -> None:
    """Give every norm affine weight U(0.5, 1.5) and bias N(0, 0.1), and every layer-scale
    layer-scale vector (a parameter named `gamma`, initialised at 1e-6) U(0.25, 0.75).

    Trained networks have O(1) norm scales; the zero-initialised last BN of a residual branch
    (timm's zero_init_last) or a 1e-6 layer scale would make every residual branch vanish,
    so the network would compute little more than its stem and downsampling path."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mod in model.modules():
            norm = isinstance(mod, (torch.nn.modules.batchnorm._BatchNorm, torch.nn.LayerNorm,
                                    torch.nn.GroupNorm))
            if norm and getattr(mod, "weight", None) is not None:
                mod.weight.copy_(torch.rand(mod.weight.shape, generator=g) + 0.5)
                if mod.bias is not None:
                    mod.bias.copy_(torch.randn(mod.bias.shape, generator=g) * 0.1)
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if p.dim() == 1 and leaf == "gamma":
                p.copy_(torch.rand(p.shape, generator=g) * 0.5 + 0.25)


def calibrate_batchnorm(model: Any, make_batch: Any, steps: int = 4) -> int:
    """Set BatchNorm running statistics to the cumulative mean/variance over `steps` random
    batches (train mode, momentum=None), then return to eval mode. Returns the BN count."""
    import torch

    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None  # cumulative average over all calibration batches
    if bns:
        model.train()
        with torch.no_grad():
            for i in range(steps):
                model(*make_batch(i))
    model.eval()
    return len(bns)


def export(model: Any, args: tuple, input_names: list[str], output_names: list[str],
           dynamic_axes: dict[str, dict[int, str]]) -> bytes:
    """TorchScript ONNX export (opset 17) to bytes; raises the exporter's error unchanged."""
    import torch

    f = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, f, input_names=input_names, output_names=output_names,
                          dynamic_axes=dynamic_axes, opset_version=OPSET, dynamo=False,
                          do_constant_folding=True)
    return f.getvalue()
