"""onnxruntime's InferenceSession methods beyond `run`, as a base class of the session.

`OrtSessionMethods` holds what code written for onnxruntime calls on a session: values
(`run_with_ort_values`), IO binding, `run_async`, providers and their fallback, the model's
metadata, the options and profiling clock. It relies on the session for `run`, `options`,
`providers`, `get_inputs`/`get_outputs` and `_rebuild` (a fresh placement for new providers).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from opwarden.errors import InputError
from opwarden.ort.binding import SessionIOBinding
from opwarden.ort.meta import ModelMetadata
from opwarden.ort.providers import provider_names, resolve_providers
from opwarden.ort.values import OrtValue

# onnxruntime's graph transformers (InferenceSession(..., disabled_optimizers=[...])) and the
# opwarden pass doing their work; names with no counterpart here disable nothing, as there is
# nothing of theirs to run.
ORT_OPTIMIZERS = {
    "ConstantFolding": "constant_folding",
    "ShapeToInitializer": "shape_folding",
    "EliminateIdentity": "identity_elimination",
    "ConvBNFusion": "conv_bn_folding",
    "ConvActivationFusion": "conv_fusion",
    "ConvAddFusion": "conv_fusion",
    "ConvMulFusion": "scale_into_conv",
    "GemmActivationFusion": "gemm_fusion",
    "MatMulAddFusion": "gemm_fusion",
    "TransposeOptimizer": "transpose_cancellation",
    "QDQSelectorActionTransformer": "qdq_fusion",
    "DynamicQuantizeMatMulFusion": "dynamic_quantize_matmul_fusion",
    "MatMulIntegerToFloatFusion": "dynamic_quantize_matmul_fusion",
}


def ort_kwargs(kwargs: dict[str, Any]) -> tuple[bool, list[str], dict[str, Any]]:
    """(fallback enabled, passes to disable, the other keywords: session options) from the
    keywords of InferenceSession: onnxruntime's `enable_fallback` (0 or 1) and
    `disabled_optimizers` (its transformer names, or opwarden pass names) are its own."""
    rest = dict(kwargs)
    fallback = int(rest.pop("enable_fallback", 1)) == 1
    disabled: list[str] = []
    for name in rest.pop("disabled_optimizers", None) or ():
        mapped = ORT_OPTIMIZERS.get(name, name if name in _pass_names() else None)
        if mapped is not None and mapped not in disabled:
            disabled.append(mapped)
    return fallback, disabled, rest


def _pass_names() -> tuple[str, ...]:
    from opwarden.passes import PASS_NAMES

    return PASS_NAMES


class OrtSessionMethods:
    """The onnxruntime surface of `opwarden.InferenceSession` (see the module docstring)."""

    options: Any
    providers: list[str]
    _provider_options: dict[str, dict[str, str]]
    _fallback: bool
    _meta: ModelMetadata
    _profiling_start_ns: int
    # The session provides run, get_inputs, get_outputs and _rebuild(providers).

    # -- values and bindings ---------------------------------------------------------------
    def run_with_ort_values(self, output_names: Sequence[str] | None,
                            input_dict_ort_values: Mapping[str, Any],
                            run_options: Any = None) -> list[OrtValue]:
        """`run` with OrtValue feeds (arrays accepted too); returns OrtValues."""
        return [OrtValue(x) for x in self.run(output_names, input_dict_ort_values, run_options)]

    def io_binding(self) -> SessionIOBinding:
        """A new IO binding for this session (`run_with_iobinding` runs it)."""
        return SessionIOBinding(self)

    def run_with_iobinding(self, iobinding: SessionIOBinding, run_options: Any = None) -> None:
        """Run on the binding's inputs, writing its outputs (`iobinding.get_outputs()`)."""
        if not isinstance(iobinding, SessionIOBinding) or iobinding._session is not self:
            raise InputError("run_with_iobinding needs an IOBinding made by this session's "
                             "io_binding()")
        iobinding.run(run_options)

    def run_async(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any],
                  callback: Any, user_data: Any, run_options: Any = None) -> None:
        """Run on another thread; then `callback(results, user_data, err)` on that thread,
        with err "" on success, or results [] and err the error's message (as onnxruntime).
        Missing or unknown feed names raise here, before the thread starts."""
        if not callable(callback):
            raise InputError(f"run_async needs a callable callback, got {type(callback).__name__}")
        self._check_names(input_feed)

        def work() -> None:
            try:
                results = self.run(output_names, input_feed, run_options)
            except Exception as e:  # noqa: BLE001 - every failure goes to the callback
                callback([], user_data, f"{type(e).__name__}: {e}")
                return
            callback(results, user_data, "")

        threading.Thread(target=work, name="opwarden-run-async", daemon=True).start()

    def _check_names(self, feed: Any) -> None:
        if not isinstance(feed, Mapping):
            raise InputError(f"input_feed must be a dict of name -> array, got "
                             f"{type(feed).__name__}")
        names = [a.name for a in self.get_inputs()]
        missing = [n for n in names if n not in feed]
        if missing:
            raise InputError(f"required inputs {missing} are missing from the input feed "
                             f"({list(feed)})")

    # -- providers -------------------------------------------------------------------------
    def get_providers(self) -> list[str]:
        """The session's providers as onnxruntime names them ("CPUExecutionProvider")."""
        return provider_names(self.providers)

    def get_provider_options(self) -> dict[str, dict[str, str]]:
        """{provider: its options as str -> str}, as given (see `resolve_providers`)."""
        return {k: dict(v) for k, v in self._provider_options.items()}

    def set_providers(self, providers: Sequence[Any] | None = None,
                      provider_options: Any = None) -> None:
        """Place the model again on `providers` (unavailable ones fall back with a warning,
        or raise ProviderError after `disable_fallback()`)."""
        names, opts = resolve_providers(providers, provider_options, self._fallback_allowed())
        self._rebuild(names)
        self._provider_options = opts

    def disable_fallback(self) -> None:
        """From now on, unavailable providers in `set_providers` raise ProviderError instead
        of falling back with a warning. (Kernel faults still fall back to the reference
        kernel under SessionOptions.on_fault; that is the guard's, not the providers'.)"""
        self._fallback = False

    def enable_fallback(self) -> None:
        """Unavailable providers fall back with a warning again (the default)."""
        self._fallback = True

    def _fallback_allowed(self) -> bool:
        return self._fallback and getattr(self.options, "fallback", "allow") != "forbid"

    # -- what the session holds ------------------------------------------------------------
    def get_modelmeta(self) -> ModelMetadata:
        """The model's producer, graph name, domain, descriptions, version, metadata_props."""
        return self._meta

    def get_session_options(self) -> Any:
        """The SessionOptions this session was made with."""
        return self.options

    def get_profiling_start_time_ns(self) -> int:
        """When profiling started (time.time_ns() at session creation), 0 without
        enable_profiling, as onnxruntime."""
        return self._profiling_start_ns
