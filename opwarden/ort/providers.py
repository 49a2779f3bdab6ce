"""Execution providers as onnxruntime names them, and onnxruntime's fallback between them.

Each opwarden device has one onnxruntime-style name: an alias of the device that ends in
"ExecutionProvider" (cpu: "CPUExecutionProvider"), else its name in CamelCase plus
"ExecutionProvider" (torch: "TorchExecutionProvider", edge-npu: "EdgeNpuExecutionProvider").
`get_providers()` reports those; providers lists accept them, the device names, their aliases
and profile paths.

A providers list naming onnxruntime providers that do not exist here (CUDAExecutionProvider on
this runtime, say) does what onnxruntime does: they are skipped with a warning naming them
(`ProviderFallbackWarning`, a UserWarning as onnxruntime's), and the session runs on the rest,
or on the CPU when none is left. With fallback disabled (`InferenceSession.disable_fallback()`,
or `SessionOptions(fallback="forbid")`) the same list is a `ProviderError`. A name neither
runtime knows is an `OptionsError`: a typo should not silently run on the CPU.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from typing import Any

from opwarden.errors import OptionsError, ProviderError, ProviderFallbackWarning

# Every provider onnxruntime 1.32 knows (onnxruntime.get_all_providers()), for telling an
# unavailable one from a typo.
ORT_PROVIDERS = (
    "TensorrtExecutionProvider", "NvTensorRTRTXExecutionProvider", "CUDAExecutionProvider",
    "MIGraphXExecutionProvider", "ROCMExecutionProvider", "OpenVINOExecutionProvider",
    "DnnlExecutionProvider", "VitisAIExecutionProvider", "QNNExecutionProvider",
    "NnapiExecutionProvider", "VSINPUExecutionProvider", "JsExecutionProvider",
    "CoreMLExecutionProvider", "ArmNNExecutionProvider", "ACLExecutionProvider",
    "DmlExecutionProvider", "RknpuExecutionProvider", "WebNNExecutionProvider",
    "WebGpuExecutionProvider", "XnnpackExecutionProvider", "CANNExecutionProvider",
    "AzureExecutionProvider", "TvmExecutionProvider", "SNPEExecutionProvider",
    "CPUExecutionProvider",
)
_SUFFIX = "ExecutionProvider"


def ort_name(device: Any) -> str:
    """The onnxruntime-style name of a device (see the module docstring)."""
    for alias in device.aliases:
        if alias.endswith(_SUFFIX):
            return alias
    parts = re.split(r"[^0-9A-Za-z]+", device.name)
    name = "".join(p[:1].upper() + p[1:] for p in parts if p) + _SUFFIX
    # a device standing for an onnxruntime provider takes onnxruntime's spelling of it
    return next((n for n in ORT_PROVIDERS if n.lower() == name.lower()), name)


def _by_ort_name() -> dict[str, Any]:
    from opwarden.devices import devices

    return {ort_name(d).lower(): d for d in devices()}


def get_available_providers() -> list[str]:
    """The providers this process can run on, as onnxruntime names them, CPU last as
    onnxruntime lists it. Simulated devices (TOML profiles emulating another chip's numerics,
    such as edge-npu's float16) are left out: code passing this whole list expects onnxruntime's
    numbers, and a simulated device is chosen by its name."""
    from opwarden.devices import devices

    names = [ort_name(d) for d in devices() if not d.simulated]
    return sorted(names, key=lambda n: n == "CPUExecutionProvider")


def get_all_providers() -> list[str]:
    """Every provider name either runtime knows (available or not)."""
    return list(dict.fromkeys([*get_available_providers(), *ORT_PROVIDERS]))


def get_device() -> str:
    """What onnxruntime's get_device() says for this build: "GPU" when a device runs on a
    GPU (the torch provider on CUDA), else "CPU"."""
    from opwarden.devices import devices

    return "GPU" if any(d.extra.get("cuda") for d in devices()) else "CPU"


def _resolve(name: Any) -> Any:
    """The device for one provider entry's name, or None for an onnxruntime provider that is
    not available here; OptionsError for a name no runtime knows."""
    from opwarden.devices import get_device as device_named
    from opwarden.devices import load_profile

    if hasattr(name, "__fspath__"):
        name = str(name.__fspath__())
    if not isinstance(name, str):
        raise OptionsError(f"provider must be a name, got {name!r}")
    if name.lower().endswith(".toml"):
        return load_profile(name)
    try:
        return device_named(name)
    except OptionsError as e:
        dev = _by_ort_name().get(name.lower())
        if dev is not None:
            return dev
        if name in ORT_PROVIDERS:
            return None
        raise OptionsError(
            f"unknown provider {name!r}: {e}; available providers: "
            f"{get_available_providers()}") from None


def _entries(providers: Sequence[Any], provider_options: Any) -> list[tuple[Any, dict]]:
    """(name, options) per entry, checked as onnxruntime checks them."""
    if isinstance(providers, (str, bytes)) or not isinstance(providers, Sequence):
        raise OptionsError(f"'providers' should be a sequence of names, got {providers!r}")
    if provider_options is not None:
        if not isinstance(provider_options, Sequence) or len(provider_options) != len(providers):
            raise OptionsError(
                "'providers' and 'provider_options' should be sequences of the same length "
                f"({len(providers)} providers)")
        if not all(isinstance(o, dict) for o in provider_options):
            raise OptionsError("'provider_options' values must be dicts")
        return list(zip(providers, provider_options))
    out = []
    for p in providers:
        if isinstance(p, tuple):
            if len(p) != 2 or not isinstance(p[1], dict):
                raise OptionsError(
                    f"a providers entry must be a name or a (name, options dict) tuple, got {p!r}")
            out.append((p[0], p[1]))
        else:
            out.append((p, {}))
    return out


def resolve_providers(
    providers: Sequence[Any] | None, provider_options: Any = None, fallback: bool = True
) -> tuple[list[str], dict[str, dict[str, str]]]:
    """(device names in order, {onnxruntime name: options as str -> str}) for a providers
    list; unavailable onnxruntime providers are skipped with a ProviderFallbackWarning, or
    refused with ProviderError when `fallback` is False.

    Provider options are kept, str-converted as onnxruntime does, and reported by
    `get_provider_options()`; opwarden's devices take no per-provider options (threads come
    from SessionOptions.intra_op_num_threads), so they change nothing."""
    from opwarden.devices import get_device as device_named

    if not providers:
        return ["cpu"], {"CPUExecutionProvider": {}}
    names: list[str] = []
    opts: dict[str, dict[str, str]] = {}
    missing: list[str] = []
    for name, o in _entries(providers, provider_options):
        dev = _resolve(name)
        if dev is None:
            missing.append(str(name))
            continue
        if dev.name not in names:
            names.append(dev.name)
            opts[ort_name(dev)] = {str(k): str(v) for k, v in o.items()}
    if missing:
        avail = get_available_providers()
        if not fallback:
            raise ProviderError(
                f"provider(s) {missing} not available (available: {avail}) and fallback is "
                "disabled")
        if not names:
            cpu = device_named("cpu")
            names, opts = [cpu.name], {ort_name(cpu): {}}
        warnings.warn(
            f"opwarden: specified provider(s) {missing} not available; running on "
            f"{[ort_name(device_named(n)) for n in names]}. Available providers: {avail}",
            ProviderFallbackWarning, stacklevel=3)
    return names, opts


def provider_names(devices: Sequence[str]) -> list[str]:
    """The onnxruntime-style names of a session's devices."""
    from opwarden.devices import get_device as device_named

    return [ort_name(device_named(d)) for d in devices]
