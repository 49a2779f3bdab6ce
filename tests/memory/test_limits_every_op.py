"""memory_limit_bytes holds for operators whose output size comes from input values (Pad, Resize,
OneHot, Concat of a feed, Loop and Scan outputs, ...): refused before allocating, named, and the
session still serves small feeds; run_timeout_ms ends a Loop that would run forever."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tracemalloc
import zlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import opwarden
from opwarden.errors import MemoryLimitError, OptionsError, OpwardenError, RunTimeoutError
from tests.models import graph_model

LIMIT = 256 << 20
F, I64 = T.FLOAT, T.INT64


def _model(nodes, inputs, outputs, inits=(), opset=18, value_info=()) -> onnx.ModelProto:
    return graph_model(nodes, inputs, outputs, inits, opset, value_info, name="limits")


def _f32(*shape):
    return np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) / 7


def _i64(*v):
    return np.array(v, np.int64)


def pad():
    m = _model(
        [helper.make_node("Pad", ["x", "pads"], ["y"], name="pad")],
        [("x", F, [2, 2]), ("pads", I64, [4])],
        [("y", F, None)],
    )
    return m, {"x": _f32(2, 2), "pads": _i64(0, 0, 0, 10**8)}, {"x": _f32(2, 2),
                                                               "pads": _i64(0, 1, 1, 0)}


def pad_declared_small():
    # The model declares the padded tensor small; the check does not trust that.
    m = _model(
        [helper.make_node("Pad", ["x", "pads"], ["p"], name="pad"),
         helper.make_node("Relu", ["p"], ["y"], name="relu")],
        [("x", F, [2, 2]), ("pads", I64, [4])],
        [("y", F, [2, 2])],
        value_info=[helper.make_tensor_value_info("p", F, [2, 2])],
    )
    return m, {"x": _f32(2, 2), "pads": _i64(0, 0, 0, 10**8)}, {"x": _f32(2, 2),
                                                               "pads": _i64(0, 0, 0, 0)}


def resize_sizes():
    m = _model(
        [helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="resize",
                          mode="nearest")],
        [("x", F, [1, 1, 4, 4]), ("sizes", I64, [4])],
        [("y", F, None)],
        opset=19,
    )
    x = _f32(1, 1, 4, 4)
    return m, {"x": x, "sizes": _i64(1, 1, 20000, 20000)}, {"x": x, "sizes": _i64(1, 1, 8, 6)}


def resize_scales():
    m = _model(
        [helper.make_node("Resize", ["x", "", "scales"], ["y"], name="resize",
                          mode="linear")],
        [("x", F, [1, 1, 4, 4]), ("scales", F, [4])],
        [("y", F, None)],
        opset=19,
    )
    x = _f32(1, 1, 4, 4)
    big = np.array([1, 1, 5000, 5000], np.float32)
    return m, {"x": x, "scales": big}, {"x": x, "scales": np.array([1, 1, 2, 1.5], np.float32)}


def upsample():
    m = _model(
        [helper.make_node("Upsample", ["x", "scales"], ["y"], name="upsample", mode="nearest")],
        [("x", F, [1, 1, 2, 2]), ("scales", F, [4])],
        [("y", F, None)],
        opset=9,
    )
    x = _f32(1, 1, 2, 2)
    big = np.array([1, 1, 10000, 10000], np.float32)
    return m, {"x": x, "scales": big}, {"x": x, "scales": np.array([1, 1, 2, 3], np.float32)}


def one_hot():
    values = numpy_helper.from_array(np.array([0, 1], np.float32), "values")
    m = _model(
        [helper.make_node("OneHot", ["idx", "depth", "values"], ["y"], name="onehot")],
        [("idx", I64, [3]), ("depth", I64, [1])],
        [("y", F, None)],
        inits=[values],
        opset=11,
    )
    idx = _i64(0, 2, 1)
    return m, {"idx": idx, "depth": _i64(10**8)}, {"idx": idx, "depth": _i64(4)}


def concat_of_feed():
    # 16 copies of one 20 MiB feed along its dynamic axis: 320 MiB.
    m = _model(
        [helper.make_node("Concat", ["x"] * 16, ["y"], name="concat", axis=0)],
        [("x", F, ["n", 1024])],
        [("y", F, None)],
    )
    return m, {"x": np.ones((5000, 1024), np.float32)}, {"x": _f32(2, 1024)}


def constant_of_shape():
    m = _model(
        [helper.make_node("ConstantOfShape", ["s"], ["y"], name="fill",
                          value=numpy_helper.from_array(np.array([1.5], np.float32)))],
        [("s", I64, [2])],
        [("y", F, None)],
    )
    return m, {"s": _i64(20000, 20000)}, {"s": _i64(2, 3)}


def max_unpool():
    m = _model(
        [helper.make_node("MaxUnpool", ["x", "i", "shape"], ["y"], name="unpool",
                          kernel_shape=[2, 2], strides=[2, 2])],
        [("x", F, [1, 1, 2, 2]), ("i", I64, [1, 1, 2, 2]), ("shape", I64, [4])],
        [("y", F, None)],
        opset=11,
    )
    x, i = _f32(1, 1, 2, 2) + 1, _i64(0, 3, 9, 14).reshape(1, 1, 2, 2)
    return (m, {"x": x, "i": i, "shape": _i64(1, 1, 20000, 20000)},
            {"x": x, "i": i, "shape": _i64(1, 1, 5, 5)})


def col2im():
    block = numpy_helper.from_array(_i64(2, 2), "block")
    m = _model(
        [helper.make_node("Col2Im", ["x", "image", "block"], ["y"], name="col2im",
                          strides=[20000, 20000])],
        [("x", F, [1, 4, 1]), ("image", I64, [2])],
        [("y", F, None)],
        inits=[block],
    )
    x = _f32(1, 4, 1) + 1
    return m, {"x": x, "image": _i64(20000, 20000)}, {"x": x, "image": _i64(3, 3)}


def center_crop_pad():
    m = _model(
        [helper.make_node("CenterCropPad", ["x", "shape"], ["y"], name="crop")],
        [("x", F, [4, 4]), ("shape", I64, [2])],
        [("y", F, None)],
    )
    x = _f32(4, 4)
    return m, {"x": x, "shape": _i64(20000, 20000)}, {"x": x, "shape": _i64(2, 6)}


def broadcast_of_reshaped():
    # Shapes no fact knows (Reshape to fed shapes) broadcast to n * m elements.
    m = _model(
        [helper.make_node("Reshape", ["a", "sa"], ["ra"]),
         helper.make_node("Reshape", ["b", "sb"], ["rb"]),
         helper.make_node("Mul", ["ra", "rb"], ["y"], name="outer")],
        [("a", F, ["n"]), ("sa", I64, [2]), ("b", F, ["m"]), ("sb", I64, [2])],
        [("y", F, None)],
    )
    a, b = _f32(10000), _f32(10000)
    big = {"a": a, "sa": _i64(10000, 1), "b": b, "sb": _i64(1, 10000)}
    return m, big, {"a": _f32(3), "sa": _i64(3, 1), "b": _f32(4), "sb": _i64(1, 4)}


def hann_window():
    m = _model(
        [helper.make_node("HannWindow", ["n"], ["y"], name="window")],
        [("n", I64, [])],
        [("y", F, None)],
        opset=17,
    )
    return m, {"n": np.array(10**9, np.int64)}, {"n": np.array(5, np.int64)}


def _png(width: int, height: int, body: bytes = b"") -> np.ndarray:
    """PNG bytes: an RGB header of this size, then `body` (the IDAT chunk, or nothing)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (len(data).to_bytes(4, "big") + kind + data
                + zlib.crc32(kind + data).to_bytes(4, "big"))

    ihdr = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + body + chunk(b"IEND", b"")
    return np.frombuffer(data, np.uint8)


def image_decoder():
    pytest.importorskip("PIL")
    m = _model(
        [helper.make_node("ImageDecoder", ["bytes"], ["y"], name="decode")],
        [("bytes", T.UINT8, ["n"])],
        [("y", T.UINT8, None)],
        opset=20,
    )
    # 10^8 pixels: under Pillow's own bomb threshold, 600 MB decoded and converted
    big = _png(10000, 10000)
    rows = zlib.compress(b"".join(b"\x00" + bytes(range(r, r + 9)) for r in range(2)))
    idat = len(rows).to_bytes(4, "big") + b"IDAT" + rows + zlib.crc32(b"IDAT" + rows).to_bytes(
        4, "big")
    small = _png(3, 2, idat)  # 2 rows of 3 RGB pixels
    return m, {"bytes": big}, {"bytes": small}


def _loop_body(nodes, inputs, outputs):
    return helper.make_graph(
        nodes, "body",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
    )


def loop_scan_output():
    # Each iteration emits v + i (256 KiB); the trip count comes from a feed.
    body = _loop_body(
        [helper.make_node("Identity", ["c"], ["c_out"]),
         helper.make_node("Cast", ["i"], ["i_f"], to=F),
         helper.make_node("Add", ["v", "i_f"], ["row"])],
        [("i", I64, []), ("c", T.BOOL, [])],
        [("c_out", T.BOOL, []), ("row", F, [65536])],
    )
    m = _model(
        [helper.make_node("Loop", ["M", "cond"], ["rows"], name="loop", body=body)],
        [("M", I64, []), ("v", F, [65536])],
        [("rows", F, None)],
        inits=[numpy_helper.from_array(np.array(True), "cond")],
        opset=17,
    )
    v = _f32(65536)
    return m, {"M": np.array(10**9, np.int64), "v": v}, {"M": np.array(3, np.int64), "v": v}


def scan_outputs():
    # Each step emits x_t expanded to a feed-given shape (1 MiB a step, 200 steps).
    body = _loop_body(
        [helper.make_node("Add", ["s", "x"], ["s_out"]),
         helper.make_node("Expand", ["x", "shape"], ["y"])],
        [("s", F, [4]), ("x", F, [4])],
        [("s_out", F, [4]), ("y", F, None)],
    )
    m = _model(
        [helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], name="scan", body=body,
                          num_scan_inputs=1)],
        [("s0", F, [4]), ("xs", F, ["t", 4]), ("shape", I64, [2])],
        [("s", F, [4]), ("ys", F, None)],
        opset=16,
    )
    s0 = np.zeros(4, np.float32)
    return (m, {"s0": s0, "xs": _f32(200, 4), "shape": _i64(65536, 4)},
            {"s0": s0, "xs": _f32(3, 4), "shape": _i64(2, 4)})


def loop_carried_sequence():
    # A loop-carried sequence grows by one 256 KiB tensor per iteration.
    body = _loop_body(
        [helper.make_node("Identity", ["c"], ["c_out"]),
         helper.make_node("SequenceInsert", ["seq", "v"], ["seq_out"])],
        [("i", I64, []), ("c", T.BOOL, []),
         ("seq", T.FLOAT, None)],
        [("c_out", T.BOOL, []), ("seq_out", T.FLOAT, None)],
    )
    # sequence types for the carried value
    seq_t = helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, None))
    for vi in (body.input[2], body.output[1]):
        vi.type.CopyFrom(seq_t)
    m = _model(
        [helper.make_node("SequenceEmpty", [], ["empty"], dtype=F),
         helper.make_node("Loop", ["M", "cond", "empty"], ["seq"], name="loop", body=body),
         helper.make_node("ConcatFromSequence", ["seq"], ["y"], axis=0)],
        [("M", I64, []), ("v", F, [65536])],
        [("y", F, None)],
        inits=[numpy_helper.from_array(np.array(True), "cond")],
        opset=17,
    )
    v = _f32(65536)
    return m, {"M": np.array(10**9, np.int64), "v": v}, {"M": np.array(3, np.int64), "v": v}


CASES = {
    f.__name__: f
    for f in (pad, pad_declared_small, resize_sizes, resize_scales, upsample, one_hot,
              concat_of_feed, constant_of_shape, max_unpool, col2im, center_crop_pad,
              hann_window, image_decoder, broadcast_of_reshaped,
              loop_scan_output, scan_outputs, loop_carried_sequence)
}
# Loops accumulate up to the limit before they refuse the next iteration; the others refuse
# before allocating anything of size.
ACCUMULATES = {"loop_scan_output", "scan_outputs", "loop_carried_sequence"}


# MaxUnpool's indices address the pooled input's unpooled shape in the ONNX reference and its
# conformance data, as in our kernel; onnxruntime reads them in output_shape's.
ONNX_REFERENCE = {"max_unpool"}


def _reference(case: str, m: onnx.ModelProto, feeds: dict) -> list:
    if case not in ONNX_REFERENCE:
        import onnxruntime as ort

        try:
            s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        except Exception:  # noqa: BLE001 - an op onnxruntime lacks: the ONNX reference
            pass
        else:
            return s.run(None, feeds)
    return ReferenceEvaluator(m).run(None, feeds)


@pytest.mark.filterwarnings("ignore:Image size")  # Pillow's own note on the 10^8-pixel PNG
@pytest.mark.parametrize("case", list(CASES))
def test_feed_driven_size_is_refused_before_allocating(case):
    m, big, small = CASES[case]()
    sess = opwarden.InferenceSession(m.SerializeToString(), memory_limit_bytes=LIMIT)
    tracemalloc.start()
    try:
        with pytest.raises(MemoryLimitError) as err:
            sess.run(None, big)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    msg = str(err.value)
    node = next(n.name for n in m.graph.node if n.name)
    assert node in msg and "256.0 MiB" in msg and "memory_limit_bytes" in msg
    assert peak < (LIMIT if case in ACCUMULATES else 32 << 20), f"{peak / 2**20:.0f} MiB traced"
    # the session stays usable and agrees with the ONNX reference on small feeds
    got = sess.run(None, small)
    for g, r in zip(got, _reference(case, m, small)):
        np.testing.assert_allclose(g, r, rtol=1e-6, atol=1e-6)


def test_refusal_names_the_request():
    m, big, _ = pad()
    sess = opwarden.InferenceSession(m.SerializeToString(), memory_limit_bytes=LIMIT)
    with pytest.raises(MemoryLimitError) as err:
        sess.run(None, big)
    msg = str(err.value)
    assert msg.startswith("node 'pad' (Pad)") and msg.count("'pad'") == 1, msg
    assert "762.9 MiB" in msg and "int64 [0, 0, 0, 100000000]" in msg, msg


def test_refusal_under_the_guard_names_the_node():
    m, big, small = one_hot()
    sess = opwarden.InferenceSession(m.SerializeToString(), memory_limit_bytes=LIMIT,
                                     checks="all")
    with pytest.raises(MemoryLimitError, match="'onehot'"):
        sess.run(None, big)
    assert not sess.faults  # a refusal is not a kernel fault: nothing quarantined
    np.testing.assert_array_equal(sess.run(None, small)[0], _reference("one_hot", m, small)[0])


def test_quarantined_variant_is_checked_too():
    """A quarantined variant's node runs the reference kernel; the limit still holds there."""
    m, big, small = concat_of_feed()
    sess = opwarden.InferenceSession(m.SerializeToString(), memory_limit_bytes=LIMIT)
    (st,) = sess.program.steps
    assert not st.placement.variant.reference
    sess.guard.quarantine.add(st.placement.variant.name, "test")
    tracemalloc.start()
    try:
        with pytest.raises(MemoryLimitError, match="'concat'"):
            sess.run(None, big)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20
    np.testing.assert_array_equal(sess.run(None, small)[0], np.concatenate([small["x"]] * 16))


def test_static_nodes_are_not_wrapped():
    """Nodes whose sizes the plan fixes call their kernel directly (no per-run cost)."""
    m = _model(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Pad", ["r", "pads"], ["y"])],
        [("x", F, ["n", 4])],
        [("y", F, ["n", 6])],
        inits=[numpy_helper.from_array(_i64(0, 1, 0, 1), "pads")],
    )
    sess = opwarden.InferenceSession(m.SerializeToString(), optimization_level=0)
    for st in sess.program.steps:
        assert not hasattr(st.fn, "size_rule"), st.placement.node.label
    m, _, _ = pad()
    sess = opwarden.InferenceSession(m.SerializeToString())
    assert all(hasattr(st.fn, "size_rule") for st in sess.program.steps)


def _infinite_loop() -> onnx.ModelProto:
    body = _loop_body(
        [helper.make_node("Identity", ["c"], ["c_out"]),
         helper.make_node("Add", ["acc", "one"], ["acc_out"])],
        [("i", I64, []), ("c", T.BOOL, []), ("acc", F, [])],
        [("c_out", T.BOOL, []), ("acc_out", F, [])],
    )
    return _model(
        [helper.make_node("Loop", ["M", "cond", "acc0"], ["acc"], name="forever", body=body)],
        [("M", I64, []), ("acc0", F, [])],
        [("acc", F, [])],
        inits=[numpy_helper.from_array(np.array(True), "cond"),
               numpy_helper.from_array(np.array(1, np.float32), "one")],
        opset=17,
    )


def test_run_timeout_ends_a_loop_that_would_not(tmp_path):
    path = tmp_path / "forever.onnx"
    onnx.save(_infinite_loop(), path)
    script = textwrap.dedent(f"""
        import resource, numpy as np, opwarden
        s = opwarden.InferenceSession({str(path)!r}, run_timeout_ms=500)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            s.run(None, {{"M": np.array(10**9, np.int64), "acc0": np.array(0, np.float32)}})
            print("NO ERROR")
        except opwarden.RunTimeoutError as e:
            print("TIMEOUT", e)
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        print("GROWN_KIB", grown)
        (acc,) = s.run(None, {{"M": np.array(5, np.int64), "acc0": np.array(0, np.float32)}})
        print("AFTER", float(acc))
    """)
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    # Generous: a regression must fail here, not hang the suite.
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, env=env)
    out = res.stdout
    assert res.returncode == 0, res.stderr[-2000:]
    assert "TIMEOUT" in out, out
    assert "'forever' (Loop)" in out and "500 ms" in out and "run_timeout_ms" in out
    grown = int(out.split("GROWN_KIB")[1].split()[0])
    assert grown * 1024 < LIMIT
    assert "AFTER 5.0" in out


def test_run_timeout_option_is_validated():
    assert opwarden.SessionOptions().run_timeout_ms is None
    assert opwarden.SessionOptions(run_timeout_ms=2.5).run_timeout_ms == 2.5
    for bad in (0, -1, True, "1", float("nan")):
        with pytest.raises(OptionsError, match="run_timeout_ms"):
            opwarden.SessionOptions(run_timeout_ms=bad)
    assert issubclass(RunTimeoutError, OpwardenError)
    assert opwarden.RunTimeoutError is RunTimeoutError


def test_run_timeout_leaves_short_runs_alone():
    sess = opwarden.InferenceSession(_infinite_loop().SerializeToString(), run_timeout_ms=60_000)
    (acc,) = sess.run(None, {"M": np.array(7, np.int64), "acc0": np.array(1, np.float32)})
    assert float(acc) == 8.0
