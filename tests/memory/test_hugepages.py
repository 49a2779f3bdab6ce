"""Weights and packed weights in transparent huge pages (memory.hugepages)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import opwarden
from opwarden.kernels.cpu import util as kutil
from opwarden.memory import hugepages
from opwarden.memory.constants import mark as mark_constant

needs_thp = pytest.mark.skipif(not hugepages.enabled(),
                               reason="transparent huge pages are not available here")


def _model(seed: int = 0) -> onnx.ModelProto:
    """Conv (a large 3x3 weight) -> Relu -> Conv 1x1 (large) + a small bias: the weights of at
    least MIN_BYTES move, the biases stay."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((96, 64, 3, 3)) * 0.05).astype(np.float32)  # 221 KB
    w2 = (rng.standard_normal((128, 96, 1, 1)) * 0.1).astype(np.float32)  # 48 KB: stays
    b1 = rng.standard_normal(96).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (w2, "w2"), (b1, "b1"))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


FEED = {"x": np.random.default_rng(1).standard_normal((1, 64, 12, 12)).astype(np.float32)}


@needs_thp
def test_large_initializers_move_to_an_aligned_store_and_results_do_not_change(tmp_path):
    model = _model()
    path = str(tmp_path / "m.onnx")
    onnx.save(model, path)
    plain = opwarden.InferenceSession(model.SerializeToString(), huge_page_weights=False)
    assert plain.huge_page_bytes == 0
    want = plain.run(None, FEED)[0]
    sess = opwarden.InferenceSession(path)  # views of the mapped file: copied, pages dropped
    init = sess.model.graph.initializers
    moved = {n for n, v in init.items() if v.const.nbytes >= hugepages.MIN_BYTES}
    assert moved == {"w1"} and sess.huge_page_bytes >= init["w1"].const.nbytes
    w1 = init["w1"].const
    assert not w1.flags.writeable and not w1.flags.owndata
    # The store starts at a 2 MiB boundary; w1 is its first array.
    assert w1.ctypes.data % hugepages.HUGE_PAGE == 0
    assert init["b1"].const.nbytes < hugepages.MIN_BYTES
    np.testing.assert_array_equal(sess.run(None, FEED)[0], want)


@needs_thp
def test_views_of_model_bytes_are_collapsed_in_place_not_copied():
    """A model given as bytes: weights that are views of those bytes stay views (a copy would
    hold them twice); the whole 2 MiB pages under them are collapsed where the kernel can."""
    rng = np.random.default_rng(4)
    w = (rng.standard_normal((512, 256, 3, 3)) * 0.02).astype(np.float32)  # 4.5 MiB
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w")])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    data = data.SerializeToString()
    x = {"x": rng.standard_normal((1, 256, 4, 4)).astype(np.float32)}
    want = opwarden.InferenceSession(data, huge_page_weights=False).run(None, x)[0]
    sess = opwarden.InferenceSession(data)
    got = sess.model.graph.initializers["w"].const
    np.testing.assert_array_equal(got, w)
    if np.shares_memory(got, np.frombuffer(data, np.uint8)):
        # In place: at most the bytes of w, at least one whole huge page when collapsing works.
        assert sess.huge_page_bytes <= w.nbytes
    else:  # a misaligned payload: the loader's private copy, moved to the store
        assert sess.huge_page_bytes >= w.nbytes
    np.testing.assert_array_equal(sess.run(None, x)[0], want)


def test_collapse_keeps_contents():
    buf = np.random.default_rng(5).standard_normal(3 << 20).astype(np.float32)  # 12 MiB
    want = buf.copy()
    covered = hugepages._collapse_views([buf[1000:]])
    assert 0 <= covered <= buf[1000:].nbytes
    np.testing.assert_array_equal(buf, want)


@needs_thp
def test_private_sources_are_discarded_only_after_their_copy():
    """A private source (an aligned copy or a folded weight) hands its pages back chunk by
    chunk while it is copied: the copy is exact even with chunks far smaller than the array."""
    a = np.random.default_rng(2).standard_normal((300, 700)).astype(np.float32)
    want = a.copy()
    old = hugepages.COPY_CHUNK
    try:
        hugepages.COPY_CHUNK = 4096 * 3
        out = hugepages.huge_copy(a, private=True)
    finally:
        hugepages.COPY_CHUNK = old
    assert out is not a
    np.testing.assert_array_equal(out, want)


@needs_thp
def test_packed_weights_are_moved_and_shared_views_are_not(monkeypatch):
    seen = []
    real = hugepages.huge_copy

    def spy(a, private=False):
        seen.append((a.nbytes, private))
        return real(a, private)

    monkeypatch.setattr(hugepages, "huge_copy", spy)
    w = np.random.default_rng(3).standard_normal((512, 256)).astype(np.float32)
    mark_constant(w)
    p = kutil.packed(w, "test.hp.copy", lambda x: np.ascontiguousarray(x.T))
    np.testing.assert_array_equal(p, w.T)
    assert seen == [(w.nbytes, True)] and not p.flags.owndata and not p.flags.writeable
    assert kutil.packed(w, "test.hp.copy", lambda x: 1 / 0) is p  # cached
    view = kutil.packed(w, "test.hp.view", lambda x: x.T)  # a view of w is never copied
    assert np.shares_memory(view, w) and len(seen) == 1


def test_switched_off_by_the_environment():
    code = ("import opwarden.memory.hugepages as h; import numpy as np; "
            "a = np.ones(1 << 20, np.float32); print(h.enabled(), h.huge_copy(a) is a)")
    env = dict(os.environ, OPWARDEN_HUGE_PAGES="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == ["False", "True"]


def test_option_is_checked():
    with pytest.raises(opwarden.OptionsError, match="huge_page_weights"):
        opwarden.SessionOptions(huge_page_weights="yes")


@needs_thp
def test_one_array_behind_two_values_is_copied_once():
    """Two initializers holding the same array (as a pass may leave them) share one copy."""
    from opwarden.ir.load import load

    model = load(_model().SerializeToString())
    init = model.graph.initializers
    arr = init["w1"].const.copy()  # a private array both values hold
    init["w1"].const = arr
    init["b1"].const = arr
    moved = hugepages.move_weights(model)
    assert init["w1"].const is init["b1"].const
    assert moved == -(-arr.nbytes // 64) * 64
    np.testing.assert_array_equal(init["w1"].const, arr)
