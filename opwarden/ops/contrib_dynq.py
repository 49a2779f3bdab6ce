"""Operators: dynamically quantized com.microsoft operators, as ORT's quantizer and
optimizer write them (``quantize_dynamic``; a saved ORT-optimized model).

DynamicQuantizeMatMul and DynamicQuantizeLSTM quantize their float input to uint8 at run time
with ORT's own scale and zero point (`_dynamic_quant_uint8`), take an exact integer product
with the quantized weights and rescale in float32; MatMulIntegerToFloat is the same product for
inputs already quantized. The LSTM's recurrent state is quantized per block of batch rows that
one of ORT's threads steps, so its results follow ORT's thread count (see lstm_batch_chunk).
"""

from __future__ import annotations

import functools
import glob
import os

import numpy as np

from opwarden.blas import compute_threads
from opwarden.contract import Contract, TensorFact, one_of
from opwarden.errors import KernelError
from opwarden.ops.base import Sample, op
from opwarden.ops.common import broadcast_shapes

MS = "com.microsoft"
F32 = np.float32


# --------------------------------------------------------------------------------------------
# Integer MatMul to float: DynamicQuantizeMatMul, MatMulIntegerToFloat
# --------------------------------------------------------------------------------------------


def _dynamic_quant_uint8(a: np.ndarray) -> tuple[np.ndarray, np.float32, np.int32]:
    """Asymmetric uint8 quantization of `a` (float32), its range widened to include 0.

    Bit for bit ORT's GetQuantizationParameter + MlasQuantizeLinear: the scale is
    (max - min) / 255 and the zero point 0 - min / scale, both in float32, the zero point
    clamped to [0, 255] then rounded half to even; values are a / scale (a division),
    rounded half to even, plus the zero point, saturated to [0, 255].
    """
    f32 = np.float32
    lo = min(f32(a.min()) if a.size else f32(0), f32(0))
    hi = max(f32(a.max()) if a.size else f32(0), f32(0))
    scale = f32(1) if hi == lo else f32(f32(hi - lo) / f32(255))
    zp = np.int32(np.rint(min(max(f32(f32(0) - f32(lo / scale)), f32(0)), f32(255))))
    q = np.clip(np.rint(a / scale) + zp, 0, 255).astype(np.int32)
    return q, scale, zp


def _per_column_param(v, n: int, name: str, what: str, dtype=None) -> np.ndarray:
    """A scale or zero point given per tensor (one element) or per column of B (n entries)."""
    if v is None:
        return np.zeros((), np.int32)
    v = np.asarray(v)
    if v.ndim > 1 or v.size not in (1, n):
        raise KernelError(f"{what}: {name} must be a scalar or a 1-D tensor of 1 or {n} entries "
                          f"(B's columns), got shape {v.shape}")
    if dtype is not None and v.dtype != np.dtype(dtype):
        raise KernelError(f"{what}: {name} has type {v.dtype}, expected {np.dtype(dtype)}")
    return v.reshape(-1) if v.size > 1 else v.reshape(())


def _int_matmul_to_float(qa, za, B, b_zero_point, multiplier, bias, what: str) -> np.ndarray:
    """(qa - za) @ (B - zB), exact in integers, times the float32 multiplier (per tensor or
    per column), plus bias: the output step of ORT's MatMulIntegerToFloat kernels."""
    if B.ndim < 1 or qa.ndim < 1:
        raise KernelError(f"{what}: A and B must have rank >= 1, got {qa.shape} and {B.shape}")
    n = B.shape[-1]
    zb = _per_column_param(b_zero_point, n, "b_zero_point", what, B.dtype).astype(np.int64)
    try:
        acc = np.matmul(qa.astype(np.int64) - int(za), B.astype(np.int64) - zb)
    except ValueError as e:
        raise KernelError(f"{what}: A {qa.shape} and B {B.shape} do not multiply: {e}") from e
    y = acc.astype(F32) * multiplier
    if bias is not None:
        bias = np.asarray(bias)
        if bias.shape != (n,):
            raise KernelError(f"{what}: bias must have shape ({n},) (B's columns), "
                              f"got {bias.shape}")
        y = y + bias.astype(F32)
    return y.astype(F32)


@op("DynamicQuantizeMatMul", domain=MS, since=1,
    inputs=["A: T1", "B: T2", "b_scale: T1", "b_zero_point?: T2", "bias?: T1"],
    outputs=["Y: T1"], types={"T1": ["float32"], "T2": ["int8", "uint8"]},
    contract=Contract(nan="propagate"))
def DynamicQuantizeMatMul(A, B, b_scale, b_zero_point=None, bias=None):
    """A quantized to uint8 on the fly, integer MatMul with B, then rescale
    (com.microsoft DynamicQuantizeMatMul-1)."""
    what = "DynamicQuantizeMatMul"
    qa, sa, za = _dynamic_quant_uint8(A.astype(F32))
    bs = _per_column_param(b_scale, B.shape[-1] if B.ndim else 1, "b_scale", what).astype(F32)
    return _int_matmul_to_float(qa, za, B, b_zero_point, (sa * bs).astype(F32), bias, what)


@op("MatMulIntegerToFloat", domain=MS, since=1,
    inputs=["A: T1", "B: T2", "a_scale: T3", "b_scale: T3", "a_zero_point?: T1",
            "b_zero_point?: T2", "bias?: T3"],
    outputs=["Y: T3"], types={"T1": ["uint8", "int8"], "T2": ["uint8", "int8"],
                              "T3": ["float32"]},
    contract=Contract(nan="propagate"))
def MatMulIntegerToFloat(A, B, a_scale, b_scale, a_zero_point=None, b_zero_point=None,
                         bias=None):
    """(A - a_zero_point) @ (B - b_zero_point) * (a_scale * b_scale) + bias, the integer
    product exact, A per tensor and B per tensor or per column
    (com.microsoft MatMulIntegerToFloat-1, which ORT's optimizer writes for
    DynamicQuantizeLinear + MatMulInteger + Cast + Mul)."""
    what = "MatMulIntegerToFloat"
    if A.dtype == np.int8 and B.dtype != np.int8:
        raise KernelError(f"{what}: an int8 A needs an int8 B (as ORT's kernels), got {B.dtype}")
    n = B.shape[-1] if B.ndim else 1
    sa = _per_column_param(a_scale, 1, "a_scale", what, F32)
    za = _per_column_param(a_zero_point, 1, "a_zero_point", what,
                           A.dtype if a_zero_point is not None else None)
    bs = _per_column_param(b_scale, n, "b_scale", what, F32)
    return _int_matmul_to_float(A, int(za), B, b_zero_point, (F32(sa) * bs).astype(F32), bias,
                                what)


def matmul_fact_shape(a, b) -> tuple | None:
    """MatMul's output shape from two fact shapes (symbolic dims allowed; None if unknown)."""
    if a is None or b is None or not a or not b:
        return None
    a, b = tuple(a), tuple(b)
    if len(b) == 1:
        return a[:-1]
    if len(a) == 1:
        return (*b[:-2], b[-1])
    batch = broadcast_shapes(a[:-2], b[:-2])
    return None if batch is None else (*batch, a[-2], b[-1])


@DynamicQuantizeMatMul.infer
def _dqmm_infer(a, b, *_, **__):
    return TensorFact("float32", matmul_fact_shape(a.shape, b.shape))


@MatMulIntegerToFloat.infer
def _mmitf_infer(a, b, sa, *_, **__):
    return TensorFact(sa.dtype or "float32", matmul_fact_shape(a.shape, b.shape))


def _int8s(rng, dtype, shape) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, size=shape).astype(dtype)


@DynamicQuantizeMatMul.samples
def _dqmm_samples(rng):
    for bt in (np.int8, np.uint8):
        name = np.dtype(bt).name
        a = rng.standard_normal((2, 3, 8)).astype(F32)
        b = _int8s(rng, bt, (8, 5))
        zp = np.asarray(3 if bt == np.int8 else 128, bt)
        yield Sample([a, b, np.asarray(0.02, F32), zp], label=f"{name} per tensor 3-D A",
                     constants=(1, 2, 3))
        yield Sample([a[0], b, rng.uniform(0.01, 0.03, 5).astype(F32),
                      np.full(5, zp, bt), rng.standard_normal(5).astype(F32)],
                     label=f"{name} per column + bias", constants=(1, 2, 3, 4))
    b = _int8s(rng, np.int8, (8, 4))
    yield Sample([np.abs(rng.standard_normal((3, 8))).astype(F32), b, np.asarray(0.05, F32)],
                 label="all-positive A, no zero point")
    yield Sample([np.zeros((3, 8), F32), b, np.asarray(0.05, F32)], label="A all zero")
    yield Sample([np.zeros((0, 8), F32), b, np.asarray(0.05, F32)], label="empty A")
    yield Sample([rng.standard_normal((8,)).astype(F32), b, np.asarray(0.05, F32)],
                 label="1-D A")


@MatMulIntegerToFloat.samples
def _mmitf_samples(rng):
    for at, bt in ((np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8)):
        name = f"{np.dtype(at).name}x{np.dtype(bt).name}"
        a, b = _int8s(rng, at, (2, 3, 16)), _int8s(rng, bt, (16, 6))
        za = np.asarray(7, at)
        yield Sample([a, b, np.asarray(0.03, F32), np.asarray(0.01, F32), za,
                      np.asarray(2, bt)], label=f"{name} per tensor", constants=(1, 3, 5))
        yield Sample([a[0], b, np.asarray(0.03, F32), rng.uniform(0.005, 0.02, 6).astype(F32),
                      za, np.full(6, 1, bt), rng.standard_normal(6).astype(F32)],
                     label=f"{name} per column + bias", constants=(1, 3, 5, 6))
    a, b = _int8s(rng, np.uint8, (0, 16)), _int8s(rng, np.int8, (16, 6))
    yield Sample([a, b, np.asarray(0.03, F32), np.asarray(0.01, F32)], label="empty A")


# --------------------------------------------------------------------------------------------
# Dynamically quantized LSTM
# --------------------------------------------------------------------------------------------


def _quant_matmul(a: np.ndarray, qw: np.ndarray, scale: np.ndarray, zp: np.ndarray) -> np.ndarray:
    """a @ dequantize(qw) as ORT computes it: all of `a` quantized to uint8 with one scale,
    an exact integer product, then rescaled per column of qw (float32)."""
    qa, sa, za = _dynamic_quant_uint8(a)
    acc = (qa - za).astype(np.int64) @ (qw.astype(np.int64) - zp.astype(np.int64))
    return acc.astype(np.float32) * (sa * scale)


@functools.lru_cache(maxsize=1)
def physical_cores() -> int:
    """Physical CPU cores, counted as ORT's default thread pool counts them (cpuinfo: distinct
    core ids per package); ORT's own fallback, half the logical CPUs, when sysfs is silent."""
    cores = set()
    for topo in glob.glob("/sys/devices/system/cpu/cpu[0-9]*/topology"):
        try:
            with open(f"{topo}/physical_package_id") as f1, open(f"{topo}/core_id") as f2:
                cores.add((f1.read().strip(), f2.read().strip()))
        except OSError:
            continue
    return len(cores) or max(1, (os.cpu_count() or 2) // 2)


def ort_intra_threads() -> int:
    """The degree of parallelism ORT's CPU kernels would see in this process: the session's
    intra_op_num_threads (as the CPU kernels compute with it: blas.compute_threads) capped at
    the physical cores, which is ORT's default."""
    return max(1, min(compute_threads(), physical_cores()))


def lstm_batch_chunk(batch: int, hidden: int, threads: int) -> int:
    """Rows of the batch that ORT's LSTM steps together (and so quantizes with one scale):
    the batch is split over the threads when it has more than 4 rows, or at least 2 rows and
    a hidden size of at most 256; otherwise the whole batch is one block."""
    if batch > 4 or (batch >= 2 and hidden <= 256):
        return -(-batch // max(1, threads))
    return max(batch, 1)


def _recurrent(prev: np.ndarray, qr, rs, rz, chunk: int) -> np.ndarray:
    """prev @ R with each block of `chunk` batch rows quantized on its own, as ORT's threads
    do."""
    return np.concatenate([_quant_matmul(prev[r:r + chunk], qr, rs, rz)
                           for r in range(0, prev.shape[0], chunk)]) if prev.shape[0] else \
        np.zeros((0, qr.shape[1]), np.float32)


def _per_column(v: np.ndarray, num_dir: int, cols: int, what: str) -> np.ndarray:
    """A scale / zero point given per direction ([D]) or per column ([D, cols]) as [D, 1|cols]."""
    v = np.asarray(v)
    if v.shape in ((num_dir,), (num_dir, 1)) or (num_dir == 1 and v.shape == ()):
        return v.reshape(num_dir, 1)
    if v.shape == (num_dir, cols):
        return v
    raise KernelError(f"{what} has shape {v.shape}; expected ({num_dir},) or ({num_dir}, {cols})")


def _qlstm_shapes(X, W, R, num_dir: int, hidden_size):
    if X.ndim != 3:
        raise KernelError(f"X must be [seq, batch, input], got shape {X.shape}")
    H = R.shape[1] if R.ndim == 3 else -1
    if hidden_size is not None and int(hidden_size) != H:
        raise KernelError(f"hidden_size={hidden_size} but R has shape {R.shape}")
    if W.shape != (num_dir, X.shape[2], 4 * H):
        raise KernelError(f"W has shape {W.shape}, expected {(num_dir, X.shape[2], 4 * H)}")
    if R.shape != (num_dir, H, 4 * H):
        raise KernelError(f"R has shape {R.shape}, expected {(num_dir, H, 4 * H)}")
    return H


def _f32_or_zeros(v, shape, what: str) -> np.ndarray:
    if v is None:
        return np.zeros(shape, np.float32)
    if v.shape != shape:
        raise KernelError(f"{what} has shape {v.shape}, expected {shape}")
    return v.astype(np.float32)


@op("DynamicQuantizeLSTM", domain=MS, since=1,
    inputs=["X: T", "W: T2", "R: T2", "B?: T", "sequence_lens?: T1", "initial_h?: T",
            "initial_c?: T", "P?: T", "W_scale: T", "W_zero_point: T2", "R_scale: T",
            "R_zero_point: T2"],
    outputs=["Y?: T", "Y_h?: T", "Y_c?: T"],
    types={"T": ["float32"], "T1": ["int32"], "T2": ["uint8", "int8"]},
    attrs={"activation_alpha": ("FLOATS", None), "activation_beta": ("FLOATS", None),
           "activations": ("STRINGS", None), "clip": ("FLOAT", None),
           "direction": "forward", "hidden_size": ("INT", None), "input_forget": 0},
    contract=Contract(nan="propagate", allowed={
        "direction": one_of("forward", "reverse", "bidirectional"),
        "input_forget": one_of(0, 1)}))
def DynamicQuantizeLSTM(X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None,
                        P=None, W_scale=None, W_zero_point=None, R_scale=None,
                        R_zero_point=None, *, activation_alpha=None, activation_beta=None,
                        activations=None, clip=None, direction="forward", hidden_size=None,
                        input_forget=0):
    """LSTM (gates i|o|f|c) with int8/uint8 W [D, input, 4H] and R [D, H, 4H]; X and each
    step's hidden state are quantized to uint8 on the fly (com.microsoft DynamicQuantizeLSTM-1).

    As in ORT, the input projection quantizes X[:max(sequence_lens)] with one scale and each
    recurrent step quantizes the previous output per block of batch rows that one of ORT's
    threads steps (see lstm_batch_chunk), so results follow ORT's thread count.
    """
    return quantized_lstm(
        X, W, R, B, sequence_lens, initial_h, initial_c, P, W_scale, W_zero_point, R_scale,
        R_zero_point, activation_alpha=activation_alpha, activation_beta=activation_beta,
        activations=activations, clip=clip, direction=direction, hidden_size=hidden_size,
        input_forget=input_forget, threads=ort_intra_threads())


def quantized_lstm(X, W, R, B, sequence_lens, initial_h, initial_c, P, W_scale, W_zero_point,
                   R_scale, R_zero_point, *, activation_alpha=None, activation_beta=None,
                   activations=None, clip=None, direction="forward", hidden_size=None,
                   input_forget=0, threads: int = 1):
    """DynamicQuantizeLSTM as ORT computes it with `threads` intra-op threads."""
    from opwarden.ops.rnn import _activation_list, _clipper, _seq_lens

    if W_scale is None or W_zero_point is None or R_scale is None or R_zero_point is None:
        raise KernelError("DynamicQuantizeLSTM needs W_scale, W_zero_point, R_scale, R_zero_point")
    num_dir = 2 if direction == "bidirectional" else 1
    H = _qlstm_shapes(X, W, R, num_dir, hidden_size)
    T, Bsz = X.shape[0], X.shape[1]
    lens = _seq_lens(sequence_lens, T, Bsz)
    quant = (_per_column(W_scale, num_dir, 4 * H, "W_scale").astype(np.float32),
             _per_column(W_zero_point, num_dir, 4 * H, "W_zero_point"),
             _per_column(R_scale, num_dir, 4 * H, "R_scale").astype(np.float32),
             _per_column(R_zero_point, num_dir, 4 * H, "R_zero_point"))
    b = _f32_or_zeros(B, (num_dir, 8 * H), "B")
    bias = b[:, :4 * H] + b[:, 4 * H:]
    p = _f32_or_zeros(P, (num_dir, 3 * H), "P")
    h0 = _f32_or_zeros(initial_h, (num_dir, Bsz, H), "initial_h")
    c0 = _f32_or_zeros(initial_c, (num_dir, Bsz, H), "initial_c")
    acts = _activation_list(activations, activation_alpha, activation_beta,
                            ["Sigmoid", "Tanh", "Tanh"], num_dir)
    chunk = lstm_batch_chunk(Bsz, H, threads)
    Y = np.zeros((T, num_dir, Bsz, H), np.float32)
    Y_h, Y_c = h0.copy(), c0.copy()
    for d in range(num_dir):
        reverse = direction == "reverse" or d == 1
        Y[:, d], Y_h[d], Y_c[d] = _qlstm_direction(
            X.astype(np.float32), W[d], R[d], [q[d] for q in quant], bias[d], p[d], h0[d], c0[d],
            lens, acts[d], _clipper(clip), input_forget, reverse, chunk)
    return Y, Y_h.astype(np.float32), Y_c.astype(np.float32)


def _qlstm_direction(x, w, r, quant, bias, p, h, c, lens, acts, cl, input_forget, reverse,
                     chunk):
    """One direction of quantized_lstm: (Y [T, B, H], final h, final c)."""
    from opwarden.ops.rnn import _reverse_index

    T, Bsz, H = x.shape[0], x.shape[1], r.shape[0]
    ws, wz, rs, rz = quant
    t_max = int(lens.max()) if lens.size else 0
    bidx = np.arange(Bsz)
    ridx = _reverse_index(lens, T) if reverse else None
    xd = x[ridx, bidx] if reverse else x
    # One quantization over every time step any sequence still uses.
    proj = _quant_matmul(xd[:t_max].reshape(-1, x.shape[2]), w, ws, wz)
    proj = proj.reshape(t_max, Bsz, 4 * H)
    f, g, hf = acts
    pi, po, pf = p[:H], p[H:2 * H], p[2 * H:]
    Yd = np.zeros((T, Bsz, H), np.float32)
    for t in range(t_max):
        active = (t < lens)[:, None]
        # The state quantized is last step's output row, which ORT zeroes for sequences
        # that had already ended then; it sets the range of its block's quantization scale.
        prev = h if t == 0 else np.where((t - 1 < lens)[:, None], h, 0.0)
        gates = proj[t] + _recurrent(prev.astype(np.float32), r, rs, rz, chunk) + bias
        i = f(cl(gates[:, :H] + pi * c))
        fg = 1 - i if input_forget else f(cl(gates[:, 2 * H:3 * H] + pf * c))
        c_new = fg * c + i * g(cl(gates[:, 3 * H:]))
        o = f(cl(gates[:, H:2 * H] + po * c_new))
        h_new = o * hf(c_new)
        h, c = np.where(active, h_new, h), np.where(active, c_new, c)
        Yd[t] = np.where(active, h_new, 0.0)
    return (Yd[ridx, bidx] if reverse else Yd), h, c


@DynamicQuantizeLSTM.infer
def _dqlstm_infer(x, w, r, *_, direction="forward", hidden_size=None, **__):
    num_dir = 2 if direction == "bidirectional" else 1
    hidden = hidden_size
    if hidden is None and r.shape is not None and len(r.shape) == 3:
        hidden = r.shape[1]
    if x.shape is None or len(x.shape) != 3 or hidden is None:
        return TensorFact("float32", None), TensorFact("float32", None), \
            TensorFact("float32", None)
    seq, batch = x.shape[0], x.shape[1]
    state = TensorFact("float32", (num_dir, batch, hidden))
    return TensorFact("float32", (seq, num_dir, batch, hidden)), state, state


def _qlstm_weights(rng, wdt, num_dir, inp, hidden, per_column):
    """Quantized W [D, inp, 4H] and R [D, H, 4H] with their scales and zero points."""
    cols = 4 * hidden
    w, r = _int8s(rng, wdt, (num_dir, inp, cols)), _int8s(rng, wdt, (num_dir, hidden, cols))
    shape = (num_dir, cols) if per_column else (num_dir,)
    zp = 0 if wdt == np.int8 else 128
    return (w, r, rng.uniform(0.002, 0.01, shape).astype(F32), np.full(shape, zp, wdt),
            rng.uniform(0.002, 0.01, shape).astype(F32), np.full(shape, zp, wdt))


@DynamicQuantizeLSTM.samples
def _dqlstm_samples(rng):
    seq, batch, inp, hidden = 4, 3, 5, 6
    x = rng.standard_normal((seq, batch, inp)).astype(F32)
    for direction, wdt, per_column in (("forward", np.int8, False),
                                       ("reverse", np.uint8, True),
                                       ("bidirectional", np.int8, True)):
        d = 2 if direction == "bidirectional" else 1
        w, r, ws, wz, rs, rz = _qlstm_weights(rng, wdt, d, inp, hidden, per_column)
        b = (rng.standard_normal((d, 8 * hidden)) * 0.1).astype(F32)
        lens = np.asarray([4, 2, 3], np.int32)
        h0 = (rng.standard_normal((d, batch, hidden)) * 0.5).astype(F32)
        c0 = (rng.standard_normal((d, batch, hidden)) * 0.5).astype(F32)
        p = (rng.standard_normal((d, 3 * hidden)) * 0.1).astype(F32)
        label = f"{direction} {np.dtype(wdt).name} {'per column' if per_column else 'per tensor'}"
        yield Sample([x, w, r, b, None, None, None, None, ws, wz, rs, rz],
                     {"direction": direction, "hidden_size": hidden}, noutputs=3,
                     label=label, constants=(1, 2, 3, 8, 9, 10, 11))
        yield Sample([x, w, r, b, lens, h0, c0, p, ws, wz, rs, rz],
                     {"direction": direction, "hidden_size": hidden}, noutputs=3,
                     label=f"{label}, sequence_lens, initial state, peepholes",
                     constants=(1, 2, 3, 7, 8, 9, 10, 11))
    w, r, ws, wz, rs, rz = _qlstm_weights(rng, np.int8, 1, inp, hidden, False)
    yield Sample([x, w, r, None, None, None, None, None, ws, wz, rs, rz],
                 {"hidden_size": hidden, "clip": 0.5, "input_forget": 1}, noutputs=3,
                 label="clip and input_forget")
    yield Sample([x[:, :0], w, r, None, None, None, None, None, ws, wz, rs, rz],
                 {"hidden_size": hidden}, noutputs=3, label="empty batch")
