"""Declared samples (OpDef.samples): the fused operators and custom ops whose inputs the schema
cannot make are checked on them; defects are found; bad samples are named."""

from __future__ import annotations

import dis
import linecache
import sys
import threading

import numpy as np
import pytest

import opwarden
import opwarden.verify
from opwarden import native
from opwarden.cli import check as check_cli
from opwarden.errors import ContractError
from opwarden.kernels.cpu import conv as kconv
from opwarden.kernels.cpu import fused as kfused
from opwarden.ops import REGISTRY
from opwarden.ops.fused import FusedConv, apply_activation, shuffle_channels

from .test_check import _cli

FUSED = ["FusedConv", "FusedGemm", "FusedMatMul", "FusedElementwise", "ChannelShuffle"]
# Checks every variant of the fused ops runs on its samples (none left with nothing to probe).
RUN = {"numerics", "boundary", "nan", "mutation", "alias", "workspace", "concurrency", "shape"}


# The routes of compiled loops without "native" in their name (conv.cpu.grouped, .direct)
COMPILED_ROUTES = {"grouped", "direct"}


def _all_run(report):
    assert report.ok, report.failures
    assert len(report.variants) >= 2
    for v in report.variants:
        tail = v.variant.rsplit(".", 1)[-1]
        if not native.available() and ("native" in tail or tail in COMPILED_ROUTES):
            continue  # (OPWARDEN_NATIVE=0: the compiled variants accept nothing, by design)
        assert {c for c in RUN if v.checks[c] != "pass"} == set(), (v.variant, v.skipped)


# (FusedConv: in test_check_reaches_every_line_of_the_convolution_kernels)
@pytest.mark.parametrize("op_type", [op for op in FUSED if op != "FusedConv"])
def test_fused_ops_are_checked_on_their_samples(op_type):
    _all_run(opwarden.verify.check(f"opwarden::{op_type}", device="cpu"))


@pytest.fixture
def extra_variant():
    """Register a FusedConv variant for one test; removed afterwards."""
    (od,) = REGISTRY.versions("FusedConv", "opwarden")
    before = list(od.variants)

    def add(fn, name, **kw):
        od.kernel(device="cpu", name=name, dtypes=["float32"], priority=-1, **kw)(fn)
        return name

    yield add
    od.variants = before


def test_a_variant_running_branches_over_the_whole_w_is_caught(extra_variant):
    # The defect this mechanism found in the NHWC/NCHW kernels: branches computed as one
    # convolution over W, reading taps outside a branch's part.
    def whole(X, W, B=None, Z=None, *, branches=None, input_shuffle=0, **attrs):
        if input_shuffle > 1:
            X = shuffle_channels(X, input_shuffle, axis=1)
        return kfused.conv_nchw(X, W, B, Z, **attrs)

    name = extra_variant(whole, "fusedconv.test.whole", when=kconv._conv_ok)
    report = opwarden.verify.check(name)
    (v,) = report.variants
    assert v.checks["numerics"] == "fail"
    f = next(f for f in report.failures if f["check"] == "numerics")
    assert "branches" in f["input"]["label"] and "never read" in f["input"]["label"]


def test_a_variant_unsafe_in_place_over_the_residual_is_caught(extra_variant):
    # may_alias (3, 0): Y may be Z's buffer. A kernel that writes Y before reading Z is wrong
    # in place and only in place.
    def early(X, W, B=None, Z=None, *, activation="", activation_params=None, out=None,
              **attrs):
        y = FusedConv(X, W, B, None, **attrs)
        if out is None:
            out = np.empty_like(y)
        out[...] = y
        if Z is not None:
            out += Z  # when out is Z itself, Z is gone: this adds Y to itself
        out[...] = apply_activation(out, activation, activation_params)
        return out

    name = extra_variant(early, "fusedconv.test.early", accepts_out=True)
    report = opwarden.verify.check(name, checks=["numerics", "alias"])
    (v,) = report.variants
    assert v.checks["numerics"] == "pass"
    assert v.checks["alias"] == "fail"
    f = next(f for f in report.failures if f["check"] == "alias")
    assert "in place (out is input 3)" in f["detail"]


def _custom(name: str):
    @opwarden.op(name, domain="test.samples", inputs=["X: T", "W: T"], outputs=["Y: T"],
                 types={"T": ["float32"]}, attrs={"scale": 1.0},
                 contract=opwarden.Contract(nan="propagate", workspace_bytes=0))
    def Proj(X, W, *, scale=1.0):
        """Rows of X times W (X's last axis must be W's first)."""
        if X.shape[-1] != W.shape[0]:
            raise opwarden.KernelError(f"Proj: X {X.shape} and W {W.shape} do not chain")
        return (X @ W) * np.float32(scale)

    return Proj


def test_custom_op_without_samples_has_nothing_to_check_and_with_them_is_checked():
    op = _custom("ProjA")
    before = opwarden.verify.check(op)
    assert before.variants[0].checks["numerics"] == "skip"

    @op.kernel(device="cpu", name="proja.cpu.fast", dtypes=["float32"])
    def fast(X, W, *, scale=1.0):
        y = np.matmul(X, W)
        y *= np.float32(scale)
        return y

    @op.samples
    def _samples(rng):
        yield opwarden.Sample([rng.standard_normal((4, 3), dtype=np.float32),
                               rng.standard_normal((3, 5), dtype=np.float32)], {"scale": 2.0},
                              label="4x3 @ 3x5")

    after = opwarden.verify.check(op)
    assert after.ok, after.failures
    for v in after.variants:
        assert v.checks["numerics"] == "pass" and v.checks["concurrency"] == "pass"


def test_a_sample_the_reference_rejects_fails_the_reference():
    op = _custom("ProjB")

    @op.samples
    def _samples(rng):
        yield opwarden.Sample([np.ones((4, 3), np.float32), np.ones((2, 5), np.float32)],
                              label="does not chain")

    report = opwarden.verify.check(op, checks=["numerics"])
    (f,) = report.failures
    assert "declared sample" in f["detail"] and f["input"]["label"] == "does not chain"


@pytest.mark.parametrize("bad, match", [
    (lambda rng: iter([([np.ones(2)], {})]), "expected an opwarden.Sample"),
    (lambda rng: 1 / 0, "samples function raised ZeroDivisionError"),
])
def test_bad_samples_functions_are_named(bad, match):
    op = _custom(f"ProjC{len(match)}")
    op.samples(bad)
    with pytest.raises(ContractError, match=match):
        opwarden.verify.check(op)


def test_check_cli_loads_the_device_it_is_asked_for():
    assert check_cli.cmd_check(_cli("--device", "no-such-device", "--op", "Relu")) == 2
    pytest.importorskip("torch")
    rc = check_cli.cmd_check(
        _cli("--device", "torch", "--op", "opwarden::ChannelShuffle", "--checks", "numerics")
    )
    assert rc == 0
    assert any(v.device == "torch" for od in REGISTRY.versions("ChannelShuffle", "opwarden")
               for v in od.variants)


def _lines_run(functions, action):
    """{function name: the lines of its body `action()` never ran}, from a line tracer on
    those functions' frames only (threads included)."""
    codes = {f.__code__: f for f in functions}
    hit: set[tuple] = set()

    def local(frame, event, arg):
        if event == "line":
            hit.add((frame.f_code, frame.f_lineno))
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code in codes else None

    sys.settrace(tracer)
    threading.settrace(tracer)
    try:
        action()
    finally:
        sys.settrace(None)
        threading.settrace(None)
    missed = {}
    for code, f in codes.items():
        body = {ln for _, ln in dis.findlinestarts(code) if ln and ln > code.co_firstlineno}
        left = body - {ln for c, ln in hit if c is code}
        if left:
            missed[f.__name__] = {ln: linecache.getline(code.co_filename, ln).strip()
                                  for ln in sorted(left)}
    return missed


def test_check_reaches_every_line_of_the_convolution_kernels(monkeypatch):
    # Conv's and FusedConv's samples are meant to reach every path of the fast kernels, so that
    # `opwarden check` validates them all (the node suite's convolutions are tiny). Winograd
    # and the cached packings also need the weights declared constant (Sample.constants).
    # Where the packed GEMM runs (AVX-512F) the BLAS lines it replaces run in a second pass
    # without it: every line must run in one of the two.
    from opwarden.kernels.cpu import packed_gemm

    kernels = [kconv.conv_nhwc, kconv.conv_nchw, kconv._stem_nhwc, kconv._stem_taps,
               kconv._phase_planes, kconv._rowtap_nhwc, kconv._shifted_nhwc,
               kconv._winograd_nhwc, kconv._few_pixels_nhwc, kconv._depthwise_nhwc,
               kconv._branch_gemms]
    reports = []

    def run():
        reports.extend(opwarden.verify.check(op, device="cpu")
                       for op in ("Conv", "opwarden::FusedConv"))

    missed = _lines_run(kernels, run)
    if packed_gemm.available():
        monkeypatch.setattr(packed_gemm, "available", lambda: False)
        without = _lines_run(kernels, run)
        missed = {f: {ln: t for ln, t in lines.items() if ln in without.get(f, {})}
                  for f, lines in missed.items()}
        missed = {f: lines for f, lines in missed.items() if lines}
    for r in reports:
        _all_run(r)
    assert missed == {}
