"""Operators: shape family (reshaping, joining, splitting, padding), with their backward rules
(the data-movement ops share ops.grad.index_traced); constant-making ops live in constant.py."""

from __future__ import annotations

import math

import numpy as np

from opwarden.contract import Contract, one_of
from opwarden.errors import KernelError
from opwarden.ops.base import Sample, op
from opwarden.ops.common import (
    axes_indices,
    axis_index,
    ints,
    one_value,
    transpose_keeps_order,
    transpose_perm,
)
from opwarden.ops.grad import (
    away_from_zero,
    differentiable,
    fit,
    index_traced,
    int64,
    unary,
    unary_cases,
)

# Reshape-like ops return NumPy views when they can; a copy is made for non-contiguous input.
# A contiguous input always gives a view: the memory plan shares its buffer (view_when).
RESHAPE_LIKE = Contract(may_alias=((0, 0),), view_when=lambda attrs, shape: True)
TRANSPOSE = Contract(may_alias=((0, 0),), view_when=transpose_keeps_order)
# Every output of Split is a view of its input: no copy (a Split after sibling convolutions
# merged into one, see passes.sibling_convs.sibling_conv_merge, costs nothing); the memory
# plan keeps the input's buffer while any output lives, and consumers read strided views.
SPLIT_VIEWS = Contract(must_alias=((0, -1),))
PAD_MODES = one_of("constant", "reflect", "edge", "wrap")
_BLOCK_MODES = Contract(allowed={"mode": one_of("DCR", "CRD")})


# ---------------------------------------------------------------------------------------------
# Reshape


def _reshape(data: np.ndarray, shape: list[int], allowzero: int) -> np.ndarray:
    if shape.count(-1) > 1:
        raise KernelError(f"Reshape: shape {shape} has more than one -1")
    dims = list(shape)
    for i, d in enumerate(dims):
        if d < -1:
            raise KernelError(f"Reshape: shape {shape} has invalid dimension {d}")
        if d == 0 and not allowzero:
            # 0 copies the input's dimension at the same position.
            if i >= data.ndim:
                raise KernelError(
                    f"Reshape: shape {shape} has 0 at position {i} but data has rank {data.ndim}"
                )
            dims[i] = data.shape[i]
    if allowzero and 0 in dims and -1 in dims:
        raise KernelError(f"Reshape: shape {shape} has both 0 and -1 with allowzero=1")
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        if known == 0 or data.size % known:
            raise KernelError(f"Reshape: cannot infer -1 in {shape} for data of shape {data.shape}")
        dims[dims.index(-1)] = data.size // known
    if math.prod(dims) != data.size:
        raise KernelError(f"Reshape: cannot reshape data of shape {data.shape} to {shape}")
    return data.reshape(dims)


@op("Reshape", since=1, contract=RESHAPE_LIKE)
def Reshape_1(data, *, shape=None, consumed_inputs=None):
    """Reshape to the `shape` attribute; 0 copies a dim, -1 is inferred (ONNX Reshape-1)."""
    return _reshape(data, ints(shape, "shape"), 0)


@op("Reshape", since=5, contract=RESHAPE_LIKE)
def Reshape_5(data, shape):
    """Reshape to the `shape` input; 0 copies a dim, -1 is inferred (ONNX Reshape-5)."""
    return _reshape(data, ints(shape, "shape"), 0)


@op("Reshape", since=14, contract=RESHAPE_LIKE)
def Reshape(data, shape, *, allowzero=0):
    """Reshape; with allowzero=1 a 0 in `shape` means an empty dim (ONNX Reshape-14)."""
    return _reshape(data, ints(shape, "shape"), allowzero)


@op("Flatten", since=1, contract=RESHAPE_LIKE)
def Flatten(input, *, axis=1):
    """Flatten to 2-D: dims before `axis` and from `axis` on (ONNX Flatten-1..13)."""
    r = input.ndim
    if not -r <= axis <= r:
        raise KernelError(f"Flatten: axis {axis} is out of range for rank {r}")
    a = axis + r if axis < 0 else axis
    return input.reshape(math.prod(input.shape[:a]), math.prod(input.shape[a:]))


# ---------------------------------------------------------------------------------------------
# Squeeze / Unsqueeze


def _squeeze(data: np.ndarray, axes) -> np.ndarray:
    if axes is None or len(axes) == 0:
        return data.reshape([d for d in data.shape if d != 1])
    ax = axes_indices(axes, data.ndim)
    for a in ax:
        if data.shape[a] != 1:
            raise KernelError(
                f"Squeeze: axis {a} has size {data.shape[a]}, not 1 (data shape {data.shape})"
            )
    return data.reshape([d for i, d in enumerate(data.shape) if i not in ax])


@op("Squeeze", since=1, contract=RESHAPE_LIKE)
def Squeeze_1(data, *, axes=None):
    """Remove size-1 dims listed in the `axes` attribute, or all (ONNX Squeeze-1/11)."""
    return _squeeze(data, axes)


@op("Squeeze", since=13, contract=RESHAPE_LIKE)
def Squeeze(data, axes=None):
    """Remove size-1 dims listed in the `axes` input, or all (ONNX Squeeze-13)."""
    return _squeeze(data, None if axes is None else ints(axes, "axes"))


def _unsqueeze(data: np.ndarray, axes) -> np.ndarray:
    out_rank = data.ndim + len(axes)
    ax = set(axes_indices(axes, out_rank))
    rest = iter(data.shape)
    return data.reshape([1 if i in ax else next(rest) for i in range(out_rank)])


@op("Unsqueeze", since=1, contract=RESHAPE_LIKE)
def Unsqueeze_1(data, *, axes=None):
    """Insert size-1 dims at the `axes` attribute (output positions) (ONNX Unsqueeze-1/11)."""
    return _unsqueeze(data, ints(axes, "axes"))


@op("Unsqueeze", since=13, contract=RESHAPE_LIKE)
def Unsqueeze(data, axes):
    """Insert size-1 dims at the `axes` input (output positions) (ONNX Unsqueeze-13)."""
    return _unsqueeze(data, ints(axes, "axes"))


@op("Transpose", since=1, contract=TRANSPOSE)
def Transpose(data, *, perm=None):
    """Permute dims by `perm`, reversing them by default (ONNX Transpose-1..13)."""
    p = transpose_perm(perm, data.ndim)
    if p is None:
        raise KernelError(f"Transpose: perm {list(perm)} is not a permutation of rank {data.ndim}")
    return data.transpose(p)


# ---------------------------------------------------------------------------------------------
# Concat / Split


@op("Concat", since=1)
def Concat(*inputs, axis=1):
    """Join tensors along `axis`, negative allowed (ONNX Concat-1..13)."""
    if not inputs:
        raise KernelError("Concat: needs at least one input")
    r = inputs[0].ndim
    a = axis_index(axis, r)
    for i, x in enumerate(inputs):
        if (
            x.ndim != r
            or x.shape[:a] + x.shape[a + 1 :] != inputs[0].shape[:a] + inputs[0].shape[a + 1 :]
        ):
            raise KernelError(
                f"Concat: input {i} has shape {x.shape}, incompatible with {inputs[0].shape} "
                f"along axis {a}"
            )
    return np.concatenate(inputs, axis=a)


def _split(data: np.ndarray, sizes: list[int], axis: int) -> tuple[np.ndarray, ...]:
    a = axis_index(axis, data.ndim)
    if any(s < 0 for s in sizes) or sum(sizes) != data.shape[a]:
        raise KernelError(f"Split: sizes {sizes} do not sum to dimension {data.shape[a]}")
    # Views (see SPLIT_VIEWS): the memory plan keeps the input's buffer for all of them.
    # (Basic slicing costs less per call than np.split.)
    lead = (slice(None),) * a
    outs = []
    start = 0
    for n in sizes:
        outs.append(data[(*lead, slice(start, start + n))])
        start += n
    return tuple(outs)


def _equal_sizes(dim: int, n: int) -> list[int]:
    if n <= 0 or dim % n:
        raise KernelError(f"Split: dimension {dim} cannot be split evenly into {n} outputs")
    return [dim // n] * n


@op("Split", since=2, contract=SPLIT_VIEWS)
def Split_2(input, *, axis=0, split=None, noutputs=1):
    """Split along `axis` by the `split` attribute, or evenly (ONNX Split-2/11)."""
    a = axis_index(axis, input.ndim)
    sizes = ints(split, "split") if split else _equal_sizes(input.shape[a], noutputs)
    return _split(input, sizes, a)


@op("Split", since=13, contract=SPLIT_VIEWS)
def Split_13(input, split=None, *, axis=0, noutputs=1):
    """Split along `axis` by the `split` input, or evenly (ONNX Split-13)."""
    a = axis_index(axis, input.ndim)
    sizes = ints(split, "split") if split is not None else []
    if not sizes:
        sizes = _equal_sizes(input.shape[a], noutputs)
    return _split(input, sizes, a)


@op("Split", since=18, contract=SPLIT_VIEWS)
def Split(input, split=None, *, axis=0, num_outputs=None, noutputs=1):
    """Split by the `split` input or into `num_outputs` chunks, last smaller (ONNX Split-18)."""
    a = axis_index(axis, input.ndim)
    if split is not None:
        return _split(input, ints(split, "split"), a)
    n = num_outputs if num_outputs is not None else noutputs
    if n <= 0:
        raise KernelError(f"Split: num_outputs must be positive, got {n}")
    dim = input.shape[a]
    chunk = -(-dim // n)  # ceil: all chunks equal except a smaller last one
    sizes = [min(chunk, max(dim - i * chunk, 0)) for i in range(n)]
    return _split(input, sizes, a)


# ---------------------------------------------------------------------------------------------
# Shape / Size / Identity / Dropout


@op("Shape", since=1, contract=Contract(nan="none"))
def Shape_1(data):
    """The input's shape as a 1-D int64 tensor (ONNX Shape-1/13)."""
    return np.asarray(data.shape, dtype=np.int64).reshape(-1)


@op("Shape", since=15, contract=Contract(nan="none"))
def Shape(data, *, start=0, end=None):
    """The input's shape sliced to [start, end), clamped (ONNX Shape-15)."""
    r = data.ndim
    s = start + r if start < 0 else start
    e = r if end is None else (end + r if end < 0 else end)
    s, e = min(max(s, 0), r), min(max(e, 0), r)
    return np.asarray(data.shape[s:e], dtype=np.int64).reshape(-1)


@op("Size", since=1, contract=Contract(nan="none"))
def Size(data):
    """Number of elements as an int64 scalar (ONNX Size-1..)."""
    return np.asarray(np.asarray(data).size, dtype=np.int64)


@op("Identity", since=1, contract=Contract(must_alias=((0, 0),)))
def Identity(input):
    """The input itself: a tensor, sequence or optional (ONNX Identity-1..)."""
    return input


def _dropout_mask(shape, ratio: float, seed) -> np.ndarray:
    """Keep-mask: each element kept with probability 1 - ratio."""
    rng = np.random.RandomState(seed) if seed is not None else np.random.RandomState()
    return rng.uniform(0.0, 1.0, shape) >= ratio


def _dropout_train(data: np.ndarray, ratio: float, seed) -> tuple[np.ndarray, np.ndarray]:
    mask = _dropout_mask(data.shape, ratio, seed)
    scale = data.dtype.type(1.0 / (1.0 - ratio))
    out = np.where(mask, data * scale, data.dtype.type(0)).astype(data.dtype, copy=False)
    return out, mask


def _dropout_old(data: np.ndarray, is_test: int, ratio: float):
    if is_test:
        return data, np.ones(data.shape, dtype=data.dtype)
    # Opset-6 training dropout does not rescale the kept values.
    mask = _dropout_mask(data.shape, ratio, None)
    out = np.where(mask, data, data.dtype.type(0)).astype(data.dtype, copy=False)
    return out, mask.astype(data.dtype)


@op("Dropout", since=1, contract=Contract(may_alias=((0, 0),), deterministic=False, nan="suppress"))
def Dropout_1(data, *, consumed_inputs=None, is_test=0, ratio=0.5):
    """Random dropout unless is_test; mask has data's type (ONNX Dropout-1)."""
    return _dropout_old(data, is_test, ratio)


@op("Dropout", since=6, contract=Contract(may_alias=((0, 0),), deterministic=False, nan="suppress"))
def Dropout_6(data, *, is_test=0, ratio=0.5):
    """Random dropout unless is_test; mask has data's type (ONNX Dropout-6)."""
    return _dropout_old(data, is_test, ratio)


@op("Dropout", since=7, contract=Contract(may_alias=((0, 0),)))
def Dropout_7(data, *, ratio=0.5):
    """Inference: output is data, mask all ones of data's type (ONNX Dropout-7)."""
    return data, np.ones(data.shape, dtype=data.dtype)


@op("Dropout", since=10, contract=Contract(may_alias=((0, 0),)))
def Dropout_10(data, *, ratio=0.5):
    """Inference: output is data, mask all True (ONNX Dropout-10)."""
    return data, np.ones(data.shape, dtype=np.bool_)


@op("Dropout", since=12, contract=Contract(may_alias=((0, 0),), deterministic=False))
def Dropout(data, ratio=None, training_mode=None, *, seed=None):
    """Identity unless training_mode; then drop with `ratio` and scale by 1/(1-ratio)
    (ONNX Dropout-12/13/22)."""
    r = 0.5 if ratio is None else float(one_value(ratio, "ratio"))
    training = training_mode is not None and bool(one_value(training_mode, "training_mode"))
    if not training or r == 0.0:
        return data, np.ones(data.shape, dtype=np.bool_)
    if not 0.0 <= r < 1.0:
        raise KernelError(f"Dropout: ratio must be in [0, 1), got {r}")
    return _dropout_train(data, r, seed)


# ---------------------------------------------------------------------------------------------
# Expand / Tile


@op("Expand", since=8)
def Expand(input, shape):
    """Broadcast input to the bidirectional broadcast of its shape and `shape` (ONNX Expand-8)."""
    dims = ints(shape, "shape")
    try:
        out_shape = np.broadcast_shapes(input.shape, tuple(dims))
    except ValueError:
        raise KernelError(f"Expand: shape {dims} is not broadcastable with {input.shape}") from None
    return np.broadcast_to(input, out_shape).copy()


@op("Tile", since=1)
def Tile_1(input, tiles, axis):
    """Repeat the input `tiles` times along `axis` (ONNX Tile-1)."""
    reps = [1] * input.ndim
    reps[axis_index(int(one_value(axis, "axis")), input.ndim)] = int(one_value(tiles, "tiles"))
    return np.tile(input, reps)


@op("Tile", since=6)
def Tile(input, repeats):
    """Repeat the input `repeats[i]` times along each dim i (ONNX Tile-6/13)."""
    reps = ints(repeats, "repeats")
    if len(reps) != input.ndim:
        raise KernelError(f"Tile: repeats has {len(reps)} values, input has rank {input.ndim}")
    if any(r < 0 for r in reps):
        raise KernelError(f"Tile: repeats {reps} must be non-negative")
    return np.tile(input, reps)


# ---------------------------------------------------------------------------------------------
# Space/depth rearrangements


def _check_4d(x: np.ndarray, name: str) -> None:
    if x.ndim != 4:
        raise KernelError(f"{name}: input must be 4-D (N, C, H, W), got shape {x.shape}")


def _space_to_depth(x: np.ndarray, b: int, mode: str) -> np.ndarray:
    _check_4d(x, "SpaceToDepth")
    n, c, h, w = x.shape
    if b <= 0 or h % b or w % b:
        raise KernelError(f"SpaceToDepth: H={h} and W={w} must be divisible by blocksize {b}")
    t = x.reshape(n, c, h // b, b, w // b, b)
    # DCR: channel index = (bh * b + bw) * C + c; CRD: c * b * b + bh * b + bw.
    perm = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
    return t.transpose(perm).reshape(n, c * b * b, h // b, w // b)


@op("SpaceToDepth", since=1, layout_inputs=(0,))
def SpaceToDepth_1(input, *, blocksize=None):
    """Move spatial blocks into channels, DCR order (ONNX SpaceToDepth-1/13)."""
    return _space_to_depth(input, int(blocksize), "DCR")


@op("SpaceToDepth", since=28, layout_inputs=(0,), contract=_BLOCK_MODES)
def SpaceToDepth(input, *, blocksize=None, mode="DCR"):
    """Move spatial blocks into channels in DCR or CRD order (ONNX SpaceToDepth-28)."""
    return _space_to_depth(input, int(blocksize), mode)


@op("DepthToSpace", since=1, layout_inputs=(0,))
def DepthToSpace_1(input, *, blocksize=None):
    """Move channels into blocksize x blocksize spatial blocks, DCR order (ONNX DepthToSpace-1)."""
    return _depth_to_space(input, int(blocksize), "DCR")


@op("DepthToSpace", since=11, layout_inputs=(0,), contract=_BLOCK_MODES)
def DepthToSpace(input, *, blocksize=None, mode="DCR"):
    """Move channels into spatial blocks, DCR or CRD order (ONNX DepthToSpace-11..28)."""
    return _depth_to_space(input, int(blocksize), mode)


def _depth_to_space(input: np.ndarray, b: int, mode: str) -> np.ndarray:
    _check_4d(input, "DepthToSpace")
    n, c, h, w = input.shape
    if b <= 0 or c % (b * b):
        raise KernelError(f"DepthToSpace: C={c} must be divisible by blocksize^2 = {b * b}")
    oc = c // (b * b)
    if mode == "DCR":
        t = input.reshape(n, b, b, oc, h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        t = input.reshape(n, oc, b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return t.reshape(n, oc, h * b, w * b)


# ---------------------------------------------------------------------------------------------
# Padding and cropping


@op("CenterCropPad", since=18)
def CenterCropPad(input_data, shape, *, axes=None):
    """Center-crop or zero-pad each listed axis to `shape` (ONNX CenterCropPad-18)."""
    r = input_data.ndim
    ax = axes_indices(axes, r) if axes else list(range(r))
    target = ints(shape, "shape")
    if len(target) != len(ax):
        raise KernelError(f"CenterCropPad: shape has {len(target)} values for {len(ax)} axes")
    crop = [slice(None)] * r
    pads = [(0, 0)] * r
    for a, t in zip(ax, target):
        if t < 0:
            raise KernelError(f"CenterCropPad: shape {target} has a negative dimension")
        d = input_data.shape[a]
        if d >= t:
            # Crop window start rounds down.
            s = (d - t) // 2
            crop[a] = slice(s, s + t)
        else:
            # The odd extra pad pixel goes to the end.
            before = (t - d) // 2
            pads[a] = (before, t - d - before)
    return np.pad(input_data[tuple(crop)], pads, mode="constant")


def _pad(data: np.ndarray, pads: list[int], mode: str, value, axes=None) -> np.ndarray:
    r = data.ndim
    ax = axes_indices(axes, r) if axes is not None else list(range(r))
    if len(pads) != 2 * len(ax):
        raise KernelError(f"Pad: pads has {len(pads)} values, expected {2 * len(ax)}")
    begins, ends = [0] * r, [0] * r
    for i, a in enumerate(ax):
        begins[a], ends[a] = pads[i], pads[i + len(ax)]
    # Negative pads crop first; positive pads are then added.
    crop = tuple(
        slice(max(-b, 0), data.shape[a] - max(-e, 0)) for a, (b, e) in enumerate(zip(begins, ends))
    )
    for a, (b, e) in enumerate(zip(begins, ends)):
        if max(-b, 0) + max(-e, 0) > data.shape[a]:
            raise KernelError(f"Pad: negative pads ({b}, {e}) exceed dimension {data.shape[a]}")
    x = data[crop]
    width = [(max(b, 0), max(e, 0)) for b, e in zip(begins, ends)]
    if mode == "constant":
        if value is None:
            v = data.dtype.type(0) if data.dtype != object else ""
        else:
            v = np.asarray(value).astype(data.dtype).reshape(-1)[0]
        if data.dtype == object:
            # np.pad cannot fill object arrays with a constant reliably; build the output.
            out = np.full(tuple(s + b + e for s, (b, e) in zip(x.shape, width)), v, dtype=object)
            out[tuple(slice(b, b + s) for s, (b, _) in zip(x.shape, width))] = x
            return out
        return np.pad(x, width, mode="constant", constant_values=v)
    for a, (b, e) in enumerate(width):
        if (b or e) and x.shape[a] == 0:
            raise KernelError(f"Pad: cannot {mode}-pad empty axis {a}")
    if mode not in ("reflect", "edge", "wrap"):
        raise KernelError(f"Pad: unknown mode {mode!r}")
    # NumPy's reflect/edge/wrap match ONNX's (reflect excludes the edge value).
    return np.pad(x, width, mode=mode)


@op("Pad", since=1, contract=Contract(allowed={"mode": one_of("constant", "reflect", "edge")}))
def Pad_1(data, *, mode="constant", paddings=None, value=0.0):
    """Pad by the `paddings` attribute (ONNX Pad-1)."""
    return _pad(data, ints(paddings, "paddings"), mode, value)


@op("Pad", since=2, contract=Contract(allowed={"mode": one_of("constant", "reflect", "edge")}))
def Pad_2(data, *, mode="constant", pads=None, value=0.0):
    """Pad by the `pads` attribute [x1_begin, ..., x1_end, ...] (ONNX Pad-2)."""
    return _pad(data, ints(pads, "pads"), mode, value)


@op("Pad", since=11, contract=Contract(allowed={"mode": one_of("constant", "reflect", "edge")}))
def Pad_11(data, pads, constant_value=None, *, mode="constant"):
    """Pad by the `pads` input; negative pads crop (ONNX Pad-11/13)."""
    return _pad(data, ints(pads, "pads"), mode, constant_value)


@op("Pad", since=18, contract=Contract(allowed={"mode": one_of("constant", "reflect", "edge")}))
def Pad_18(data, pads, constant_value=None, axes=None, *, mode="constant"):
    """Pad the listed `axes` (default all) by the `pads` input (ONNX Pad-18)."""
    ax = None if axes is None else ints(axes, "axes")
    return _pad(data, ints(pads, "pads"), mode, constant_value, ax)


@op("Pad", since=19, contract=Contract(allowed={"mode": PAD_MODES}))
def Pad(data, pads, constant_value=None, axes=None, *, mode="constant"):
    """Pad the listed `axes` by `pads`; modes constant/reflect/edge/wrap (ONNX Pad-19..)."""
    ax = None if axes is None else ints(axes, "axes")
    return _pad(data, ints(pads, "pads"), mode, constant_value, ax)


@op("Trilu", since=14, contract=Contract(nan="suppress"))
def Trilu(input, k=None, *, upper=1):
    """Upper or lower triangle of the last two dims, offset by diagonal `k` (ONNX Trilu-14)."""
    if input.ndim < 2:
        raise KernelError(f"Trilu: input must have rank >= 2, got shape {input.shape}")
    kk = 0 if k is None else int(one_value(k, "k"))
    return np.triu(input, kk) if upper else np.tril(input, kk)


# ---------------------------------------------------------------------------------------------
# Backward rules


def _movement_grad_cases(op_type: str, since: int) -> list[Sample]:
    r, i = away_from_zero, int64
    x = r(2, 3, 4)
    if op_type == "Reshape":
        return ([Sample([x], {"shape": [4, 6]})] if since < 5
                else [Sample([x, i([4, -1])]), Sample([x, i([0, 12])])])
    if op_type == "Flatten":
        return [Sample([x], {"axis": 2})]
    if op_type == "Squeeze":
        return ([Sample([r(2, 1, 3)], {"axes": [1]})] if since < 13
                else [Sample([r(2, 1, 3), i([1])]), Sample([r(2, 1, 3)])])
    if op_type == "Unsqueeze":
        return [Sample([x], {"axes": [0, 3]})] if since < 13 else [Sample([x, i([0, 3])])]
    if op_type == "Transpose":
        return [Sample([x], {"perm": [2, 0, 1]}), Sample([x])]
    if op_type == "Expand":
        return [Sample([r(3, 1), i([2, 3, 4])])]
    if op_type == "Tile":
        return [Sample([x, i(2), i(1)])] if since < 6 else [Sample([x, i([1, 2, 1])])]
    if op_type == "DepthToSpace":
        return [Sample([r(1, 8, 2, 3)], {"blocksize": 2}),
                *([Sample([r(1, 8, 2, 3)], {"blocksize": 2, "mode": "CRD"})]
                  if since >= 11 else [])]
    if op_type == "SpaceToDepth":
        return [Sample([r(1, 2, 4, 6)], {"blocksize": 2})]
    if op_type == "Concat":
        return [Sample([x, r(2, 1, 4, seed=3), r(2, 2, 4, seed=4)], {"axis": 1})]
    if op_type == "Split":
        return ([Sample([r(5, 3)], {"axis": 0, "split": [2, 3]}, noutputs=2)] if since < 13
                else [Sample([r(5, 3), i([2, 3])], {"axis": 0}, noutputs=2),
                      Sample([r(2, 6)], {"axis": 1}, noutputs=3, label="equal")])
    return _pad_grad_cases(x, since)


def _pad_grad_cases(x: np.ndarray, since: int) -> list[Sample]:
    if since < 11:
        pads = "pads" if since >= 2 else "paddings"
        return [Sample([x], {pads: [0, 1, 0, 1, 0, 2], "value": 0.5}),
                Sample([x], {pads: [0, 1, 1, 0, 1, 2], "mode": "reflect"}, label="reflect")]
    return [Sample([x, int64([0, 1, 0, 1, 0, 2]), np.array(0.5)]),
            Sample([x, int64([1, 1, 0, 0, 2, 1])], {"mode": "edge"}, label="edge"),
            Sample([x, int64([0, 1, 1, 0, 1, 2])], {"mode": "reflect"}, label="reflect")]


differentiable("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Expand", "Tile",
               "DepthToSpace", "SpaceToDepth", "Split", "Pad",
               cases=_movement_grad_cases)(index_traced((0,)))
differentiable("Concat", cases=_movement_grad_cases)(index_traced("all"))
unary("Identity", cases=unary_cases({}, {}))(lambda x, y, a: np.ones_like(y))


def _dropout_grad_cases(op_type: str, since: int) -> list[Sample]:
    x = away_from_zero(2, 3)
    if since >= 12:
        return [Sample([x]), Sample([x, np.array(0.3)])]
    return [Sample([x], {"is_test": 1} if since < 7 else {})]


@differentiable("Dropout", cases=_dropout_grad_cases)
def _dropout_grad(ctx, dY, *rest, **attrs):
    X, Y = np.asarray(ctx.inputs[0]), np.asarray(ctx.outputs[0])
    if len(ctx.inputs) > 2 and ctx.inputs[2] is not None:
        training = bool(np.asarray(ctx.inputs[2]))
    else:
        training = "is_test" in attrs and not attrs["is_test"]
    if not training:
        return fit(ctx, dY)
    # Y = X * mask * scale: the per-element factor is Y / X (0 where X is 0 and dropped).
    with np.errstate(divide="ignore", invalid="ignore"):
        factor = np.where(X != 0, Y / np.where(X != 0, X, 1), 0)
    return fit(ctx, dY * factor)
