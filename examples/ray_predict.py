"""Batch inference on Ray Data and a Ray Serve deployment, with the fleet's health.

Run: python examples/ray_predict.py          (needs: pip install "opwarden[ray]")
     python examples/ray_predict.py --serve  (also needs: pip install "ray[serve]")
"""

from __future__ import annotations

import sys

import numpy as np
import ray

import opwarden.ray as owr
from opwarden import zoo


def batch() -> None:
    model = zoo.build("squeezenet", seed=0).SerializeToString()
    images = np.random.default_rng(0).standard_normal((32, 3, 224, 224)).astype(np.float32)
    ds = ray.data.from_items([{"data_0": img, "id": i} for i, img in enumerate(images)])
    # 2 workers of 1 CPU each; each worker's session uses 1 intra-op thread
    out = owr.predict(ds, model, batch_size=8, concurrency=2, num_cpus_per_worker=1)
    rows = out.take_all()
    print("top-1 of the first 4:", [int(np.argmax(r["softmaxout_1"])) for r in rows[:4]])
    h = owr.health()
    for name, w in h["workers"].items():
        print(f"worker {name} on {w['node']}: {w['rows']} images in {w['batches']} batches")
    print("faults:", len(h["faults"]), "quarantined:", sorted(h["quarantine"]))


def serve() -> None:
    from ray import serve as ray_serve

    model = zoo.build("squeezenet", seed=0).SerializeToString()
    handle = ray_serve.run(owr.serve_deployment(model, max_batch_size=8))
    image = np.random.default_rng(1).standard_normal((3, 224, 224)).astype(np.float32)
    # concurrent requests are batched by @serve.batch into one run of the model
    futures = [handle.remote({"data_0": image}) for _ in range(8)]
    print("served top-1:", {int(np.argmax(f.result()["softmaxout_1"])) for f in futures})
    print("replica batches:", [w["batches"] for w in owr.health()["workers"].values()])
    ray_serve.shutdown()


if __name__ == "__main__":
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        serve() if "--serve" in sys.argv else batch()
    finally:
        ray.shutdown()
