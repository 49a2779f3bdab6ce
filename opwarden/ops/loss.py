"""Operators: loss family (NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss)."""

import numpy as np

from opwarden.contract import Contract, one_of
from opwarden.errors import KernelError
from opwarden.ops.base import Sample, op
from opwarden.ops.common import work_float
from opwarden.ops.grad import away_from_zero, differentiable, fit, int64, positive

_REDUCTIONS = {"reduction": one_of("none", "sum", "mean")}
# 'mean' divides by the summed weights, which is 0/0 when every sample is ignored.
_CONTRACT = Contract(nan="produce", allowed=_REDUCTIONS)


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
    logp = input.astype(work_float(input.dtype))
    return _nll(logp, target, weight, reduction, ignore_index, input.dtype)


@op("SoftmaxCrossEntropyLoss", since=12, contract=_CONTRACT)
def SoftmaxCrossEntropyLoss(scores, labels, weights=None, *, ignore_index=None,
                            reduction="mean"):
    """Cross entropy of softmax over axis 1, and log_prob (ONNX SoftmaxCrossEntropyLoss-12)."""
    if scores.ndim < 2:
        raise KernelError(f"scores must have shape (N, C, D1, ...), got {scores.shape}")
    x = scores.astype(work_float(scores.dtype))
    # Log-softmax with the max subtracted so large scores do not overflow exp.
    shifted = x - np.max(x, axis=1, keepdims=True)
    logp = shifted - np.log(np.sum(np.exp(shifted), axis=1, keepdims=True))
    loss = _nll(logp, labels, weights, reduction, ignore_index, scores.dtype)
    return loss, logp.astype(scores.dtype)


# ---------------------------------------------------------------------------------------------
# Backward rules


def _nll_grad(logp, target, weight, attrs, dloss):
    """(d logp, d weight) of NegativeLogLikelihoodLoss given its upstream gradient."""
    reduction = attrs.get("reduction", "mean")
    ignore = attrs.get("ignore_index")
    t = np.asarray(target).astype(np.int64)
    keep = np.ones(t.shape, bool) if ignore is None else t != int(ignore)
    safe = np.where(keep, t, 0)
    picked = np.take_along_axis(logp, safe[:, None], axis=1)[:, 0]
    w = (np.asarray(weight, logp.dtype)[safe] if weight is not None else 1) * keep
    w = np.broadcast_to(w, t.shape).astype(logp.dtype)
    up = np.asarray(dloss, logp.dtype)
    if reduction == "none":
        coef = up
        dw_term = -picked * up
    elif reduction == "sum":
        coef = np.broadcast_to(up, t.shape)
        dw_term = -picked * up
    else:
        wsum = w.sum()
        loss = (-picked * w).sum() / wsum
        coef = np.broadcast_to(up / wsum, t.shape)
        dw_term = (-picked - loss) * up / wsum
    dlogp = np.zeros_like(logp)
    np.put_along_axis(dlogp, safe[:, None], (-w * coef)[:, None], axis=1)
    dweight = None
    if weight is not None:
        dweight = np.zeros(np.shape(weight), logp.dtype)
        np.add.at(dweight, safe[keep], np.broadcast_to(dw_term, t.shape)[keep])
    return dlogp, dweight


def _loss_grad_cases(op_type: str, since: int) -> list[Sample]:
    scores = away_from_zero(3, 4, 2)
    labels = int64([[0, 3], [2, 1], [1, 1]])
    w = positive(4, seed=9)
    out = []
    for red in ("mean", "sum", "none"):
        out.append(Sample([scores, labels, w], {"reduction": red}, label=red))
    out.append(Sample([scores, labels], {"reduction": "mean", "ignore_index": 1},
                      label="ignore_index"))
    if op_type == "SoftmaxCrossEntropyLoss":
        out[0].noutputs = 2
    return out


@differentiable("NegativeLogLikelihoodLoss", cases=_loss_grad_cases)
def _nll_loss_grad(ctx, dY, **attrs):
    logp = np.asarray(ctx.inputs[0]).astype(dY.dtype)
    weight = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    dlogp, dw = _nll_grad(logp, ctx.inputs[1], weight, attrs, dY)
    return fit(ctx, dlogp, None, dw)


@differentiable("SoftmaxCrossEntropyLoss", cases=_loss_grad_cases)
def _sce_loss_grad(ctx, dY, *rest, **attrs):
    scores = np.asarray(ctx.inputs[0]).astype(dY.dtype)
    weight = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    shifted = scores - scores.max(axis=1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    dlogp, dw = _nll_grad(logp, ctx.inputs[1], weight, attrs, dY)
    if rest and rest[0] is not None:
        dlogp = dlogp + rest[0]
    dscores = dlogp - np.exp(logp) * dlogp.sum(axis=1, keepdims=True)
    return fit(ctx, dscores, None, dw)
