"""Operators: image family (Resize, Upsample, GridSample, AffineGrid, ImageDecoder); RoiAlign
and NonMaxSuppression live in detection.py.

Resampling is separable: each resized axis gets a small table of source taps (indices and
weights) per output position, applied with one gather per tap, so no per-pixel Python loops.
ImageDecoder needs Pillow, an optional dependency (the `image` extra), imported only when run.
"""

from __future__ import annotations

import io
import itertools

import numpy as np

from opwarden.contract import Contract, one_of, such_that
from opwarden.errors import KernelError
from opwarden.ops.base import op
from opwarden.ops.common import interp_float

# ---------------------------------------------------------------------------------------------
# Shared helpers


def _to_dtype(Y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Cast interpolated values back; integers are rounded and saturated (no wrap-around)."""
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        Y = np.clip(np.rint(Y), info.min, info.max)
    return np.asarray(Y.astype(dtype, copy=False))


def _cubic_kernel(t: np.ndarray, a: float) -> np.ndarray:
    """Keys cubic convolution kernel with coefficient `a` (zero outside |t| < 2)."""
    t = np.abs(t)
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


def _linear_kernel(t: np.ndarray) -> np.ndarray:
    """Triangle (tent) kernel."""
    return np.maximum(0.0, 1.0 - np.abs(t))


def _reflect(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Fold coordinates into [lo, hi] by repeated reflection at the two borders."""
    span = hi - lo
    if span <= 0:
        return np.zeros_like(x)
    d = np.abs(x - lo)
    flips = np.floor(d / span)
    rem = d - flips * span
    return np.where(flips % 2 == 0, lo + rem, hi - rem)


# ---------------------------------------------------------------------------------------------
# Resize / Upsample engine


def _source_coords(n_out: int, n_in: int, scale: float, ctm: str,
                   roi: tuple[float, float]) -> np.ndarray:
    """x_original for every output index along one axis (Resize coordinate_transformation_mode).

    Lengths in the formulas are the unrounded n_in * scale (equal to n_out when sizes were given).
    """
    x = np.arange(n_out, dtype=np.float64)
    length = n_in * scale
    if ctm == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if ctm == "half_pixel_symmetric":
        # Centre the sampled window when the integer output size truncated the scaled extent.
        adjustment = n_out / length
        offset = n_in / 2.0 * (1.0 - adjustment)
        return offset + (x + 0.5) / scale - 0.5
    if ctm == "pytorch_half_pixel":
        # A single output samples the first pixel (the integer size decides, as in onnxruntime).
        return (x + 0.5) / scale - 0.5 if n_out > 1 else np.zeros_like(x)
    if ctm == "align_corners":
        return x * (n_in - 1) / (length - 1) if length > 1 else np.zeros_like(x)
    if ctm == "asymmetric":
        return x / scale
    if ctm == "tf_half_pixel_for_nn":
        return (x + 0.5) / scale
    if ctm == "tf_crop_and_resize":
        start, end = roi
        if length > 1:
            return start * (n_in - 1) + x * (end - start) * (n_in - 1) / (length - 1)
        return np.full_like(x, 0.5 * (start + end) * (n_in - 1))
    raise KernelError(f"unknown coordinate_transformation_mode {ctm!r}")


def _nearest_index(x: np.ndarray, n_in: int, nearest_mode: str, scale: float) -> np.ndarray:
    """Source index for nearest interpolation, clamped into the input."""
    if nearest_mode == "round_prefer_floor":
        i = np.ceil(x - 0.5)
    elif nearest_mode == "round_prefer_ceil":
        i = np.floor(x + 0.5)
    elif nearest_mode == "floor":
        i = np.floor(x)
    elif nearest_mode == "ceil":
        i = np.ceil(x)
    elif nearest_mode == "simple":
        # Resize-10 / Upsample (no nearest_mode attribute): truncate when enlarging, ceil when
        # shrinking, as onnxruntime does for these versions.
        i = np.ceil(x) if scale < 1 else np.floor(x)
    else:
        raise KernelError(f"unknown nearest_mode {nearest_mode!r}")
    return np.clip(i, 0, n_in - 1).astype(np.int64)


def _filter_taps(x: np.ndarray, n_in: int, scale: float, mode: str, cubic_a: float,
                 exclude_outside: bool, antialias: bool) -> tuple[np.ndarray, np.ndarray]:
    """(indices, weights), each [n_out, K], for linear or cubic resampling along one axis."""
    radius = 1 if mode == "linear" else 2
    # Antialiasing stretches the kernel by 1/scale when shrinking, widening the footprint.
    f = min(scale, 1.0) if antialias else 1.0
    start = int(np.floor(-radius / f)) + 1
    offsets = np.arange(start, 2 - start)  # symmetric about +0.5, 2 * radius taps when f == 1
    base = np.floor(x)
    idx = base[:, None].astype(np.int64) + offsets[None, :]
    t = (offsets[None, :] - (x - base)[:, None]) * f
    w = _linear_kernel(t) if mode == "linear" else _cubic_kernel(t, cubic_a)
    if exclude_outside:
        w = np.where((idx < 0) | (idx >= n_in), 0.0, w)
    total = w.sum(axis=1, keepdims=True)
    w = np.divide(w, total, out=np.zeros_like(w), where=total != 0)
    return np.clip(idx, 0, n_in - 1), w


def _apply_taps(Y: np.ndarray, axis: int, idx: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted sum of gathered slices along `axis`: out[..., i, ...] = sum_k w[i,k] Y[idx[i,k]]."""
    shape = [1] * Y.ndim
    shape[axis] = idx.shape[0]
    out = None
    for k in range(idx.shape[1]):  # K taps (a handful), each a vectorised gather
        term = np.take(Y, idx[:, k], axis=axis) * w[:, k].astype(Y.dtype).reshape(shape)
        out = term if out is None else out + term
    return out


def _resize_nd(X: np.ndarray, out_shape: list[int], scales: list[float],
               roi: list[tuple[float, float]], *, mode: str, ctm: str, nearest_mode: str,
               cubic_a: float = -0.75, exclude_outside: bool = False,
               extrapolation_value: float = 0.0, antialias: bool = False) -> np.ndarray:
    """Resample every axis of X to out_shape (the common core of Resize and Upsample)."""
    if mode not in ("nearest", "linear", "cubic"):
        raise KernelError(f"unknown Resize mode {mode!r}")
    if any(s < 0 for s in out_shape):
        raise KernelError(f"negative output shape {out_shape}")
    interp = mode != "nearest"
    Y = X.astype(interp_float(X.dtype)) if interp else X
    outside_masks = []
    for axis, (n_in, n_out) in enumerate(zip(X.shape, out_shape)):
        scale = float(scales[axis])
        crop = ctm == "tf_crop_and_resize" and tuple(roi[axis]) != (0.0, 1.0)
        if n_in == n_out and scale == 1.0 and not crop:
            continue  # identity along this axis for every mode
        if n_out == 0 or n_in == 0:
            shape = list(Y.shape)
            shape[axis] = n_out
            Y = np.zeros(shape, Y.dtype)
            continue
        x = _source_coords(n_out, n_in, scale, ctm, roi[axis])
        if ctm == "tf_crop_and_resize":
            mask_shape = [1] * X.ndim
            mask_shape[axis] = n_out
            outside_masks.append(((x < 0) | (x > n_in - 1)).reshape(mask_shape))
        if mode == "nearest":
            Y = np.take(Y, _nearest_index(x, n_in, nearest_mode, scale), axis=axis)
        else:
            idx, w = _filter_taps(x, n_in, scale, mode, cubic_a, exclude_outside, antialias)
            Y = _apply_taps(Y, axis, idx, w)
    if outside_masks:
        outside = np.logical_or.reduce(np.broadcast_arrays(*outside_masks))
        Y = np.where(outside, np.asarray(extrapolation_value).astype(Y.dtype), Y)
    if not interp:
        return Y.copy() if Y is X else Y
    return _to_dtype(Y, X.dtype)


def _vector(v: np.ndarray | None) -> np.ndarray | None:
    """An optional 1-D input; an empty tensor counts as absent."""
    if v is None:
        return None
    v = np.asarray(v).reshape(-1)
    return v if v.size else None


def _resize_geometry(X: np.ndarray, roi, scales, sizes, axes, policy: str):
    """(out_shape, per-axis scales, per-axis roi) for Resize-11+ from its inputs and attributes."""
    r = X.ndim
    axes = list(range(r)) if axes is None else [a + r if a < 0 else a for a in axes]
    if any(not 0 <= a < r for a in axes) or len(set(axes)) != len(axes):
        raise KernelError(f"Resize: invalid axes {axes} for input of rank {r}")
    scales, sizes, roi = _vector(scales), _vector(sizes), _vector(roi)
    if (scales is None) == (sizes is None):
        raise KernelError("Resize: exactly one of 'scales' and 'sizes' must be given")
    k = len(axes)
    full_roi = [(0.0, 1.0)] * r
    if roi is not None:
        if roi.size != 2 * k:
            raise KernelError(f"Resize: roi has {roi.size} values, expected {2 * k}")
        for i, a in enumerate(axes):
            full_roi[a] = (float(roi[i]), float(roi[k + i]))
    out_shape = list(X.shape)
    full_scales = [1.0] * r
    if scales is not None:
        if scales.size != k:
            raise KernelError(f"Resize: scales has {scales.size} values, expected {k}")
        if np.any(scales <= 0):
            raise KernelError(f"Resize: scales must be positive, got {scales.tolist()}")
        for i, a in enumerate(axes):
            full_scales[a] = float(scales[i])
            out_shape[a] = _scaled_size(X.shape[a], scales[i])
        return out_shape, full_scales, full_roi
    if sizes.size != k:
        raise KernelError(f"Resize: sizes has {sizes.size} values, expected {k}")
    ratios = [int(sizes[i]) / X.shape[a] if X.shape[a] else 1.0 for i, a in enumerate(axes)]
    if policy != "stretch":
        # One common scale drives both the output size and the coordinate transform.
        common = min(ratios) if policy == "not_larger" else max(ratios)
        ratios = [common] * k
        sizes = [int(np.floor(common * X.shape[a] + 0.5)) for a in axes]
    for i, a in enumerate(axes):
        out_shape[a] = int(sizes[i])
        full_scales[a] = ratios[i]
    return out_shape, full_scales, full_roi


def _resize(X, roi, scales, sizes, *, axes=None, keep_aspect_ratio_policy="stretch",
            **kw) -> np.ndarray:
    out_shape, full_scales, full_roi = _resize_geometry(
        X, roi, scales, sizes, axes, keep_aspect_ratio_policy)
    return _resize_nd(X, out_shape, full_scales, full_roi, **kw)


_MODES = one_of("nearest", "linear", "cubic")
_NEAREST = one_of("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
_CTM_13 = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
           "tf_crop_and_resize")
# Shrinking (nearest or filtered) can skip input pixels, so a NaN there may not reach Y.
_RESIZE_NAN = "suppress"


@op("Resize", since=19, layout_inputs=(0,), contract=Contract(nan=_RESIZE_NAN, allowed={
    "mode": _MODES, "nearest_mode": _NEAREST, "antialias": one_of(0, 1),
    "coordinate_transformation_mode": one_of(*_CTM_13, "half_pixel_symmetric"),
    "keep_aspect_ratio_policy": one_of("stretch", "not_larger", "not_smaller")}))
def Resize(X, roi=None, scales=None, sizes=None, *, antialias=0, axes=None,
           coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75, exclude_outside=0,
           extrapolation_value=0.0, keep_aspect_ratio_policy="stretch", mode="nearest",
           nearest_mode="round_prefer_floor"):
    """Resize with nearest/linear/cubic, antialias, axes and aspect policy (ONNX Resize-19)."""
    return _resize(X, roi, scales, sizes, axes=axes,
                   keep_aspect_ratio_policy=keep_aspect_ratio_policy, mode=mode,
                   ctm=coordinate_transformation_mode, nearest_mode=nearest_mode,
                   cubic_a=cubic_coeff_a, exclude_outside=bool(exclude_outside),
                   extrapolation_value=extrapolation_value, antialias=bool(antialias))


@op("Resize", since=18, layout_inputs=(0,), contract=Contract(nan=_RESIZE_NAN, allowed={
    "mode": _MODES, "nearest_mode": _NEAREST, "antialias": one_of(0, 1),
    "coordinate_transformation_mode": one_of(*_CTM_13),
    "keep_aspect_ratio_policy": one_of("stretch", "not_larger", "not_smaller")}))
def Resize_18(X, roi=None, scales=None, sizes=None, *, antialias=0, axes=None,
              coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75,
              exclude_outside=0, extrapolation_value=0.0, keep_aspect_ratio_policy="stretch",
              mode="nearest", nearest_mode="round_prefer_floor"):
    """Resize with antialias, axes and keep_aspect_ratio_policy (ONNX Resize-18)."""
    return Resize.reference(X, roi, scales, sizes, antialias=antialias, axes=axes,
                            coordinate_transformation_mode=coordinate_transformation_mode,
                            cubic_coeff_a=cubic_coeff_a, exclude_outside=exclude_outside,
                            extrapolation_value=extrapolation_value,
                            keep_aspect_ratio_policy=keep_aspect_ratio_policy, mode=mode,
                            nearest_mode=nearest_mode)


@op("Resize", since=13, layout_inputs=(0,), contract=Contract(nan=_RESIZE_NAN, allowed={
    "mode": _MODES, "nearest_mode": _NEAREST,
    "coordinate_transformation_mode": one_of(*_CTM_13)}))
def Resize_13(X, roi=None, scales=None, sizes=None, *,
              coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75,
              exclude_outside=0, extrapolation_value=0.0, mode="nearest",
              nearest_mode="round_prefer_floor"):
    """Resize with roi/scales/sizes inputs, all optional (ONNX Resize-13)."""
    return _resize(X, roi, scales, sizes, mode=mode, ctm=coordinate_transformation_mode,
                   nearest_mode=nearest_mode, cubic_a=cubic_coeff_a,
                   exclude_outside=bool(exclude_outside),
                   extrapolation_value=extrapolation_value)


@op("Resize", since=11, layout_inputs=(0,), contract=Contract(nan=_RESIZE_NAN, allowed={
    "mode": _MODES, "nearest_mode": _NEAREST,
    "coordinate_transformation_mode": one_of(*_CTM_13, "tf_half_pixel_for_nn")}))
def Resize_11(X, roi=None, scales=None, sizes=None, *,
              coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75,
              exclude_outside=0, extrapolation_value=0.0, mode="nearest",
              nearest_mode="round_prefer_floor"):
    """Resize with roi and scales inputs, sizes optional, tf_half_pixel_for_nn (Resize-11)."""
    return Resize_13.reference(X, roi, scales, sizes,
                               coordinate_transformation_mode=coordinate_transformation_mode,
                               cubic_coeff_a=cubic_coeff_a, exclude_outside=exclude_outside,
                               extrapolation_value=extrapolation_value, mode=mode,
                               nearest_mode=nearest_mode)


def _scaled_size(n: int, scale) -> int:
    """floor(n * scale) with the product rounded to float32, as onnxruntime computes it.

    Exporters emit scales = float32(out / in) for a dynamic target size (Upsample-9, Resize-10)
    and rely on this: 9 * float32(17 / 9) is 16.9999995 exactly but 17.0 in float32.
    """
    return int(np.floor(np.float32(n) * np.float32(scale)))


def _upsample(X: np.ndarray, scales, mode: str, *, min_scale: float = 0.0) -> np.ndarray:
    """Resize-10 / Upsample semantics: asymmetric coordinates, floor(in * scale) sizes."""
    scales = np.asarray(scales, dtype=np.float64).reshape(-1)
    if scales.size != X.ndim:
        raise KernelError(f"scales has {scales.size} values for an input of rank {X.ndim}")
    if np.any(scales < min_scale) if min_scale else np.any(scales <= 0):
        raise KernelError(f"scales must be {'>= 1' if min_scale else '> 0'}, "
                          f"got {scales.tolist()}")
    if mode == "bilinear":  # Upsample-1 spelling
        mode = "linear"
    out_shape = [_scaled_size(n, s) for n, s in zip(X.shape, scales)]
    return _resize_nd(X, out_shape, scales.tolist(), [(0.0, 1.0)] * X.ndim, mode=mode,
                      ctm="asymmetric", nearest_mode="simple")


@op("Resize", since=10, layout_inputs=(0,), contract=Contract(nan=_RESIZE_NAN, allowed={
    "mode": one_of("nearest", "linear")}))
def Resize_10(X, scales, *, mode="nearest"):
    """Resize by per-axis scales, asymmetric coordinates (ONNX Resize-10)."""
    return _upsample(X, scales, mode)


@op("Upsample", since=9, layout_inputs=(0,),
    contract=Contract(allowed={"mode": one_of("nearest", "linear")}))
def Upsample(X, scales, *, mode="nearest"):
    """Upsample by a scales input (ONNX Upsample-9; also serves the deprecated Upsample-10)."""
    return _upsample(X, scales, mode, min_scale=1.0)


@op("Upsample", since=7, layout_inputs=(0,), contract=Contract(allowed={
    "mode": one_of("nearest", "linear"),
    "scales": such_that(lambda v: all(s >= 1 for s in v), "scales each >= 1")}))
def Upsample_7(X, *, mode="nearest", scales=None):
    """Upsample by a scales attribute (ONNX Upsample-7)."""
    if scales is None:
        raise KernelError("Upsample-7 requires the 'scales' attribute")
    return _upsample(X, scales, mode, min_scale=1.0)


# ---------------------------------------------------------------------------------------------
# GridSample / AffineGrid


def _unnormalize(g: np.ndarray, n: int, align_corners: bool) -> np.ndarray:
    """Grid value in [-1, 1] -> pixel coordinate along an axis of length n."""
    if align_corners:
        return (g + 1) / 2 * (n - 1)
    return ((g + 1) * n - 1) / 2


def _pad_coord(x: np.ndarray, n: int, padding_mode: str, align_corners: bool) -> np.ndarray:
    """Move an out-of-range coordinate (or tap index) back inside for border/reflection."""
    if padding_mode == "border":
        return np.clip(x, 0, n - 1)
    if padding_mode == "reflection":
        lo, hi = (0.0, n - 1.0) if align_corners else (-0.5, n - 0.5)
        return np.clip(_reflect(x, lo, hi), 0, n - 1)
    return x


def _grid_taps(x: np.ndarray, n: int, mode: str, padding_mode: str, align_corners: bool):
    """[(index, weight)] per tap along one spatial axis; weight None means 1 (nearest)."""
    if mode == "nearest":
        # Halfway cases round to the even index (the spec's rule, like torch's nearbyint).
        return [(np.rint(_pad_coord(x, n, padding_mode, align_corners)), None)]
    if mode == "linear":
        x = _pad_coord(x, n, padding_mode, align_corners)
        base = np.floor(x)
        frac = x - base
        return [(base, 1 - frac), (base + 1, frac)]
    # Cubic: the coordinate is used as is; padding applies to each of the 4 tap indices.
    base = np.floor(x)
    frac = x - base
    return [(_pad_coord(base + o, n, padding_mode, align_corners),
             _cubic_kernel(o - frac, -0.75)) for o in (-1, 0, 1, 2)]


def _grid_sample(X: np.ndarray, grid: np.ndarray, mode: str, padding_mode: str,
                 align_corners: bool) -> np.ndarray:
    """N-D grid sampling shared by GridSample-16 and -20."""
    r = X.ndim - 2
    if r < 1 or grid.ndim != r + 2 or grid.shape[-1] != r or grid.shape[0] != X.shape[0]:
        raise KernelError(f"GridSample: grid shape {grid.shape} does not fit X shape {X.shape}")
    N, C, spatial = X.shape[0], X.shape[1], X.shape[2:]
    out_spatial = grid.shape[1:-1]
    # Unnormalize in the grid's own precision (at least float32), as torch and onnxruntime do:
    # in float64 a coordinate float32 math puts exactly on .5 can land past it and round the
    # other way in nearest mode.
    g = grid.astype(np.promote_types(grid.dtype, np.float32)).reshape(N, -1, r)
    Xf = X.reshape(N, C, -1)
    # grid's last axis lists coordinates innermost-first: g[..., 0] is along X's last axis.
    taps = [_grid_taps(_unnormalize(g[:, :, r - 1 - i], n, align_corners), n, mode,
                       padding_mode, align_corners) for i, n in enumerate(spatial)]
    interp = mode != "nearest"
    if interp and X.dtype.kind not in "fiuc":
        raise KernelError(f"GridSample mode {mode!r} needs numeric X, got {X.dtype}")
    wdt = interp_float(X.dtype) if X.dtype.kind != "c" else X.dtype
    out = np.zeros((N, C, g.shape[1]), wdt if interp else X.dtype)
    for combo in itertools.product(*taps):  # 1, 2**r or 4**r corner combinations
        flat = np.zeros(g.shape[:2], np.int64)
        valid = np.ones(g.shape[:2], bool)
        weight = np.ones(g.shape[:2])
        for (idx, w), n in zip(combo, spatial):
            valid &= (idx >= 0) & (idx <= n - 1)
            flat = flat * n + np.clip(idx, 0, n - 1).astype(np.int64)
            if w is not None:
                weight = weight * w
        vals = np.take_along_axis(Xf, flat[:, None, :], axis=2)
        if interp:
            out += vals.astype(wdt) * (weight * valid).astype(wdt)[:, None, :]
        else:
            out = np.where(valid[:, None, :], vals, out)
    out = out.reshape((N, C) + tuple(out_spatial))
    return _to_dtype(out, X.dtype) if interp else out


_PADDING = one_of("zeros", "border", "reflection")


def _grid_sample_workspace(x, grid, **_):
    """Float64 scratch: index/weight/mask planes per grid point plus the output accumulator."""
    if len(x) < 3 or len(grid) < 3 or not all(isinstance(v, int) for v in (*x, *grid)):
        return 0
    points = int(np.prod(grid[:-1]))
    return (4 * points + 2 * x[1] * points) * 8


# Grid points outside the image (zeros padding) or between pixels skip input values: NaNs too.
_GRID_CONTRACT = {"layout": "NCHW", "nan": "suppress", "workspace_bytes": _grid_sample_workspace}


@op("GridSample", since=20, contract=Contract(**_GRID_CONTRACT, allowed={
    "mode": one_of("linear", "nearest", "cubic"), "padding_mode": _PADDING,
    "align_corners": one_of(0, 1)}))
def GridSample(X, grid, *, align_corners=0, mode="linear", padding_mode="zeros"):
    """Sample X at normalized grid positions, N-D (ONNX GridSample-20)."""
    return _grid_sample(X, grid, mode, padding_mode, bool(align_corners))


@op("GridSample", since=16, contract=Contract(**_GRID_CONTRACT, allowed={
    "mode": one_of("bilinear", "nearest", "bicubic"), "padding_mode": _PADDING,
    "align_corners": one_of(0, 1)}))
def GridSample_16(X, grid, *, align_corners=0, mode="bilinear", padding_mode="zeros"):
    """Sample a 4-D X at normalized grid positions (ONNX GridSample-16)."""
    if X.ndim != 4:
        raise KernelError(f"GridSample-16 takes a 4-D X, got rank {X.ndim}")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    return _grid_sample(X, grid, mode, padding_mode, bool(align_corners))


def _base_coords(n: int, align_corners: bool) -> np.ndarray:
    """Evenly spaced positions in [-1, 1] for n pixels (centres or edges as aligned)."""
    if n <= 1:
        # One pixel sits at the centre, 0, as in torch.affine_grid (which the spec follows;
        # onnxruntime gives +1 and the ONNX reference -1 here when align_corners=1).
        return np.zeros(max(n, 0))
    if align_corners:
        return np.linspace(-1.0, 1.0, n)
    return (2.0 * np.arange(n) + 1.0) / n - 1.0


@op("AffineGrid", since=20, contract=Contract(allowed={"align_corners": one_of(0, 1)}))
def AffineGrid(theta, size, *, align_corners=0):
    """Sampling grid from affine matrices, 2-D or 3-D (ONNX AffineGrid-20)."""
    size = [int(s) for s in np.asarray(size).reshape(-1)]
    r = len(size) - 2
    if r not in (2, 3) or theta.shape != (size[0], r, r + 1):
        raise KernelError(f"AffineGrid: theta {theta.shape} does not fit size {size}")
    # Homogeneous positions ordered (x, y[, z], 1): x runs along the last spatial axis.
    axes = [_base_coords(n, bool(align_corners)) for n in size[2:]]
    mesh = np.meshgrid(*axes, indexing="ij")
    pos = np.stack([m.reshape(-1) for m in reversed(mesh)] + [np.ones(mesh[0].size)], axis=-1)
    grid = np.einsum("pk,nik->npi", pos, theta.astype(np.float64))
    return np.asarray(grid.reshape([size[0]] + size[2:] + [r]).astype(theta.dtype))


# ---------------------------------------------------------------------------------------------
# ImageDecoder

# pixel_format -> (Pillow mode to convert to, whether to reverse the channel order)
_PIXEL_FORMATS = {"RGB": ("RGB", False), "BGR": ("RGB", True), "Grayscale": ("L", False)}


def _pillow_image():
    """PIL.Image, imported on first use so Pillow stays an optional dependency."""
    try:
        from PIL import Image
    except ImportError as e:
        raise KernelError("ImageDecoder needs Pillow: pip install 'opwarden[image]'") from e
    return Image


@op("ImageDecoder", since=20, contract=Contract(
    nan="none", allowed={"pixel_format": one_of(*_PIXEL_FORMATS)}))
def ImageDecoder(encoded_stream, *, pixel_format="RGB"):
    """Decode BMP/JPEG/JPEG2000/TIFF/PNG/WebP/PNM bytes to an (H, W, C) uint8 image
    (ONNX ImageDecoder-20).

    Grayscale is Pillow's "L" conversion, ITU-R 601-2 luma (0.299 R + 0.587 G + 0.114 B),
    which is what the ONNX test data holds. Bytes that do not decode give an empty
    (0, 0, C) image, as the spec asks.
    """
    Image = _pillow_image()
    mode, reverse = _PIXEL_FORMATS[pixel_format]
    channels = 1 if mode == "L" else 3
    data = np.asarray(encoded_stream)
    if data.dtype != np.uint8 or data.ndim != 1:
        raise KernelError(
            f"ImageDecoder input must be a 1-D uint8 tensor, got {data.dtype} {data.shape}"
        )
    try:
        with Image.open(io.BytesIO(data.tobytes())) as im:
            im.load()
            pixels = np.asarray(im.convert(mode), dtype=np.uint8)
    except (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError):
        return np.zeros((0, 0, channels), dtype=np.uint8)
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    if reverse:
        pixels = pixels[:, :, ::-1]
    return np.ascontiguousarray(pixels)
