"""Dev tool: run single-node ONNX backend node tests directly against reference kernels.

    python tools/opcheck.py [SUBSTRING ...]      # e.g. python tools/opcheck.py test_conv test_relu

Calls the op object's reference kernel with the node's attributes (plus schema defaults) and
compares with the expected outputs the way onnx's runner does. The full conformance runner
(opwarden.verify.conformance) goes through InferenceSession instead.
"""

from __future__ import annotations

import sys
import traceback
import warnings

import numpy as np
from onnx.backend.test.loader import load_model_tests

from opwarden.ops import REGISTRY
from opwarden.ops.schema import attr_value


def call_node(model, node, inputs):
    opsets = {o.domain: o.version for o in model.opset_import}
    dom = "" if node.domain in ("", "ai.onnx") else node.domain
    opdef, sch = REGISTRY.resolve(node.op_type, dom, opsets.get(node.domain, opsets.get(dom, 1)))
    if opdef is None:
        raise NotImplementedError(f"no implementation of {node.op_type}-{sch.since}")
    kw = {k: a.default for k, a in sch.attrs.items() if a.has_default}
    kw.update({a.name: attr_value(a) for a in node.attribute})
    args = list(inputs)
    fn = opdef.reference
    import inspect
    if "noutputs" in inspect.signature(fn).parameters:
        kw["noutputs"] = len(node.output)
    res = fn(*args, **kw)
    return list(res) if isinstance(res, tuple) else [res]


def main(patterns):
    warnings.simplefilter("ignore")
    cases = load_model_tests(kind="node")
    ok = fail = skip = 0
    for case in cases:
        if patterns and not any(p in case.name for p in patterns):
            continue
        model = case.model
        if len(model.graph.node) != 1:
            skip += 1
            continue
        node = model.graph.node[0]
        for ins, exp in case.data_sets[:1]:
            byname = {gi.name: v for gi, v in zip(model.graph.input, ins)}
            args = [byname.get(n) if n else None for n in node.input]
            while args and args[-1] is None and not node.input[-1]:
                args.pop()
            try:
                got = call_node(model, node, args)
                assert len(got) >= len(exp), f"{len(got)} outputs, expected {len(exp)}"
                for e, g in zip(exp, got):
                    _compare(e, g, case)
                ok += 1
                print(f"PASS {case.name}")
            except Exception as e:  # noqa: BLE001
                fail += 1
                print(f"FAIL {case.name}: {type(e).__name__}: {str(e)[:300]}")
                if "-v" in sys.argv:
                    traceback.print_exc()
    print(f"passed {ok} failed {fail} skipped(multi-node) {skip}")


def _read(path, vinfo):
    import onnx
    from onnx import numpy_helper
    data = open(path, "rb").read()
    t = vinfo.type
    if t.HasField("sequence_type"):
        s = onnx.SequenceProto(); s.ParseFromString(data); return numpy_helper.to_list(s)
    if t.HasField("optional_type"):
        o = onnx.OptionalProto(); o.ParseFromString(data); return numpy_helper.to_optional(o)
    if t.HasField("map_type"):
        m = onnx.MapProto(); m.ParseFromString(data); return numpy_helper.to_dict(m)
    tp = onnx.TensorProto(); tp.ParseFromString(data); return numpy_helper.to_array(tp)


def _compare(e, g, case):
    if isinstance(e, list):
        assert isinstance(g, list) and len(e) == len(g), f"sequence mismatch {type(g)}"
        for a, b in zip(e, g):
            _compare(a, b, case)
        return
    if e is None:
        assert g is None, "expected None (empty optional)"
        return
    g = np.asarray(g)
    assert e.dtype == g.dtype, f"dtype {g.dtype} != expected {e.dtype}"
    assert e.shape == g.shape, f"shape {g.shape} != expected {e.shape}"
    if e.dtype == object:
        assert e.tolist() == g.tolist()
        return
    if e.dtype.kind in "fc" or e.dtype.itemsize <= 1 and e.dtype.kind == "V":
        np.testing.assert_allclose(g, e, rtol=case.rtol, atol=case.atol)
    else:
        try:
            np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=case.rtol, atol=case.atol)
        except (TypeError, ValueError):
            np.testing.assert_array_equal(g, e)


if __name__ == "__main__":
    main([a for a in sys.argv[1:] if not a.startswith("-")])
