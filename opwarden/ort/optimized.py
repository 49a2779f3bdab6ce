"""SessionOptions.optimized_model_filepath: the optimized graph written as an ONNX model.

The graph is written as the passes left it, before placement (device copies and layout
conversions are the devices', not the model's): fused operators stay nodes of domain
"opwarden", imported at version 1, which opwarden loads back as they are, with the same
outputs. onnxruntime cannot read that domain: with the session config entry
"opwarden.optimized_model_standard_ops" = "1" the fused nodes are written as the standard
operators they compute (ort.expand), and where one has no such expansion the model written is
the graph optimized with standard operators only (the basic level: folding, identity and
dead-code elimination), with an OpwardenWarning naming the nodes. onnxruntime's entries
"session.optimized_model_external_initializers_file_name" and
"session.optimized_model_external_initializers_min_size_in_bytes" (default 1024) put the
weights in an external file beside the model.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import onnx

from opwarden.errors import OptionsError, OpwardenWarning
from opwarden.ir.export import optimized_model_proto
from opwarden.ir.graph import Model
from opwarden.ort.expand import expand_fused

STANDARD_OPS_KEY = "opwarden.optimized_model_standard_ops"
_EXTERNAL_KEY = "session.optimized_model_external_initializers_file_name"
_MIN_SIZE_KEY = "session.optimized_model_external_initializers_min_size_in_bytes"


def wants_standard_ops(options: Any) -> bool:
    """Is the optimized model to hold standard operators only?"""
    return options.config_entries.get(STANDARD_OPS_KEY, "0") in ("1", "true", "True")


def _proto(model: Model, meta: Any) -> onnx.ModelProto:
    proto = optimized_model_proto(
        model, metadata=getattr(meta, "custom_metadata_map", None),
        doc_string=getattr(meta, "description", ""))
    if meta is not None:
        proto.producer_name = meta.producer_name or "opwarden"
        proto.domain = meta.domain
        proto.model_version = meta.version
        proto.graph.doc_string = meta.graph_description
    return proto


def _dtypes(model: Model) -> dict[str, str]:
    return {v.name: v.fact.dtype for v in model.graph.values.values()
            if v.kind == "tensor" and v.fact.dtype}


def write_optimized(model: Model, options: Any, meta: Any,
                    basic: Callable[[], Model]) -> str:
    """Write `model` (optimized, not yet placed) to options.optimized_model_filepath; returns
    the path. `basic()` gives the model optimized at the basic level, for a standard-ops model
    whose fused nodes do not all expand. OptionsError (naming the path) when it cannot be
    written."""
    path = os.fspath(options.optimized_model_filepath)
    proto = _proto(model, meta)
    if wants_standard_ops(options):
        missing = expand_fused(proto, _dtypes(model))
        if missing:
            warnings.warn(
                f"opwarden: {path!r} is written optimized at the basic level only: "
                f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''} have no "
                "standard-operator expansion", OpwardenWarning, stacklevel=4)
            proto = _proto(basic(), meta)
    entries = options.config_entries
    external = entries.get(_EXTERNAL_KEY)
    try:
        if external:
            threshold = int(entries.get(_MIN_SIZE_KEY, "1024"))
            onnx.save_model(proto, path, save_as_external_data=True, all_tensors_to_one_file=True,
                            location=external, size_threshold=threshold)
        else:
            onnx.save_model(proto, path)
    except (OSError, ValueError) as e:
        raise OptionsError(
            f"optimized_model_filepath {path!r} cannot be written: {type(e).__name__}: {e}"
        ) from None
    return path
