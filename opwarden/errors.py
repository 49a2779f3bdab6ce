"""Every error the runtime raises derives from :class:`OpwardenError`.

Each also derives from the builtin exception that code written for onnxruntime catches (whose
own errors are `ValueError` for a bad feed in Python, `RuntimeError`-like `Fail` for a failed
or terminated run): a bad model, feed or option is a `ValueError`, a failed, stopped or
refused run a `RuntimeError`, an operator nothing can run a `NotImplementedError` (onnxruntime's
NOT_IMPLEMENTED). `except ValueError` and `except RuntimeError` therefore keep working when
opwarden replaces onnxruntime, and `except opwarden.InputError` still tells the kinds apart.
"""

from __future__ import annotations


class OpwardenError(Exception):
    """Base of every error opwarden raises on purpose."""


class ModelError(OpwardenError, ValueError):
    """The model file or graph is malformed or violates an operator's schema."""


class UnsupportedOpError(ModelError, NotImplementedError):
    """No operator, kernel variant or decomposition can run a node."""


class InputError(OpwardenError, ValueError):
    """A feed or a requested output does not match the model's declared signature."""


class KernelError(OpwardenError, RuntimeError):
    """A kernel failed while running a node."""


class ContractError(OpwardenError):
    """An operator or kernel declaration is inconsistent (raised at registration)."""


class OptionsError(OpwardenError, ValueError):
    """A SessionOptions value is unknown or out of range."""


class MemoryLimitError(OpwardenError, RuntimeError):
    """A model or a feed would need more memory than SessionOptions.memory_limit_bytes."""


class RunTimeoutError(OpwardenError, RuntimeError):
    """A run passed SessionOptions.run_timeout_ms (checked between steps and loop iterations)."""


class RunTerminated(RunTimeoutError):
    """A run stopped by ``RunOptions.terminate`` (onnxruntime raises ``Fail`` for it).

    It derives from RunTimeoutError so that every place that stops a run at its deadline
    (between steps, at each Loop/Scan iteration, through the guard) stops it here too."""


class ProviderError(OptionsError):
    """An execution provider asked for is not available and fallback is disabled
    (``InferenceSession.disable_fallback()`` or ``SessionOptions(fallback="forbid")``)."""


class OpwardenWarning(UserWarning):
    """Base of the warnings opwarden emits on purpose."""


class ProviderFallbackWarning(OpwardenWarning):
    """Providers asked for that are not available here were skipped (as onnxruntime does,
    which warns with a UserWarning); the session runs on the ones that are."""


class PrecisionWarning(OpwardenWarning):
    """A device cannot compute in the precision the session asked for; it computes in f32
    (explain says so)."""


def describe_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
