"""The validation harness over every built-in operator variant (cheap checks on all of them,
workspace/concurrency/gradient on a sample), so contract regressions show up in CI."""

from __future__ import annotations

import pytest

import opwarden.verify
from opwarden.ops import REGISTRY
from opwarden.ops.schema import STANDARD_DOMAINS

CHEAP = ("numerics", "boundary", "nan", "overflow", "mutation", "alias", "shape")
CHUNKS = 4
SAMPLE = ("Add", "Relu", "Tanh", "Softmax", "MatMul", "Gemm", "Conv", "ReduceSum", "Where")

# (variant, check) -> why: violations found by the harness and reported to the kernels' owners.
# Remove an entry when its bug is fixed (the test then fails if it comes back).
KNOWN_VIOLATIONS: dict[tuple[str, str], str] = {}


def _builtin_ops():
    return [
        o for o in REGISTRY.all() if o.domain in STANDARD_DOMAINS or o.domain == "com.microsoft"
    ]


def _unexpected(report):
    return [
        (v.variant, f["check"], f["detail"][:200])
        for v in report.variants
        for f in v.failures
        if (v.variant, f["check"]) not in KNOWN_VIOLATIONS
    ]


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_cheap_checks_on_every_builtin_variant(chunk):
    ops = _builtin_ops()[chunk::CHUNKS]
    report = opwarden.verify.Report()
    for o in ops:
        # The host's variants: another device's (openvino, torch) register only once that
        # device is first asked for, so which are present would depend on test order; they
        # have their own `check --device` tests.
        r = opwarden.verify.check(o, device="cpu", checks=CHEAP, quick=True, suite_limit=2,
                                  fast_suite=True)
        report.variants.extend(r.variants)
    assert report.variants
    assert not _unexpected(report)
    # every check ran somewhere (a harness that skips everything would pass vacuously)
    summary = report.summary()
    for name in ("numerics", "mutation", "alias", "shape"):
        assert summary[name]["pass"] > 10, (name, summary[name])


def test_expensive_checks_on_a_sample():
    report = opwarden.verify.Report()
    for name in SAMPLE:
        o = REGISTRY.latest(name)
        r = opwarden.verify.check(
            o,
            checks=("workspace", "concurrency", "grad"),
            quick=True,
            suite_limit=2,
            fast_suite=True,
        )
        report.variants.extend(r.variants)
    assert not _unexpected(report)
    summary = report.summary()
    assert summary["concurrency"]["pass"] >= len(SAMPLE)
    assert summary["workspace"]["pass"] >= len(SAMPLE)
