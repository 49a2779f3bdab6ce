"""Scratch rules of the reference kernels that compute through wide or per-step temporaries:
Erf and exact Gelu (math.erf per element, through an object array of Python floats), the
recurrent ops (work copies of X, W and R, a per-direction output and its time reversal, the
gates of one step) and the Fourier transforms (complex copies, numpy.fft's output, the stacked
real/imaginary result before its cast). `plan.scratch.SCRATCH` takes them in; the rules read
shapes, dtypes and attributes only, and allocate nothing. Each bounds what tracemalloc measures
for the reference kernel (tests/memory/test_limits_workspace.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

# math.erf per element: an object array of pointers and one Python float each (ops.elementwise)
_ERF_PER_ELEMENT = 40  # float64 copy, object array, floats, float64 result, as tracemalloc sees


def _work(dt: np.dtype) -> int:
    """Itemsize of the float the kernels compute in (ops.common.work_float)."""
    return 8 if dt == np.float64 else 4


def _scalar(v: Any) -> int | None:
    if not isinstance(v, np.ndarray) or v.size != 1 or v.dtype.kind not in "biu":
        return None
    return int(v.reshape(-1)[0])


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
        ax = -2  # DFT-20's default (DFT-17 passes its attribute, default 1)
    ax = ax % x.ndim
    if ax == x.ndim - 1:
        return 0
    size = x.shape[ax]
    n = _scalar(dft_length) if dft_length is not None else None
    if n is None:
        n = 2 * (size - 1) if (onesided and inverse) else size
    return _dft_core(x, size, max(n, 1), bool(onesided), bool(inverse))


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


# op_type -> f(*inputs, **attrs) -> bytes the reference kernel holds beyond its outputs
RULES: dict[str, Callable[..., int]] = {
    "Erf": _erf,
    "Gelu": _gelu,
    "RNN": _rnn,
    "GRU": _gru,
    "LSTM": _lstm,
    "DFT": _dft,
    "STFT": _stft,
}
