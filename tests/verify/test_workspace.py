"""Workspace is part of a variant's contract: the scratch a kernel takes (including the
thread-local scratch buffers of kernels.util, which persist between calls) is measured by
`opwarden check` against the variant's own declaration (Variant.workspace_bytes) or the
contract's, and the fast convolution's declaration covers every path it takes."""

from __future__ import annotations

import ast
import inspect
import textwrap
import threading
import tracemalloc

import numpy as np
import pytest

import opwarden
import opwarden.verify
from opwarden import native
from opwarden.kernels.cpu import conv as C
from opwarden.kernels.cpu.util import release_scratch, scratch, scratch_held, scratch_probe
from opwarden.memory.constants import mark as mark_constant
from opwarden.ops import REGISTRY

DOMAIN = "test.workspace"
_SAFE = dict(thread_safe=True, nan="propagate", mutates=(), overflow=None, workspace_bytes=0)


def _floats():
    return dict(domain=DOMAIN, inputs=["X: T"], outputs=["Y: T"], types={"T": ["float32"]},
                contract=opwarden.Contract(**_SAFE))


def _scaled(X):
    # Four copies of X in a thread-local scratch buffer: 16 bytes per float32 element.
    buf = scratch("test.workspace.buf", (4,) + X.shape)
    buf[:] = X
    return buf.sum(axis=0)


@opwarden.op("HiddenScratch", **_floats())
def HiddenScratch(X):
    return X * 4


@HiddenScratch.kernel(device="cpu", name="hiddenscratch.cpu.fast", priority=10)
def _hidden(X):
    return _scaled(X)


@opwarden.op("DeclaredScratch", **_floats())
def DeclaredScratch(X):
    return X * 4


@DeclaredScratch.kernel(device="cpu", name="declaredscratch.cpu.fast", priority=10,
                        workspace_bytes=lambda x, **_: 16 * int(np.prod(x)))
def _declared(X):
    return _scaled(X)


def test_undeclared_scratch_fails_even_when_the_pool_already_holds_it():
    # The buffer is grown before the check: a measurement without a fresh pool sees nothing.
    _hidden(np.ones((1 << 16,), np.float32))
    report = opwarden.verify.check(f"{DOMAIN}::HiddenScratch", checks=["workspace"])
    assert report["hiddenscratch.ref"].checks["workspace"] == "pass"
    (f,) = report.failures
    assert f["variant"] == "hiddenscratch.cpu.fast" and f["check"] == "workspace"
    assert "test.workspace.buf" in f["detail"] and "workspace_bytes=0" in f["detail"]


def test_a_variant_declares_its_own_workspace():
    report = opwarden.verify.check(f"{DOMAIN}::DeclaredScratch", checks=["workspace"])
    assert report.ok, report.failures
    (op,) = REGISTRY.versions("DeclaredScratch", DOMAIN)
    fast = next(v for v in op.variants if v.name == "declaredscratch.cpu.fast")
    ref = next(v for v in op.variants if v.reference)
    assert fast.workspace([(10, 3)], {}) == 480
    assert ref.workspace([(10, 3)], {}) == 0  # the contract's
    assert fast.describe()["workspace_bytes"] == "f(shapes)"
    assert ref.describe()["workspace_bytes"] == "contract"


def test_scratch_probe_sees_a_fresh_pool_and_gives_the_thread_its_own_back():
    release_scratch()
    mine = scratch("test.workspace.keep", (1000,))
    held = scratch_held()
    assert held >= 4000
    with scratch_probe() as got:
        assert scratch_held() == 0
        scratch("test.workspace.keep", (10,))
        scratch("test.workspace.other", (2, 50))
        scratch("test.workspace.other", (300,))  # grown: the larger size is what it holds
    assert got == {"test.workspace.keep": 40, "test.workspace.other": 1200}
    assert scratch_held() == held
    assert scratch("test.workspace.keep", (1000,)).ctypes.data == mine.ctypes.data

    other = {}

    def run():
        other["held"] = scratch_held()

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert other["held"] == 0  # pools are per thread
    release_scratch()


# ---------------------------------------------------------------------------------------------
# The NHWC convolution: each path's measured scratch lies within nhwc_workspace's declaration,
# and the declaration is not a blanket over-estimate.

RNG = np.random.default_rng(0)


def _case(n, h, w, c, m, k, *, stride=1, pad=None, group=1, residual=False, constant=False,
          bias=True, activation=""):
    x = RNG.standard_normal((n, h, w, c)).astype(np.float32)
    wt = (RNG.standard_normal((m, c // group, k, k)) * 0.1).astype(np.float32)
    b = RNG.standard_normal(m).astype(np.float32) if bias else None
    if constant:
        mark_constant(wt)
        if b is not None:
            mark_constant(b)
    p = k // 2 if pad is None else pad
    attrs = dict(pads=[p] * 4, strides=[stride] * 2, group=group)
    if activation:
        attrs.update(activation=activation, activation_params=())
    oh = (h + 2 * p - k) // stride + 1
    ow = (w + 2 * p - k) // stride + 1
    z = RNG.standard_normal((n, oh, ow, m)).astype(np.float32) if residual else None
    return x, wt, b, z, attrs


# Weights computed at run time (packed on every call, as the declaration assumes), except
# Winograd's, which only runs on declared constants.
CASES = {
    "depthwise": dict(n=1, h=28, w=28, c=64, m=64, k=3, group=64),
    "pointwise": dict(n=1, h=28, w=28, c=64, m=96, k=1, residual=True),
    "pointwise few pixels": dict(n=1, h=7, w=7, c=256, m=512, k=1),
    # 32 channels per group: past conv_grouped.GROUPED_PW_MAX_CG, one GEMM per group
    "pointwise grouped": dict(n=1, h=14, w=14, c=64, m=64, k=1, group=2, residual=True),
    "grouped": dict(n=1, h=28, w=28, c=64, m=64, k=3, group=16, residual=True),
    "winograd": dict(n=1, h=30, w=30, c=64, m=512, k=3, residual=True, constant=True),
    "winograd declined": dict(n=1, h=30, w=30, c=64, m=512, k=3),
    "shifted": dict(n=1, h=56, w=56, c=64, m=64, k=3, residual=True),
    "rowtap": dict(n=1, h=28, w=28, c=32, m=128, k=3, activation="Sigmoid"),
    # M not a multiple of 8: the NumPy stem (the direct loop takes the others)
    "stem": dict(n=1, h=112, w=112, c=3, m=60, k=7, stride=2, pad=3),
    "stem direct": dict(n=1, h=64, w=64, c=3, m=36, k=3, stride=2),
    "direct": dict(n=1, h=112, w=112, c=3, m=64, k=7, stride=2, pad=3),
    "few pixels": dict(n=1, h=14, w=14, c=256, m=512, k=3, stride=2),
    "patch": dict(n=2, h=20, w=20, c=16, m=24, k=5, stride=2, group=2),
}


def _measure(fn):
    """(tracemalloc peak of fn's allocations, fresh-pool scratch) for one call."""
    fn()  # packing of constant weights, cached with them: weight memory, not workspace
    tracemalloc.start()
    try:
        with scratch_probe() as pool:
            base = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            y = fn()
            peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    return peak - y.nbytes, pool


@pytest.mark.parametrize("label", sorted(CASES))
def test_nhwc_convolution_scratch_is_within_its_declaration(label):
    if label in ("grouped", "direct") and not native.available():
        pytest.skip(f"the grouped route needs the compiled kernels: {native.status()}")
    spec = dict(CASES[label])
    x, w, b, z, attrs = _case(**spec)
    route = label.split()[0].replace("few", "few_pixels")
    s, d, begin, end, (oh, ow) = C.geometry(x.shape[1:3], w.shape[2:], attrs["strides"], None,
                                            attrs["pads"], "NOTSET")
    routes = C._routes_nhwc(x.shape, w.shape, attrs["group"], s, d, begin, end, oh, ow, False)
    assert routes[0] == route or (route == "winograd" and routes[0] == "winograd"), routes

    def run():
        out = np.empty((x.shape[0], oh, ow, w.shape[0]), np.float32)
        return C.conv_nhwc(x, w, b, z, out=out, **attrs)

    want = C.conv_nhwc(x, w, b, z, **attrs)
    used, pool = _measure(run)
    np.testing.assert_allclose(run(), want, rtol=1e-4, atol=1e-4)
    declared = C.nhwc_workspace(x.shape, w.shape, None if b is None else b.shape,
                                None if z is None else z.shape, **attrs)
    # Python objects, cache entries and NumPy's ufunc buffers (8192 elements an operand) for
    # strided operands: the check's allowance for non-reference variants.
    allowance = opwarden.verify.harness.TEMP_FIXED[False]
    assert used <= declared + allowance, (label, used, declared, pool)
    # Tight enough to mean something: at most 4x what the path took, plus the allowance.
    assert declared <= 4 * max(used, 0) + (1 << 18), (label, used, declared, pool)


def test_every_nhwc_route_is_covered_here():
    # The routes are the string constants _routes_nhwc returns ("empty" has no scratch).
    tree = ast.parse(textwrap.dedent(inspect.getsource(C._routes_nhwc)))
    body = [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    routes = {n.value for n in body if n.value.isidentifier()} - {"empty"}
    assert {k.split()[0].replace("few", "few_pixels") for k in CASES} == routes


def test_the_planner_and_the_trace_use_the_variants_declaration():
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    wt = (RNG.standard_normal((8, 3, 3, 3)) * 0.1).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "g", [x], [y],
        [onnx.numpy_helper.from_array(wt, "w")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    sess = opwarden.InferenceSession(model.SerializeToString(),
                                     opwarden.SessionOptions(trace=True))
    sess.run(None, {"x": RNG.standard_normal((1, 3, 32, 32)).astype(np.float32)})
    (rec,) = [r for r in sess.trace if r.op_type == "Conv"]
    (op,) = [o for o in REGISTRY.versions("Conv") if o.since <= 17][-1:]
    var = next(v for v in op.variants if v.name == rec.variant)
    shapes = [tuple(s) for s in rec.input_shapes]
    assert rec.workspace_bytes == var.workspace(shapes, {"pads": [1, 1, 1, 1]}) > 0


def test_an_omitted_optional_input_counts_as_absent():
    # The planner and the guard pass () for an omitted input, the check too.
    attrs = dict(pads=[1, 1, 1, 1])
    for rule, x in ((C.nhwc_workspace, (1, 56, 56, 64)), (C.nchw_workspace, (1, 64, 56, 56))):
        assert rule(x, (64, 64, 3, 3), (), (), **attrs) == rule(x, (64, 64, 3, 3), **attrs)
        assert rule(x, (64, 64, 3, 3), (64,), (1, 56, 56, 64), **attrs) > rule(
            x, (64, 64, 3, 3), (), (), **attrs)
