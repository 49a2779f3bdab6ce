"""Graph optimizations run between validation and placement (issue 8 fills this room)."""

from __future__ import annotations

from typing import Any


def optimize(model: Any, options: Any) -> list[dict[str, Any]]:
    """Rewrite `model` in place according to `options`; returns what each pass did."""
    return []
