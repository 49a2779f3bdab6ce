"""The operators. Importing this package registers every built-in operator object.

One file per family: each operator's declaration (``@op``: schema, contract, the inputs a
layout places), reference kernel, shape rule, backward rule and gradcheck cases, and samples
live together in its family's file. Shared helpers: base.py (OpDef, the registry), grad.py
(backward-rule helpers), common.py (compute dtypes, axes), select.py (variant choice and the
layout lookup the planners read), schema.py (ONNX schemas), custom.py (custom-op schemas).
"""

from __future__ import annotations

import importlib

from opwarden.ops.base import REGISTRY, OpDef, Sample, Variant, kernel, op

# Operator families, one module each; each module registers its ops on import.
FAMILIES = (
    "elementwise",
    "logic",
    "activation",
    "cast",
    "quant",
    "reduce",
    "linalg",
    "norm",
    "conv",
    "pool",
    "image",
    "detection",
    "shape",
    "constant",
    "index",
    "rnn",
    "signal",
    "random",
    "loss",
    "string",
    "transformer",
    "ml", "ml_tree_samples",
    "ml_features", "ml_samples",
    "ml_svm",
    "training",
    "control",
    "sequence",
    "contrib", "contrib_dynq",
    "contrib_quant", "contrib_quant_nn", "contrib_qmore",
    "contrib_attention",
    "contrib_embed",
    "contrib_wq",
    "contrib_fused", "contrib_legacy",
    "fused_elementwise",
    "fused",
    "fused_attention",
)

for _family in FAMILIES:
    importlib.import_module(f"{__name__}.{_family}")

# The fast kernel variants (opwarden.kernels) register on these operators from
# opwarden/__init__.py, which imports kernels.registry: they import the operators, not back.

__all__ = ["REGISTRY", "OpDef", "Sample", "Variant", "kernel", "op"]
