"""gradcheck of every built-in operator version that has a backward rule (float64, small)."""

from __future__ import annotations

import pytest

from opwarden.ops.grad import differentiable_ops
from opwarden.ops.grad import grad_cases as cases
from opwarden.verify.grads import gradcheck

# opwarden's own operators (other tests register custom ops with backward rules of their own)
OPS = [o for o in differentiable_ops() if o.domain in ("", "opwarden")]
PARAMS = [
    pytest.param(o, c, id=f"{o.op_type}-{o.since}-{c.label or i}")
    for o in OPS
    for i, c in enumerate(cases(o))
]


def test_every_rule_has_cases():
    missing = [o.qualname for o in OPS if not cases(o)]
    assert not missing, f"backward rules without gradcheck cases: {missing}"


def test_rules_cover_the_required_operators():
    have = {o.op_type for o in OPS}
    required = set(
        "Add Sub Mul Div Neg Exp Log Sqrt Pow Abs Tanh Sigmoid Relu LeakyRelu Elu Selu Softplus "
        "Gelu HardSigmoid HardSwish Clip Erf Sin Cos Reciprocal Max Min Where MatMul Gemm Conv "
        "MaxPool AveragePool GlobalAveragePool BatchNormalization LayerNormalization Softmax "
        "LogSoftmax ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceSumSquare ReduceL1 "
        "ReduceL2 ReduceLogSum ReduceLogSumExp Reshape Flatten Squeeze Unsqueeze Transpose Concat "
        "Split Slice Gather Pad Expand Identity Cast SoftmaxCrossEntropyLoss "
        "NegativeLogLikelihoodLoss".split()
    )
    assert required <= have, sorted(required - have)


@pytest.mark.parametrize("opdef,case", PARAMS)
def test_gradcheck(opdef, case):
    res = gradcheck(opdef, case.inputs, case.attrs, noutputs=case.noutputs)
    assert res.ok, res.detail
    assert "no input has a gradient" not in res.detail
    assert "non-differentiable points" not in res.detail, res.detail
