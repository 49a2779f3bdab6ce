"""The compiled NHWC MaxPool (native/pool.c) and its Python-side checks."""

from __future__ import annotations

import numpy as np

from opwarden import native
from opwarden.errors import KernelError


def maxpool_nhwc(x: np.ndarray, y: np.ndarray, kernel: tuple[int, int],
                 strides: tuple[int, int], dilations: tuple[int, int], pads_begin: tuple[int, int],
                 n_threads: int | None = None) -> np.ndarray:
    """y = MaxPool(x) over C-contiguous float32 NHWC x and y; y's H and W are the output size
    (pads_begin: top and left; the end pads follow from it). Returns y."""
    lib = native._LIB
    if lib is None:
        raise KernelError(f"compiled kernels not available: {native.status()['reason']}")
    for name, a in (("x", x), ("y", y)):
        if a.dtype != np.float32 or a.ndim != 4 or not a.flags.c_contiguous:
            raise KernelError(f"maxpool_nhwc: {name} must be a C-contiguous 4-D float32 array, "
                              f"got {a.dtype} {a.shape}")
    if not y.flags.writeable or y.shape[0] != x.shape[0] or y.shape[3] != x.shape[3]:
        raise KernelError(f"maxpool_nhwc: y {y.shape} does not match x {x.shape}")
    n, h, w, c = x.shape
    lib.maxpool_nhwc(x, y, n, h, w, c, y.shape[1], y.shape[2], *kernel, *strides, *dilations,
                     *pads_begin, native._threads(n_threads))
    return y
