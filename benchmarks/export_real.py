"""Export small, realistic PyTorch models to ONNX and compare opwarden with onnxruntime.

    python benchmarks/export_real.py [--out DIR] [--opsets 9,11,13,17] [--only NAME] [--no-export]

Needs torch (CPU build) for exporting; the comparison needs onnxruntime. Every model is built
with seeded random weights and exported with the TorchScript exporter (``dynamo=False``), which
emits the classic op patterns (Upsample/Resize, LSTM, Loop/If, Gather/ScatterND ...) at the
requested opset. Alongside the models it writes ``recipes.json``: the seeded input recipe of
each model (shapes with the symbolic ``B``/``T`` axes, dtype, value range, batch sizes to try).
tests/test_real_models.py replays these recipes without torch.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "..", "tests", "data", "real")
sys.path.insert(0, os.path.join(HERE, ".."))  # run from a checkout without installing


# ----------------------------------------------------------------------------- input recipes


def make_inputs(recipe: dict, batch: int, seq: int | None = None, seed: int = 0,
                extra: int | None = None) -> dict:
    """Draw the feeds of one recipe for a given batch (and sequence) size, deterministically.

    Symbolic dims: ``B`` is the batch, ``T`` the sequence length, ``S`` a second free size.
    """
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in recipe["inputs"]:
        shape = []
        for d in spec["shape"]:
            if d == "B":
                shape.append(batch)
            elif d == "T":
                shape.append(seq if seq is not None else recipe.get("seq", 8))
            elif d == "S":
                shape.append(extra)
            else:
                shape.append(int(d))
        kind = spec.get("kind", "normal")
        dtype = np.dtype(spec["dtype"])
        if kind == "normal":
            x = rng.standard_normal(shape).astype(dtype) * spec.get("scale", 1.0)
        elif kind == "int":
            x = rng.integers(spec["low"], spec["high"], size=shape).astype(dtype)
        elif kind == "bool":
            x = rng.random(shape) < spec.get("p", 0.3)
            if spec.get("keep_first", False):
                x[..., 0] = False  # never mask every key of a row
        elif kind == "uniform":
            x = rng.uniform(spec["low"], spec["high"], size=shape).astype(dtype)
        else:
            raise ValueError(kind)
        feeds[spec["name"]] = np.asarray(x, dtype=dtype)
    return feeds


def tolerance(recipe: dict) -> float:
    """Relative tolerance: 1e-3, or 1e-2 for quantized variants (a one-ulp float difference
    before a QuantizeLinear can flip a rounding tie into a whole quantization step)."""
    return 1e-2 if recipe["model"].endswith(("_qdq", "_qop", "_qdyn")) else 1e-3


def compare(model_bytes: bytes, recipe: dict) -> tuple[bool, float, str]:
    """Run opwarden and onnxruntime on each recipe size; return (ok, worst rel error, note)."""
    import onnxruntime as ort

    import opwarden

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])
    ours = opwarden.InferenceSession(model_bytes)
    worst = 0.0
    for i, size in enumerate(recipe["sizes"]):
        b, t = size[0], size[1]
        feeds = make_inputs(recipe, b, t, seed=i, extra=size[2] if len(size) > 2 else None)
        want = ref.run(None, feeds)
        got = ours.run(None, feeds)
        if len(got) != len(want):
            return False, float("inf"), f"{len(got)} outputs, want {len(want)}"
        for k, (g, w) in enumerate(zip(got, want)):
            g = np.asarray(g)
            if g.shape != w.shape or g.dtype != w.dtype:
                return False, float("inf"), f"out{k} {g.dtype}{g.shape} vs {w.dtype}{w.shape}"
            if w.dtype.kind in "iub":
                if not np.array_equal(g, w):
                    return False, float("inf"), f"out{k} integer mismatch (b={b}, t={t})"
                continue
            if w.size == 0:
                continue
            scale = float(np.max(np.abs(w)))
            err = float(np.max(np.abs(g.astype(np.float64) - w.astype(np.float64))))
            if not np.isfinite(err) and np.array_equal(np.isnan(g), np.isnan(w)):
                err = 0.0
            worst = max(worst, err / (scale + 1e-2))
            if not err <= tolerance(recipe) * scale + 1e-5:
                return False, err, f"out{k} max err {err:.3g} (scale {scale:.3g}, b={b}, t={t})"
    return True, worst, ""


# ----------------------------------------------------------------------------- models


def build_models():
    """Return [(name, module, example_args, recipe, opsets, dynamic_axes, script)]."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    specs = []

    # 1. Transformer encoder with padding and causal masks -------------------------------
    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(50, 32)
            self.pos = nn.Parameter(torch.randn(1, 64, 32) * 0.1)
            layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
            self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.cls = nn.Linear(32, 5)

        def forward(self, tokens, pad_mask):
            t = tokens.shape[1]
            x = self.emb(tokens) + self.pos[:, :t]
            r = torch.arange(t)
            causal = torch.zeros(t, t).masked_fill(r.unsqueeze(0) > r.unsqueeze(1), float("-inf"))
            y = self.enc(x, mask=causal, src_key_padding_mask=pad_mask)
            return self.cls(y).softmax(-1)

    specs.append(
        (
            "transformer_encoder",
            Encoder(),
            (torch.randint(0, 50, (2, 8)), torch.zeros(2, 8, dtype=torch.bool)),
            {
                "inputs": [
                    {
                        "name": "tokens",
                        "shape": ["B", "T"],
                        "dtype": "int64",
                        "kind": "int",
                        "low": 0,
                        "high": 50,
                    },
                    {
                        "name": "pad_mask",
                        "shape": ["B", "T"],
                        "dtype": "bool",
                        "kind": "bool",
                        "p": 0.25,
                        "keep_first": True,
                    },
                ],
                "sizes": [[1, 8], [3, 8]],
            },
            [14, 17, 20],
            {"tokens": {0: "B"}, "pad_mask": {0: "B"}},
            False,
        )
    )

    # 2. GPT-like decoder block -----------------------------------------------------------
    class Block(nn.Module):
        def __init__(self, d=32, h=4):
            super().__init__()
            self.h = h
            self.ln1 = nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
            self.ln2 = nn.LayerNorm(d)
            self.fc1 = nn.Linear(d, 4 * d)
            self.fc2 = nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
            q = q.view(b, t, self.h, d // self.h).transpose(1, 2)
            k = k.view(b, t, self.h, d // self.h).transpose(1, 2)
            v = v.view(b, t, self.h, d // self.h).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) / (d // self.h) ** 0.5
            r = torch.arange(t)
            mask = (r.unsqueeze(0) <= r.unsqueeze(1)).view(1, 1, t, t).to(torch.int64)
            att = att.masked_fill(mask == 0, float("-inf")).softmax(-1)
            y = (att @ v).transpose(1, 2).contiguous().view(b, t, d)
            x = x + self.proj(y)
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(64, 32)
            self.wpe = nn.Embedding(32, 32)
            self.blocks = nn.ModuleList([Block(), Block()])
            self.lnf = nn.LayerNorm(32)
            self.head = nn.Linear(32, 64, bias=False)

        def forward(self, ids):
            pos = torch.arange(ids.shape[1], dtype=torch.long).unsqueeze(0)
            x = self.wte(ids) + self.wpe(pos)
            for blk in self.blocks:
                x = blk(x)
            logits = self.head(self.lnf(x))
            # exact GELU path as well (Erf)
            return logits, F.gelu(logits[:, -1]).argmax(-1)

    specs.append(
        (
            "gpt_decoder",
            GPT(),
            (torch.randint(0, 64, (2, 8)),),
            {
                "inputs": [
                    {
                        "name": "ids",
                        "shape": ["B", "T"],
                        "dtype": "int64",
                        "kind": "int",
                        "low": 0,
                        "high": 64,
                    }
                ],
                "sizes": [[1, 5], [4, 12]],
            },
            [9, 11, 13, 17],
            {"ids": {0: "B", 1: "T"}},
            False,
        )
    )

    # 3. BiLSTM + GRU tagger --------------------------------------------------------------
    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(40, 16)
            self.lstm = nn.LSTM(16, 24, num_layers=2, bidirectional=True, batch_first=True)
            self.gru = nn.GRU(48, 16, batch_first=True, bidirectional=True)
            self.out = nn.Linear(32, 7)

        def forward(self, ids):
            x, _ = self.lstm(self.emb(ids))
            x, h = self.gru(x)
            return self.out(x).log_softmax(-1), h

    specs.append(
        (
            "bilstm_tagger",
            Tagger(),
            (torch.randint(0, 40, (2, 9)),),
            {
                "inputs": [
                    {
                        "name": "ids",
                        "shape": ["B", "T"],
                        "dtype": "int64",
                        "kind": "int",
                        "low": 0,
                        "high": 40,
                    }
                ],
                "sizes": [[1, 6], [3, 10]],
            },
            [9, 11, 13, 17],
            {"ids": {0: "B", 1: "T"}},
            False,
        )
    )

    # 4. CRNN OCR ---------------------------------------------------------------------------
    class CRNN(nn.Module):
        def __init__(self, ncls=20):
            super().__init__()

            def cbr(i, o):
                return [nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(inplace=True)]

            self.cnn = nn.Sequential(
                *cbr(1, 16),
                nn.MaxPool2d(2, 2),
                *cbr(16, 32),
                nn.MaxPool2d(2, 2),
                *cbr(32, 48),
                nn.MaxPool2d((2, 1), (2, 1)),
                *cbr(48, 48),
                nn.MaxPool2d((2, 1), (2, 1), (0, 0)),
            )
            self.rnn = nn.LSTM(48 * 2, 32, bidirectional=True)
            self.fc = nn.Linear(64, ncls)

        def forward(self, img):
            f = self.cnn(img)  # N, C, 2, W/4
            n, c, h, w = f.shape
            f = f.reshape(n, c * h, w).permute(2, 0, 1)  # W, N, C*H
            y, _ = self.rnn(f)
            return F.log_softmax(self.fc(y), dim=2)

    specs.append(
        (
            "crnn_ocr",
            CRNN(),
            (torch.randn(2, 1, 32, 64),),
            {
                "inputs": [{"name": "img", "shape": ["B", 1, 32, 64], "dtype": "float32"}],
                "sizes": [[1, None], [3, None]],
            },
            [9, 11, 13, 17],
            {"img": {0: "B"}},
            False,
        )
    )

    # 5. U-Net-like segmenter ----------------------------------------------------------------
    class UNet(nn.Module):
        def __init__(self):
            super().__init__()

            def block(i, o):
                return nn.Sequential(
                    nn.Conv2d(i, o, 3, padding=1, bias=False),
                    nn.BatchNorm2d(o),
                    nn.ReLU(),
                    nn.Conv2d(o, o, 3, padding=1),
                    nn.BatchNorm2d(o),
                    nn.ReLU(),
                )

            self.e1, self.e2, self.e3 = block(3, 8), block(8, 16), block(16, 32)
            self.pool = nn.MaxPool2d(2)
            self.up3 = nn.ConvTranspose2d(32, 16, 2, stride=2)
            self.d2 = block(32, 16)
            self.d1 = block(16 + 8, 8)
            self.head = nn.Conv2d(8, 4, 1)
            self.aux = nn.Conv2d(32, 4, 1)
            self.corners = True  # Upsample-9 cannot express align_corners: off below opset 11

        def forward(self, x):
            e1 = self.e1(x)
            e2 = self.e2(self.pool(e1))
            e3 = self.e3(self.pool(e2))
            d2 = self.d2(torch.cat([self.up3(e3), e2], 1))
            up = F.interpolate(d2, scale_factor=2.0, mode="nearest")
            d1 = self.d1(torch.cat([up, e1], 1))
            aux = F.interpolate(
                self.aux(e3), size=x.shape[2:], mode="bilinear", align_corners=False
            )
            aux2 = F.interpolate(
                self.aux(e3), scale_factor=4.0, mode="bilinear", align_corners=self.corners
            )
            return self.head(d1).softmax(1), aux, aux2

    specs.append(
        (
            "unet_seg",
            UNet(),
            (torch.randn(2, 3, 32, 32),),
            {
                "inputs": [{"name": "image", "shape": ["B", 3, 32, 32], "dtype": "float32"}],
                "sizes": [[1, None], [2, None]],
            },
            [9, 11, 13, 17],
            {"image": {0: "B"}},
            False,
        )
    )

    # 6. Detection head with box decode + top-k ---------------------------------------------
    class Detector(nn.Module):
        def __init__(self, na=3, nc=4, k=20):
            super().__init__()
            self.na, self.nc, self.k = na, nc, k
            self.backbone = nn.Sequential(
                nn.Conv2d(3, 16, 3, 2, 1),
                nn.BatchNorm2d(16),
                nn.SiLU(),
                nn.Conv2d(16, 32, 3, 2, 1),
                nn.BatchNorm2d(32),
                nn.LeakyReLU(0.1),
                nn.Conv2d(32, 32, 3, 2, 1),
                nn.BatchNorm2d(32),
                nn.SiLU(),
            )
            self.head = nn.Conv2d(32, na * (5 + nc), 1)
            self.register_buffer("anchors", torch.tensor([[10.0, 13], [16, 30], [33, 23]]))

        def forward(self, img):
            p = self.head(self.backbone(img))
            b, _, h, w = p.shape
            p = p.view(b, self.na, 5 + self.nc, h, w).permute(0, 1, 3, 4, 2)
            gy, gx = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
            grid = torch.stack((gx, gy), 2).view(1, 1, h, w, 2).float()
            s = p.sigmoid()
            xy = (s[..., :2] * 2 - 0.5 + grid) * 8.0
            wh = torch.exp(p[..., 2:4]).clamp(max=50.0) * self.anchors.view(1, self.na, 1, 1, 2)
            boxes = torch.cat([xy - wh / 2, xy + wh / 2], -1).view(b, -1, 4)
            obj = s[..., 4:5]
            cls_score, cls_id = (s[..., 5:] * obj).max(-1)
            cls_score = cls_score.view(b, -1)
            cls_id = cls_id.view(b, -1)
            top, idx = cls_score.topk(self.k, dim=1)
            sel = boxes.gather(1, idx.unsqueeze(-1).expand(-1, -1, 4))
            sel_cls = cls_id.gather(1, idx)
            keep = (top > 0.3).to(torch.int64).sum(1)
            return sel, top, sel_cls, keep

    specs.append(
        (
            "detector_head",
            Detector(),
            (torch.randn(2, 3, 64, 64),),
            {
                "inputs": [{"name": "image", "shape": ["B", 3, 64, 64], "dtype": "float32"}],
                "sizes": [[1, None], [2, None]],
            },
            [11, 13, 17],
            {"image": {0: "B"}},
            False,
        )
    )

    # 7. Audio: STFT-by-conv + GroupNorm + GLU ---------------------------------------------
    class Audio(nn.Module):
        def __init__(self, nfft=64, hop=16, ncls=6):
            super().__init__()
            n = torch.arange(nfft).float()
            k = torch.arange(nfft // 2 + 1).float().unsqueeze(1)
            win = torch.hann_window(nfft)
            self.register_buffer("cosk", (torch.cos(2 * torch.pi * k * n / nfft) * win)[:, None])
            self.register_buffer("sink", (-torch.sin(2 * torch.pi * k * n / nfft) * win)[:, None])
            self.hop = hop
            f = nfft // 2 + 1
            self.pre = nn.Conv1d(1, 1, 5, padding=2)
            self.c1 = nn.Conv1d(f, 64, 3, padding=1)
            self.gn = nn.GroupNorm(4, 64)
            self.c2 = nn.Conv1d(32, 48, 3, padding=2, dilation=2)
            self.inorm = nn.InstanceNorm1d(48, affine=True)
            self.prelu = nn.PReLU(48)
            self.fc = nn.Linear(48, ncls)

        def forward(self, wav):
            x = self.pre(wav.unsqueeze(1))
            x = F.pad(x, (32, 32), mode="reflect")
            re = F.conv1d(x, self.cosk, stride=self.hop)
            im = F.conv1d(x, self.sink, stride=self.hop)
            mag = torch.log(torch.sqrt(re * re + im * im) + 1e-5)
            y = F.glu(self.gn(self.c1(mag)), dim=1)
            y = self.prelu(self.inorm(self.c2(y)))
            pooled = F.adaptive_avg_pool1d(y, 1).squeeze(-1)
            return self.fc(pooled), mag.mean(dim=(1, 2), keepdim=False)

    specs.append(
        (
            "audio_stft",
            Audio(),
            (torch.randn(2, 800),),
            {
                "inputs": [{"name": "wav", "shape": ["B", 800], "dtype": "float32"}],
                "sizes": [[1, None], [3, None]],
            },
            [9, 11, 13, 17, 18],
            {"wav": {0: "B"}},
            False,
        )
    )

    # 8. MobileNet-like with SE + hardswish ------------------------------------------------
    class SE(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.fc1 = nn.Conv2d(c, c // 4, 1)
            self.fc2 = nn.Conv2d(c // 4, c, 1)

        def forward(self, x):
            s = F.adaptive_avg_pool2d(x, 1)
            return x * F.hardsigmoid(self.fc2(F.relu(self.fc1(s))))

    class IR(nn.Module):
        def __init__(self, i, o, s, e=4):
            super().__init__()
            m = i * e
            self.res = s == 1 and i == o
            self.body = nn.Sequential(
                nn.Conv2d(i, m, 1, bias=False),
                nn.BatchNorm2d(m),
                nn.Hardswish(),
                nn.Conv2d(m, m, 3, s, 1, groups=m, bias=False),
                nn.BatchNorm2d(m),
                nn.ReLU6(),
                SE(m),
                nn.Conv2d(m, o, 1, bias=False),
                nn.BatchNorm2d(o),
            )

        def forward(self, x):
            y = self.body(x)
            return x + y if self.res else y

    class MobileNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.Hardswish())
            self.blocks = nn.Sequential(IR(16, 16, 1), IR(16, 24, 2), IR(24, 24, 1), IR(24, 32, 2))
            self.head = nn.Sequential(
                nn.Flatten(), nn.Linear(32, 64), nn.Hardswish(), nn.Dropout(0.2), nn.Linear(64, 10)
            )

        def forward(self, x):
            x = self.blocks(self.stem(x))
            x = F.avg_pool2d(x, 2, ceil_mode=True, count_include_pad=False)
            x = F.adaptive_avg_pool2d(x, (1, 1))
            return self.head(x)

    specs.append(
        (
            "mobilenet_se",
            MobileNet(),
            (torch.randn(2, 3, 48, 48),),
            {
                "inputs": [{"name": "image", "shape": ["B", 3, 48, 48], "dtype": "float32"}],
                "sizes": [[1, None], [4, None]],
            },
            [7, 9, 11, 13, 17, 20],
            {"image": {0: "B"}},
            False,
        )
    )

    # 9. Control flow: scripted loop + if ---------------------------------------------------
    class Cell(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x, n: int):
            h = torch.zeros_like(x)
            for i in range(n):
                h = torch.tanh(self.lin(x + h)) + float(i) * 0.01
            if bool(h.sum() > 0):
                h = h * 2.0
            else:
                h = h - 1.0
            return h

    class Controlled(nn.Module):
        def __init__(self):
            super().__init__()
            self.cell = torch.jit.script(Cell())

        def forward(self, x, steps):
            n = int(steps.item()) if not torch.jit.is_scripting() else int(steps)
            return self.cell(x, n)

    class ScriptedWrap(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x, steps):
            h = torch.zeros_like(x)
            acc = []
            i = 0
            while i < int(steps):
                h = torch.tanh(self.lin(x + h))
                acc.append(h.sum(-1))
                i += 1
            if bool(h.mean() > 0):
                out = h * 2.0
            else:
                out = h - 1.0
            return out, torch.stack(acc, 0)

    del Controlled  # kept simple: the scripted wrapper below exports Loop + If directly
    specs.append(
        (
            "control_flow",
            torch.jit.script(ScriptedWrap()),
            (torch.randn(2, 8), torch.tensor(3)),
            {
                "inputs": [
                    {"name": "x", "shape": ["B", 8], "dtype": "float32"},
                    {
                        "name": "steps",
                        "shape": [],
                        "dtype": "int64",
                        "kind": "int",
                        "low": 1,
                        "high": 6,
                    },
                ],
                "sizes": [[1, None], [3, None]],
            },
            [11, 13, 17],
            {"x": {0: "B"}},
            True,
        )
    )

    # 10. Integer index ops -----------------------------------------------------------------
    class IndexOps(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = nn.Parameter(torch.randn(30, 8))
            self.proj = nn.Linear(8, 4)

        def forward(self, ids, vals):
            b, t = ids.shape
            emb = self.table[ids]  # Gather
            w = (ids > 3).to(torch.float32)
            bag = (emb * w.unsqueeze(-1)).sum(1) / w.sum(1, keepdim=True).clamp(min=1.0)
            pos = torch.cumsum((ids != 0).to(torch.int64), dim=1)
            hist = torch.zeros(b, 30, dtype=torch.float32).scatter_add(1, ids, vals)
            onehot = F.one_hot(ids % 5, 5)
            sel = torch.where(vals > 0, vals, torch.zeros_like(vals) - 1.0)
            big = vals.unsqueeze(1).expand(b, 3, t)
            out = big.clone()
            out[:, 1] = sel
            lp = pos[:, -1:] - 1
            last = ids.gather(1, lp * (lp > 0).to(torch.int64))  # int Clip is opset 12+
            am = vals.argmax(1)
            srt, order = torch.sort(vals, dim=1, descending=True)
            return (
                self.proj(bag),
                pos,
                hist,
                onehot,
                out,
                last,
                am,
                srt,
                order,
                torch.flip(ids, [1]),
            )

    specs.append(
        (
            "index_ops",
            IndexOps(),
            (torch.randint(0, 30, (2, 7)), torch.randn(2, 7)),
            {
                "inputs": [
                    {
                        "name": "ids",
                        "shape": ["B", "T"],
                        "dtype": "int64",
                        "kind": "int",
                        "low": 0,
                        "high": 30,
                    },
                    {"name": "vals", "shape": ["B", "T"], "dtype": "float32"},
                ],
                "sizes": [[1, 7], [4, 7]],
            },
            [11, 13, 17],
            {"ids": {0: "B"}, "vals": {0: "B"}},
            False,
        )
    )

    # 11. Vision-transformer-ish: patch conv, LayerNorm, SDPA, Einsum, var/std -----------------
    class ViT(nn.Module):
        def __init__(self):
            super().__init__()
            self.patch = nn.Conv2d(3, 32, 8, 8)
            self.cls = nn.Parameter(torch.randn(1, 1, 32))
            self.ln = nn.LayerNorm(32, eps=1e-6)
            self.qkv = nn.Linear(32, 96)
            self.mix = nn.Parameter(torch.randn(4, 4) * 0.3)
            self.out = nn.Linear(32, 10)

        def forward(self, x):
            p = self.patch(x).flatten(2).transpose(1, 2)
            b = p.shape[0]
            h = torch.cat([self.cls.expand(b, -1, -1), p], 1)
            q, k, v = self.qkv(self.ln(h)).chunk(3, -1)
            q, k, v = (t.reshape(b, -1, 4, 8).transpose(1, 2) for t in (q, k, v))
            a = F.scaled_dot_product_attention(q, k, v)
            a = torch.einsum("bhtd,hg->bgtd", a, self.mix)
            a = a.transpose(1, 2).reshape(b, -1, 32)
            z = h + a
            z = (z - z.mean(-1, keepdim=True)) / torch.sqrt(z.var(-1, keepdim=True) + 1e-5)
            return self.out(z[:, 0]), z.std(1), F.normalize(z[:, 1:].mean(1), dim=-1)

    specs.append(
        (
            "vit_tiny",
            ViT(),
            (torch.randn(2, 3, 32, 32),),
            {
                "inputs": [{"name": "image", "shape": ["B", 3, 32, 32], "dtype": "float32"}],
                "sizes": [[1, None], [3, None]],
            },
            [14, 17, 20],
            {"image": {0: "B"}},
            False,
        )
    )

    # 12. Spatial transformer + pixel shuffle + pads (OCR rectification style) -------------
    class STN(nn.Module):
        def __init__(self):
            super().__init__()
            self.loc = nn.Sequential(nn.Conv2d(1, 8, 3, 2, 1), nn.ReLU(), nn.AdaptiveMaxPool2d(4),
                                     nn.Flatten(), nn.Linear(128, 6))
            nn.init.zeros_(self.loc[-1].weight)
            with torch.no_grad():
                self.loc[-1].bias.copy_(torch.tensor([0.9, 0.1, 0.05, -0.1, 0.8, 0.02]))
            self.conv = nn.Conv2d(1, 16, 3, padding=1, padding_mode="replicate")
            self.ps = nn.PixelShuffle(2)
            self.up = nn.ConvTranspose2d(4, 4, 3, stride=2, padding=1, output_padding=1,
                                         groups=2, dilation=1)

        def forward(self, x):
            theta = self.loc(x).view(-1, 2, 3)
            n, c, h, w = x.shape
            ys = torch.linspace(-1.0, 1.0, h)
            xs = torch.linspace(-1.0, 1.0, w)
            gy, gx = torch.meshgrid(ys, xs, indexing="ij")
            base = torch.stack([gx, gy, torch.ones_like(gx)], -1).view(1, h * w, 3)
            grid = torch.bmm(base.expand(n, -1, -1), theta.transpose(1, 2)).view(n, h, w, 2)
            r1 = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros",
                               align_corners=False)
            r2 = F.grid_sample(x, grid, mode="nearest", padding_mode="border", align_corners=True)
            y = self.ps(self.conv(r1))  # N, 4, 2H, 2W
            y = F.pad(y, (1, 2, 0, 1), mode="constant", value=0.5)
            y = F.pad(y, (2, 2, 1, 1), mode="reflect")
            z = self.up(y)
            m, mi = F.max_pool2d(z, 3, 2, 1, return_indices=True)
            return z, r2, m, F.lp_pool2d(z.abs() + 0.1, 2, 2)

    specs.append(
        (
            "stn_pixelshuffle",
            STN(),
            (torch.randn(2, 1, 16, 24),),
            {
                "inputs": [{"name": "img", "shape": ["B", 1, 16, 24], "dtype": "float32"}],
                "sizes": [[1, None], [3, None]],
            },
            [16, 17, 20],
            {"img": {0: "B"}},
            False,
        )
    )

    # 13. torch.stft front end (STFT op at opset 17) -----------------------------------------
    class Spectro(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("win", torch.hann_window(64))
            self.register_buffer("mel", torch.rand(33, 12))
            self.conv = nn.Conv2d(1, 4, 3, padding=1)

        def forward(self, wav):
            spec = torch.stft(wav, 64, hop_length=16, win_length=64, window=self.win,
                              center=False, return_complex=False, onesided=True)
            power = spec.pow(2).sum(-1)  # N, F, frames
            mel = torch.matmul(power.transpose(1, 2), self.mel)
            logmel = torch.log10(torch.clamp(mel, min=1e-6))
            y = self.conv(logmel.unsqueeze(1))
            return y.amax(dim=(2, 3)), logmel.mean(1), logmel.std(1)

    specs.append(
        (
            "stft_spectrogram",
            Spectro(),
            (torch.randn(2, 512),),
            {
                "inputs": [{"name": "wav", "shape": ["B", 512], "dtype": "float32"}],
                "sizes": [[1, None], [2, None]],
            },
            [17, 18, 20],
            {"wav": {0: "B"}},
            False,
        )
    )

    # 14. Dynamic-shape / data-dependent ops -------------------------------------------------
    class DataDep(nn.Module):
        def forward(self, x, ids):
            pos = x[x > 0.5]  # NonZero + GatherND: data-dependent length
            nz = torch.nonzero(ids % 3 == 0)
            q = torch.div(ids, 4, rounding_mode="floor") - torch.remainder(ids - 7, 5)
            t = torch.div(ids - 9, 4, rounding_mode="trunc")
            y = x.clone()
            y[x < -1.0] = 0.0  # index_put with bool mask -> Where
            k = min(4, x.shape[1])
            top = torch.topk(x, k, dim=1, largest=False, sorted=True)[0]
            acc = torch.zeros(x.shape[0], 6).index_add(1, ids[0] % 6, x)
            red = torch.zeros(x.shape[0], 6).scatter_reduce(1, ids % 6, x, reduce="amax")
            rng = torch.arange(0, x.shape[1], 2).to(torch.float32)
            uniq = torch.unique(ids % 7, sorted=True)
            return (pos.sum().reshape(1), nz, q, t, y, top, acc, red, rng, uniq,
                    (ids > 3) & ~(ids > 30), x.round(), torch.sign(x) * x.abs().sqrt())

    specs.append(
        (
            "data_dependent",
            DataDep(),
            (torch.randn(2, 9), torch.randint(0, 40, (2, 9))),
            {
                "inputs": [
                    {"name": "x", "shape": ["B", 9], "dtype": "float32"},
                    {"name": "ids", "shape": ["B", 9], "dtype": "int64", "kind": "int",
                     "low": 0, "high": 40},
                ],
                "sizes": [[1, None], [4, None]],
            },
            [16, 17, 18],
            {"x": {0: "B"}, "ids": {0: "B"}},
            False,
        )
    )

    # 15. U-Net variant with dynamic H, W (Resize sizes computed at run time) -------------
    class DynSeg(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv2d(3, 8, 3, padding=1)
            self.c2 = nn.Conv2d(8, 8, 3, stride=2, padding=1)
            self.c3 = nn.Conv2d(8, 8, 3, stride=2, padding=1, dilation=1)
            self.out = nn.Conv2d(16, 2, 1)
            self.opset = 11

        def forward(self, x):
            a = F.relu(self.c1(x))
            b = F.relu(self.c2(a))
            c = F.relu(self.c3(b))
            c_up = F.interpolate(c, size=a.shape[2:], mode="bilinear", align_corners=False)
            b_up = F.interpolate(b, size=(a.shape[2], a.shape[3]), mode="nearest")
            y = self.out(torch.cat([c_up, b_up], 1))
            # Upsample-9 cannot shrink: the 0.5 rescale only from opset 11 (Resize)
            small = F.interpolate(y, scale_factor=0.5, mode="bilinear") if self.opset >= 11 else y
            return torch.sigmoid(y), small

    specs.append(
        (
            "dynamic_seg",
            DynSeg(),
            (torch.randn(1, 3, 20, 28),),
            {
                "inputs": [{"name": "image", "shape": ["B", 3, "T", "S"], "dtype": "float32"}],
                "sizes": [[1, 20, 28], [2, 17, 30]],
            },
            [9, 11, 13, 17],
            {"image": {0: "B", 2: "H", 3: "W"}},
            False,
        )
    )

    # 16. LSTM over padded batches (pack_padded_sequence) -------------------------------------
    class Packed(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(6, 10, batch_first=True, bidirectional=True)
            self.rnn = nn.RNN(20, 8, nonlinearity="tanh", batch_first=True)

        def forward(self, x, lengths):
            packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True,
                                                       enforce_sorted=False)
            out, (h, c) = self.lstm(packed)
            out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True,
                                                      total_length=x.shape[1])
            y, hr = self.rnn(out)
            return out, h, c, y, hr

    specs.append(
        (
            "packed_lstm",
            Packed(),
            (torch.randn(3, 7, 6), torch.tensor([7, 4, 5])),
            {
                "inputs": [
                    {"name": "x", "shape": ["B", 7, 6], "dtype": "float32"},
                    {"name": "lengths", "shape": ["B"], "dtype": "int64", "kind": "int",
                     "low": 1, "high": 8},
                ],
                "sizes": [[3, None], [5, None]],
            },
            [11, 13, 17],
            {"x": {0: "B"}, "lengths": {0: "B"}},
            False,
        )
    )
    return specs


def export_one(module, args, opset, names, dynamic_axes, script):
    import torch

    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            args,
            buf,
            dynamo=False,
            opset_version=opset,
            input_names=names,
            dynamic_axes=dynamic_axes,
            do_constant_folding=True,
        )
    return buf.getvalue()


QUANT_SOURCES = ["mobilenet_se_op13", "unet_seg_op13", "gpt_decoder_op13", "bilstm_tagger_op13",
                 "crnn_ocr_op13", "audio_stft_op13"]


def quantize_variants(out: str, recipes: dict) -> None:
    """Write onnxruntime-quantized variants: dynamic (MatMulInteger/ConvInteger), static QDQ and
    static QOperator (QLinearConv/QLinearMatMul...), as deployment pipelines produce them."""
    import tempfile

    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self, recipe):
            self.items = iter([make_inputs(recipe, recipe["sizes"][0][0], recipe["sizes"][0][1],
                                           seed=100 + i,
                                           extra=(recipe["sizes"][0] + [None])[2])
                               for i in range(4)])

        def get_next(self):
            return next(self.items, None)

    for stem in QUANT_SOURCES:
        src = os.path.join(out, stem + ".onnx")
        if stem + ".onnx" not in recipes or not os.path.exists(src):
            continue
        recipe = recipes[stem + ".onnx"]
        with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pre = os.path.join(tmp, "pre.onnx")
            try:
                quant_pre_process(src, pre, skip_symbolic_shape=True)
            except Exception:
                pre = src
            jobs = {
                "qdyn": lambda dst, pre=pre: quantize_dynamic(pre, dst,
                                                              weight_type=QuantType.QInt8),
                "qdq": lambda dst, pre=pre, rc=recipe: quantize_static(
                    pre, dst, Reader(rc), quant_format=QuantFormat.QDQ),
                "qop": lambda dst, pre=pre, rc=recipe: quantize_static(
                    pre, dst, Reader(rc), quant_format=QuantFormat.QOperator),
            }
            for tag, job in jobs.items():
                fname = f"{stem}_{tag}.onnx"
                try:
                    job(os.path.join(out, fname))
                except Exception as e:
                    print(f"quantize {fname}: {type(e).__name__}: {e}"[:200], file=sys.stderr)
                    continue
                recipes[fname] = dict(recipe, model=f"{recipe['model']}_{tag}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--only", default=None, help="comma-separated model names")
    p.add_argument("--no-export", action="store_true", help="compare the saved models only")
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    rpath = os.path.join(a.out, "recipes.json")
    recipes = json.load(open(rpath)) if os.path.exists(rpath) else {}
    only = set(a.only.split(",")) if a.only else None

    rows = []
    if not a.no_export:
        import torch

        torch.manual_seed(0)
        for name, module, args, recipe, opsets, dyn, script in build_models():
            if only and name not in only:
                continue
            module.eval()
            torch.manual_seed(0)
            names = [s["name"] for s in recipe["inputs"]]
            for opset in opsets:
                if hasattr(module, "corners"):
                    module.corners = opset >= 11
                if hasattr(module, "opset"):
                    module.opset = opset
                fname = f"{name}_op{opset}.onnx"
                try:
                    data = export_one(module, args, opset, names, dyn, script)
                except Exception as e:  # exporter limitation: record and go on
                    rows.append(
                        (
                            name,
                            opset,
                            "EXPORT-FAIL",
                            float("nan"),
                            f"{type(e).__name__}: {str(e).splitlines()[0][:80]}",
                        )
                    )
                    continue
                with open(os.path.join(a.out, fname), "wb") as f:
                    f.write(data)
                recipes[fname] = dict(recipe, model=name, opset=opset)
        if not only:
            quantize_variants(a.out, recipes)
        with open(rpath, "w") as f:
            json.dump(recipes, f, indent=1, sort_keys=True)

    for fname, recipe in sorted(recipes.items()):
        if only and recipe["model"] not in only:
            continue
        path = os.path.join(a.out, fname)
        data = open(path, "rb").read()
        try:
            ok, err, note = compare(data, recipe)
            status = "pass" if ok else "FAIL"
        except Exception as e:
            ok, err, status = False, float("nan"), "ERROR"
            note = f"{type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"
        rows.append((recipe["model"], recipe["opset"], status, err, note))

    print(f"{'model':22} {'opset':>5}  {'result':11} {'rel err':>9}  note")
    for name, opset, status, err, note in sorted(rows, key=lambda r: (r[0], r[1])):
        print(f"{name:22} {opset:>5}  {status:11} {err:9.2e}  {note}")
    bad = [r for r in rows if r[2] not in ("pass", "EXPORT-FAIL")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
