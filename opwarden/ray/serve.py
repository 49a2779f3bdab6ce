"""A Ray Serve deployment of a model: requests batched with ``@serve.batch``.

Each request is one row: a dict of input name -> array (a sample, or a whole feed), or over
HTTP a JSON body ``{"inputs": {name: nested lists}}``, cast to the input's declared type.
Requests that arrive within `batch_wait_timeout_s` (up to `max_batch_size`) run as one batch
through a `Predictor` (with its fleet health); each gets its own row of the outputs back.
Needs Ray Serve: ``pip install "ray[serve]"``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opwarden.errors import InputError, OptionsError


def _stack(requests: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    keys = set(requests[0])
    if any(set(r) != keys for r in requests):
        raise InputError(f"requests of one batch name different inputs: "
                         f"{sorted({tuple(sorted(r)) for r in requests})}")
    return {k: np.stack([np.asarray(r[k]) for r in requests]) for k in keys}


def serve_deployment(model: Any, *, max_batch_size: int = 8, batch_wait_timeout_s: float = 0.01,
                     num_replicas: int = 1, ray_actor_options: dict[str, Any] | None = None,
                     name: str = "opwarden", **predictor_kw: Any) -> Any:
    """A bound Serve application: ``serve.run(serve_deployment("model.onnx"))``, then
    ``handle.remote({"x": row})`` or an HTTP POST of ``{"inputs": {...}}``. `predictor_kw` go
    to `Predictor` (setup, providers, SessionOptions keywords, ...)."""
    try:
        from ray import serve
    except ImportError:
        raise OptionsError('serve_deployment needs Ray Serve: pip install "ray[serve]"') \
            from None
    from opwarden.dtypes import np_dtype_of, typestr_to_dtype_name
    from opwarden.ray.predictor import Predictor, model_ref

    if not isinstance(max_batch_size, int) or max_batch_size < 1:
        raise OptionsError(f"max_batch_size must be an int >= 1, got {max_batch_size!r}")
    ref = model_ref(model)
    import ray

    from opwarden.ray.board import board

    board()  # the driver's board; replicas (in Serve's namespace) are told where it is
    predictor_kw.setdefault("board_namespace", ray.get_runtime_context().namespace)

    @serve.deployment(name=name, num_replicas=num_replicas,
                      ray_actor_options=ray_actor_options or {"num_cpus": 1})
    class OpwardenDeployment:
        def __init__(self, ref: Any, kw: dict[str, Any]) -> None:
            self.predictor = Predictor(ref, **kw)
            sess = self.predictor.fleet.session
            self.dtypes = {a.name: typestr_to_dtype_name(a.type) for a in sess.get_inputs()}
            self.np_dtype = np_dtype_of

        @serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=batch_wait_timeout_s)
        async def run(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
            out = self.predictor(_stack(requests))
            return [{k: v[i] for k, v in out.items()} for i in range(len(requests))]

        async def __call__(self, request: Any) -> Any:
            if not hasattr(request, "json"):  # a handle call: a dict of arrays
                return await self.run(request)
            body = await request.json()
            inputs = body.get("inputs") if isinstance(body, dict) else None
            if not isinstance(inputs, dict):
                raise InputError('the request body must be {"inputs": {name: values}}')
            row = {k: np.asarray(v, dtype=self.np_dtype(self.dtypes[k])
                                 if self.dtypes.get(k) else None) for k, v in inputs.items()}
            got = await self.run(row)
            return {"outputs": {k: np.asarray(v).tolist() for k, v in got.items()}}

    return OpwardenDeployment.bind(ref, predictor_kw)
