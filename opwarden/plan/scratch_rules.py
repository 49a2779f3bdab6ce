"""Scratch rules of the reference kernels that compute through wide or per-step temporaries:
Erf and exact Gelu (math.erf per element, through an object array of Python floats), the
recurrent ops (work copies of X, W and R, a per-direction output and its time reversal, the
gates of one step), the Fourier transforms (complex copies, numpy.fft's output, the stacked
real/imaginary result before its cast), Cast and CastLike (widened copies, float64 rounding to a
narrow float's grid, int64 values for the sub-byte integers), the quantization ops (float64
and int64 copies of x, the int64 accumulator of the integer matrix products), elementwise
kernels with wide temporaries (Sigmoid, Swish, SwiGLU, Celu, IsInf, Mod, Pow, BitShift,
Bernoulli, the Instance and RMS normalizations, ReverseSequence's index), the string ops
(StringSplit, StringNormalizer, TfIdfVectorizer: a Python list, str or int per item),
AffineGrid (float64 meshes and grid) and Det (a float64 copy).
`plan.scratch.SCRATCH` takes them in; the rules read shapes, dtypes and attributes, and the
string ops' rules the strings themselves (one element at a time); they allocate nothing of
size. Each bounds what tracemalloc measures for the reference kernel
(tests/memory/test_limits_workspace.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from opwarden.ops.cast import is_exotic_float, is_small_int, to_target_dtype

# math.erf per element: an object array of pointers and one Python float each (ops.elementwise)
_ERF_PER_ELEMENT = 40  # float64 copy, object array, floats, float64 result, as tracemalloc sees


def _work(dt: np.dtype) -> int:
    """Itemsize of the float the kernels compute in (ops.common.work_float)."""
    return 8 if dt == np.float64 else 4


def _scalar(v: Any) -> int | None:
    if not isinstance(v, (np.ndarray, np.generic)) or v.size != 1 or v.dtype.kind not in "biu":
        return None
    return int(np.reshape(v, -1)[0])


def _erf(x: Any, **_: Any) -> int:
    return x.size * (_ERF_PER_ELEMENT + _work(x.dtype)) if isinstance(x, np.ndarray) else 0


def _gelu(x: Any, *, approximate: str = "none", **_: Any) -> int:
    if not isinstance(x, np.ndarray):
        return 0
    ws = _work(x.dtype)
    # the widened copy and the elementwise products; the exact form adds erf's temporaries
    wide = 5 * x.size * ws
    return wide + (x.size * _ERF_PER_ELEMENT if approximate != "tanh" else 0)


# -- RNN / GRU / LSTM (ops.rnn) -----------------------------------------------------------------


def _recurrent(gates: int, x: Any, w: Any, r: Any, *, direction: str = "forward",
               layout: int = 0) -> int:
    if not all(isinstance(a, np.ndarray) and a.ndim == 3 for a in (x, w, r)):
        return 0
    t, b = (x.shape[1], x.shape[0]) if layout == 1 else (x.shape[0], x.shape[1])
    h = r.shape[-1]
    dirs = 2 if direction == "bidirectional" else 1
    reverse = direction in ("reverse", "bidirectional")
    ws = _work(x.dtype)
    y = t * dirs * b * h
    held = x.size * (2 if reverse else 1)  # X in the work dtype, and its time reversal
    held += w.size + r.size + t * b * h * (3 if reverse else 2)  # W, R; Y per direction
    if layout == 1 or ws != x.dtype.itemsize:
        held += y  # Y is transposed or cast into the output
    step = 8 * b * gates * h  # one step's products, sums and activations
    return ws * (held + step) + (16 * t * b if reverse else 0)


def _rnn(x: Any, w: Any, r: Any, *_: Any, direction: str = "forward", layout: int = 0,
         **__: Any) -> int:
    return _recurrent(1, x, w, r, direction=direction, layout=layout)


def _gru(x: Any, w: Any, r: Any, *_: Any, direction: str = "forward", layout: int = 0,
         **__: Any) -> int:
    return _recurrent(3, x, w, r, direction=direction, layout=layout)


def _lstm(x: Any, w: Any, r: Any, *_: Any, direction: str = "forward", layout: int = 0,
          **__: Any) -> int:
    return _recurrent(4, x, w, r, direction=direction, layout=layout)


# -- DFT / STFT (ops.signal) ------------------------------------------------------------------

# numpy.fft (numpy 2, pocketfft) holds working copies of about four times the larger of its
# input and output, besides its output
_FFT_COPIES = 4


def _dft_core(x: np.ndarray, size: int, n: int, onesided: bool, inverse: bool) -> int:
    ws = _work(x.dtype)
    cz = 2 * ws
    m = x.size // max(x.shape[-1], 1)  # complex elements in
    rows = m // max(size, 1)
    # the widened copy and the complex one (real + 1j * imag for complex input)
    to_complex = x.size * ws + m * cz * (1 if x.shape[-1] == 1 else 2)
    if onesided and inverse:
        y = rows * n * ws  # irfft's real result, then cast into the output
        return m * cz + max(to_complex, 2 * y)
    mo, keep = rows * n, rows * (n // 2 + 1 if onesided else n)
    fft = (_FFT_COPIES * max(m, mo) + mo) * cz
    tail = mo * cz + keep * cz + keep * 2 * ws  # the one-sided take and the stacked parts
    return m * cz + max(to_complex, fft, tail)


def _dft(x: Any, dft_length: Any = None, axis_in: Any = None, *, axis: int | None = None,
         inverse: int = 0, onesided: int = 0, **_: Any) -> int:
    if not isinstance(x, np.ndarray) or x.ndim < 2:
        return 0
    ax = _scalar(axis_in) if axis_in is not None else axis
    if ax is None:
        ax = -2  # DFT-20's default (DFT-17 has its own rule, default 1)
    ax = ax % x.ndim
    if ax == x.ndim - 1:
        return 0
    size = x.shape[ax]
    n = _scalar(dft_length) if dft_length is not None else None
    if n is None:
        n = 2 * (size - 1) if (onesided and inverse) else size
    return _dft_core(x, size, max(n, 1), bool(onesided), bool(inverse))


def _dft_17(x: Any, dft_length: Any = None, *, axis: int = 1, inverse: int = 0,
            onesided: int = 0, **_: Any) -> int:
    # the axis is an attribute, default 1 (an input since DFT-20, default -2)
    return _dft(x, dft_length, None, axis=axis, inverse=inverse, onesided=onesided)


def _stft(signal: Any, frame_step: Any, window: Any = None, frame_length: Any = None, *,
          onesided: int = 1, **_: Any) -> int:
    step = _scalar(frame_step)
    if not isinstance(signal, np.ndarray) or signal.ndim not in (2, 3) or not step or step < 0:
        return 0
    batch, length = signal.shape[0], signal.shape[1]
    flen = _scalar(frame_length) if frame_length is not None else None
    if flen is None:
        flen = int(window.shape[0]) if isinstance(window, np.ndarray) and window.ndim else length
    if not 0 < flen <= length:
        return 0
    ws = _work(signal.dtype)
    cz = 2 * ws
    frames = batch * ((length - flen) // step + 1) * flen
    keep = frames // flen * (flen // 2 + 1 if onesided else flen)
    # the complex signal, the frame indices, the frames, windowed, their FFT and the stacked
    # real/imaginary parts before the cast
    lead = signal.size * ws + batch * length * cz + frames // batch * 8 * 2
    fft = (_FFT_COPIES + 1) * frames * cz
    return lead + frames * cz * (2 if window is not None else 1) + fft + keep * 2 * ws


# -- Cast / CastLike (ops.cast.cast_array) -------------------------------------------------------

_E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
_F8 = frozenset(np.dtype(t) for t in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz,
                                      ml_dtypes.float8_e5m2, ml_dtypes.float8_e5m2fnuz))
# bytes per element of each path, as tracemalloc sees them: e8m0 goes through float64 magnitudes,
# frexp's mantissas and exponents and int64 codes; the sub-byte integers through int64 values
# masked (and sign-extended when signed); narrow floats from float64 or wide integers through a
# float64 copy rounded to the target's grid (frexp, ldexp, rint of the finite values)
_TO_E8M0 = 65
_TO_SMALL_INT = {True: 32, False: 16}  # by signedness
_TO_GRID = 56


def cast_per_element(src: np.dtype, dst: np.dtype, saturate: bool = True) -> int:
    """Bytes per element `cast_array` holds beyond its output, casting `src` to `dst`."""
    if src.kind in "OUS" or dst.kind in "OUS":
        return 0  # strings: Python objects per element (not ruled)
    # exotic sources widen first: float32 for the ml_dtypes floats, int8/uint8 for int4/int2
    widened = 4 if is_exotic_float(src) else 1 if is_small_int(src) else 0
    w = np.dtype(np.float32) if widened == 4 else np.dtype(np.int8) if widened else src
    if dst == np.bool_:
        return widened
    if is_small_int(dst):
        return widened + _TO_SMALL_INT[ml_dtypes.iinfo(dst).min < 0]
    if dst == _E8M0:
        return widened + _TO_E8M0
    clip = saturate and dst in _F8
    if is_exotic_float(dst):
        if w == np.float64 or (w.kind in "iu" and w.itemsize >= 4):
            return widened + _TO_GRID
        if w.kind in "iub":
            return widened + 4 + (4 if clip else 0)  # a float32 copy, clipped
        return widened + (w.itemsize if clip else 0)
    # standard targets: float to integer builds the in-range mask, and zeroes what is outside
    return widened + (1 + w.itemsize if w.kind == "f" and dst.kind in "iu" else 0)


def _cast(x: Any, *_: Any, to: Any = None, saturate: int = 1, **__: Any) -> int:
    if not isinstance(x, np.ndarray) or to is None:
        return 0
    return x.size * cast_per_element(x.dtype, to_target_dtype(to), bool(saturate))


def _cast_like(x: Any, target_type: Any = None, *, saturate: int = 1, **_: Any) -> int:
    if not (isinstance(x, np.ndarray) and isinstance(target_type, (np.ndarray, np.generic))):
        return 0
    return x.size * cast_per_element(x.dtype, target_type.dtype, bool(saturate))


# -- quantization (ops.quant) --------------------------------------------------------------------

# bytes per element of x as tracemalloc sees them: the quotient in the work float, rounded, in
# float64, with the zero point added, NaN-cleared, clipped and in int64 before the integer cast;
# float outputs add the float64 grid rounding of cast_array
_QUANTIZE_INT, _QUANTIZE_FLOAT = 24, 64
# the requantization of an int64 accumulator: float32 product, rint, float64, zero point added,
# NaN-cleared, clipped, int64
_REQUANTIZE = 24


def _blocked(block_size: int, scale: Any, x: np.ndarray) -> bool:
    return block_size > 0 and np.ndim(scale) == x.ndim > 0


def _tensor(v: Any) -> bool:
    return isinstance(v, (np.ndarray, np.generic))  # a scale or zero point may be a scalar


def _quantize(x: Any, y_scale: Any = None, y_zero_point: Any = None, *, block_size: int = 0,
              output_dtype: int = 0, precision: int = 0, **_: Any) -> int:
    if not isinstance(x, np.ndarray) or not _tensor(y_scale):
        return 0
    if _tensor(y_zero_point):
        out = y_zero_point.dtype
    else:
        out = to_target_dtype(output_dtype) if output_dtype else np.dtype(np.uint8)
    per = _QUANTIZE_FLOAT if out.kind == "f" or is_exotic_float(out) else _QUANTIZE_INT
    if _blocked(block_size, y_scale, x):
        prec = to_target_dtype(precision) if precision else y_scale.dtype
        per += _work(prec) + 2  # the scale repeated over each block, in the work float
    return x.size * per


def _dequantize(x: Any, x_scale: Any = None, *rest: Any, block_size: int = 0,
                output_dtype: int = 0, **_: Any) -> int:
    if not isinstance(x, np.ndarray) or not _tensor(x_scale):
        return 0
    if output_dtype:
        out = to_target_dtype(output_dtype)
    elif x_scale.dtype.kind == "f" or x_scale.dtype.name == "bfloat16":
        out = x_scale.dtype
    else:
        out = np.dtype(np.float32)
    ws = out.itemsize if out in (np.float16, np.float32, np.float64) else 4
    # x in int64 (or float64), its product in the work float, and that rounded to an exotic
    # output type and back
    per = 8 + ws + (ws if is_exotic_float(out) else 0)
    if _blocked(block_size, x_scale, x):
        per += 8 + ws  # the repeated scale, in float64 and in the work float
    return x.size * per


def _dynamic_quantize(x: Any, **_: Any) -> int:
    if not isinstance(x, np.ndarray):
        return 0
    return x.size * (_QUANTIZE_INT + (0 if x.dtype == np.float32 else 4))


def _int_product(a: Any, b: Any, a_zp: Any, b_zp: Any) -> tuple[int, int] | None:
    """(peak bytes, int64 accumulator bytes) of ops.quant's centered int64 matmul."""
    if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) or not (a.ndim and b.ndim):
        return None
    try:
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        return None
    m = a.shape[-2] if a.ndim > 1 else 1
    n = b.shape[-1] if b.ndim > 1 else 1
    acc = 8 * int(np.prod(batch, dtype=np.int64)) * m * n
    ca, cb = 8 * a.size, 8 * b.size  # each centered in int64; a zero point's subtraction too
    peak = max(ca * (2 if a_zp is not None else 1), ca + cb * (2 if b_zp is not None else 1),
               ca + cb + acc)
    return peak, acc


def _matmul_integer(a: Any, b: Any, a_zero_point: Any = None, b_zero_point: Any = None,
                    **_: Any) -> int:
    got = _int_product(a, b, a_zero_point, b_zero_point)
    return got[0] if got else 0


def _qlinear_matmul(a: Any, a_scale: Any, a_zero_point: Any, b: Any, b_scale: Any = None,
                    b_zero_point: Any = None, *_: Any, **__: Any) -> int:
    got = _int_product(a, b, a_zero_point, b_zero_point)
    if got is None:
        return 0
    peak, acc = got
    return max(peak, acc + acc // 8 * _REQUANTIZE)


# -- elementwise kernels through work-float temporaries (ops.common.apply_wide) -----------------

# op_type -> (temporaries in the work float, bytes) per output element, as tracemalloc sees them:
# sigmoid's exp, sum and quotient, Swish/SwiGLU's product besides, Celu's expm1 and its min,
# the instance statistics' deviation, square and quotient, IsInf's two tests and their union
_WIDE_TEMPS = {
    "Sigmoid": (3, 1), "Swish": (4, 1), "SwiGLU": (4, 1), "Celu": (2, 0), "IsInf": (0, 3),
    "Mod": (0, 0), "InstanceNormalization": (3, 0),
}


def _elementwise(op_type: str) -> Callable[..., int]:
    temps, extra = _WIDE_TEMPS[op_type]

    def rule(*xs: Any, **_: Any) -> int:
        arrs = [x for x in xs if isinstance(x, np.ndarray)]
        if not arrs or (op_type == "InstanceNormalization" and len(arrs) > 1):
            arrs = arrs[:1]  # scale and B are per channel
        try:
            n = int(np.prod(np.broadcast_shapes(*(a.shape for a in arrs)), dtype=np.int64))
        except ValueError:
            return 0
        dt = arrs[0].dtype
        if dt.kind not in "f" and dt.name != "bfloat16":
            return n * extra if op_type == "IsInf" else 0
        per = temps * _work(dt) + extra
        if dt.name in ("float16", "bfloat16"):
            # float32 copies of the inputs, and the float32 result before its cast
            return n * (per + 4) + 4 * sum(a.size for a in arrs)
        return n * per

    return rule


def _pow(x: Any, y: Any = None, *_: Any, **__: Any) -> int:
    y = np.asarray(y) if isinstance(y, np.generic) else y
    if not (isinstance(x, np.ndarray) and isinstance(y, np.ndarray)):
        return 0
    if x.dtype.kind in "iu" and y.dtype.kind in "iub":
        return 0  # integer powers: no float copies
    try:
        n = int(np.prod(np.broadcast_shapes(x.shape, y.shape), dtype=np.int64))
    except ValueError:
        return 0
    out = n * x.dtype.itemsize
    # float64 copies of base and exponent and their power; integer bases test and truncate it
    peak = max(8 * (x.size + y.size + n), 8 * n + out)
    if x.dtype.kind in "iu":
        peak = max(peak, 17 * n + out)
    return max(peak - out, 0)


def _rms_norm(x: Any, scale: Any = None, *, stash_type: int = 1, **_: Any) -> int:
    if not isinstance(x, np.ndarray):
        return 0
    st = to_target_dtype(stash_type).itemsize
    # X in the stash type, its square and quotient; the quotient in X's type and in scale's
    return x.size * (2 * st + 2 * max(x.dtype.itemsize, 4))


def _bernoulli(x: Any, *, dtype: Any = None, **_: Any) -> int:
    if not isinstance(x, np.ndarray):
        return 0
    out = x.size * (to_target_dtype(dtype) if dtype is not None else x.dtype).itemsize
    p = 0 if x.dtype == np.float64 else 8 * x.size  # the float64 probabilities
    # the float64 uniforms and the boolean draw before its cast
    return max(p + 9 * x.size, p + x.size + out) - out


def _reverse_sequence(x: Any, lens: Any = None, *, batch_axis: int = 1, time_axis: int = 0,
                      **_: Any) -> int:
    if not isinstance(x, np.ndarray) or x.ndim < 2:
        return 0
    steps_batch = x.shape[time_axis % x.ndim] * x.shape[batch_axis % x.ndim]
    # the (time, batch) int64 source steps: a test, a difference, np.where's result; then the
    # gathered copy before it is moved back into place
    return 17 * steps_batch + x.nbytes


def _bit_shift(x: Any, y: Any = None, *, direction: str = "LEFT", **_: Any) -> int:
    y = np.asarray(y) if isinstance(y, np.generic) else y
    if not (isinstance(x, np.ndarray) and isinstance(y, np.ndarray)):
        return 0
    try:
        n = int(np.prod(np.broadcast_shapes(x.shape, y.shape), dtype=np.int64))
    except ValueError:
        return 0
    isz = x.dtype.itemsize
    # the in-range mask, the masked amounts and their cast, the shifted values; a signed right
    # shift's sign fill (a test, an int64 where and its cast)
    fill = n * (1 + 8 + isz) if direction == "RIGHT" and x.dtype.kind == "i" else 0
    return y.size * (1 + 2 * max(y.dtype.itemsize, isz)) + n * isz + fill


# -- string kernels (ops.string): Python str objects and lists per element ----------------------

_LIST, _SLOT = 64, 8  # a list's header (with its GC head, rounded), a pointer per item


def _text(s: Any) -> str:
    return s.decode("utf-8", "replace") if isinstance(s, bytes) else str(s)


def _str_bytes(s: str) -> int:
    if len(s) < 2 and (not s or ord(s) < 256):
        return 0  # CPython's shared empty and one-character strings
    return sys.getsizeof(s) + 8  # the object and allocator rounding


def _decoded(s: Any) -> int:
    """Bytes of the str a kernel makes of an element (none for a str itself)."""
    return 0 if type(s) is str else _str_bytes(_text(s))


def _string_split(x: Any, *, delimiter: Any = None, maxsplit: Any = None, **_: Any) -> int:
    if not isinstance(x, np.ndarray) or x.dtype != object:
        return 0
    sep = delimiter if delimiter else None
    limit = -1 if maxsplit is None else int(maxsplit)
    prealloc = 12 if limit < 0 else min(limit + 1, 12)
    total = 0
    for s in x.reshape(-1):
        parts = _text(s).split(sep, limit)  # one string's parts at a time, counted then freed
        # a list per string and a new str per part (the padded output points at them)
        k = len(parts)
        # str.split preallocates its list (12 slots at most), then grows it by an eighth
        slots = max(k + k // 8 + 6, prealloc) if k > prealloc else prealloc
        total += _LIST + _SLOT * (slots + 1) + sum(_str_bytes(p) for p in parts) + _decoded(s)
    return total


def _string_normalizer(x: Any, *, case_change_action: str = "NONE", **_: Any) -> int:
    if not isinstance(x, np.ndarray) or x.dtype != object:
        return 0
    # the word lists (decoded, filtered, case-changed, copied into the output), the decoded
    # strs of elements that are not str, and the case-changed ones
    total = 4 * (_LIST + _SLOT * x.size)
    changes = case_change_action in ("LOWER", "UPPER")
    for s in x.reshape(-1):
        total += _decoded(s) + (_str_bytes(_text(s)) if changes else 0)
    return total


def _tfidf(x: Any, *, max_gram_length: Any = None, pool_strings: Any = None,
           ngram_indexes: Any = None, **_: Any) -> int:
    if not isinstance(x, np.ndarray) or x.ndim not in (1, 2) or not max_gram_length:
        return 0
    n, length = int(max_gram_length), x.shape[-1]
    # per row, for the longest n-grams: the int64 window index (and its arange), the gathered
    # windows, their tolist: a list per window holding n items (a Python int each unless the
    # items are the pool's strs)
    item = 8 + (0 if pool_strings is not None else 32)
    row = length * (80 + n * (16 + item))
    # the rows in int64 or as an object array of strs; the pool's n-gram table (a tuple each)
    rows = 8 * x.size
    table = 120 * len(ngram_indexes) if ngram_indexes is not None else 0
    return row + rows + table


# -- geometry and linear algebra -----------------------------------------------------------------


def _affine_grid(theta: Any, size: Any = None, **_: Any) -> int:
    if not isinstance(theta, np.ndarray) or not isinstance(size, np.ndarray) or size.size > 8:
        return 0
    dims = [int(v) for v in size.reshape(-1)]
    r = len(dims) - 2
    if r not in (2, 3) or min(dims) < 0:
        return 0
    p = int(np.prod(dims[2:], dtype=np.int64))
    # float64 meshes, the homogeneous positions (r + 1 per point), and the float64 grid of
    # every batch before its cast
    return 8 * p * (2 * r + 1) + 8 * dims[0] * p * r


def _det(x: Any, **_: Any) -> int:
    if not isinstance(x, np.ndarray) or x.ndim < 2:
        return 0
    m = x.shape[-1]
    # numpy.linalg.det computes in float64: a cast copy of anything else (float16 widened to
    # float32 first), with int pivots per row; each matrix is factored in a buffer of its own
    cast = 0 if x.dtype == np.float64 else 8 * x.size + 8 * (x.size // max(m, 1))
    half = 4 * x.size if x.dtype.name in ("float16", "bfloat16") else 0
    return cast + half + 8 * m * (m + 1)


# op_type -> f(*inputs, **attrs) -> bytes the reference kernel holds beyond its outputs
RULES: dict[str, Callable[..., int]] = {
    "Erf": _erf,
    "Gelu": _gelu,
    "RNN": _rnn,
    "GRU": _gru,
    "LSTM": _lstm,
    "DFT": _dft,
    "DFT-17": _dft_17,
    "STFT": _stft,
    "Cast": _cast,
    "CastLike": _cast_like,
    "QuantizeLinear": _quantize,
    "DequantizeLinear": _dequantize,
    "DynamicQuantizeLinear": _dynamic_quantize,
    "MatMulInteger": _matmul_integer,
    "QLinearMatMul": _qlinear_matmul,
    **{op_type: _elementwise(op_type) for op_type in _WIDE_TEMPS},
    "Pow": _pow,
    "RMSNormalization": _rms_norm,
    "Bernoulli": _bernoulli,
    "ReverseSequence": _reverse_sequence,
    "BitShift": _bit_shift,
    "StringSplit": _string_split,
    "StringNormalizer": _string_normalizer,
    "TfIdfVectorizer": _tfidf,
    "AffineGrid": _affine_grid,
    "Det": _det,
}
