"""Operators: detection family (RoiAlign, NonMaxSuppression)."""

from __future__ import annotations

import numpy as np

from opwarden.contract import Contract, one_of
from opwarden.errors import KernelError
from opwarden.ops.base import op
from opwarden.ops.common import interp_float

# ---------------------------------------------------------------------------------------------
# RoiAlign


def _roi_axis_samples(start: float, extent: float, n_bins: int, grid: int, limit: int):
    """Bilinear taps of a RoI's samples along one axis: (low idx, high idx, low w, high w).

    Samples more than one pixel outside the input get zero weights (they count as 0).
    """
    bin_size = extent / n_bins
    s = (np.arange(n_bins)[:, None] * bin_size
         + (np.arange(grid)[None, :] + 0.5) * bin_size / grid + start).reshape(-1)
    inside = (s >= -1.0) & (s <= limit)  # samples beyond one pixel outside contribute 0
    s = np.maximum(s, 0.0)
    low = np.floor(s).astype(np.int64)
    at_end = low >= limit - 1
    low = np.where(at_end, limit - 1, low)
    high = np.where(at_end, limit - 1, low + 1)
    s = np.where(at_end, low, s)
    frac = s - low
    return low, high, (1 - frac) * inside, frac * inside


def _bin_matrix(low, high, w_low, w_high, n_bins: int, grid: int):
    """[n_bins, span] weights averaging each bin's samples over input positions first..;
    returns it with `first`, the input position of its column 0."""
    first = int(low.min())
    span = int(high.max()) - first + 1
    M = np.zeros((n_bins, span))
    rows = np.repeat(np.arange(n_bins), grid)
    np.add.at(M, (rows, low - first), w_low / grid)
    np.add.at(M, (rows, high - first), w_high / grid)
    return M, first


def _roi_align(X, rois, batch_indices, *, mode, output_height, output_width, sampling_ratio,
               spatial_scale, half_pixel):
    """RoiAlign over all RoIs: a vectorised bilinear sampling grid per RoI."""
    if X.ndim != 4 or rois.ndim != 2 or rois.shape[1] != 4:
        raise KernelError(f"RoiAlign: bad shapes X {X.shape}, rois {rois.shape}")
    batch_indices = np.asarray(batch_indices).reshape(-1).astype(np.int64)
    if batch_indices.size != rois.shape[0]:
        raise KernelError(f"RoiAlign: {batch_indices.size} batch_indices for "
                          f"{rois.shape[0]} rois")
    if np.any((batch_indices < 0) | (batch_indices >= X.shape[0])):
        raise KernelError(f"RoiAlign: batch_indices out of range [0, {X.shape[0]})")
    _, C, H, W = X.shape
    oh, ow = int(output_height), int(output_width)
    wdt = interp_float(X.dtype)
    Y = np.zeros((rois.shape[0], C, oh, ow), wdt)
    offset = 0.5 if half_pixel else 0.0
    Xw = X.astype(wdt, copy=False)
    for r, (box, b) in enumerate(zip(rois.astype(np.float64), batch_indices)):
        x1, y1, x2, y2 = box * spatial_scale - offset
        roi_w, roi_h = x2 - x1, y2 - y1
        if not half_pixel:  # legacy behaviour: RoIs are at least one pixel
            roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
        gh = sampling_ratio if sampling_ratio > 0 else int(np.ceil(roi_h / oh))
        gw = sampling_ratio if sampling_ratio > 0 else int(np.ceil(roi_w / ow))
        if gh <= 0 or gw <= 0:
            continue
        yl, yh, wyl, wyh = _roi_axis_samples(y1, roi_h, oh, gh, H)
        xl, xh, wxl, wxh = _roi_axis_samples(x1, roi_w, ow, gw, W)
        img = Xw[b]
        if mode == "avg":
            # Bilinear sampling then averaging is separable: Y = Ay @ crop @ Ax^T per channel.
            Ay, y0 = _bin_matrix(yl, yh, wyl, wyh, oh, gh)
            Ax, x0 = _bin_matrix(xl, xh, wxl, wxh, ow, gw)
            crop = img[:, y0:y0 + Ay.shape[1], x0:x0 + Ax.shape[1]]
            Y[r] = Ay.astype(wdt) @ crop @ Ax.T.astype(wdt)
            continue
        # Max mode takes the largest weighted corner of each sample, as onnxruntime defines it.
        corners = [img[:, iy][:, :, ix] * (wy[:, None] * wx[None, :]).astype(wdt)
                   for iy, wy in ((yl, wyl), (yh, wyh)) for ix, wx in ((xl, wxl), (xh, wxh))]
        vals = np.maximum(np.maximum(corners[0], corners[1]), np.maximum(corners[2], corners[3]))
        Y[r] = vals.reshape(C, oh, gh, ow, gw).max(axis=(2, 4))
    return np.asarray(Y.astype(X.dtype))


@op("RoiAlign", since=16, contract=Contract(layout="NCHW", nan="suppress", allowed={
    "mode": one_of("avg", "max"),
    "coordinate_transformation_mode": one_of("half_pixel", "output_half_pixel")}))
def RoiAlign(X, rois, batch_indices, *, coordinate_transformation_mode="half_pixel",
             mode="avg", output_height=1, output_width=1, sampling_ratio=0, spatial_scale=1.0):
    """Region-of-interest align with bilinear sampling (ONNX RoiAlign-16)."""
    return _roi_align(X, rois, batch_indices, mode=mode, output_height=output_height,
                      output_width=output_width, sampling_ratio=sampling_ratio,
                      spatial_scale=spatial_scale,
                      half_pixel=coordinate_transformation_mode == "half_pixel")


@op("RoiAlign", since=10, contract=Contract(layout="NCHW", nan="suppress", allowed={
    "mode": one_of("avg", "max")}))
def RoiAlign_10(X, rois, batch_indices, *, mode="avg", output_height=1, output_width=1,
                sampling_ratio=0, spatial_scale=1.0):
    """Region-of-interest align without the half-pixel shift (ONNX RoiAlign-10)."""
    return _roi_align(X, rois, batch_indices, mode=mode, output_height=output_height,
                      output_width=output_width, sampling_ratio=sampling_ratio,
                      spatial_scale=spatial_scale, half_pixel=False)


# ---------------------------------------------------------------------------------------------
# NonMaxSuppression


def _corners(boxes: np.ndarray, center_point_box: int) -> np.ndarray:
    """[S, 4] boxes -> [S, 4] as (lo0, lo1, hi0, hi1) with lo <= hi on both axes."""
    if center_point_box:
        c, half = boxes[:, :2], boxes[:, 2:] / 2
        return np.concatenate([c - half, c + half], axis=1)
    a, b = boxes[:, :2], boxes[:, 2:]
    return np.concatenate([np.minimum(a, b), np.maximum(a, b)], axis=1)


def _nms_one(corners: np.ndarray, scores: np.ndarray, limit: int, iou_threshold: float,
             score_threshold: float | None) -> list[int]:
    """Greedy NMS for one (batch, class): selected box indices in selection order."""
    order = np.argsort(-scores, kind="stable")  # ties keep the lower box index first
    if score_threshold is not None:
        order = order[scores[order] >= score_threshold]
    # Candidates as separate coordinate columns (1-D ops are much cheaper than 2-D reductions).
    lo0, lo1, hi0, hi1 = (np.ascontiguousarray(corners[order, j]) for j in range(4))
    area = (hi0 - lo0) * (hi1 - lo1)
    selected: list[int] = []
    while order.size and len(selected) < limit:
        selected.append(int(order[0]))
        inter = (np.clip(np.minimum(hi0[0], hi0[1:]) - np.maximum(lo0[0], lo0[1:]), 0, None)
                 * np.clip(np.minimum(hi1[0], hi1[1:]) - np.maximum(lo1[0], lo1[1:]), 0, None))
        union = area[0] + area[1:] - inter
        # IoU 0 when boxes do not overlap or are degenerate; suppress only IoU > threshold.
        iou = np.divide(inter, union, out=np.zeros_like(inter), where=(inter > 0) & (union > 0))
        keep = np.flatnonzero(iou <= iou_threshold) + 1
        order, lo0, lo1, hi0, hi1, area = (a[keep] for a in (order, lo0, lo1, hi0, hi1, area))
    return selected


def _scalar(v, default, dtype):
    v = None if v is None else np.asarray(v).reshape(-1)
    return default if v is None or v.size == 0 else dtype(v[0])


@op("NonMaxSuppression", since=10, contract=Contract(
    nan="none", allowed={"center_point_box": one_of(0, 1)}))
def NonMaxSuppression(boxes, scores, max_output_boxes_per_class=None, iou_threshold=None,
                      score_threshold=None, *, center_point_box=0):
    """Greedy per-class NMS; rows [batch, class, box] (ONNX NonMaxSuppression-10/11)."""
    if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3:
        raise KernelError(f"NonMaxSuppression: bad shapes boxes {boxes.shape}, "
                          f"scores {scores.shape}")
    if scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
        raise KernelError(f"NonMaxSuppression: scores {scores.shape} do not match "
                          f"boxes {boxes.shape}")
    limit = _scalar(max_output_boxes_per_class, 0, int)
    iou_t = _scalar(iou_threshold, 0.0, float)
    score_t = _scalar(score_threshold, None, float)
    rows = []
    if limit > 0:
        for b in range(boxes.shape[0]):
            corners = _corners(boxes[b].astype(np.float64), center_point_box)
            for c in range(scores.shape[1]):
                for i in _nms_one(corners, scores[b, c].astype(np.float64), limit, iou_t,
                                  score_t):
                    rows.append((b, c, i))
    return np.array(rows, dtype=np.int64).reshape(-1, 3)
