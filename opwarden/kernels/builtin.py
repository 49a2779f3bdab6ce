"""Importing this module registers every fast kernel variant on the built-in operators."""

from __future__ import annotations

from opwarden.kernels import activation, conv, elementwise, fused, linalg, norm, pool, select, shape, shuffle

for _module in (conv, pool, norm, linalg, elementwise, activation, fused, select, shape, shuffle):
    _module.register()
