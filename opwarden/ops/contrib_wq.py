"""Operators: weight-quantized com.microsoft ops (MatMulNBits, GatherBlockQuantized, QAttention).

What ORT's int4 LLM exports and its quantizer write: weights stored as blocks of 2/4/8-bit
integers with one scale (and zero point) per block, dequantized as (q - zero_point) * scale.
Layouts follow ORT's ContribOperators.md: values are packed low bits first within each byte;
MatMulNBits' B is [N, k_blocks, blob] (column n's K values, block by block), its packed zero
points [N, ceil(k_blocks * bits / 8)]. References compute in float32, as ORT's CPU kernels do
for float and (on x86) float16 inputs.
"""

from __future__ import annotations

import numpy as np

from opwarden.contract import Contract, TensorFact, one_of, such_that
from opwarden.errors import KernelError
from opwarden.ops.base import Sample, op
from opwarden.ops.common import normal
from opwarden.ops.contrib import attention_from_qkv

MS = "com.microsoft"
F32 = np.float32
_POW2_16 = such_that(lambda v: int(v) >= 16 and int(v) & (int(v) - 1) == 0,
                     "a power of 2, at least 16")


def _given(fact) -> bool:
    """Whether a shape rule's input fact stands for a present input."""
    return fact is not None and (fact.dtype is not None or fact.shape is not None)


def unpack_bits(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """uint8 [..., nbytes] -> int32 [..., count]: `bits`-wide values, low bits first."""
    per = 8 // bits
    shifts = (np.arange(per, dtype=np.uint8) * bits).astype(np.uint8)
    v = (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    v = v.reshape(*packed.shape[:-1], packed.shape[-1] * per)
    if v.shape[-1] < count:
        raise KernelError(f"{packed.shape[-1]} bytes hold {v.shape[-1]} {bits}-bit values, "
                          f"{count} needed")
    return v[..., :count].astype(np.int32)


def pack_bits(values: np.ndarray, bits: int) -> np.ndarray:
    """int [..., n] in [0, 2^bits) -> uint8 [..., ceil(n * bits / 8)], low bits first."""
    per = 8 // bits
    n = values.shape[-1]
    pad = (-n) % per
    v = np.concatenate([values, np.zeros((*values.shape[:-1], pad), values.dtype)], axis=-1)
    v = v.astype(np.uint8).reshape(*values.shape[:-1], -1, per)
    shifts = (np.arange(per, dtype=np.uint8) * bits).astype(np.uint8)
    return np.bitwise_or.reduce(v << shifts, axis=-1).astype(np.uint8)


# ---------------------------------------------------------------------------------------------
# MatMulNBits
# ---------------------------------------------------------------------------------------------


def _nbits_zero_points(zero_points, n: int, k_blocks: int, bits: int):
    """[N, k_blocks] zero points: the default 2^(bits-1), unpacked uint8, or float ones."""
    if zero_points is None:
        return np.full((n, k_blocks), 1 << (bits - 1), np.int32)
    zp = np.asarray(zero_points)
    if zp.dtype == np.uint8:
        zbytes = -(-k_blocks * bits // 8)
        if zp.size != n * zbytes:
            raise KernelError(f"MatMulNBits: uint8 zero_points must hold N * ceil(k_blocks * bits"
                              f" / 8) = {n * zbytes} bytes, got shape {zp.shape}")
        return unpack_bits(zp.reshape(n, zbytes), bits, k_blocks)
    if zp.size != n * k_blocks:
        raise KernelError(f"MatMulNBits: float zero_points must have N * k_blocks = "
                          f"{n * k_blocks} entries, got shape {zp.shape}")
    return zp.reshape(n, k_blocks).astype(F32)


def dequantize_nbits(B, scales, zero_points=None, g_idx=None, *, K: int, N: int, bits: int,
                     block_size: int) -> np.ndarray:
    """MatMulNBits' weight as a float32 [K, N] matrix: (q - zero_point) * scale per block."""
    if bits not in (2, 4, 8):
        raise KernelError(f"MatMulNBits: bits must be 2, 4 or 8, got {bits}")
    k_blocks = -(-K // block_size)
    blob = block_size * bits // 8
    if B.dtype != np.uint8 or B.shape != (N, k_blocks, blob):
        raise KernelError(f"MatMulNBits: B must be uint8 [N, k_blocks, blob] = "
                          f"{[N, k_blocks, blob]}, got {B.dtype} {list(B.shape)}")
    s = np.asarray(scales)
    if s.size != N * k_blocks:
        raise KernelError(f"MatMulNBits: scales must have N * k_blocks = {N * k_blocks} entries,"
                          f" got shape {s.shape}")
    s = s.reshape(N, k_blocks).astype(F32)
    if g_idx is not None and zero_points is not None and np.asarray(zero_points).dtype == np.uint8:
        # ORT's CPU kernel reads no packed zero points on its g_idx path: it dequantizes with
        # the default 2^(bits-1) (float zero points it does honour). Agree with it.
        zero_points = None
    zp = _nbits_zero_points(zero_points, N, k_blocks, bits)
    q = unpack_bits(B.reshape(N, k_blocks * blob), bits, k_blocks * block_size)
    if g_idx is not None:
        g = np.asarray(g_idx).astype(np.int64).reshape(-1)
        if g.shape != (K,) or (g.size and (g.min() < 0 or g.max() >= k_blocks)):
            raise KernelError(f"MatMulNBits: g_idx must be {K} block indices in [0, {k_blocks}),"
                              f" got shape {np.shape(g_idx)}")
        diff = q[:, :K] - zp[:, g] if zp.dtype != F32 else q[:, :K].astype(F32) - zp[:, g]
        return (diff.astype(F32) * s[:, g]).T
    q = q.reshape(N, k_blocks, block_size)
    diff = q - zp[..., None] if zp.dtype != F32 else q.astype(F32) - zp[..., None]
    w = (diff.astype(F32) * s[..., None]).reshape(N, k_blocks * block_size)
    return w[:, :K].T


def check_nbits_a(A, K: int, N: int, bias) -> None:
    if A.ndim < 1 or A.shape[-1] != K:
        raise KernelError(f"MatMulNBits: A's last dimension must be K={K}, got shape {A.shape}")
    if bias is not None and bias.shape != (N,):
        raise KernelError(f"MatMulNBits: bias must have shape [N] = [{N}], got {bias.shape}")


def matmul_nbits_apply(A, w: np.ndarray, bias, N: int) -> np.ndarray:
    """A @ w (+ bias) in float32, in A's dtype."""
    y = np.matmul(A.astype(F32), w)
    if bias is not None:
        y = y + bias.astype(F32)
    return y.reshape(*A.shape[:-1], N).astype(A.dtype)


@op("MatMulNBits", domain=MS, since=1,
    inputs=["A: T1", "B: T2", "scales: T1", "zero_points?: T3", "g_idx?: T4", "bias?: T1"],
    outputs=["Y: T1"],
    types={"T1": ["float32", "float16", "bfloat16"], "T2": ["uint8"],
           "T3": ["uint8", "float32", "float16", "bfloat16"], "T4": ["int32"]},
    attrs={"K": "INT", "N": "INT", "bits": 4, "block_size": "INT", "accuracy_level": 0},
    contract=Contract(nan="propagate", allowed={
        "bits": one_of(2, 4, 8), "block_size": _POW2_16,
        "accuracy_level": one_of(0, 1, 2, 3, 4)}))
def MatMulNBits(A, B, scales, zero_points=None, g_idx=None, bias=None, *, K, N, bits=4,
                block_size, accuracy_level=0):
    """A @ dequantize(B) (+ bias) with B block-quantized along K (com.microsoft MatMulNBits-1).

    accuracy_level is a speed hint; this computes in float32 at every level."""
    K, N = int(K), int(N)
    check_nbits_a(A, K, N, bias)
    w = dequantize_nbits(B, scales, zero_points, g_idx, K=K, N=N, bits=int(bits),
                         block_size=int(block_size))
    return matmul_nbits_apply(A, w, bias, N)


@MatMulNBits.infer
def _matmul_nbits_infer(A, *_, N, **__):
    if A.shape is None:
        return TensorFact(A.dtype, None)
    return TensorFact(A.dtype, (*A.shape[:-1], int(N)))


def quantize_nbits(w: np.ndarray, bits: int, block_size: int, rng=None, symmetric=False):
    """A float [K, N] weight as MatMulNBits' (B, scales, packed zero points): the samples' and
    tests' way to make valid inputs (min/max per block, round to nearest)."""
    K, N = w.shape
    k_blocks = -(-K // block_size)
    qmax = (1 << bits) - 1
    wp = np.zeros((N, k_blocks * block_size), F32)
    wp[:, :K] = w.T
    blocks = wp.reshape(N, k_blocks, block_size)
    lo = np.minimum(blocks.min(-1), 0)
    hi = np.maximum(blocks.max(-1), 0)
    scale = np.where(hi > lo, (hi - lo) / qmax, 1.0).astype(F32)
    zp = np.clip(np.rint(-lo / scale), 0, qmax).astype(np.int32)
    if symmetric:
        zp[:] = 1 << (bits - 1)
    q = np.clip(np.rint(blocks / scale[..., None]) + zp[..., None], 0, qmax).astype(np.int32)
    B = pack_bits(q.reshape(N, -1), bits).reshape(N, k_blocks, block_size * bits // 8)
    return B, scale.reshape(-1), pack_bits(zp, bits).reshape(-1)


@MatMulNBits.samples
def _matmul_nbits_samples(rng):
    r = normal(rng)

    def case(shape_a, K, N, bits, bs, zp="packed", g=False, bias=False, dtype=np.float32):
        B, s, z = quantize_nbits(r(K, N), bits, bs)
        k_blocks = -(-K // bs)
        zps = {"packed": z, "none": None,
               "float": (rng.random(N * k_blocks) * (1 << bits)).astype(dtype)}[zp]
        gi = (np.arange(K) // bs).astype(np.int32) if g else None
        if g:
            gi = rng.permutation(gi).astype(np.int32)
        ins = [r(*shape_a, K).astype(dtype), B, s.astype(dtype), zps, gi,
               r(N).astype(dtype) if bias else None]
        return Sample(ins, {"K": K, "N": N, "bits": bits, "block_size": bs}, constants=(1, 2, 3),
                      label=f"{bits}-bit K={K} N={N} bs={bs} zp={zp}{' g_idx' if g else ''}"
                            f"{' bias' if bias else ''} A{list(shape_a)} {np.dtype(dtype).name}")

    yield case((3,), 64, 8, 4, 32)
    yield case((2, 3), 40, 5, 4, 16, bias=True)  # K not a multiple of block_size, batch dims
    yield case((1,), 33, 1, 4, 32, zp="none")  # N = 1, default zero point
    yield case((4,), 48, 6, 2, 16)
    yield case((4,), 70, 3, 8, 64, zp="float")
    yield case((2,), 32, 4, 4, 16, g=True)
    yield case((2, 2), 24, 4, 4, 16, bias=True, dtype=np.float16)


# ---------------------------------------------------------------------------------------------
# GatherBlockQuantized
# ---------------------------------------------------------------------------------------------


def _gbq_values(data, bits: int):
    """(q as int32 with nibbles unpacked, default zero point, packed) for GatherBlockQuantized."""
    name = data.dtype.name
    if name == "uint8":
        if bits == 4:
            return unpack_bits(data, 4, data.shape[-1] * 2), 8, True
        return data.astype(np.int32), 128, False
    if name in ("int4", "uint4"):
        return data.astype(np.int32), 0, False
    raise KernelError(f"GatherBlockQuantized: data must be int4, uint4 or uint8, got {name}")


def _gbq_expand(p, axis: int, block_size: int, length: int):
    return np.repeat(p, block_size, axis=axis).take(np.arange(length), axis=axis)


@op("GatherBlockQuantized", domain=MS, since=1,
    inputs=["data: T1", "indices: Tind", "scales: T2", "zero_points?: T1"], outputs=["output: T2"],
    types={"T1": ["int4", "uint4", "uint8"], "T2": ["float32", "float16", "bfloat16"],
           "Tind": ["int32", "int64"]},
    attrs={"gather_axis": 0, "quantize_axis": 1, "block_size": 128, "bits": 4},
    contract=Contract(allowed={"block_size": _POW2_16, "bits": one_of(4, 8)}))
def GatherBlockQuantized(data, indices, scales, zero_points=None, *, gather_axis=0,
                         quantize_axis=1, block_size=128, bits=4):
    """Gather slices of a block-quantized tensor, dequantized to the scales' type
    (com.microsoft GatherBlockQuantized-1). uint8 data with bits=4 packs two values a byte
    along the last axis, which must then be the quantized axis."""
    q, default_zp, packed = _gbq_values(data, int(bits))
    r = q.ndim
    if not (-r <= gather_axis < r and -r <= quantize_axis < r):
        raise KernelError(f"GatherBlockQuantized: axes {gather_axis}, {quantize_axis} out of "
                          f"range for rank {r}")
    g, qa, bs = gather_axis % r, quantize_axis % r, int(block_size)
    if packed and qa != r - 1:
        raise KernelError("GatherBlockQuantized: packed uint8 data needs quantize_axis = last")
    want = tuple(-(-d // bs) if i == qa else d for i, d in enumerate(q.shape))
    if scales.shape != want:
        raise KernelError(f"GatherBlockQuantized: scales must have shape {list(want)}, got "
                          f"{list(scales.shape)}")
    if zero_points is None:
        zp = np.full(want, default_zp, np.int32)
    else:
        zp = _gbq_values(zero_points, int(bits))[0][..., :want[-1]] if packed else \
            _gbq_values(zero_points, int(bits))[0]
        if zp.shape != want:
            raise KernelError(f"GatherBlockQuantized: zero_points must match scales {list(want)}"
                              f", got {list(zero_points.shape)}")
    idx = np.asarray(indices).astype(np.int64)
    dim = q.shape[g]
    if idx.size and (idx.min() < -dim or idx.max() >= dim):
        raise KernelError(f"GatherBlockQuantized: indices must lie in [{-dim}, {dim}), got "
                          f"[{idx.min()}, {idx.max()}]")
    idx = np.where(idx < 0, idx + dim, idx)
    # Gather first, dequantize only what was gathered (an embedding table stays packed).
    qg = np.take(q, idx, axis=g)
    pidx = idx // bs if g == qa else idx
    sg, zg = np.take(scales, pidx, axis=g), np.take(zp, pidx, axis=g)
    axis = qa if qa < g else qa + idx.ndim - 1
    if g != qa:
        sg = _gbq_expand(sg, axis, bs, qg.shape[axis])
        zg = _gbq_expand(zg, axis, bs, qg.shape[axis])
    return ((qg - zg).astype(F32) * sg.astype(F32)).astype(scales.dtype)


@GatherBlockQuantized.infer
def _gbq_infer(data, indices, scales, *_, gather_axis=0, bits=4, **__):
    if data.shape is None or indices.shape is None:
        return TensorFact(scales.dtype, None)
    shape = list(data.shape)
    if data.dtype == "uint8" and int(bits) == 4:
        last = shape[-1]
        shape[-1] = 2 * last if isinstance(last, int) else None
    g = gather_axis % len(shape)
    return TensorFact(scales.dtype, (*shape[:g], *indices.shape, *shape[g + 1:]))


@GatherBlockQuantized.samples
def _gbq_samples(rng):
    def case(rows, cols, bits, bs, idx, g=0, qa=1, zp=True, dtype=np.float32):
        nb = -(-cols // bs)
        q = rng.integers(0, 1 << bits, (rows, cols))
        data = pack_bits(q, 4) if bits == 4 else q.astype(np.uint8)
        shape_s = (rows, nb) if qa == 1 else (-(-rows // bs), cols)
        if qa == 0:
            data = q.astype(np.uint8)
        scales = (rng.random(shape_s) * 0.1 + 0.01).astype(dtype)
        z = rng.integers(0, 1 << bits, shape_s)
        zps = (pack_bits(z, 4) if bits == 4 and qa == 1 else z.astype(np.uint8)) if zp else None
        return Sample([data, np.asarray(idx, np.int64), scales, zps],
                      {"gather_axis": g, "quantize_axis": qa, "block_size": bs,
                       "bits": bits if qa == 1 else 8}, constants=(0, 2, 3),
                      label=f"{bits}-bit [{rows}, {cols}] bs={bs} gather {g} quantize {qa}")

    yield case(10, 64, 4, 32, [[1, 9], [0, -1]])
    yield case(7, 40, 4, 16, [3, 3, 6], zp=False)  # cols not a multiple of block_size
    yield case(5, 48, 8, 16, [4, 0])
    yield case(6, 33, 4, 16, [2], g=1, zp=True)  # gather along the quantized axis
    yield case(40, 3, 8, 16, [39, 0, 17], qa=0)  # blocks along rows
    yield case(4, 32, 4, 16, [1], dtype=np.float16)


# ---------------------------------------------------------------------------------------------
# QAttention
# ---------------------------------------------------------------------------------------------


def _scalar_or_columns(p, n: int, what: str, dtype=None) -> np.ndarray:
    v = np.asarray(p) if dtype is None else np.asarray(p).astype(dtype)
    if v.size == 1:
        return v.reshape(())
    if v.shape == (n,):
        return v
    raise KernelError(f"QAttention: {what} must be a scalar or have {n} entries, got {v.shape}")


@op("QAttention", domain=MS, since=1,
    inputs=["input: T1", "weight: T2", "bias: T3", "input_scale: T3", "weight_scale: T3",
            "mask_index?: T4", "input_zero_point?: T1", "weight_zero_point?: T2", "past?: T3"],
    outputs=["output: T3", "present?: T3"],
    types={"T1": ["int8", "uint8"], "T2": ["int8", "uint8"], "T3": ["float32", "float16"],
           "T4": ["int32"]},
    attrs={"num_heads": "INT", "unidirectional": 0, "do_rotary": 0,
           "past_present_share_buffer": 0, "mask_filter_value": -10000.0, "scale": 0.0},
    contract=Contract(nan="propagate", allowed={
        "unidirectional": one_of(0, 1), "do_rotary": one_of(0),
        "past_present_share_buffer": one_of(0)}))
def QAttention(input, weight, bias, input_scale, weight_scale, mask_index=None,
               input_zero_point=None, weight_zero_point=None, past=None, *, num_heads,
               unidirectional=0, do_rotary=0, past_present_share_buffer=0,
               mask_filter_value=-10000.0, scale=0.0):
    """com.microsoft Attention on a quantized projection (QAttention-1): the int32 product
    (input - zp) @ (weight - zp), times input_scale * weight_scale (per tensor or per column),
    plus bias, then Attention's heads, mask, past and softmax in float32."""
    if input.ndim != 3 or weight.ndim != 2 or weight.shape[0] != input.shape[2]:
        raise KernelError(f"QAttention: input (B, S, hidden) and weight (hidden, 3 * hidden) "
                          f"expected, got {input.shape} and {weight.shape}")
    width = weight.shape[1]
    if width % 3 or (width // 3) % int(num_heads) or bias.shape != (width,):
        raise KernelError(f"QAttention: weight width {width} and bias {bias.shape} must be "
                          f"3 * hidden with hidden divisible by num_heads={num_heads}")
    zx = 0 if input_zero_point is None else int(np.asarray(input_zero_point).reshape(-1)[0])
    zw = np.zeros((), np.int64) if weight_zero_point is None else \
        _scalar_or_columns(weight_zero_point, width, "weight_zero_point", np.int64)
    sw = _scalar_or_columns(weight_scale, width, "weight_scale", F32)
    sx = F32(np.asarray(input_scale, F32).reshape(-1)[0])
    acc = np.matmul(input.astype(np.int64) - zx, weight.astype(np.int64) - zw)
    qkv = acc.astype(F32) * (sx * sw) + bias.astype(F32)
    h = width // 3
    return attention_from_qkv(qkv, (h, h, h), int(num_heads), mask_index, past, None,
                              unidirectional, mask_filter_value, scale, bias.dtype)


@QAttention.infer
def _qattention_infer(input, weight, bias, *rest, num_heads=1, **__):
    dt = bias.dtype
    past = rest[5] if len(rest) > 5 and _given(rest[5]) else None
    if input.shape is None or weight.shape is None:
        return TensorFact(dt, None), TensorFact(dt, None)
    b, s = input.shape[0], input.shape[1]
    w = weight.shape[1]
    h = w // 3 if isinstance(w, int) else None
    heads = int(num_heads)
    total = s
    if past is not None:
        p = past.shape[3] if past.shape is not None and len(past.shape) == 5 else None
        total = s + p if isinstance(s, int) and isinstance(p, int) else None
    head = h // heads if isinstance(h, int) else None
    return TensorFact(dt, (b, s, h)), TensorFact(dt, (2, b, heads, total, head))


@QAttention.samples
def _qattention_samples(rng):
    B, S, N, H = 2, 3, 2, 4
    D = N * H

    def case(label, mask=None, past=False, per_col=False, zp=True, wdt=np.int8, **attrs):
        x = rng.integers(0, 256, (B, S, D)).astype(np.uint8)
        lo, hi = (-128, 128) if wdt == np.int8 else (0, 256)
        w = rng.integers(lo, hi, (D, 3 * D)).astype(wdt)
        ws = (rng.random(3 * D if per_col else ()) * 0.002 + 0.001).astype(F32)
        wz = rng.integers(lo, hi, 3 * D if per_col else ()).astype(wdt) if zp else None
        ins = [x, w, rng.standard_normal(3 * D).astype(F32), np.asarray(0.02, F32),
               np.asarray(ws, F32), mask, np.asarray(rng.integers(0, 256), np.uint8) if zp
               else None, None if wz is None else np.asarray(wz, wdt),
               rng.standard_normal((2, B, N, 2, H)).astype(F32) if past else None]
        return Sample(ins, {"num_heads": N, **attrs}, noutputs=2 if past else 1, label=label,
                      constants=(1, 2, 4))

    yield case("per-tensor, no mask")
    yield case("1-D key lengths", mask=np.array([3, 1], np.int32))
    yield case("2-D mask, per-column weight scale/zero point", per_col=True, wdt=np.uint8,
               mask=(rng.random((B, S)) > 0.3).astype(np.int32))
    yield case("past, unidirectional", past=True, unidirectional=1)
    yield case("no zero points, scale", zp=False, scale=0.5)
