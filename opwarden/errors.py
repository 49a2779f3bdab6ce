"""Every error the runtime raises derives from :class:`OpwardenError`."""

from __future__ import annotations


class OpwardenError(Exception):
    """Base of every error opwarden raises on purpose."""


class ModelError(OpwardenError):
    """The model file or graph is malformed or violates an operator's schema."""


class UnsupportedOpError(ModelError):
    """No operator, kernel variant or decomposition can run a node."""


class InputError(OpwardenError):
    """A feed or a requested output does not match the model's declared signature."""


class KernelError(OpwardenError):
    """A kernel failed while running a node."""


class ContractError(OpwardenError):
    """An operator or kernel declaration is inconsistent (raised at registration)."""


class OptionsError(OpwardenError):
    """A SessionOptions value is unknown or out of range."""


class MemoryLimitError(OpwardenError):
    """A model or a feed would need more memory than SessionOptions.memory_limit_bytes."""


class RunTimeoutError(OpwardenError):
    """A run passed SessionOptions.run_timeout_ms (checked between steps and loop iterations)."""


def describe_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
