"""What several `opwarden` subcommands share: the model a command runs and the console.

A model argument is a path, a light-zoo name (``resnet50``; ``opwarden plan``) or nothing, for
the embedded default (the light ResNet-50 with seeded weights). Feeds are in feeds.py.
"""

from __future__ import annotations

from typing import Any


def console():
    """A rich Console on stdout."""
    from rich.console import Console

    return Console()


def load_default() -> tuple[bytes, str]:
    """The embedded default model's bytes and label."""
    from opwarden import zoo

    return zoo.build("resnet50", seed=0).SerializeToString(), "light ResNet-50 (seeded weights)"


def model_source(arg: str | None) -> tuple[Any, str]:
    """A model path, a light-zoo name (e.g. "resnet50"), or the embedded default."""
    import os

    from opwarden import zoo

    if not arg:
        return load_default()
    if not os.path.exists(arg) and arg in zoo.LIGHT_MODELS:
        return zoo.build(arg, seed=0).SerializeToString(), f"light {arg} (seeded weights)"
    return arg, arg
