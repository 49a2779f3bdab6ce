"""Fused operators (domain "opwarden") created by the graph passes (issue 8)."""

from __future__ import annotations
