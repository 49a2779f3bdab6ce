"""Where OpenVINO's CPU plugin computes otherwise than ONNX (and opwarden's contracts) says.

Found by `opwarden check --device openvino` and confirmed one node at a time (OpenVINO
2025.x, CPU plugin, f32 hint):

- float64 is computed in float32 (0.1 + 0.2 gives 0.30000001): a silent precision degrade.
- NumPy bfloat16 arrays (ml_dtypes) cross the boundary as float16.
- int64 is computed in int32 (2**40 + 1 gives 1). A region may still carry int64 (shapes,
  indices, token ids are small): constants must fit int32 (checked here) and the region checks
  its int64 feeds per call, running on the host when one does not fit (region.py). Slice's
  starts/ends beyond int32 ("to the end") are clamped by OpenVINO, which keeps their meaning.
- 8-bit integer arithmetic saturates (int8 127 + 127 gives 127); ONNX wraps.
- signed integer Div rounds toward -inf (-3 / 2 gives -2); ONNX truncates toward zero.
- some operators yield fewer outputs than asked (LayerNormalization's Mean and InvStdDev):
  convert.refusal compares the converted model's outputs with the node's.
- LayerNormalization over more than 2**16 elements drifts (its float32 variance).
- an empty tensor (a zero dimension) comes back with the wrong shape.
- Some operators lose NaN (`NAN_LOST`): their contract propagates it. Inside a region they still
  run on OpenVINO (the zoo's ReLUs would otherwise split every region), and explain says so
  for each such node; their single-node variants are declared unsupported on float inputs.
- Operator-specific (`op_refusal`; OpenVINO 2026.4):
  - RNN, GRU, LSTM with layout=1 (batch first): OpenVINO ignores the layout and reads X as
    [seq, batch, input], so outputs come back transposed and mixed. LSTM ignores its
    peephole weights P.
  - NonMaxSuppression suppresses a box whose IoU equals iou_threshold (ONNX: only above it);
    with the default threshold 0 it drops every disjoint box. Data decide it: always refused.
  - Dropout before opset 10 yields a bool mask; ONNX's is the data's type.
  - DFT with onesided=1 keeps the real input's trailing axis of 1 ([.., n//2+1, 1, 2]); a
    signal length that is not a power of 2 is computed by a float32 direct sum whose error
    grows with the length (1e-5 relative at 100 points; the FFT lengths are exact to 1e-7).
  - Attention (opset 25) ignores left_window_size and right_window_size (the sliding window).
  - TopK with K=0 is refused by the CPU plugin when it compiles ("K must be greater or equal
    to 1"); ONNX yields empty outputs.
  - QLinearMatMul with scales that are inputs, not constants, computes the right values on its
    first call only (wrong ones from the second on).
  - DynamicQuantizeLinear's quantized values differ by one from ONNX's (data decide where).
  - Resize ignores keep_aspect_ratio_policy (opset 18+), using `sizes` as given.
  - RoiAlign's mode="max" is a true max over the samples; ONNX's max mode is another formula.
  - SpaceToDepth ignores mode="CRD" (opset 28), computing DCR.
  - RandomNormalLike/RandomUniformLike on a rank-0 input yield shape [1].
  - LogSoftmax (opset 13) puts NaN elsewhere than the reference, as Softmax does; RMS
    normalizations drift over long axes as LayerNormalization does.
  - Rank-0 integer inputs (a scalar times a small integer constant) can come back as shape
    [1]; single-node variants on rank-0 integer inputs are declared unsupported.
  - A single-node variant's outputs are OpenVINO's own buffers: an operator whose contract
    makes an output a view of an input (Identity, Split) is declared unsupported there.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# Boundary dtypes: what OpenVINO computes in as ONNX does (int64: see the module docstring).
DTYPES = frozenset({"float32", "float16", "int64", "int32", "int16", "int8", "uint8", "bool"})
_INT32 = (-(1 << 31), (1 << 31) - 1)
_SATURATING = frozenset({"int8", "uint8"})
_ARITH = frozenset({"Add", "Sub", "Mul", "Neg", "Abs", "Sum", "Pow", "Mod", "Div"})
_NORM_MAX = 1 << 16
_SIGNED = frozenset({"int8", "int16", "int32", "int64"})
_FLOORING = frozenset({"Div"})
NAN_LOST = {
    "Relu": "maps NaN to 0", "Max": "drops NaN", "Min": "drops NaN", "MaxPool": "drops NaN",
    "GlobalMaxPool": "drops NaN", "ReduceMax": "drops NaN", "ReduceMin": "drops NaN",
    "HardSigmoid": "maps NaN to 1", "Exp": "maps NaN to Inf",
    "Clip": "maps NaN to its min",
    "Softmax": "puts NaN elsewhere than the reference (opset 13, one axis)",
    "Celu": "maps NaN to 0",
    "LogSoftmax": "puts NaN elsewhere than the reference (opset 13, one axis)",
    "TopK": "misorders the values around a NaN (ONNX ranks NaN above every number)",
}
_NAN_FROM = {"LogSoftmax": 13}  # NaN lost only from this opset on
_RECURRENT = frozenset({"RNN", "GRU", "LSTM"})
_NORMS = frozenset({"LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization"})
_INTS = frozenset({"int64", "int32", "int16", "int8", "uint8"})


def dtype_refusal(name: str, dtype: Any) -> str | None:
    """Why a tensor of `dtype` cannot cross into OpenVINO, or None."""
    if dtype in DTYPES:
        return None
    if dtype == "float64":
        why = "OpenVINO's CPU plugin computes float64 in float32"
    elif dtype == "bfloat16":
        why = "NumPy bfloat16 arrays reach OpenVINO as float16"
    else:
        why = "openvino takes " + ", ".join(sorted(DTYPES))
    return f"value {name!r} is {dtype}: {why}"


def node_refusal(node: Any) -> str | None:
    """A measured deviation that keeps `node` off OpenVINO (dtypes, empty tensors, saturating
    arithmetic, int64 constants beyond int32), or None."""
    clamped = {id(v) for v in node.inputs[1:3] if v is not None} if node.op_type == "Slice" \
        else set()  # starts/ends beyond int32 mean "to the end": clamping keeps that meaning
    for v in list(node.inputs) + list(node.outputs):
        if v is None:
            continue
        why = dtype_refusal(v.name, v.fact.dtype)
        if why:
            return why
        if v.fact.shape is not None and any(d == 0 for d in v.fact.shape):
            return f"value {v.name!r} is empty {list(v.fact.shape)}: OpenVINO mis-shapes " \
                   "empty tensors"
        if v.fact.dtype == "int64" and v.const is not None and v.const.size \
                and id(v) not in clamped:
            c = np.asarray(v.const)
            if int(c.min()) < _INT32[0] or int(c.max()) > _INT32[1]:
                return f"constant {v.name!r} holds int64 values beyond int32, which " \
                       "OpenVINO's CPU plugin computes int64 in"
    x = node.inputs[0] if node.inputs else None
    long = _long_norm(node.op_type, x.fact.shape if x is not None else None, node.attrs)
    if long:
        return long
    consts = [None if v is None or v.const is None else np.asarray(v.const)
              for v in node.inputs]
    why = op_refusal(node.op_type, node.opset, node.attrs,
                     [None if v is None else v.fact.shape for v in node.inputs], consts,
                     [v is not None for v in node.outputs])
    if why:
        return why
    outs = [v.fact.dtype for v in node.outputs if v is not None]
    if node.op_type in _ARITH and any(d in _SATURATING for d in outs):
        return f"{node.op_type} on 8-bit integers: OpenVINO saturates, ONNX wraps"
    if node.op_type in _FLOORING and any(d in _SIGNED for d in outs):
        return f"integer {node.op_type}: OpenVINO rounds toward -inf, ONNX toward zero"
    return None


def _long_norm(op_type: str, shape: Any, attrs: dict[str, Any]) -> str | None:
    """LayerNormalization over more than `_NORM_MAX` elements: OpenVINO's float32 variance
    drifts past the tolerance there (2e-4 relative over 2**20 elements)."""
    if op_type not in _NORMS or shape is None or not shape:
        return None
    axis = int(attrs.get("axis", -1))
    axis = axis + len(shape) if axis < 0 else axis
    dims = shape[axis:]
    if any(not isinstance(d, int) for d in dims) or int(np.prod(dims)) <= _NORM_MAX:
        return None
    return f"{op_type} over {int(np.prod(dims))} elements: OpenVINO's float32 " \
           f"variance drifts past the tolerance beyond {_NORM_MAX}"


def op_refusal(op_type: str, opset: int, attrs: dict[str, Any], shapes: list[Any],
               consts: list[Any], outputs: list[bool] | None = None) -> str | None:
    """The operator-specific deviations (module docstring) for a node of `op_type` at `opset`
    with these attributes, input shapes and constant input values (None: not constant or
    absent; a single-node variant sees no values: None throughout) and outputs asked for
    (None: all of them), or None."""
    def const(i: int) -> Any:
        return consts[i] if i < len(consts) else None

    def given(i: int) -> bool:
        return i < len(shapes) and (shapes[i] is not None or const(i) is not None)

    if op_type in _RECURRENT and int(attrs.get("layout", 0) or 0) == 1:
        return f"OpenVINO's {op_type} ignores layout=1 (batch first): it reads X as " \
               "[seq, batch, input]"
    if op_type == "LSTM" and given(7):
        return "OpenVINO's LSTM ignores the peephole weights P"
    if op_type == "NonMaxSuppression":
        return "OpenVINO's NonMaxSuppression suppresses a box whose IoU equals " \
               "iou_threshold (ONNX: only above it; at the default 0 it drops disjoint boxes)"
    if op_type == "Dropout" and opset < 10 and (outputs is None or
                                                (len(outputs) > 1 and outputs[1])):
        return "OpenVINO's Dropout yields a bool mask; before opset 10 ONNX's mask has " \
               "the data's type"
    if op_type == "Attention" and any(int(attrs.get(k, -1) if attrs.get(k) is not None
                                          else -1) >= 0
                                      for k in ("left_window_size", "right_window_size")):
        return "OpenVINO's Attention ignores left_window_size/right_window_size (the " \
               "sliding window)"
    if op_type == "TopK":
        k = attrs.get("k") if opset < 10 else const(1)
        if k is None and opset >= 10:
            return None if outputs is not None else \
                "TopK's k is an input a single-node variant cannot see, and OpenVINO's " \
                "CPU plugin refuses K=0 (ONNX yields empty outputs)"
        if k is not None and int(np.asarray(k).reshape(-1)[0]) == 0:
            return "OpenVINO's CPU plugin refuses TopK with K=0 (ONNX yields empty outputs)"
    if op_type == "DFT":
        return _dft(opset, attrs, shapes, const, given)
    if op_type == "QLinearMatMul" and any(const(i) is None for i in (1, 4, 6)):
        return "OpenVINO's QLinearMatMul with scales that are not constants is right on its " \
               "first call only"
    if op_type == "DynamicQuantizeLinear":
        return "OpenVINO's DynamicQuantizeLinear values differ by one from ONNX's"
    if op_type == "Resize" and str(attrs.get("keep_aspect_ratio_policy") or "stretch") \
            != "stretch" and given(3):
        return "OpenVINO's Resize ignores keep_aspect_ratio_policy (it uses sizes as given)"
    if op_type == "RoiAlign" and str(attrs.get("mode") or "avg") == "max":
        return "OpenVINO's RoiAlign mode='max' takes the max of the samples (ONNX: another " \
               "formula)"
    if op_type == "SpaceToDepth" and str(attrs.get("mode") or "DCR") == "CRD":
        return "OpenVINO's SpaceToDepth ignores mode='CRD' (it computes DCR)"
    if op_type in ("RandomNormalLike", "RandomUniformLike") and shapes \
            and shapes[0] is not None and len(shapes[0]) == 0:
        return f"OpenVINO's {op_type} on a rank-0 input yields shape [1]"
    return None


def _dft(opset: int, attrs: dict[str, Any], shapes: list[Any], const: Any, given: Any
         ) -> str | None:
    if int(attrs.get("onesided", 0) or 0) == 1:
        return "OpenVINO's DFT with onesided=1 keeps the real input's trailing axis of 1"
    x = shapes[0] if shapes else None
    if x is None:
        return "DFT of unknown rank: its length decides OpenVINO's precision"
    if opset < 20:
        axes = [int(attrs.get("axis", 1))]
    elif given(2):
        a = const(2)
        axes = [int(np.asarray(a).reshape(-1)[0])] if a is not None else \
            list(range(len(x) - 1))  # not seen: every signal axis must be fine
    else:
        axes = [-2]
    lengths = [x[a] for a in axes if -len(x) <= a < len(x)]
    if given(1):
        n = const(1)
        if n is None:
            return "DFT's dft_length is not a constant: its value decides OpenVINO's " \
                   "precision"
        lengths = [int(np.asarray(n).reshape(-1)[0])]
    for n in lengths:
        if not isinstance(n, int) or n <= 0 or n & (n - 1):
            return f"OpenVINO's DFT over a length of {n}, not a power of 2: a float32 " \
                   "direct sum, its error growing with the length (1e-5 relative at 100)"
    return None


def variant_refusal(op_type: str, dtypes: list[Any], shapes: list[Any],
                    attrs: dict[str, Any] | None = None, since: int = 1,
                    views: bool = False) -> str | None:
    """Why a single-node variant (of the operator version `since`; `views`: its contract makes
    an output a view of an input) is declared unsupported for these input facts, or None."""
    if views:
        return f"{op_type}'s contract makes an output a view of an input; OpenVINO's are copies"
    if shapes and _long_norm(op_type, shapes[0], attrs or {}):
        return _long_norm(op_type, shapes[0], attrs or {})
    if op_type in NAN_LOST and since >= _NAN_FROM.get(op_type, 0):
        return f"OpenVINO's {op_type} {NAN_LOST[op_type]}; its contract propagates NaN"
    why = op_refusal(op_type, since, attrs or {}, shapes, [None] * len(shapes))
    if why:
        return why
    if op_type == "QLinearConv" and len(shapes) > 5 and shapes[5] is not None \
            and len(shapes[5]) == 0:
        return "OpenVINO's frontend refuses QLinearConv's rank-0 w_zero_point as the " \
               "constant a single-node variant makes it"
    if shapes and all(s is not None and len(s) == 0 for s in shapes) \
            and any(d in _INTS for d in dtypes):
        return "rank-0 integer inputs: OpenVINO's CPU plugin yields some such results as " \
               "shape [1]"
    for i, dt in enumerate(dtypes):
        if dt is None:
            continue
        why = dtype_refusal(f"x{i}", dt)
        if why:
            return why
        if dt == "int64" and not _embedded(i, shapes[i] if i < len(shapes) else None):
            return "int64 data: OpenVINO's CPU plugin computes it in int32"
        if dt in _SATURATING and op_type in _ARITH:
            return f"{op_type} on 8-bit integers: OpenVINO saturates, ONNX wraps"
        if dt in _SIGNED and op_type in _FLOORING:
            return f"integer {op_type}: OpenVINO rounds toward -inf, ONNX toward zero"
    for s in shapes:
        if s is not None and any(d == 0 for d in s):
            return "an empty tensor: OpenVINO mis-shapes it"
    return None


def _embedded(i: int, shape: Any) -> bool:
    """Whether a single-node variant's int64 input is a parameter it embeds as a constant
    (shape, axes, pads: not its first input, at most 64 elements; provider._MAX_EMBED)."""
    if i == 0 or shape is None or any(not isinstance(d, int) for d in shape):
        return False
    return int(np.prod(shape, dtype=np.int64)) <= 64


def nan_note(op_type: str, opset: int = 1 << 30) -> str | None:
    """explain's note on a node in a region whose OpenVINO kernel loses NaN, or None."""
    why = NAN_LOST.get(op_type) if opset >= _NAN_FROM.get(op_type, 0) else None
    return None if why is None else f"OpenVINO's {op_type} {why} (its contract propagates NaN)"


def int32_safe(a: np.ndarray) -> bool:
    """Whether an int64 array's values survive OpenVINO's int32 computation."""
    if not a.size:
        return True
    return _INT32[0] <= int(a.min()) and int(a.max()) <= _INT32[1]
