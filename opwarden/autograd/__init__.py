"""Reverse-mode differentiation: the backward-rule protocol and `grad` over a whole model.

The built-in backward rules attach with their operators (the ops files, ops/grad.py).
"""

from __future__ import annotations

from opwarden.autograd.core import GradContext, call_rule
from opwarden.autograd.graph import grad

__all__ = ["GradContext", "call_rule", "grad"]
