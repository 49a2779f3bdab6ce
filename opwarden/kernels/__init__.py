"""Fast kernel variants. Importing this package registers them on the built-in operators.

Every variant here is float32, registered on the cpu device with priority 10 (above the
reference kernel), accepts a planned output buffer (`out=`), and is tested against the
reference kernel in tests/kernels/. NHWC variants are chosen by the layout pass.
"""

from __future__ import annotations

from . import activation, conv, elementwise, fused, linalg, norm, pool, select, shape, shuffle

for _module in (conv, pool, norm, linalg, elementwise, activation, fused, select, shape, shuffle):
    _module.register()

__all__ = [
    "activation", "conv", "elementwise", "fused", "linalg", "norm", "pool", "select", "shape",
    "shuffle",
]
