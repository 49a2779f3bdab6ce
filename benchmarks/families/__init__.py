"""Model builders of the family benchmark (benchmarks/families.py), one module per kind.

Importing the package registers every case in `base.CASES`; nothing heavy is imported until a
case is built (torch, timm, transformers, lightgbm and xgboost load inside the builders).
"""

from families import derived, text, tiny, trees, vision
from families.base import CASES

tiny.register_smoke()
vision.register_all()
text.register_all()
trees.register_all()
derived.register_all()  # last: it derives from the cases above

FAMILIES = ("cnn", "vit", "bert", "decoder", "encoder", "trees", "quant", "fp16")

__all__ = ["CASES", "FAMILIES"]
