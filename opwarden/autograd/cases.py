"""Sample inputs for gradchecking every built-in operator that has a backward rule.

`cases(opdef)` gives small float64 inputs (away from kinks: no ties, no values at 0 for Relu
and friends) with attributes, for the op's version; the tests and the check harness use them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from opwarden.ops.base import Sample as Case  # one gradcheck call: inputs, attributes, output count


def _r(*shape: int, lo: float = -2.0, hi: float = 2.0, seed: int = 0) -> np.ndarray:
    """Uniform values kept at least 0.05 away from 0 (kinks of relu/abs/sign live there)."""
    rng = np.random.default_rng(seed + 7 * len(shape) + sum(shape))
    x = rng.uniform(lo, hi, size=shape)
    return np.where(np.abs(x) < 0.05, 0.05 + np.abs(x), x)


def _pos(*shape: int, lo: float = 0.5, hi: float = 2.0, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed + sum(shape)).uniform(lo, hi, size=shape)


def _i(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


_UNARY_RANGES: dict[str, Callable[[], np.ndarray]] = {
    "Log": lambda: _pos(2, 3),
    "Sqrt": lambda: _pos(2, 3),
    "Reciprocal": lambda: _pos(2, 3),
    "Asin": lambda: _r(2, 3, lo=-0.8, hi=0.8),
    "Acos": lambda: _r(2, 3, lo=-0.8, hi=0.8),
    "Atanh": lambda: _r(2, 3, lo=-0.8, hi=0.8),
    "Acosh": lambda: _pos(2, 3, lo=1.2, hi=3.0),
    "Tan": lambda: _r(2, 3, lo=-1.2, hi=1.2),
    # stay off the integer / half-integer steps and the thresholds
    "Floor": lambda: _r(2, 3) * 0 + np.array([[0.3, 1.4, -0.6], [2.2, -1.3, 0.7]]),
    "Ceil": lambda: np.array([[0.3, 1.4, -0.6], [2.2, -1.3, 0.7]]),
    "Round": lambda: np.array([[0.3, 1.2, -0.7], [2.2, -1.3, 0.8]]),
    "HardSwish": lambda: np.array([[-4.0, -2.5, -0.5], [0.7, 2.9, 4.2]]),
    "HardSigmoid": lambda: np.array([[-4.0, -2.0, -0.5], [0.7, 2.2, 4.2]]),
    "Shrink": lambda: np.array([[-1.0, -0.2, 0.3], [0.7, 1.6, -0.9]]),
    "ThresholdedRelu": lambda: np.array([[-1.0, 0.5, 1.3], [2.7, 0.2, 1.6]]),
}

_UNARY = (
    "Neg Exp Log Sqrt Abs Reciprocal Sin Cos Tan Asin Acos Atan Sinh Cosh Asinh Acosh Atanh "
    "Erf Tanh Sigmoid Relu LeakyRelu Elu Celu ThresholdedRelu Softplus Softsign Floor Ceil "
    "Round Sign Identity Selu HardSigmoid HardSwish Shrink Mish Gelu"
).split()


def _unary_cases(op_type: str, since: int) -> list[Case]:
    x = _UNARY_RANGES.get(op_type, lambda: _r(2, 3))()
    out = [Case([x])]
    extra = {
        "LeakyRelu": {"alpha": 0.1}, "Elu": {"alpha": 0.7}, "Celu": {"alpha": 1.5},
        "Selu": {"alpha": 1.5, "gamma": 1.2}, "HardSigmoid": {"alpha": 0.3, "beta": 0.4},
        "Gelu": {"approximate": "tanh"}, "Shrink": {"lambd": 0.4, "bias": 0.1},
        "ThresholdedRelu": {"alpha": 0.8},
    }
    if op_type in extra:
        out.append(Case([x], extra[op_type], label=str(extra[op_type])))
    return out


def _binary_cases(op_type: str, since: int) -> list[Case]:
    b_pos = op_type in ("Div", "Pow")
    a = _pos(2, 3, 4) if op_type == "Pow" else _r(2, 3, 4)
    if since < 7:
        b_full = _pos(2, 3, 4, seed=5) if b_pos else _r(2, 3, 4, seed=5)
        b_axis = _pos(3, seed=6) if b_pos else _r(3, seed=6)
        return [
            Case([a, b_full]),
            Case([a, b_axis], {"broadcast": 1, "axis": 1}, label="legacy axis broadcast"),
        ]
    b1 = _pos(3, 1, seed=3) if b_pos else _r(3, 1, seed=3)
    b2 = _pos(2, 3, 4, seed=4) if b_pos else _r(2, 3, 4, seed=4)
    return [Case([a, b1], label="broadcast"), Case([a[:, :1, :], b2], label="A broadcast")]


def _variadic(op_type: str, since: int) -> list[Case]:
    return [Case([_r(2, 3, seed=1), _r(3, seed=2), _r(1, 3, seed=3)])]


def _reduce_cases(op_type: str, since: int) -> list[Case]:
    positive = op_type in ("ReduceLogSum", "ReduceProd", "ReduceL2", "ReduceL1")
    x = _pos(2, 3, 4) if positive else _r(2, 3, 4)
    if op_type == "ReduceProd":
        x = x * np.array([1, -1, 1, -1])
    axes_in = since >= (13 if op_type == "ReduceSum" else 18)
    if axes_in:
        return [
            Case([x, _i([1])]),
            Case([x, _i([0, -1])], {"keepdims": 0}),
            Case([x], label="all axes"),
        ]
    return [Case([x], {"axes": [1]}), Case([x], {"axes": [0, 2], "keepdims": 0}), Case([x])]


def _conv_cases(op_type: str, since: int) -> list[Case]:
    x = _r(2, 4, 5, 5)
    return [
        Case([x, _r(3, 4, 3, 3, seed=2), _r(3, seed=3)], {"pads": [1, 1, 1, 1]}),
        Case([x, _r(4, 2, 2, 3, seed=4)],
             {"group": 2, "strides": [2, 1], "dilations": [1, 2], "pads": [0, 1, 1, 0]},
             label="groups strides dilations"),
        Case([x, _r(2, 4, 3, 3, seed=5)], {"auto_pad": "SAME_LOWER", "strides": [2, 2]},
             label="SAME_LOWER"),
        Case([_r(1, 2, 6), _r(2, 2, 3, seed=6)], {"strides": [2]}, label="1-D"),
    ]


def _pool_cases(op_type: str, since: int) -> list[Case]:
    rng = np.random.default_rng(3)
    x = rng.permutation(2 * 3 * 5 * 5).reshape(2, 3, 5, 5) / 10.0  # distinct: no max ties
    out = [
        Case([x], {"kernel_shape": [2, 2]}),
        Case([x], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
             label="strided padded"),
    ]
    if op_type == "AveragePool" and since >= 7:
        out.append(Case([x], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1],
                              "count_include_pad": 1}, label="count_include_pad"))
    if since >= 10:
        out.append(Case([x], {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1},
                        label="ceil_mode"))
    if since >= (19 if op_type == "AveragePool" else 10):
        out.append(Case([x], {"kernel_shape": [2, 2], "dilations": [2, 2]}, label="dilations"))
    return out


def _bn_cases(op_type: str, since: int) -> list[Case]:
    x = _r(2, 3, 4, 2)
    params = [_r(3, seed=2), _r(3, seed=3), _r(3, seed=4), _pos(3, seed=5)]
    out = [Case([x, *params], {"epsilon": 1e-3})]
    if since >= 14:
        out.append(Case([x, *params], {"training_mode": 1}, noutputs=3, label="training"))
    return out


def _softmax_cases(op_type: str, since: int) -> list[Case]:
    x = _r(2, 3, 4)
    return [Case([x]), Case([x], {"axis": 1}), Case([x], {"axis": 0})]


def _movement_cases(op_type: str, since: int) -> list[Case]:
    x = _r(2, 3, 4)
    c = {
        "Reshape": (lambda: [Case([x], {"shape": [4, 6]})] if since < 5
                    else [Case([x, _i([4, -1])]), Case([x, _i([0, 12])])]),
        "Flatten": lambda: [Case([x], {"axis": 2})],
        "Squeeze": (lambda: [Case([_r(2, 1, 3)], {"axes": [1]})] if since < 13
                    else [Case([_r(2, 1, 3), _i([1])]), Case([_r(2, 1, 3)])]),
        "Unsqueeze": (lambda: [Case([x], {"axes": [0, 3]})] if since < 13
                      else [Case([x, _i([0, 3])])]),
        "Transpose": lambda: [Case([x], {"perm": [2, 0, 1]}), Case([x])],
        "Expand": lambda: [Case([_r(3, 1), _i([2, 3, 4])])],
        "Slice": (lambda: [Case([x], {"starts": [0, 1], "ends": [2, 3], "axes": [0, 2]})]
                  if since < 10 else
                  [Case([x, _i([1, 0]), _i([3, 4]), _i([1, 2]), _i([1, 2])]),
                   Case([x, _i([-1]), _i([-100]), _i([2]), _i([-2])], label="negative step")]),
        "Gather": lambda: [Case([x, _i([[2, 0], [2, 1]])], {"axis": 2}),
                           Case([x, _i([1, -1])], {"axis": 0})],
        "GatherElements": lambda: [Case([x, _i(np.random.default_rng(0).integers(0, 3, (2, 2, 4)))],
                                        {"axis": 1})],
        "GatherND": lambda: [Case([x, _i([[0, 1], [1, 2]])])],
        "Tile": (lambda: [Case([x, _i(2), _i(1)])] if since < 6
                 else [Case([x, _i([1, 2, 1])])]),
        "DepthToSpace": lambda: [Case([_r(1, 8, 2, 3)], {"blocksize": 2}),
                                 *([Case([_r(1, 8, 2, 3)], {"blocksize": 2, "mode": "CRD"})]
                                   if since >= 11 else [])],
        "SpaceToDepth": lambda: [Case([_r(1, 2, 4, 6)], {"blocksize": 2})],
        "Concat": lambda: [Case([x, _r(2, 1, 4, seed=3), _r(2, 2, 4, seed=4)], {"axis": 1})],
        "Split": (lambda: [Case([_r(5, 3)], {"axis": 0, "split": [2, 3]}, noutputs=2)]
                  if since < 13 else
                  [Case([_r(5, 3), _i([2, 3])], {"axis": 0}, noutputs=2),
                   Case([_r(2, 6)], {"axis": 1}, noutputs=3, label="equal")]),
        "Pad": (lambda: [Case([x], {"pads" if since >= 2 else "paddings":
                                    [0, 1, 0, 1, 0, 2], "value": 0.5}),
                         Case([x], {"pads" if since >= 2 else "paddings": [0, 1, 1, 0, 1, 2],
                                    "mode": "reflect"}, label="reflect")]
                if since < 11 else
                [Case([x, _i([0, 1, 0, 1, 0, 2]), np.array(0.5)]),
                 Case([x, _i([1, 1, 0, 0, 2, 1])], {"mode": "edge"}, label="edge"),
                 Case([x, _i([0, 1, 1, 0, 1, 2])], {"mode": "reflect"}, label="reflect")]),
        "ReverseSequence": lambda: [Case([_r(4, 2, 3), _i([3, 2])],
                                         {"batch_axis": 1, "time_axis": 0})],
        "Compress": lambda: [Case([x, np.array([True, False, True])], {"axis": 1})],
    }
    return c[op_type]()


def _loss_cases(op_type: str, since: int) -> list[Case]:
    scores = _r(3, 4, 2)
    labels = _i([[0, 3], [2, 1], [1, 1]])
    w = _pos(4, seed=9)
    out = []
    for red in ("mean", "sum", "none"):
        out.append(Case([scores, labels, w], {"reduction": red}, label=red))
    out.append(Case([scores, labels], {"reduction": "mean", "ignore_index": 1},
                    label="ignore_index"))
    if op_type == "SoftmaxCrossEntropyLoss":
        out[0].noutputs = 2
    return out


def _misc(op_type: str, since: int) -> list[Case]:
    x = _r(2, 3)
    if op_type == "MatMul":
        return [Case([_r(2, 3, 4), _r(4, 2, seed=2)]), Case([_r(3), _r(2, 3, 4, seed=2)]),
                Case([_r(2, 1, 2, 3), _r(3, 3, 2, seed=4)], label="batch broadcast")]
    if op_type == "Gemm":
        c = _r(3, 4, seed=3) if since < 7 else _r(4, seed=3)
        attrs = {"broadcast": 1} if since < 7 else {}
        return [Case([_r(2, 3), _r(3, 4, seed=2), c[:2] if since < 7 else c],
                     {"alpha": 0.5, "beta": 2.0, **attrs}),
                Case([_r(3, 2), _r(4, 3, seed=2), _r(2, 4, seed=3)],
                     {"transA": 1, "transB": 1})]
    if op_type == "PRelu":
        return [Case([x, _r(3, seed=4)])]
    if op_type == "Where":
        return [Case([np.array([True, False, True]), _r(2, 3), _r(2, 1, seed=2)])]
    if op_type == "Clip":
        y = np.array([[-2.0, -0.5, 0.2], [0.9, 1.7, -1.2]])
        if since < 11:
            return [Case([y], {"min": -1.0, "max": 1.0})]
        return [Case([y, np.array(-1.0), np.array(1.0)]), Case([y, None, np.array(0.5)])]
    if op_type in ("Cast", "CastLike"):
        if op_type == "Cast":
            return [Case([x], {"to": 11})]
        return [Case([x, np.zeros(1)])]
    if op_type == "Dropout":
        if since >= 12:
            return [Case([x]), Case([x, np.array(0.3)])]
        return [Case([x], {"is_test": 1} if since < 7 else {})]
    if op_type == "CumSum":
        return [Case([_r(3, 4), _i(1)], {"exclusive": e, "reverse": r}, label=f"e{e}r{r}")
                for e in (0, 1) for r in (0, 1)]
    if op_type == "GlobalAveragePool":
        return [Case([_r(2, 3, 4, 2)])]
    if op_type == "GlobalMaxPool":
        return [Case([np.random.default_rng(1).permutation(48).reshape(2, 3, 4, 2) / 7.0])]
    if op_type == "LayerNormalization":
        return [Case([_r(2, 3, 4), _r(4, seed=2), _r(4, seed=3)], {"stash_type": 11},
                     noutputs=3),
                Case([_r(2, 3, 4), _r(3, 4, seed=2)], {"axis": 1, "stash_type": 11})]
    raise KeyError(op_type)


_FAMILIES: list[tuple[tuple[str, ...], Callable[[str, int], list[Case]]]] = [
    (tuple(_UNARY), _unary_cases),
    (("Add", "Sub", "Mul", "Div", "Pow"), _binary_cases),
    (("Sum", "Mean", "Max", "Min"), _variadic),
    (tuple(f"Reduce{k}" for k in (
        "Sum", "Mean", "Max", "Min", "Prod", "SumSquare", "L1", "L2", "LogSum", "LogSumExp"
    )), _reduce_cases),
    (("Conv",), _conv_cases),
    (("MaxPool", "AveragePool"), _pool_cases),
    (("BatchNormalization",), _bn_cases),
    (("Softmax", "LogSoftmax"), _softmax_cases),
    (("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Expand", "Slice", "Gather",
      "GatherElements", "GatherND", "Tile", "DepthToSpace", "SpaceToDepth", "Concat", "Split",
      "Pad", "ReverseSequence", "Compress"), _movement_cases),
    (("SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss"), _loss_cases),
]


# Built-in operators of opwarden's own domain that have a backward rule.
_OPWARDEN: dict[str, Callable[[], list[Case]]] = {
    "ChannelShuffle": lambda: [
        Case([_r(2, 3, 12)], {"group": g}, label=f"group{g}") for g in (2, 3, 4)
    ],
}


def cases(opdef: Any) -> list[Case]:
    """Gradcheck cases for a built-in operator version (empty if none are known)."""
    if opdef.domain:
        make = _OPWARDEN.get(opdef.op_type) if opdef.domain == "opwarden" else None
        return make() if make is not None else []
    for names, fn in _FAMILIES:
        if opdef.op_type in names:
            return fn(opdef.op_type, opdef.since)
    try:
        return _misc(opdef.op_type, opdef.since)
    except KeyError:
        return []
