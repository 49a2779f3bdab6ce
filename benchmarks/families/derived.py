"""Models derived from other cases by the tools people run on them:

- quant: onnxruntime.quantization's quantize_dynamic (int8 weights, DynamicQuantizeLinear +
  MatMulInteger) on BERT-base, and quantize_static in QDQ format (int8 weights per channel,
  uint8 activations, MinMax over a few calibration batches) on ResNet-50;
- fp16: onnxconverter_common.float16 (keep_io_types: float32 in and out) on ResNet-50 and
  BERT-base.

The smoke versions apply the same tools to the onnx.helper toy models.
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Callable

import onnx

from families.base import CASES, Case, Feeds, base_bytes, cache_key, register

QUANT = ("onnxruntime",)
FP16 = ("onnxconverter_common",)


def _base(name: str) -> Callable[[], bytes]:
    """The bytes of a base case: cached for full cases, built for smoke ones."""
    case = CASES[name]
    return (lambda: base_bytes(name)) if case.cache else case.build


def dynamic_quant(base: Callable[[], bytes]) -> bytes:
    """quantize_dynamic with int8 weights on every MatMul with a constant weight."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "f32.onnx"), os.path.join(d, "q.onnx")
        with open(src, "wb") as f:
            f.write(base())
        quantize_dynamic(src, dst, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"])
        with open(dst, "rb") as f:
            return f.read()


def static_qdq(base: Callable[[], bytes], feeds: Callable[[int, int], Feeds],
               batches: int = 4, signed: bool = False) -> bytes:
    """quantize_static, QDQ format, per-channel int8 weights, uint8 activations (int8 with
    `signed`, quantize_static's own default), MinMax calibration over `batches` seeded feeds
    of batch 1."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter([feeds(1, 100 + i) for i in range(batches)])

        def get_next(self) -> Feeds | None:
            return next(self.it, None)

    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "f32.onnx"), os.path.join(d, "q.onnx")
        with open(src, "wb") as f:
            f.write(base())
        quantize_static(src, dst, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QInt8 if signed else QuantType.QUInt8,
                        weight_type=QuantType.QInt8)
        with open(dst, "rb") as f:
            return f.read()


def fp16(base: Callable[[], bytes], keep_io_types: bool = True) -> bytes:
    """float16.convert_float_to_float16, by default with float32 graph inputs and outputs
    (`keep_io_types`: without it, float outputs become float16; BERT needs that, since the
    converter mistypes a node that reads a kept-float32 graph output, the pooler's Gather of
    last_hidden_state, and ORT refuses the model). Cast joins the
    op block list: the converter retypes a Cast(to=FLOAT)'s output to float16 but leaves its
    `to` attribute, which ORT then refuses (the attention mask's int->float Cast of every
    BERT export); blocked, the Cast stays float32 and the converter casts after it."""
    from onnxconverter_common import float16

    m = onnx.load_from_string(base())
    block = [*float16.DEFAULT_OP_BLOCK_LIST, "Cast"]
    return float16.convert_float_to_float16(m, keep_io_types=keep_io_types,
                                            op_block_list=block).SerializeToString()


def fp16_out(base: Callable[[], bytes]) -> bytes:
    """fp16 with float16 graph outputs (keep_io_types=False; BERT's inputs are int64)."""
    return fp16(base, keep_io_types=False)


def register_all() -> None:
    """The quant and fp16 families (full cases need their base case registered)."""
    full = [("bert_base_qdyn", "quant", "bert_base", QUANT, dynamic_quant, "quantize_dynamic"),
            ("resnet50_qdq", "quant", "resnet50", QUANT, None, "quantize_static QDQ"),
            ("resnet50_qdq_s8", "quant", "resnet50", QUANT, "s8", "quantize_static QDQ, int8"),
            ("resnet50_fp16", "fp16", "resnet50", FP16, fp16, "float16 converter"),
            ("bert_base_fp16", "fp16", "bert_base", FP16, fp16_out, "float16 converter")]
    smoke = [("tiny_bert_qdyn", "quant", "tiny_bert", QUANT, dynamic_quant, "quantize_dynamic"),
             ("tiny_cnn_qdq", "quant", "tiny_cnn", QUANT, None, "quantize_static QDQ"),
             ("tiny_cnn_fp16", "fp16", "tiny_cnn", FP16, fp16, "float16 converter"),
             ("tiny_bert_fp16", "fp16", "tiny_bert", FP16, fp16_out, "float16 converter")]
    for rows, is_smoke in ((full, False), (smoke, True)):
        for name, family, base_name, needs, tool, note in rows:
            base = CASES[base_name]
            src = _base(base_name)
            if tool is None or tool == "s8":
                build = functools.partial(static_qdq, src, base.feeds, signed=tool == "s8")
                tool_name = static_qdq.__name__ + ("_s8" if tool else "")
            else:
                build, tool_name = (lambda src=src, tool=tool: tool(src)), tool.__name__
            register(Case(name, family, build, base.feeds, needs=(*base.needs, *needs),
                          kind=family,
                          config={"base": cache_key(base), "tool": tool_name},
                          batches=base.batches[:1], smoke=is_smoke, cache=not is_smoke,
                          note=f"{note} of {base_name}"))
