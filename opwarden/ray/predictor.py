"""`Predictor` (a callable class for ``ds.map_batches``) and `predict`, its one-line form.

Each worker (a Ray actor) runs `setup`, builds one session with `intra_op_num_threads` set to
the CPUs Ray gave it, and runs every batch between a pull from and a push to the fleet's
health board (`opwarden.batch.fleet`), so a variant one worker quarantines is skipped by all
from their next batch on. `predict` repartitions the dataset into blocks of `batch_size` rows
(one task each, spread over the actors) and keeps the output in input order.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping
from typing import Any

from opwarden.batch.fleet import FleetWorker, worker_options
from opwarden.errors import InputError, OptionsError
from opwarden.ray.board import BOARD_NAME, RayLink, board, existing_board, ray_module


class ModelRef:
    """A model's bytes in Ray's object store, handed to every worker (a path need not exist on
    the other nodes)."""

    def __init__(self, ref: Any) -> None:
        self.ref = ref


def model_ref(model: Any) -> ModelRef:
    """Put a model (path, bytes or onnx.ModelProto) into the object store once."""
    ray = ray_module()
    if isinstance(model, ModelRef):
        return model
    if hasattr(model, "SerializeToString"):
        data = model.SerializeToString()
    elif isinstance(model, (bytes, bytearray, memoryview)):
        data = bytes(model)
    elif isinstance(model, (str, os.PathLike)):
        try:
            with open(model, "rb") as f:
                data = f.read()
        except OSError as e:
            raise InputError(f"model {str(model)!r} cannot be read: {e.strerror or e}") from None
    else:
        raise InputError(f"model must be a path, bytes or an onnx.ModelProto, got "
                         f"{type(model).__name__}")
    return ModelRef(ray.put(data))


def _assigned_cpus(ray: Any) -> int | None:
    try:
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
    except Exception:  # noqa: BLE001 - outside a worker: no assignment
        return None
    return max(1, round(cpus)) if cpus else None


class Predictor:
    """``ds.map_batches(Predictor, fn_constructor_kwargs={"model": ...}, ...)``: batches are
    dicts of NumPy arrays in, the model's outputs as columns out (`opwarden.batch.rows`:
    rows are samples or whole feeds; other columns pass through).

    `setup` ("module:function", a module path, or a callable) runs in each worker before its
    session is made, to register custom ops and kernels. `guarded` (default) keeps the worker
    on the guarded loop (the `shape` and `dtype` output checks), which counts calls per variant
    and catches a kernel that fails only once; `board` names the fleet's health board (None:
    no fleet; looked up in `board_namespace`, by default the job's own: a Serve replica runs
    in Serve's namespace and is given the driver's). Other keywords are SessionOptions.
    """

    def __init__(self, model: Any, *, providers: Any = None, sess_options: Any = None,
                 setup: Any = None, output_names: Any = None, guarded: bool = True,
                 board: str | None = BOARD_NAME, board_namespace: str | None = None,
                 **session_kw: Any) -> None:
        ray = ray_module()
        if isinstance(model, ModelRef):
            model = ray.get(model.ref)
        ctx = ray.get_runtime_context()
        actor = ctx.get_actor_id() if ray.is_initialized() else None
        self.worker = f"{(actor or 'driver')[:8]}:{os.getpid()}"
        self.node = ray.util.get_node_ip_address() if ray.is_initialized() else ""
        link = RayLink(board, board_namespace) if board else None
        self.fleet = FleetWorker(model, providers=providers, sess_options=sess_options,
                                 setup=setup, output_names=output_names, link=link,
                                 worker=self.worker, node=self.node,
                                 threads=_assigned_cpus(ray), guarded=guarded, **session_kw)

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        return self.fleet.run_batch(batch)

    def run_items(self, kind: str, payload: list[dict[str, Any]]) -> list[tuple[bool, Any]]:
        """`opwarden batch --ray`'s call (FleetWorker.run_items)."""
        return self.fleet.run_items(kind, payload)

    def ready(self) -> str:
        """The worker's name, once its session is built."""
        return self.worker


def _ordered(ds: Any) -> Any:
    """A copy of `ds` with a context of its own that keeps blocks in input order (the user's
    dataset and what else derives from it keep their own setting)."""
    try:
        ds = type(ds).copy(ds, _deep_copy=True)
    except TypeError:  # a Ray without the private flag: set it on the shared context
        pass
    ds.context.execution_options.preserve_order = True
    return ds


class _Cut:
    """Passes batches through unchanged: each becomes a block of its own (see _in_batches)."""

    def __call__(self, batch: Any) -> Any:
        return batch


def _in_batches(ds: Any, batch_size: int, concurrency: int, ray_data: Any) -> Any:
    """`ds` in blocks of `batch_size` rows: Ray Data hands an actor one block per task, so a
    dataset of one big block (``from_numpy``) would reach one worker only.

    Ray's own cut (``repartition(target_num_rows_per_block=...)``) runs tasks of one CPU each,
    which never start while the actors hold every CPU (a 2-CPU cluster with 2 workers waits
    forever). The same logical operator with zero CPUs, at most `concurrency` tasks in flight
    (each zero-CPU task in flight takes a worker process), is built here through Ray Data's
    internal API; where that API differs, one zero-CPU actor cuts the batches instead, each
    emitted as a block of its own (slower: Ray splits its output into one block per row)."""
    try:
        from ray.data._internal.logical.interfaces import LogicalPlan
        from ray.data._internal.logical.operators import StreamingRepartition

        op = StreamingRepartition(target_num_rows_per_block=batch_size,
                                  input_dependencies=[ds._logical_plan.dag],
                                  ray_remote_args={"num_cpus": 0},
                                  compute=ray_data.TaskPoolStrategy(size=concurrency))
        # Ray warns when a dataset has fewer blocks than that limit (from_numpy: one block);
        # the limit is an upper bound here, not a wish.
        warnings.filterwarnings("ignore", category=UserWarning,
                                message="The maximum number of concurrent tasks for "
                                        "'StreamingRepartition")
        return type(ds)._from_parent(ds, LogicalPlan(op, ds.context))
    except (ImportError, AttributeError, TypeError):
        pass
    ds.context.target_max_block_size = 1
    return ds.map_batches(_Cut, batch_size=batch_size, batch_format="pyarrow",
                          zero_copy_batch=True, num_cpus=0,
                          compute=ray_data.ActorPoolStrategy(size=1))


def predict(ds: Any, model: Any, *, batch_size: int = 32, concurrency: int = 1,
            num_cpus_per_worker: float = 1, providers: Any = None, sess_options: Any = None,
            setup: Any = None, output_names: Any = None, guarded: bool = True,
            **session_kw: Any) -> Any:
    """``ds`` with the model's outputs as columns, in input order (a lazy ray.data.Dataset).

    `concurrency` actors of `num_cpus_per_worker` CPUs each run `Predictor`; each session
    uses that many intra-op threads. The driver owns the fleet's health board (`health()`).
    """
    ray_module()
    try:
        import ray.data as ray_data
    except ImportError:
        raise OptionsError('predict needs Ray Data: pip install "ray[data]"') from None

    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise OptionsError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
        raise OptionsError(f"concurrency must be an int >= 1, got {concurrency!r}")
    worker_options(sess_options, None, guarded, session_kw)  # bad options fail here, once
    board()
    kwargs = {"model": model_ref(model), "providers": providers, "sess_options": sess_options,
              "setup": setup, "output_names": output_names, "guarded": guarded, **session_kw}
    ds = _in_batches(_ordered(ds), batch_size, concurrency, ray_data)
    return ds.map_batches(Predictor, fn_constructor_kwargs=kwargs, batch_size=batch_size,
                          batch_format="numpy", zero_copy_batch=True,
                          compute=ray_data.ActorPoolStrategy(size=concurrency),
                          num_cpus=num_cpus_per_worker)


def health(name: str = BOARD_NAME) -> dict[str, Any]:
    """The fleet's merged health: workers (node, batches, rows, busy_s, and first_start and
    last_end of their batches), variants (counters, and per worker), faults (each with its
    worker and cluster_node), quarantine (reason, the worker and node that found it, when, and
    when each worker adopted it)."""
    actor = existing_board(name)
    if actor is None:
        return {"workers": {}, "variants": {}, "faults": [], "faults_dropped": 0,
                "quarantine": {}}
    return ray_module().get(actor.health.remote())


def reset_health(name: str = BOARD_NAME) -> None:
    """Clear the board: counters, faults, quarantine (later workers start afresh), traces."""
    actor = existing_board(name)
    if actor is not None:
        ray_module().get(actor.reset.remote())


def write_trace(path: str, name: str = BOARD_NAME) -> str:
    """The workers' op records (sessions with trace=True) as one Chrome trace: one process
    row per worker. Returns the path."""
    actor = existing_board(name)
    events = [] if actor is None else ray_module().get(actor.trace_events.remote())
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f, default=str)
    return path
