"""The validation harness on custom operators: each deliberate defect is flagged by its check."""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import pytest
from onnx import TensorProto, helper

import opwarden
import opwarden.verify
from opwarden.cli import check as check_cli
from opwarden.contract import TensorFact
from opwarden.ir.export import model_proto
from opwarden.ir.load import load
from opwarden.ops import REGISTRY
from tests.verify import defects

DEFECTS_FILE = os.path.join(os.path.dirname(__file__), "defects.py")


def _cli(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    check_cli.add_parser(sub)
    return parser.parse_args(["check", *argv])


def test_correct_custom_op_passes_every_check():
    report = opwarden.verify.check(defects.GoodScaledTanh)
    assert report.ok, report.failures
    assert [v.variant for v in report.variants] == ["goodscaledtanh.ref", "goodscaledtanh.cpu.fast"]
    for v in report.variants:
        assert set(v.checks) == set(opwarden.verify.CHECKS)
        # overflow is the only check with nothing to probe (no integer types)
        assert {c for c, s in v.checks.items() if s != "pass"} <= {"overflow", "grad"}
        assert v.checks["concurrency"] == "pass" and v.checks["nan"] == "pass"


@pytest.mark.parametrize("name,check", sorted(defects.DEFECTS.items()))
def test_defect_is_flagged_by_its_check(name, check):
    report = opwarden.verify.check(f"{defects.DOMAIN}::{name}")
    assert not report.ok
    failed = {f["check"] for f in report.failures}
    assert check in failed, report.failures
    f = next(f for f in report.failures if f["check"] == check)
    assert f["detail"] and f["input"]["shapes"]


def test_smallest_failing_input_is_reported():
    report = opwarden.verify.check(f"{defects.DOMAIN}::Mutator", checks=["mutation"])
    (f,) = report.failures
    # the smallest input that shows the mutation is a single element
    assert f["input"]["shapes"] == [[1]] and "mutates=()" in f["detail"]


def test_wrong_variant_fails_numerics_not_its_reference():
    report = opwarden.verify.check(defects.OffByOne)
    assert report["offbyone.ref"].ok
    v = report["offbyone.cpu.sloppy"]
    assert v.checks["numerics"] == "fail" and "max abs error 0.01" in v.failures[0]["detail"]


def test_overflow_detail_names_wrap_vs_saturate():
    report = opwarden.verify.check(defects.WrapAdd, checks=["overflow"])
    (f,) = report.failures
    assert "saturate" in f["detail"] and "wraps" in f["detail"]


@pytest.mark.parametrize("name,check", sorted(defects.DEFECTS.items()))
def test_cli_flags_each_defect(name, check, capsys):
    rc = check_cli.cmd_check(_cli("--import", DEFECTS_FILE, "--op", name, "--json"))
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and out["ok"] is False
    assert any(f["check"] == check for v in out["variants"] for f in v["failures"])
    for v in out["variants"]:
        assert {"op", "domain", "variant", "checks", "failures"} <= set(v)
        assert set(v["checks"].values()) <= {"pass", "fail", "skip"}


def test_cli_passes_correct_op(capsys):
    rc = check_cli.cmd_check(_cli("--import", DEFECTS_FILE, "--op", "GoodScaledTanh"))
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "2 variants checked" in text and "0 violating" in text


def test_cli_import_errors_are_clear():
    with pytest.raises(opwarden.OptionsError, match="no such file"):
        check_cli.cmd_check(_cli("--import", "/nonexistent/ops.py"))
    with pytest.raises(opwarden.OptionsError, match="no operator or variant"):
        check_cli.cmd_check(_cli("--op", "NoSuchOperatorAnywhere"))


def test_readme_custom_op_shape_loads_runs_infers_and_exports():
    @opwarden.op(
        "ScaledTanh",
        domain="example.ops",
        inputs=["X: T"],
        outputs=["Y: T"],
        types={"T": ["float32", "float64"]},
        attrs={"alpha": 1.0},
        contract=opwarden.Contract(
            thread_safe=True, nan="propagate", mutates=(), overflow=None, workspace_bytes=0
        ),
    )
    def ScaledTanh(X, *, alpha=1.0):
        return np.tanh(X) * alpha

    @ScaledTanh.kernel(device="cpu", name="scaledtanh.cpu.fast", priority=10)
    def _(X, *, alpha=1.0):
        out = np.tanh(X)
        out *= X.dtype.type(alpha)
        return out

    @ScaledTanh.infer
    def _(X, *, alpha=1.0):
        return X

    @ScaledTanh.grad
    def _(ctx, dY, *, alpha=1.0):
        (X,) = ctx.inputs
        return (dY * alpha * (1 - np.tanh(X) ** 2),)

    node = helper.make_node("ScaledTanh", ["x"], ["y"], domain="example.ops", alpha=2.0)
    graph = helper.make_graph(
        [node, helper.make_node("Relu", ["y"], ["z"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
    )
    m = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("example.ops", 1)]
    )
    ir = load(m)
    # the .infer rule filled the custom node's output facts at load
    assert ir.graph.nodes[0].outputs[0].fact == TensorFact("float32", ("N", 3))
    sess = opwarden.InferenceSession(m)
    assert sess.explain()[0]["variant"] == "scaledtanh.cpu.fast"
    x = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    (z,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(z, np.maximum(np.tanh(x) * 2, 0), rtol=1e-6)
    out = model_proto(ir)
    assert {(o.domain, o.version) for o in out.opset_import} >= {("example.ops", 1)}
    assert out.graph.node[0].domain == "example.ops"
    assert REGISTRY.latest("ScaledTanh", "example.ops") is ScaledTanh
    report = opwarden.verify.check(ScaledTanh)
    assert report.ok, report.failures


def test_shape_rule_error_at_load_names_the_node():
    @opwarden.op(
        "NeedsMatrix",
        domain="test.rules",
        inputs=["X: T"],
        outputs=["Y: T"],
        types={"T": ["float32"]},
    )
    def NeedsMatrix(X):
        return X

    @NeedsMatrix.infer
    def _(X):
        if X.ndim != 2:
            raise opwarden.ModelError(f"NeedsMatrix wants a matrix, got rank {X.ndim}")
        return X

    node = helper.make_node("NeedsMatrix", ["x"], ["y"], name="nm", domain="test.rules")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    m = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("test.rules", 1)]
    )
    with pytest.raises(opwarden.ModelError, match="'nm'.*rank 1"):
        load(m)


def test_not_thread_safe_op_skips_concurrency():
    @opwarden.op(
        "Stateful",
        domain="test.rules",
        inputs=["X: T"],
        outputs=["Y: T"],
        types={"T": ["float32"]},
        contract=opwarden.Contract(thread_safe=False),
    )
    def Stateful(X):
        return X + 1

    report = opwarden.verify.check(Stateful)
    (v,) = report.variants
    assert v.checks["concurrency"] == "skip" and "thread_safe=False" in v.skipped["concurrency"]
    assert report.ok


def test_gradcheck_is_exported_as_a_function():
    assert callable(opwarden.verify.gradcheck) and callable(opwarden.verify.check)
