"""Fast kernel variants, registered on the built-in operators by `kernels/builtin.py`.

`opwarden/__init__.py` imports that module right after the operators, so any import of
opwarden registers them; this package itself imports nothing, so the operator modules can use
`kernels.util` without the kernels importing the operators back.

Every variant here is float32, registered on the cpu device with priority 10 (above the
reference kernel), accepts a planned output buffer (`out=`), and is tested against the
reference kernel in tests/kernels/. NHWC variants are chosen by the layout pass.
"""

from __future__ import annotations

__all__ = [
    "activation", "conv", "elementwise", "fused", "linalg", "norm", "pool", "select", "shape",
    "shuffle",
]
