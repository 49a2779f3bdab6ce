"""MatMulNBits through float BLAS on a weight dequantized once.

A block-quantized weight is an initializer in every model that carries one (an int4 LLM's
linear layers), so its float32 [K, N] form is computed on the first call and cached with the
weight (kernels.cpu.util.packed: keyed by the constant arrays' identity, dropped with them);
each call is then one float GEMM, the arithmetic ORT's float32 path does too. Weights that are
not declared constant are dequantized on every call.
"""

from __future__ import annotations

from opwarden.kernels.cpu.util import packed
from opwarden.ops.base import REGISTRY
from opwarden.ops.contrib_wq import check_nbits_a, dequantize_nbits, matmul_nbits_apply


def matmul_nbits_cached(A, B, scales, zero_points=None, g_idx=None, bias=None, *, K, N, bits=4,
                        block_size, accuracy_level=0):
    """MatMulNBits with its dequantized weight cached per constant (B, scales, zero_points,
    g_idx)."""
    K, N, bits, block_size = int(K), int(N), int(bits), int(block_size)
    check_nbits_a(A, K, N, bias)
    deps = tuple(a for a in (scales, zero_points, g_idx) if a is not None)

    def dequantize(b):
        return dequantize_nbits(b, scales, zero_points, g_idx, K=K, N=N, bits=bits,
                                block_size=block_size)

    w = packed(B, ("MatMulNBits", K, N, bits, block_size, zero_points is None,
                   g_idx is None), dequantize, deps)
    return matmul_nbits_apply(A, w, bias, N)


def register() -> None:
    """Register the cached-dequantization variant of MatMulNBits."""
    REGISTRY.latest("MatMulNBits", "com.microsoft").kernel(
        "cpu", priority=10, name="matmulnbits.cpu.cached")(matmul_nbits_cached)
