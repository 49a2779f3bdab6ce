"""timm CNNs and ViT-S/16 at real widths: `timm.create_model(name, pretrained=False)` (no
download), seeded weights with O(1) norm and layer scales, BatchNorm calibrated on random
batches, exported with a dynamic batch axis. Feeds are N(0, 1) images at 224x224."""

from __future__ import annotations

from families.base import Case, register
from families.tiny import image_feeds

TIMM = ("torch", "timm")

CNNS = [
    # (case name, timm name, batches)
    ("resnet50", "resnet50", (1, 8)),
    ("efficientnet_b0", "efficientnet_b0", (1,)),
    ("mobilenetv3_large", "mobilenetv3_large_100", (1,)),
    ("convnext_tiny", "convnext_tiny", (1,)),
    ("regnety_016", "regnety_016", (1,)),
]


def build_timm(timm_name: str, size: int = 224, seed: int = 0) -> bytes:
    """The timm model with seeded random weights, calibrated, exported to ONNX bytes."""
    import torch

    from families import torch_export as tx

    tx.import_torchvision()
    import timm

    torch.manual_seed(seed)
    model = timm.create_model(timm_name, pretrained=False)
    tx.lift_norm_scales(model, seed)
    # Calibrate on the benchmark's own image distribution: statistics taken on white noise
    # leave the structured benchmark images with nearly equal logits (spread 0.03 vs 0.18
    # on ResNet-50).
    feeds = image_feeds(size)
    tx.calibrate_batchnorm(model, lambda i: (torch.from_numpy(feeds(8, 50 + i)["image"]),))
    example = torch.from_numpy(feeds(1, 99)["image"])
    return tx.export(model, (example,), ["image"], ["logits"],
                     {"image": {0: "B"}, "logits": {0: "B"}})


def register_all() -> None:
    """The cnn family and ViT-S/16."""
    for name, timm_name, batches in CNNS:
        register(Case(name, "cnn", lambda t=timm_name: build_timm(t), image_feeds(224),
                      needs=TIMM, config={"timm": timm_name, "size": 224, "calib": "feeds"},
                      batches=batches,
                      note=f"timm {timm_name}"))
    register(Case("vit_small", "vit", lambda: build_timm("vit_small_patch16_224"),
                  image_feeds(224), needs=TIMM,
                  config={"timm": "vit_small_patch16_224", "calib": "feeds"},
                  note="timm vit_small_patch16_224"))
