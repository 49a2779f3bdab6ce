"""Verification: the ONNX node suite, the contract harness (`check`) and `gradcheck`."""

from __future__ import annotations

from typing import Any

from opwarden.verify.harness import CHECKS, Report, VariantReport, check


def gradcheck(op_or_variant: Any, inputs: Any, attrs: Any = None, **kwargs: Any) -> Any:
    """Analytic vs central finite-difference gradients (see `opwarden.verify.grads`)."""
    from opwarden.verify.grads import gradcheck as _gradcheck

    return _gradcheck(op_or_variant, inputs, attrs, **kwargs)


__all__ = ["CHECKS", "Report", "VariantReport", "check", "gradcheck"]
