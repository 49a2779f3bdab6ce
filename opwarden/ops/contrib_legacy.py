"""Operators: com.microsoft operators older ORT tools wrote before ONNX had them, which ORT's
CPU provider still runs: TransposeMatMul (FusedMatMul's first name), Trilu, Range, ExpandDims,
GatherND, Pad, Unique, Inverse, MatMulInteger16, GridSample (4-D, as ONNX GridSample-16), and
CDist (skl2onnx writes it for nearest neighbours and Gaussian processes). Each computes as its
ONNX counterpart where one exists, with ORT's differences: Unique keeps first-occurrence order
and has no first-index output, Pad also takes pads as [1, 2 * rank], CDist is ORT's
-2 A B^T + |a|^2 + |b|^2 (then abs, sqrt).
"""

from __future__ import annotations

import numpy as np

from opwarden.contract import Contract, TensorFact, one_of
from opwarden.errors import KernelError
from opwarden.ops.base import Sample, op
from opwarden.ops.common import work_float
from opwarden.ops.constant import Range_11
from opwarden.ops.contrib import FusedMatMul
from opwarden.ops.contrib_dynq import matmul_fact_shape
from opwarden.ops.image import GridSample_16
from opwarden.ops.index import GatherND as _GatherND
from opwarden.ops.index import Unique as _Unique
from opwarden.ops.shape import Pad_11
from opwarden.ops.shape import Trilu as _Trilu

MS = "com.microsoft"
_ANY = ["float32", "float64", "float16", "bfloat16", "int64", "uint64", "int32", "uint32",
        "int16", "uint16", "int8", "uint8", "bool", "string"]


@op("TransposeMatMul", domain=MS, since=1, inputs=["A: T", "B: T"], outputs=["Y: T"],
    types={"T": ["float32", "float64", "float16", "bfloat16"]},
    attrs={"alpha": 1.0, "transA": 0, "transB": 0},
    contract=Contract(nan="propagate", tolerance="normwise",
                      allowed={"transA": one_of(0, 1), "transB": one_of(0, 1)}))
def TransposeMatMul(A, B, *, alpha=1.0, transA=0, transB=0):
    """alpha * op(A) @ op(B) (com.microsoft TransposeMatMul-1, FusedMatMul's former name)."""
    return FusedMatMul.reference(A, B, alpha=alpha, transA=transA, transB=transB)


@TransposeMatMul.infer
def _transpose_matmul_infer(a, b, *, transA=0, transB=0, **_):
    def flip(s, t):
        return s if s is None or len(s) < 2 or not t else (*s[:-2], s[-1], s[-2])

    return TensorFact(a.dtype, matmul_fact_shape(flip(a.shape, transA), flip(b.shape, transB)))


@TransposeMatMul.samples
def _transpose_matmul_samples(rng):
    a, b = rng.standard_normal((2, 4, 3)).astype(np.float32), rng.standard_normal((5, 4))
    yield Sample([a, b.astype(np.float32)], {"transA": 1, "transB": 1, "alpha": 0.5},
                 label="transA, transB, alpha")
    yield Sample([a[0].T.copy(), b.T.astype(np.float32).copy()], label="plain 2-D")


@op("Trilu", domain=MS, since=1, inputs=["X: T", "k?: tensor(int64)"], outputs=["Y: T"],
    types={"T": ["float32", "float64", "int64"]}, attrs={"upper": 1},
    contract=Contract(nan="suppress", allowed={"upper": one_of(0, 1)}))
def TriluMS(X, k=None, *, upper=1):
    """Upper or lower triangle of the last two dims, offset by k (com.microsoft Trilu-1)."""
    return _Trilu(X, k, upper=upper)


@op("Range", domain=MS, since=1, inputs=["start: T", "limit: T", "delta?: T"],
    outputs=["Y: T"], types={"T": ["int32", "int64", "float32", "float64", "int16"]},
    contract=Contract())
def RangeMS(start, limit, delta=None):
    """start, start + delta, ... below limit; delta defaults to 1 (com.microsoft Range-1)."""
    if delta is None:
        delta = np.ones((), np.asarray(start).dtype)
    return Range_11(start, limit, delta)


@op("ExpandDims", domain=MS, since=1, inputs=["X: T", "axis: tensor(int32)"],
    outputs=["Y: T"], types={"T": _ANY}, contract=Contract(may_alias=((0, 0),)))
def ExpandDims(X, axis):
    """X with a new axis of size 1 at `axis` (in [-rank - 1, rank]) (com.microsoft
    ExpandDims-1)."""
    a = np.asarray(axis)
    if a.size != 1:
        raise KernelError(f"ExpandDims: axis must be a scalar, got shape {a.shape}")
    ax = int(a.reshape(()))
    if not -X.ndim - 1 <= ax <= X.ndim:
        raise KernelError(f"ExpandDims: axis {ax} out of range [{-X.ndim - 1}, {X.ndim}]")
    return np.expand_dims(X, ax % (X.ndim + 1))


@op("GatherND", domain=MS, since=1, inputs=["data: T", "indices: Tind"], outputs=["output: T"],
    types={"T": _ANY, "Tind": ["int32", "int64"]}, contract=Contract())
def GatherNDMS(data, indices):
    """Slices of data addressed by indices' last axis (com.microsoft GatherND-1)."""
    return _GatherND(data, np.asarray(indices).astype(np.int64))


@op("Pad", domain=MS, since=1, inputs=["data: T", "pads: tensor(int64)", "value?: T"],
    outputs=["output: T"], types={"T": ["float32", "float64", "float16"]},
    attrs={"mode": "constant"},
    contract=Contract(allowed={"mode": one_of("constant", "reflect", "edge")}))
def PadMS(data, pads, value=None, *, mode="constant"):
    """ONNX Pad-11 with pads also given as [1, 2 * rank] (com.microsoft Pad-1)."""
    p = np.asarray(pads)
    if p.ndim == 2 and p.shape[0] == 1:
        p = p.reshape(-1)
    if p.ndim != 1 or p.size != 2 * data.ndim:
        raise KernelError(f"Pad: pads must hold {2 * data.ndim} values ([2 * rank] or "
                          f"[1, 2 * rank]), got shape {p.shape}")
    return Pad_11(data, p, value, mode=mode)


@op("Unique", domain=MS, since=1, inputs=["x: T"], outputs=["y: T", "idx: tensor(int64)",
                                                         "counts: tensor(int64)"],
    types={"T": ["float32", "float64", "int64", "int32", "int8", "uint8", "string"]},
    contract=Contract(nan="propagate"))
def UniqueMS(x):
    """The distinct values of a 1-D x in first-occurrence order, each element's index into
    them, and their counts (com.microsoft Unique-1)."""
    if x.ndim != 1:
        raise KernelError(f"Unique: x must be 1-D, got shape {x.shape}")
    y, _first, inverse, counts = _Unique(x, sorted=0)
    return y, inverse, counts


@op("Inverse", domain=MS, since=1, inputs=["X: T"], outputs=["Y: T"],
    types={"T": ["float32", "float64", "float16"]}, contract=Contract(nan="propagate"))
def Inverse(X):
    """The inverse of each square matrix in X's last two dims; float16 inverts in float32
    (com.microsoft Inverse-1)."""
    if X.ndim < 2 or X.shape[-1] != X.shape[-2]:
        raise KernelError(f"Inverse: X must end in square matrices, got shape {X.shape}")
    try:
        return np.linalg.inv(X.astype(work_float(X.dtype))).astype(X.dtype)
    except np.linalg.LinAlgError as e:
        raise KernelError(f"Inverse: a matrix is singular ({e})") from None


@op("MatMulInteger16", domain=MS, since=1, inputs=["A: T1", "B: T2"], outputs=["Y: T3"],
    types={"T1": ["int16"], "T2": ["int16"], "T3": ["int32"]},
    contract=Contract(overflow="wrap"))
def MatMulInteger16(A, B):
    """int16 @ int16 accumulated in int32, batched like MatMul (com.microsoft
    MatMulInteger16-1)."""
    try:
        return np.matmul(A.astype(np.int64), B.astype(np.int64)).astype(np.int32)
    except ValueError as e:
        raise KernelError(f"MatMulInteger16: A {A.shape} and B {B.shape}: {e}") from None


@op("CDist", domain=MS, since=1, inputs=["A: T", "B: T"], outputs=["C: T"],
    types={"T": ["float32", "float64"]}, attrs={"metric": "sqeuclidean"},
    contract=Contract(nan="propagate", tolerance="normwise",
                      allowed={"metric": one_of("sqeuclidean", "euclidean")}))
def CDist(A, B, *, metric="sqeuclidean"):
    """Pairwise (squared) Euclidean distances between the rows of A [m, k] and B [n, k], as
    ORT computes them: (-2 A B^T + |a|^2) + |b|^2, then abs (and sqrt) (com.microsoft
    CDist-1)."""
    if A.ndim != 2 or B.ndim != 2 or A.shape[1] != B.shape[1] or A.shape[1] == 0:
        raise KernelError(f"CDist: A and B must be [m, k] and [n, k] with k > 0, got "
                          f"{A.shape} and {B.shape}")
    dt = A.dtype.type
    c = (dt(-2) * (A @ B.T)).astype(A.dtype)
    c = (c + np.square(A).sum(axis=1, dtype=A.dtype)[:, None]) + \
        np.square(B).sum(axis=1, dtype=A.dtype)[None, :]
    c = np.abs(c)
    return (np.sqrt(c) if metric == "euclidean" else c).astype(A.dtype)


@op("GridSample", domain=MS, since=1, inputs=["X: T1", "Grid: T1"], outputs=["Y: T2"],
    types={"T1": ["float32"], "T2": ["float32"]},
    attrs={"align_corners": 0, "mode": "bilinear", "padding_mode": "zeros"},
    contract=Contract(nan="propagate", allowed={
        "mode": one_of("bilinear", "nearest", "bicubic"),
        "padding_mode": one_of("zeros", "border", "reflection"),
        "align_corners": one_of(0, 1)}))
def GridSampleMS(X, Grid, *, align_corners=0, mode="bilinear", padding_mode="zeros"):
    """Sample a 4-D X at the normalized (x, y) positions of Grid [N, H_out, W_out, 2]
    (com.microsoft GridSample-1, which torch exported before ONNX GridSample-16)."""
    if X.ndim != 4 or Grid.ndim != 4 or Grid.shape[-1] != 2 or Grid.shape[0] != X.shape[0]:
        raise KernelError(f"GridSample: X must be (N, C, H, W) and Grid (N, H_out, W_out, 2), "
                          f"got {X.shape} and {Grid.shape}")
    return GridSample_16(X, Grid, align_corners=align_corners, mode=mode,
                         padding_mode=padding_mode)


# --------------------------------------------------------------------------------------------
# Shape rules and samples
# --------------------------------------------------------------------------------------------


@TriluMS.infer
def _same_infer(x, *_, **__):
    return TensorFact(x.dtype, x.shape)


Inverse.infer(_same_infer)


@MatMulInteger16.infer
def _mmi16_infer(a, b, **_):
    return TensorFact("int32", matmul_fact_shape(a.shape, b.shape))


@CDist.infer
def _cdist_infer(a, b, **_):
    if a.shape is None or b.shape is None or len(a.shape) != 2 or len(b.shape) != 2:
        return TensorFact(a.dtype, None)
    return TensorFact(a.dtype, (a.shape[0], b.shape[0]))


@GatherNDMS.infer
def _gathernd_infer(data, idx, **_):
    if data.shape is None or idx.shape is None or not isinstance(idx.shape[-1], int):
        return TensorFact(data.dtype, None)
    return TensorFact(data.dtype, (*idx.shape[:-1], *data.shape[idx.shape[-1]:]))


@TriluMS.samples
def _trilu_samples(rng):
    x = rng.standard_normal((2, 4, 5)).astype(np.float32)
    yield Sample([x], label="upper")
    yield Sample([x, np.array(-1, np.int64)], {"upper": 0}, label="lower, k=-1")
    yield Sample([rng.integers(-9, 9, (3, 3)).astype(np.int64), np.array(2, np.int64)],
                 label="int64, k=2")


@RangeMS.samples
def _range_samples(rng):
    yield Sample([np.array(2, np.int32), np.array(11, np.int32), np.array(3, np.int32)],
                 label="int32")
    yield Sample([np.array(1.0, np.float32), np.array(-2.0, np.float32),
                  np.array(-0.5, np.float32)], label="float, negative delta")
    yield Sample([np.array(0, np.int64), np.array(5, np.int64)], label="no delta")


@ExpandDims.samples
def _expand_dims_samples(rng):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    for ax in (0, 2, -1, -3):
        yield Sample([x, np.array(ax, np.int32)], label=f"axis {ax}")


@GatherNDMS.samples
def _gathernd_samples(rng):
    data = rng.standard_normal((3, 4, 2)).astype(np.float32)
    yield Sample([data, np.array([[0, 1], [2, 3]], np.int64)], label="pairs of indices")
    yield Sample([data, np.array([[2], [0]], np.int32)], label="int32 rows")


@PadMS.samples
def _pad_samples(rng):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    yield Sample([x, np.array([0, 1, 2, 0], np.int64), np.array(9.5, np.float32)],
                 label="constant value")
    yield Sample([x, np.array([[1, 1, 1, 1]], np.int64)], {"mode": "reflect"},
                 label="[1, 2 * rank] pads, reflect")
    yield Sample([x, np.array([0, 2, 0, 1], np.int64)], {"mode": "edge"}, label="edge")


@UniqueMS.samples
def _unique_samples(rng):
    yield Sample([np.array([2.0, 1.0, 1.0, 3.0, 4.0, 3.0], np.float32)], noutputs=3,
                 label="first-occurrence order")
    yield Sample([rng.integers(0, 4, 20).astype(np.float32)], noutputs=3, label="random")


@Inverse.samples
def _inverse_samples(rng):
    m = rng.standard_normal((2, 3, 3)) + 3 * np.eye(3)
    yield Sample([m.astype(np.float32)], label="batched float32")
    yield Sample([m[0].astype(np.float64)], label="float64")
    yield Sample([m[1].astype(np.float16)], label="float16")


@MatMulInteger16.samples
def _mmi16_samples(rng):
    a = rng.integers(-2 ** 15, 2 ** 15, (3, 8)).astype(np.int16)
    b = rng.integers(-2 ** 15, 2 ** 15, (8, 2)).astype(np.int16)
    yield Sample([a, b], label="full int16 range")
    yield Sample([a[None], b], label="batched A")


@CDist.samples
def _cdist_samples(rng):
    a = rng.standard_normal((4, 3)).astype(np.float32)
    b = rng.standard_normal((5, 3)).astype(np.float32)
    yield Sample([a, b], label="sqeuclidean")
    yield Sample([a, a], {"metric": "euclidean"}, label="euclidean, same points (zeros)")
    yield Sample([a.astype(np.float64), b.astype(np.float64)], {"metric": "euclidean"},
                 label="float64")


@GridSampleMS.infer
def _grid_sample_infer(x, grid, **_):
    if x.shape is None or grid.shape is None or len(x.shape) != 4 or len(grid.shape) != 4:
        return TensorFact(x.dtype, None)
    return TensorFact(x.dtype, (x.shape[0], x.shape[1], grid.shape[1], grid.shape[2]))


@GridSampleMS.samples
def _grid_sample_samples(rng):
    x = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)
    grid = rng.uniform(-1.2, 1.2, (2, 3, 6, 2)).astype(np.float32)
    for mode in ("bilinear", "nearest", "bicubic"):
        for pad in ("zeros", "border", "reflection"):
            yield Sample([x, grid], {"mode": mode, "padding_mode": pad}, label=f"{mode} {pad}")
    yield Sample([x, grid], {"align_corners": 1}, label="align_corners")
