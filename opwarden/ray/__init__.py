"""Scale out on Ray (the extra ``opwarden[ray]``, which brings ``ray[data]``).

- `Predictor`: a callable class for ``ds.map_batches``; `predict(ds, model, ...)` the one-line
  form; `serve_deployment(model, ...)` a Ray Serve deployment batching requests.
- Fleet health: a named actor (`board`) merges every worker's fault records, per-variant
  counters and quarantine decisions; a variant one worker quarantines is skipped by the others
  from their next batch on. `health()` returns it, `write_trace(path)` the workers' traces as
  one Chrome trace, `reset_health()` clears it.

Ray itself is imported only when one of these is used, so ``import opwarden.ray`` works
without it (and says how to install it on first use).
"""

from __future__ import annotations

from opwarden.ray.board import BOARD_NAME, board
from opwarden.ray.predictor import Predictor, health, predict, reset_health, write_trace
from opwarden.ray.serve import serve_deployment

__all__ = ["BOARD_NAME", "Predictor", "board", "health", "predict", "reset_health",
           "serve_deployment", "write_trace"]
