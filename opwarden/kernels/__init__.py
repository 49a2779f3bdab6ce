"""Kernel variants beyond the reference, per device: `cpu/` (fast NumPy/OpenBLAS, one module per
family, one variant per algorithm) and `torch/` (the PyTorch device, listed when torch imports).

`registry.py` registers them, in a fixed order, on the operators `opwarden.ops` declares;
`opwarden/__init__.py` imports it right after `ops`, so any import of opwarden has them. Kernels
import the operators, never the other way.

Calling convention (every variant, every device): inputs positional (`None` for an omitted
optional input), attributes as keyword arguments (node values plus schema defaults, resolved
once at placement), `noutputs=` when the operator declares it, `out=` / `workspace=` when the
variant accepts them; returns an array or a tuple. A variant with layout `NHWC` receives and
produces its activation tensors in NHWC (weights stay in ONNX layout). Graph attributes
(If/Loop/Scan bodies) arrive as `execute.bound.BoundGraph` callables. A variant may also bind
itself to a node (`Variant.specialize(kwargs) -> fn`, called once per step when a session
compiles); the guard's fallback still runs the reference kernel. Each variant is checked against
the reference by `opwarden check` on every case its `when` accepts.
"""

from __future__ import annotations
