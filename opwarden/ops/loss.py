"""Operators: loss family (NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss)."""

import numpy as np

from opwarden.contract import Contract, one_of
from opwarden.errors import KernelError
from opwarden.ops.base import op

_REDUCTIONS = {"reduction": one_of("none", "sum", "mean")}
# 'mean' divides by the summed weights, which is 0/0 when every sample is ignored.
_CONTRACT = Contract(nan="produce", allowed=_REDUCTIONS)


def _work_dtype(dt):
    # Half-precision losses accumulate in float32, then are cast back.
    return np.float64 if dt == np.float64 else np.float32


def _nll(logp, target, weight, reduction, ignore_index, out_dtype):
    """Weighted, reduced -logp[n, target[n, ...], ...]; logp is in the work dtype."""
    if logp.ndim < 2:
        raise KernelError(f"input must have shape (N, C, d1, ...), got {logp.shape}")
    C = logp.shape[1]
    if target.shape != (logp.shape[0],) + logp.shape[2:]:
        raise KernelError(
            f"target shape {target.shape} does not match input shape {logp.shape} "
            f"(expected {(logp.shape[0],) + logp.shape[2:]})"
        )
    if reduction not in ("none", "sum", "mean"):
        raise KernelError(f"reduction must be none, sum or mean, got {reduction!r}")
    t = target.astype(np.int64)
    keep = np.ones(t.shape, bool) if ignore_index is None else t != int(ignore_index)
    bad = t[keep & ((t < 0) | (t >= C))]
    if bad.size:
        raise KernelError(
            f"target values must lie in [0, {C}) or equal ignore_index, got {bad[:5].tolist()}"
        )
    safe = np.where(keep, t, 0)  # ignored entries may hold any value; index a valid class
    picked = np.take_along_axis(logp, safe[:, None], axis=1)[:, 0]
    if weight is not None:
        if weight.shape != (C,):
            raise KernelError(f"weight must have shape ({C},), got {weight.shape}")
        w = weight.astype(logp.dtype)[safe] * keep
    else:
        w = keep.astype(logp.dtype)
    loss = -picked * w
    if reduction == "none":
        return loss.astype(out_dtype)
    total = loss.sum()
    if reduction == "mean":
        with np.errstate(invalid="ignore", divide="ignore"):
            total = total / w.sum()
    return np.asarray(total, dtype=out_dtype)


@op("NegativeLogLikelihoodLoss", since=12, contract=_CONTRACT)
def NegativeLogLikelihoodLoss(input, target, weight=None, *, ignore_index=None, reduction="mean"):
    """Negative log likelihood of the target classes (ONNX NegativeLogLikelihoodLoss-12)."""
    logp = input.astype(_work_dtype(input.dtype))
    return _nll(logp, target, weight, reduction, ignore_index, input.dtype)


@op("SoftmaxCrossEntropyLoss", since=12, contract=_CONTRACT)
def SoftmaxCrossEntropyLoss(scores, labels, weights=None, *, ignore_index=None,
                            reduction="mean"):
    """Cross entropy of softmax over axis 1, and log_prob (ONNX SoftmaxCrossEntropyLoss-12)."""
    if scores.ndim < 2:
        raise KernelError(f"scores must have shape (N, C, D1, ...), got {scores.shape}")
    x = scores.astype(_work_dtype(scores.dtype))
    # Log-softmax with the max subtracted so large scores do not overflow exp.
    shifted = x - np.max(x, axis=1, keepdims=True)
    logp = shifted - np.log(np.sum(np.exp(shifted), axis=1, keepdims=True))
    loss = _nll(logp, labels, weights, reduction, ignore_index, scores.dtype)
    return loss, logp.astype(scores.dtype)
