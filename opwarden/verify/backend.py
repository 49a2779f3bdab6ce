"""An `onnx.backend.base.Backend` over InferenceSession, so onnx's own BackendTest can drive us."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from opwarden.session import InferenceSession


class OpwardenRep(BackendRep):
    """A prepared model: `run(inputs)` takes a list (graph-input order) or a dict."""

    def __init__(self, session: InferenceSession) -> None:
        self.session = session

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        names = [a.name for a in self.session.get_inputs()]
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            feeds = dict(zip(names, inputs))
        return tuple(self.session.run(None, feeds))


class OpwardenBackend(Backend):
    """onnx backend protocol: prepare / run_model / run_node / supports_device."""

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return device.upper() == "CPU"

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> OpwardenRep:
        return OpwardenRep(InferenceSession(model.SerializeToString()))

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any):
        return cls.prepare(model, device).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU", **kwargs: Any):
        opset = kwargs.get("opset_version", onnx.defs.onnx_opset_version())
        ins = [
            onnx.helper.make_tensor_value_info(
                name, onnx.helper.np_dtype_to_tensor_dtype(np.asarray(x).dtype), np.shape(x)
            )
            for name, x in zip(node.input, inputs)
        ]
        outs = [onnx.helper.make_empty_tensor_value_info(name) for name in node.output]
        graph = onnx.helper.make_graph([node], "run_node", ins, outs)
        model = onnx.helper.make_model(
            graph, opset_imports=[onnx.helper.make_opsetid(node.domain, opset)]
        )
        return cls.run_model(model, list(inputs), device)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper() == "CPU"


prepare = OpwardenBackend.prepare
run_model = OpwardenBackend.run_model
run_node = OpwardenBackend.run_node
supports_device = OpwardenBackend.supports_device
