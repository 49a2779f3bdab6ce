"""The light CNN zoo: the nine models shipped in `onnx`'s test data, made meaningful.

The files under ``onnx/backend/test/data/light`` keep only weight *shapes* (each weight is a
ConstantOfShape of 0.02). Here every such weight becomes a seeded random initializer: He-scaled
for convolution and fully connected weights, small for biases, near 1 for scales; and each
BatchNormalization's mean/variance is set to the real per-channel statistics of its input on a
seeded random image, so activations stay O(1) all the way to the classifier.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import numpy_helper

LIGHT_MODELS = (
    "bvlc_alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "vgg19",
    "zfnet512",
)


def light_dir() -> str:
    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")


def light_path(name: str) -> str:
    path = os.path.join(light_dir(), f"light_{name}.onnx")
    if not os.path.exists(path):
        raise FileNotFoundError(f"light model {name!r} is not in the installed onnx package")
    return path


def _consumers(graph: onnx.GraphProto) -> dict[str, list[tuple[onnx.NodeProto, int]]]:
    uses: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for n in graph.node:
        for i, x in enumerate(n.input):
            uses.setdefault(x, []).append((n, i))
    return uses


def _role(name: str, uses, depth: int = 0) -> tuple[str, int, dict]:
    """(consumer op, input index, attrs) of a weight, looking through Unsqueeze/Reshape."""
    for node, idx in uses.get(name, []):
        if node.op_type in ("Unsqueeze", "Reshape", "Identity") and depth < 3:
            return _role(node.output[0], uses, depth + 1)
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        return node.op_type, idx, attrs
    return "", -1, {}


def _init_weight(shape: tuple[int, ...], role: tuple[str, int, dict], rng) -> np.ndarray:
    op, idx, attrs = role
    if op == "Conv" and idx == 1 or op in ("Gemm", "MatMul") and idx == 1:
        if op == "Gemm" and not attrs.get("transB", 0):
            fan_in = shape[0]
        elif op == "MatMul":
            fan_in = shape[0]
        else:
            fan_in = int(np.prod(shape[1:]))
        std = np.float32(np.sqrt(2.0 / max(fan_in, 1)))
        return rng.standard_normal(shape, dtype=np.float32) * std
    if op == "BatchNormalization" and idx == 1 or op == "Mul":
        return rng.uniform(0.8, 1.2, shape).astype(np.float32)
    if op == "BatchNormalization" and idx == 4:
        return np.ones(shape)
    if op == "BatchNormalization" and idx == 3:
        return np.zeros(shape)
    return rng.uniform(-0.1, 0.1, shape).astype(np.float32)


def randomize(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """Replace ConstantOfShape weights by seeded random initializers; calibrate BatchNorm stats."""
    rng = np.random.default_rng(seed)
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    uses = _consumers(g)
    keep, new_inits = [], []
    for n in g.node:
        if n.op_type == "ConstantOfShape" and n.input[0] in inits:
            shape = tuple(int(d) for d in numpy_helper.to_array(inits[n.input[0]]))
            w = _init_weight(shape, _role(n.output[0], uses), rng).astype(np.float32)
            new_inits.append(numpy_helper.from_array(w, n.output[0]))
        else:
            keep.append(n)
    del g.node[:]
    g.node.extend(keep)
    used = {x for n in keep for x in n.input}
    dead = {t.name for t in g.initializer if t.name not in used}
    survivors = [t for t in g.initializer if t.name not in dead]
    del g.initializer[:]
    g.initializer.extend(survivors + new_inits)
    inputs = [i for i in g.input if i.name not in dead]
    del g.input[:]
    g.input.extend(inputs)
    _calibrate_batchnorm(m, rng)
    return m


def feeds_for(model: onnx.ModelProto, seed: int = 1, batch: int = 1) -> dict[str, np.ndarray]:
    """Seeded random feeds for the model's real (non-initializer) inputs."""
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        dims = [d.dim_value if d.dim_value > 0 else batch for d in vi.type.tensor_type.shape.dim]
        if dims:
            dims[0] = batch
        feeds[vi.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


def _calibrate_batchnorm(m: onnx.ModelProto, rng) -> None:
    """Set each BN's mean/var to its input's per-channel statistics, in topological order."""
    from opwarden.ir.load import load
    from opwarden.ir.validate import validate
    from opwarden.ops.select import kernel_kwargs

    ir = load(m)
    validate(ir)
    bns = [n for n in ir.graph.nodes if n.op_type == "BatchNormalization"]
    if not bns:
        return
    env: dict[str, np.ndarray] = {v.name: v.const for v in ir.graph.initializers.values()}
    env.update(feeds_for(m, seed=int(rng.integers(1 << 30))))
    updates: dict[str, np.ndarray] = {}
    for node in ir.graph.nodes:
        args = [env[v.name] if v is not None else None for v in node.inputs]
        if node.op_type == "BatchNormalization":
            x = args[0]
            axes = (0,) + tuple(range(2, x.ndim))
            mean = x.mean(axis=axes).astype(np.float32)
            var = x.var(axis=axes).astype(np.float32)
            args[3], args[4] = mean, var
            updates[node.inputs[3].name] = mean
            updates[node.inputs[4].name] = var
        res = node.opdef.reference(*args, **kernel_kwargs(node))
        res = res if isinstance(res, tuple) else (res,)
        for v, r in zip(node.outputs, res):
            if v is not None:
                env[v.name] = r
    for t in m.graph.initializer:
        if t.name in updates:
            t.CopyFrom(numpy_helper.from_array(updates[t.name], t.name))


def build(name: str, seed: int = 0) -> onnx.ModelProto:
    """The named light model with seeded random, calibrated weights."""
    return randomize(onnx.load(light_path(name)), seed=seed)


def build_all(out_dir: str, seed: int = 0) -> list[str]:
    """Write every zoo model to `out_dir` (returns the paths)."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for name in LIGHT_MODELS:
        path = os.path.join(out_dir, f"{name}.onnx")
        onnx.save(build(name, seed), path)
        paths.append(path)
    return paths
