"""The heldout family: real-width models opwarden has not been tuned on, run only when asked
(`--families heldout`; it is not in the default run). They check correctness and find far-off
speed outliers on architectures outside the tuned families, with the same builders: timm
CNNs/hybrids via vision.build_timm, transformers encoders via text's config builders."""

from __future__ import annotations

from families.base import Case, register
from families.text import HF, SEQ, _hf, _token_export
from families.tiny import image_feeds, token_feeds
from families.vision import TIMM, build_timm

VISION = [
    # (case name, timm name, image size)
    ("densenet121", "densenet121", 224),
    ("resnext50_32x4d", "resnext50_32x4d", 224),
    ("mobilevit_s", "mobilevit_s", 256),
    ("swin_tiny", "swin_tiny_patch4_window7_224", 224),
    # 296, not 299: image_feeds tiles an 8x8 grid, so the size must divide by 8.
    ("inception_v3", "inception_v3", 296),
    ("ghostnet_100", "ghostnet_100", 224),
]

TEXT = [
    # (case name, model class, config class, config overrides, vocab, note)
    ("roberta_base", "RobertaModel", "RobertaConfig", {"vocab_size": 50265},
     50265, "RobertaModel (roberta-base widths)"),
    ("albert_base", "AlbertModel", "AlbertConfig",
     {"hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072},
     30000, "AlbertModel (albert-base widths, shared layers)"),
    ("electra_small", "ElectraModel", "ElectraConfig", {}, 30522,
     "ElectraModel (electra-small discriminator widths)"),
]


def _text_build(cls: str, cfg_cls: str, cfg: dict) -> bytes:
    return _token_export(_hf(cls, cfg_cls, **cfg), ("last_hidden_state",))


def register_all() -> None:
    """The heldout family (opt-in, see families.OPT_IN)."""
    for name, timm_name, size in VISION:
        register(Case(name, "heldout", lambda t=timm_name, s=size: build_timm(t, s),
                      image_feeds(size), needs=TIMM,
                      config={"timm": timm_name, "size": size, "calib": "feeds"},
                      note=f"timm {timm_name} {size}px"))
    for name, cls, cfg_cls, cfg, vocab, note in TEXT:
        register(Case(name, "heldout", lambda c=cls, k=cfg_cls, o=cfg: _text_build(c, k, o),
                      token_feeds(SEQ, vocab), needs=HF,
                      config={"seq": SEQ, "model": cls, **cfg},
                      note=f"{note}, seq {SEQ}, padded mask"))
