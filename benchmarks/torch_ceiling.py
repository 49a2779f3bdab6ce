"""How fast can torch itself run these CNNs on this machine? The ceiling of any torch provider.

Two CNNs of the light zoo's kinds (SqueezeNet 1.1 and ResNet-50) are written natively in torch
with seeded weights and exported to ONNX, so that every runtime below runs the same graph:

- ``ort``: ONNX Runtime on the exported model (CPU, spinning off, as in our other benches);
- ``torch eager``: the torch module itself, channels-last, under inference mode;
- ``torch inductor``: the same module through ``torch.compile`` with inductor's weight
  freezing (oneDNN convolutions with fused epilogues, generated C++ for the rest; needs a C++
  compiler, skipped with a message when it fails);
- ``opwarden torch,cpu`` and ``opwarden cpu``: our sessions on the exported model.

Runs alternate in one process, each runtime's run right after one of ONNX Runtime's, 2 intra-op
threads each by default; the table gives medians and the ratio to ONNX Runtime (the median of all
its runs). Needs torch and onnxruntime.

    python benchmarks/torch_ceiling.py [--models squeezenet,resnet50] [--runs 21] [--threads 2]
                                       [--no-compile]
"""

from __future__ import annotations

import os

# As in torch_provider.py: NumPy's OpenBLAS stops spinning ~0.4 ms after our last GEMM, so it
# does not steal the cores of the runtime that runs next.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")

import argparse
import io
import statistics
import sys
import time
import warnings


def _squeezenet(torch):
    nn, F = torch.nn, torch.nn.functional

    class Fire(nn.Module):
        def __init__(self, cin, squeeze, expand):
            super().__init__()
            self.squeeze = nn.Conv2d(cin, squeeze, 1)
            self.e1 = nn.Conv2d(squeeze, expand, 1)
            self.e3 = nn.Conv2d(squeeze, expand, 3, padding=1)

        def forward(self, x):
            x = F.relu(self.squeeze(x))
            return torch.cat([F.relu(self.e1(x)), F.relu(self.e3(x))], 1)

    class SqueezeNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 64, 3, 2)
            spec = [(64, 16, 64), (128, 16, 64), (128, 32, 128), (256, 32, 128),
                    (256, 48, 192), (384, 48, 192), (384, 64, 256), (512, 64, 256)]
            self.fires = nn.ModuleList(Fire(*s) for s in spec)
            self.head = nn.Conv2d(512, 1000, 1)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.stem(x)), 3, 2, ceil_mode=True)
            for i, fire in enumerate(self.fires):
                x = fire(x)
                if i in (1, 3):
                    x = F.max_pool2d(x, 3, 2, ceil_mode=True)
            x = F.adaptive_avg_pool2d(F.relu(self.head(x)), 1)
            return torch.softmax(x.flatten(1), 1)

    return SqueezeNet()


def _resnet50(torch):
    nn, F = torch.nn, torch.nn.functional

    def conv_bn(cin, cout, k, stride=1):
        return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, bias=False),
                             nn.BatchNorm2d(cout))

    class Bottleneck(nn.Module):
        def __init__(self, cin, mid, stride):
            super().__init__()
            self.a = conv_bn(cin, mid, 1)
            self.b = conv_bn(mid, mid, 3, stride)
            self.c = conv_bn(mid, 4 * mid, 1)
            self.skip = (conv_bn(cin, 4 * mid, 1, stride)
                         if stride != 1 or cin != 4 * mid else None)

        def forward(self, x):
            y = self.c(F.relu(self.b(F.relu(self.a(x)))))
            return F.relu(y + (x if self.skip is None else self.skip(x)))

    class ResNet50(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = conv_bn(3, 64, 7, 2)
            blocks, cin = [], 64
            for mid, count, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
                for i in range(count):
                    blocks.append(Bottleneck(cin, mid, stride if i == 0 else 1))
                    cin = 4 * mid
            self.blocks = nn.Sequential(*blocks)
            self.fc = nn.Linear(2048, 1000)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.stem(x)), 3, 2, 1)
            x = F.adaptive_avg_pool2d(self.blocks(x), 1).flatten(1)
            return torch.softmax(self.fc(x), 1)

    return ResNet50()


MODELS = {"squeezenet": _squeezenet, "resnet50": _resnet50}


def _module(name: str, torch):
    torch.manual_seed(0)
    m = MODELS[name](torch).eval()
    for mod in m.modules():  # non-trivial batch norms, so that folding them matters
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.1, 0.1)
            mod.running_var.uniform_(0.5, 1.5)
    return m


def bench_model(name: str, runs: int, threads: int, compile_: bool) -> dict:
    """Median ms of each runtime on one model, alternated, and each one's largest difference
    from torch eager's output."""
    import numpy as np
    import torch

    from opwarden.cli import bench

    torch.set_num_threads(threads)
    m = _module(name, torch)
    x = torch.rand(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (x,), buf, dynamo=False, opset_version=13,
                          input_names=["x"], output_names=["y"])
    data = buf.getvalue()
    feeds = {"x": x.numpy()}
    peer = bench.peer_runner("onnxruntime", data, threads)  # (spinning off, as in our benches)
    mc = m.to(memory_format=torch.channels_last)
    xc = x.contiguous(memory_format=torch.channels_last)

    def eager():
        with torch.inference_mode():
            return mc(xc).numpy()

    fns = {"ort": lambda: peer(feeds)[0], "torch eager": eager}
    notes = []
    if compile_:
        try:
            import torch._inductor.config as inductor_config

            inductor_config.freezing = True
            compiled = torch.compile(mc)
            t0 = time.perf_counter()
            with torch.inference_mode():
                compiled(xc)
            notes.append(f"inductor compile {time.perf_counter() - t0:.1f} s")

            def inductor():
                with torch.inference_mode():
                    return compiled(xc).numpy()

            fns["torch inductor"] = inductor
        except Exception as e:  # no C++ compiler, an inductor limit: report, go on
            notes.append(f"inductor skipped: {type(e).__name__}: {str(e).splitlines()[0]}")
    for label, providers in (("opwarden torch,cpu", ["torch", "cpu"]), ("opwarden cpu", ["cpu"])):
        s = bench.ours_session(data, threads, providers)
        fns[label] = lambda s=s: s.run(None, feeds)[0]
    want = eager()
    diffs = {k: float(np.abs(np.asarray(f()) - want).max()) for k, f in fns.items()}
    for _ in range(3):
        for f in fns.values():
            f()
    # Each runtime runs right after an ONNX Runtime run, as in our other benches: what runs
    # before matters (torch's OpenMP workers spinning after a torch run slowed our NumPy path's
    # SqueezeNet from 2.16x to 2.73x ORT when it came next).
    times: dict[str, list[float]] = {k: [] for k in fns}
    others = [k for k in fns if k != "ort"]
    for _ in range(runs):
        for k in others:
            for name in ("ort", k):
                t0 = time.perf_counter()
                fns[name]()
                times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    return {"model": name, "ms": med, "max_abs_diff": diffs, "notes": notes}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile (inductor)")
    args = ap.parse_args(argv)
    try:
        import onnxruntime  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        print(f"needs torch and onnxruntime: {e}", file=sys.stderr)
        return 2
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        print(f"unknown model(s) {unknown}; choose from {', '.join(MODELS)}", file=sys.stderr)
        return 2
    print(f"{args.runs} runs of each after 3 warm-up, each right after an ONNX Runtime run, "
          f"{args.threads} threads each; ratio = runtime / ONNX Runtime")
    for name in names:
        r = bench_model(name, args.runs, args.threads, not args.no_compile)
        ort_ms = r["ms"]["ort"]
        print(f"\n{name}" + (f" ({'; '.join(r['notes'])})" if r["notes"] else ""))
        print(f"  {'runtime':20} {'median ms':>10} {'ratio':>7} {'max |diff|':>11}")
        for k, v in r["ms"].items():
            print(f"  {k:20} {v:10.2f} {v / ort_ms:7.3f} {r['max_abs_diff'][k]:11.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
