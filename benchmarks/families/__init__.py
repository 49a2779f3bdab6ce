"""Model builders of the family benchmark (benchmarks/families.py), one module per kind.

Importing the package registers every case in `base.CASES`; nothing heavy is imported until a
case is built (torch, timm, transformers, lightgbm and xgboost load inside the builders).
"""

from families import derived, heldout, text, tiny, trees, vision
from families.base import CASES

tiny.register_smoke()
vision.register_all()
text.register_all()
trees.register_all()
derived.register_all()  # it derives from the cases above
heldout.register_all()

FAMILIES = ("cnn", "vit", "bert", "decoder", "encoder", "trees", "quant", "fp16")
# Run only when named in --families: not part of the default (all-family) run.
OPT_IN = ("heldout",)

__all__ = ["CASES", "FAMILIES", "OPT_IN"]
