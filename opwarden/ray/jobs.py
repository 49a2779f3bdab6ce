"""`opwarden batch --ray`: the batch runner's executors as Ray actors.

Without an address a local cluster is started (and stopped at the end); with one, the driver
joins that cluster. The driver reads the inputs and writes the outputs (they need not exist on
the other nodes); each of `workers` actors (a `Predictor`, restarted by Ray when its process
dies, its batch retried) runs the batches it is handed. Two threads per actor keep the next
batch read while one runs.
"""

from __future__ import annotations

import os
from typing import Any

from opwarden.batch.runner import Executor
from opwarden.errors import ModelError, OpwardenError
from opwarden.ray.board import board, ray_module
from opwarden.ray.predictor import Predictor, health, model_ref


class RayJob:
    """A connection to a cluster (started or joined) with the job's actors."""

    def __init__(self, address: str | None) -> None:
        ray = self.ray = ray_module()
        self.started = False
        if not ray.is_initialized():
            if address:
                ray.init(address=address, include_dashboard=False, log_to_driver=False)
            else:
                ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False,
                         log_to_driver=False)
                self.started = True
        board()
        self.actors: list[Any] = []

    def cluster_cpus(self) -> int:
        return int(self.ray.cluster_resources().get("CPU", 1))

    def executors(self, model: Any, workers: int, cpus_each: float,
                  **predictor_kw: Any) -> list[Executor]:
        """`workers` actors ready to run (a model that cannot be built: ModelError)."""
        ray = self.ray
        cls = ray.remote(Predictor).options(num_cpus=cpus_each, max_restarts=-1,
                                            max_task_retries=-1)
        ref = model_ref(model)
        self.actors = [cls.remote(ref, **predictor_kw) for _ in range(workers)]
        try:
            ray.get([a.ready.remote() for a in self.actors])
        except Exception as e:  # noqa: BLE001 - a worker's own error, wrapped by Ray
            cause = getattr(e, "cause", None) or e
            if isinstance(cause, OpwardenError):
                raise cause from None
            raise ModelError(f"the workers could not build the model: {cause}") from None

        def bind(actor: Any) -> Executor:
            return lambda kind, payload: ray.get(actor.run_items.remote(kind, payload))

        return [bind(a) for a in self.actors]

    def health(self) -> dict[str, Any]:
        return health()

    def close(self) -> None:
        for a in self.actors:
            self.ray.kill(a)
        self.actors = []
        if self.started:
            self.ray.shutdown()
