"""The fleet's health board as a named Ray actor, and the link a worker reaches it through.

The driver creates the board (`board()`: `predict`, `health` and `opwarden batch --ray` call
it), so it lives as long as the driver's job; workers look it up by name in the job's
namespace. Every call is one small actor call; the board answers them in arrival order, so a
push that reached it is seen by every later pull.
"""

from __future__ import annotations

import warnings
from typing import Any

from opwarden.batch.fleet import HealthBoard
from opwarden.errors import OptionsError

BOARD_NAME = "opwarden-health"
_REMOTE: dict[str, Any] = {}
_HELD: dict[str, tuple[str, Any]] = {}  # name -> (job id, handle) of boards made here


def ray_module() -> Any:
    """The `ray` package, or an OptionsError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise OptionsError('opwarden.ray needs Ray: pip install "opwarden[ray]" (or '
                           '"ray[data]")') from None
    return ray


def _remote_class() -> Any:
    if "board" not in _REMOTE:
        _REMOTE["board"] = ray_module().remote(num_cpus=0)(HealthBoard)
    return _REMOTE["board"]


def board(name: str = BOARD_NAME) -> Any:
    """The handle of the named board, created (owned by the caller) when there is none.

    The handle is kept here: Ray ends an actor that is not detached once no handle to it is
    left, and the board must outlive the run whose health it holds."""
    ray = ray_module()
    held = _HELD.get(name)
    if held is not None and held[0] == ray.get_runtime_context().get_job_id():
        return held[1]
    handle = _remote_class().options(name=name, get_if_exists=True).remote()
    _HELD[name] = (ray.get_runtime_context().get_job_id(), handle)
    return handle


def existing_board(name: str = BOARD_NAME, namespace: str | None = None) -> Any | None:
    """The named board's handle (in `namespace`; None: the caller's job's), or None when no
    one created it (or Ray is not running)."""
    ray = ray_module()
    if not ray.is_initialized():
        return None
    try:
        return ray.get_actor(name, namespace=namespace)
    except ValueError:
        return None


class RayLink:
    """A worker's way to the board (FleetWorker's `link`)."""

    def __init__(self, name: str = BOARD_NAME, namespace: str | None = None) -> None:
        self.ray = ray_module()
        actor = existing_board(name, namespace)
        if actor is None:
            warnings.warn(f"no opwarden health board {name!r} in this job: this worker makes one, "
                          "which lives only as long as the worker; call opwarden.ray.board() in "
                          "the driver first", RuntimeWarning, stacklevel=2)
            actor = board(name)
        self.actor = actor

    def pull(self, worker: str, node: str, version: int) -> tuple[int, dict[str, str]]:
        return self.ray.get(self.actor.pull.remote(worker, node, version))

    def push(self, worker: str, node: str, report: dict[str, Any]) -> None:
        self.ray.get(self.actor.push.remote(worker, node, report))
