"""Reverse-mode differentiation: built-in backward rules and `grad` over a whole model."""

from __future__ import annotations

from opwarden.autograd import rules  # noqa: F401 - attaches the built-in backward rules
from opwarden.autograd.core import GradContext, call_rule
from opwarden.autograd.graph import grad

__all__ = ["GradContext", "call_rule", "grad"]
