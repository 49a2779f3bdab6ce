"""Ray scaling: SqueezeNet (light zoo, seeded weights) on 256 random inputs through
opwarden.ray.predict on a local cluster of 2 CPUs, 1 worker vs 2 workers (1 thread each).

Checks that both runs give one session's outputs in input order, then prints each run's
throughput and the 2-worker/1-worker ratio. Each run is timed after a warm-up run of the same
pipeline, so actor start-up and model loading are not counted.

Run: python benchmarks/ray_scaling.py [--n 256] [--batch-size 8]
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=8)
    args = ap.parse_args()

    import ray

    import opwarden as ow
    import opwarden.ray as owr
    from opwarden import zoo

    model = zoo.build("squeezenet", seed=0).SerializeToString()
    x = np.random.default_rng(0).standard_normal((args.n, 3, 224, 224)).astype(np.float32)
    sess = ow.InferenceSession(model, intra_op_num_threads=1)
    want = np.concatenate([sess.run(None, {"data_0": x[i:i + 1]})[0] for i in range(args.n)])

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        rates = {}
        for workers in (1, 2):
            def run(workers=workers):
                ds = ray.data.from_numpy(x)
                return owr.predict(ds, model, batch_size=args.batch_size, concurrency=workers,
                                   num_cpus_per_worker=1).materialize()

            run()  # warm-up: worker processes, imports
            t0 = time.perf_counter()
            out = run()
            dt = time.perf_counter() - t0
            got = np.concatenate([b["softmaxout_1"] for b in out.iter_batches(batch_size=None)])
            assert got.shape == want.shape, (got.shape, want.shape)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
            rates[workers] = args.n / dt
            print(f"{workers} worker(s): {dt:.2f} s, {rates[workers]:.1f} images/s "
                  "(outputs equal one session's, in input order)")
        print(f"ratio 2 workers / 1 worker: {rates[2] / rates[1]:.2f}x")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
