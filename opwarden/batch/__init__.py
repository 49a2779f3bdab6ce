"""Batch inference in one process or across a fleet (`opwarden batch`, `opwarden.ray`).

`rows` runs a batch of rows on a session, `fleet` keeps a worker's guard in step with the
fleet's `HealthBoard`, `files` reads INPUTS and writes outputs, `runner` drives a job over
a thread pool of executors.
"""

from __future__ import annotations

from opwarden.batch.fleet import FleetWorker, HealthBoard, run_setup
from opwarden.batch.rows import RowRunner
from opwarden.batch.runner import BatchResult, local_workers, run_items

__all__ = ["BatchResult", "FleetWorker", "HealthBoard", "RowRunner", "local_workers",
           "run_items", "run_setup"]
