"""The operators. Importing this package registers every built-in operator object."""

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
    "shape",
    "constant",
    "index",
    "rnn",
    "signal",
    "random",
    "loss",
    "string",
    "transformer",
    "ml",
    "control",
    "sequence",
    "contrib",
    "fused",
)

for _family in FAMILIES:
    importlib.import_module(f"{__name__}.{_family}")

# The fast kernel variants (opwarden.kernels) register on these operators from
# opwarden/__init__.py, which imports kernels.builtin: they import the operators, not back.

__all__ = ["REGISTRY", "OpDef", "Sample", "Variant", "kernel", "op"]
