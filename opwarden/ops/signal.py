"""Operators: signal family (DFT, STFT, window functions, MelWeightMatrix).

Complex tensors are carried as real tensors whose last dimension is 1 (real) or 2 (real, imag).
"""

import numpy as np

from opwarden.contract import Contract, one_of
from opwarden.dtypes import np_dtype
from opwarden.errors import KernelError
from opwarden.ops.base import op
from opwarden.ops.common import work_float


def _to_complex(x):
    """[..., 1] or [..., 2] real tensor -> complex ndarray without the last dimension."""
    if x.ndim < 1 or x.shape[-1] not in (1, 2):
        raise KernelError(
            f"the last dimension must be 1 (real) or 2 (complex), got shape {x.shape}"
        )
    ctype = np.complex128 if x.dtype == np.float64 else np.complex64
    xw = x.astype(work_float(x.dtype))
    if x.shape[-1] == 1:
        return xw[..., 0].astype(ctype)
    return (xw[..., 0] + 1j * xw[..., 1]).astype(ctype)


def _from_complex(z, dtype):
    """Complex ndarray -> [..., 2] real tensor of `dtype`."""
    return np.stack([z.real, z.imag], axis=-1).astype(dtype)


def _scalar_int(v, name):
    a = np.asarray(v)
    if a.size != 1:
        raise KernelError(f"{name} must be a scalar, got shape {a.shape}")
    return int(a.reshape(()))


def _dft(x, dft_length, axis, inverse, onesided):
    """The DFT of `x` along `axis` (an axis of x, not counting the trailing complex dimension)."""
    r = x.ndim
    if not (-r <= axis <= -2 or 0 <= axis <= r - 2):
        raise KernelError(f"axis {axis} out of range for input of rank {r}")
    ax = axis % r
    z = _to_complex(x)
    size = z.shape[ax]
    if dft_length is None:
        n = 2 * (size - 1) if (onesided and inverse) else size
    else:
        n = _scalar_int(dft_length, "dft_length")
    if n <= 0:
        raise KernelError(f"dft_length must be positive, got {n}")
    if onesided and inverse:
        # IRFFT: the input is the one-sided spectrum; the output is a real signal of length n.
        y = np.fft.irfft(z, n=n, axis=ax)
        return y[..., None].astype(x.dtype)
    if onesided and x.shape[-1] == 2:
        raise KernelError("onesided forward DFT needs a real input (last dimension 1)")
    y = np.fft.ifft(z, n=n, axis=ax) if inverse else np.fft.fft(z, n=n, axis=ax)
    if onesided:
        y = np.take(y, np.arange(n // 2 + 1), axis=ax)
    return _from_complex(y, x.dtype)


_DFT_CONTRACT = Contract(nan="propagate", allowed={"inverse": one_of(0, 1),
                                                    "onesided": one_of(0, 1)})


@op("DFT", since=20, contract=_DFT_CONTRACT)
def DFT(input, dft_length=None, axis=None, *, inverse=0, onesided=0):
    """Discrete Fourier transform along an axis given as an input, default -2 (ONNX DFT-20)."""
    ax = -2 if axis is None else _scalar_int(axis, "axis")
    return _dft(input, dft_length, ax, inverse, onesided)


@op("DFT", since=17, contract=_DFT_CONTRACT)
def DFT_17(input, dft_length=None, *, axis=1, inverse=0, onesided=0):
    """Discrete Fourier transform along the `axis` attribute, default 1 (ONNX DFT-17)."""
    return _dft(input, dft_length, axis, inverse, onesided)


@op("STFT", since=17, contract=Contract(nan="propagate", allowed={"onesided": one_of(0, 1)}))
def STFT(signal, frame_step, window=None, frame_length=None, *, onesided=1):
    """Short-time Fourier transform of [batch, length, 1|2] frames (ONNX STFT-17)."""
    if signal.ndim == 2:
        signal = signal[..., None]  # tolerate [batch, length] real signals
    if signal.ndim != 3:
        raise KernelError(f"signal must have rank 3, got shape {signal.shape}")
    step = _scalar_int(frame_step, "frame_step")
    if step <= 0:
        raise KernelError(f"frame_step must be positive, got {step}")
    length = signal.shape[1]
    if frame_length is not None:
        flen = _scalar_int(frame_length, "frame_length")
    elif window is not None:
        flen = int(np.asarray(window).shape[0])
    else:
        flen = length
    if window is not None:
        window = np.asarray(window)
        if window.ndim != 1 or window.shape[0] != flen:
            raise KernelError(f"window has shape {window.shape}, expected ({flen},)")
    if flen <= 0 or flen > length:
        raise KernelError(f"frame_length {flen} must lie in [1, signal length {length}]")
    z = _to_complex(signal)  # [batch, length]
    nframes = (length - flen) // step + 1
    idx = np.arange(nframes)[:, None] * step + np.arange(flen)[None, :]
    frames = z[:, idx]  # [batch, frames, flen]
    if window is not None:
        frames = frames * window.astype(work_float(signal.dtype))
    if onesided and signal.shape[-1] == 2:
        raise KernelError("onesided STFT needs a real signal (last dimension 1)")
    y = np.fft.fft(frames, axis=-1)
    if onesided:
        y = y[..., : flen // 2 + 1]
    return _from_complex(y, signal.dtype)


# ---------------------------------------------------------------------------------------------
# Window functions: generalized cosine windows sum_k (-1)^k a_k cos(2 pi k n / N).


def _cosine_window(size, periodic, output_datatype, coeffs):
    n = _scalar_int(size, "size")
    if n < 0:
        raise KernelError(f"size must be non-negative, got {n}")
    dt = np_dtype(output_datatype)
    # Periodic windows are the first `size` points of a symmetric window of length size + 1.
    denom = n if periodic else n - 1
    k = np.arange(n, dtype=np.float64)
    if denom <= 0:
        return np.ones(n, dt)  # a one-point symmetric window is a single 1
    phase = 2 * np.pi * k / denom
    w = np.zeros(n, np.float64)
    for j, a in enumerate(coeffs):
        w += (-1) ** j * a * np.cos(j * phase)
    return w.astype(dt)


_WINDOW_CONTRACT = Contract(nan="none", allowed={"periodic": one_of(0, 1)})


@op("HannWindow", since=17, contract=_WINDOW_CONTRACT)
def HannWindow(size, *, output_datatype=1, periodic=1):
    """Hann window 0.5 - 0.5 cos(2 pi n / N) (ONNX HannWindow-17)."""
    return _cosine_window(size, periodic, output_datatype, (0.5, 0.5))


@op("HammingWindow", since=17, contract=_WINDOW_CONTRACT)
def HammingWindow(size, *, output_datatype=1, periodic=1):
    """Hamming window 25/46 - 21/46 cos(2 pi n / N) (ONNX HammingWindow-17)."""
    return _cosine_window(size, periodic, output_datatype, (25 / 46, 21 / 46))


@op("BlackmanWindow", since=17, contract=_WINDOW_CONTRACT)
def BlackmanWindow(size, *, output_datatype=1, periodic=1):
    """Blackman window 0.42 - 0.5 cos(2 pi n/N) + 0.08 cos(4 pi n/N) (ONNX BlackmanWindow-17)."""
    return _cosine_window(size, periodic, output_datatype, (0.42, 0.5, 0.08))


# ---------------------------------------------------------------------------------------------


def _hz_to_mel(f):
    return 2595.0 * np.log10(1.0 + f / 700.0)


def _mel_to_hz(m):
    return 700.0 * (10.0 ** (m / 2595.0) - 1.0)


@op("MelWeightMatrix", since=17, contract=Contract(nan="none"))
def MelWeightMatrix(num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz,
                    *, output_datatype=1):
    """Triangular mel filterbank, [dft_length // 2 + 1, num_mel_bins] (ONNX MelWeightMatrix-17)."""
    nmel = _scalar_int(num_mel_bins, "num_mel_bins")
    nfft = _scalar_int(dft_length, "dft_length")
    rate = _scalar_int(sample_rate, "sample_rate")
    lo = float(np.asarray(lower_edge_hertz).reshape(()))
    hi = float(np.asarray(upper_edge_hertz).reshape(()))
    if nmel <= 0 or nfft <= 0 or rate <= 0:
        raise KernelError("num_mel_bins, dft_length and sample_rate must be positive")
    if not 0 <= lo < hi:
        raise KernelError(f"need 0 <= lower_edge_hertz < upper_edge_hertz, got {lo}, {hi}")
    nbins = nfft // 2 + 1
    # nmel + 2 band edges on the mel scale, mapped to spectrogram bin indices. The step is
    # range / (nmel + 2), as ONNX's and onnxruntime's kernels compute it (so the last edge falls
    # short of upper_edge_hertz); the backend test data follows that.
    mel_lo = _hz_to_mel(lo)
    step = (_hz_to_mel(hi) - mel_lo) / (nmel + 2)
    hz = _mel_to_hz(mel_lo + step * np.arange(nmel + 2))
    edges = np.floor((nfft + 1) * hz / rate).astype(np.int64)
    low, center, high = edges[:-2], edges[1:-1], edges[2:]
    j = np.arange(nbins)[:, None]
    rise_w = np.maximum(center - low, 1)
    fall_w = np.maximum(high - center, 1)
    rise = np.where((j >= low) & (j < center), (j - low) / rise_w, 0.0)
    fall = np.where((j > center) & (j < high), (high - j) / fall_w, 0.0)
    # Every triangle peaks at exactly 1.0 on its center bin.
    w = np.where(j == center, 1.0, rise + fall)
    return w.astype(np_dtype(output_datatype))
