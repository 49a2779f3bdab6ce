"""Fast kernel variants. Importing this package registers them on the built-in operators."""

from __future__ import annotations
