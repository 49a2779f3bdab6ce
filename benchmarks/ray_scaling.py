"""Ray scaling: SqueezeNet (light zoo, seeded weights) on N random inputs through
opwarden.ray.predict on a local cluster of 2 CPUs, 1 worker vs 2 workers (1 thread each).

Every run checks that the outputs equal one session's, in input order. Rounds alternate 1 and
2 workers in one process. Two throughputs per run:
- end to end: N / the wall time of ``predict(...).materialize()``. Ray Data starts new actors
  for every dataset, so this counts their start-up (process, imports, session) each time;
- steady: N / the span from the first batch's start to the last batch's end on any worker,
  read from the health board (``health()["workers"]``), i.e. with the workers running.
The busy column is the workers' time inside their batches over that span (1.0: never idle).

Run: env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/ray_scaling.py
         [--n 256] [--batch-size 8] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()

    import ray

    import opwarden as ow
    import opwarden.ray as owr
    from opwarden import zoo

    model = zoo.build("squeezenet", seed=0).SerializeToString()
    x = np.random.default_rng(0).standard_normal((args.n, 3, 224, 224)).astype(np.float32)
    sess = ow.InferenceSession(model, intra_op_num_threads=1)
    t0 = time.perf_counter()
    want = np.concatenate([sess.run(None, {"data_0": x[i:i + 1]})[0] for i in range(args.n)])
    print(f"one session, 1 thread, in this process: {args.n / (time.perf_counter() - t0):.1f} "
          "images/s")

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    runs: dict[int, list[tuple[float, float]]] = {1: [], 2: []}
    try:
        owr.predict(ray.data.from_numpy(x[:16]), model, batch_size=args.batch_size,
                    concurrency=1).materialize()  # warm-up: Ray Data's own actors, imports
        for rnd in range(args.rounds):
            for workers in ((1, 2) if rnd % 2 == 0 else (2, 1)):
                owr.reset_health()
                t0 = time.perf_counter()
                out = owr.predict(ray.data.from_numpy(x), model, batch_size=args.batch_size,
                                  concurrency=workers, num_cpus_per_worker=1).materialize()
                wall = time.perf_counter() - t0
                got = np.concatenate([b["softmaxout_1"]
                                      for b in out.iter_batches(batch_size=None)])
                assert got.shape == want.shape, (got.shape, want.shape)
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
                ws = owr.health()["workers"].values()
                span = max(w["last_end"] for w in ws) - min(w["first_start"] for w in ws)
                busy = sum(w["busy_s"] for w in ws) / (span * workers)
                assert sum(w["rows"] for w in ws) == args.n
                runs[workers].append((args.n / wall, args.n / span))
                print(f"round {rnd + 1}, {workers} worker(s): end to end {wall:5.2f} s "
                      f"{args.n / wall:6.1f} images/s; steady {span:5.2f} s "
                      f"{args.n / span:6.1f} images/s, busy {busy:.2f}")
    finally:
        ray.shutdown()
    for i, what in enumerate(("end to end", "steady")):
        r1 = statistics.median(r[i] for r in runs[1])
        r2 = statistics.median(r[i] for r in runs[2])
        print(f"{what:>10}: 1 worker {r1:6.1f}, 2 workers {r2:6.1f} images/s (medians): "
              f"ratio {r2 / r1:.2f}x")


if __name__ == "__main__":
    main()
