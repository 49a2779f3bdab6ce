"""Unit tests for the image family (opwarden/ops/image.py) beyond the ONNX node tests."""

import numpy as np
import pytest

from opwarden.errors import KernelError
from opwarden.ops import REGISTRY


def ref(op_type, since=None):
    versions = REGISTRY.versions(op_type)
    if since is None:
        return versions[-1].reference
    return next(o for o in versions if o.since == since).reference


def test_resize_nearest_upsample():
    X = np.array([[1, 2], [3, 4]], np.float32)
    Y = ref("Resize")(X, None, np.array([2, 2], np.float32), mode="nearest")
    np.testing.assert_array_equal(Y, np.repeat(np.repeat(X, 2, 0), 2, 1))


def test_resize_integer_linear_rounds_and_keeps_dtype():
    X = np.array([[0, 255]], np.uint8)
    Y = ref("Resize")(X, None, np.array([1, 2], np.float32), mode="cubic")
    assert Y.dtype == np.uint8 and Y.shape == (1, 4)
    assert Y.min() == 0 and Y.max() == 255  # cubic overshoot is saturated, not wrapped


def test_resize_identity_is_a_copy():
    X = np.arange(6, dtype=np.float32).reshape(2, 3)
    Y = ref("Resize")(X, None, np.array([1, 1], np.float32))
    np.testing.assert_array_equal(X, Y)
    assert not np.shares_memory(X, Y)


def test_resize_needs_exactly_one_of_scales_sizes():
    X = np.zeros((2, 2), np.float32)
    with pytest.raises(KernelError, match="exactly one"):
        ref("Resize")(X, None, np.array([1, 1], np.float32), np.array([2, 2], np.int64))
    with pytest.raises(KernelError, match="exactly one"):
        ref("Resize")(X)


def test_resize_antialias_keeps_constants():
    X = np.full((1, 1, 9, 13), 7.0, np.float32)
    for mode in ("linear", "cubic"):
        Y = ref("Resize")(X, None, np.array([1, 1, 0.3, 0.45], np.float32), mode=mode,
                          antialias=1)
        assert Y.shape == (1, 1, 2, 5)
        np.testing.assert_allclose(Y, 7.0, rtol=1e-6)


def test_resize_tf_crop_and_resize_extrapolates():
    X = np.arange(16, dtype=np.float32).reshape(4, 4)
    roi = np.array([-1.0, 0.0, 2.0, 1.0], np.float32)
    Y = ref("Resize")(X, roi, None, np.array([4, 4], np.int64), mode="linear",
                      coordinate_transformation_mode="tf_crop_and_resize",
                      extrapolation_value=-5.0)
    assert Y[0, 0] == -5.0 and Y[-1, -1] == -5.0


def test_resize_keep_aspect_ratio():
    X = np.zeros((1, 1, 2, 4), np.float32)
    Y = ref("Resize")(X, None, None, np.array([1, 3], np.int64), axes=[2, 3],
                      keep_aspect_ratio_policy="not_smaller")
    assert Y.shape == (1, 1, 2, 3)


def test_upsample_rejects_shrinking():
    X = np.zeros((4, 4), np.float32)
    with pytest.raises(KernelError, match=">= 1"):
        ref("Upsample", 9)(X, np.array([0.5, 1], np.float32))
    Y = ref("Upsample", 7)(X, mode="linear", scales=[1.0, 2.5])
    assert Y.shape == (4, 10)


def test_gridsample_identity_grid_reproduces_input():
    X = np.random.default_rng(0).standard_normal((2, 3, 5, 6)).astype(np.float32)
    theta = np.tile(np.array([[1, 0, 0], [0, 1, 0]], np.float32), (2, 1, 1))
    grid = ref("AffineGrid")(theta, np.array(X.shape, np.int64), align_corners=0)
    for mode in ("linear", "nearest", "cubic"):
        Y = ref("GridSample")(X, grid, mode=mode)
        np.testing.assert_allclose(Y, X, rtol=1e-5, atol=1e-5)


def test_gridsample_nearest_any_dtype_and_zero_padding():
    X = np.arange(4, dtype=np.int64).reshape(1, 1, 2, 2)
    grid = np.array([[[[-0.5, -0.5], [0.5, 0.5], [3.0, 0.0]]]], np.float32)
    Y = ref("GridSample")(X, grid, mode="nearest")
    assert Y.dtype == np.int64
    np.testing.assert_array_equal(Y.reshape(-1), [0, 3, 0])


def test_gridsample_16_is_2d_only():
    with pytest.raises(KernelError):
        ref("GridSample", 16)(np.zeros((1, 1, 2, 2, 2), np.float32),
                              np.zeros((1, 1, 1, 1, 3), np.float32))


def test_affine_grid_3d_shape():
    theta = np.zeros((2, 3, 4), np.float32)
    G = ref("AffineGrid")(theta, np.array([2, 1, 3, 4, 5], np.int64))
    assert G.shape == (2, 3, 4, 5, 3) and G.dtype == np.float32


def test_roialign_constant_image():
    X = np.full((2, 3, 8, 8), 2.5, np.float32)
    rois = np.array([[1, 1, 6, 5], [0, 0, 7, 7]], np.float32)
    for mode in ("avg", "max"):
        Y = ref("RoiAlign")(X, rois, np.array([1, 0]), mode=mode, output_height=2,
                            output_width=3, sampling_ratio=0)
        assert Y.shape == (2, 3, 2, 3) and Y.dtype == np.float32
        if mode == "avg":
            np.testing.assert_allclose(Y, 2.5, rtol=1e-6)
    with pytest.raises(KernelError, match="batch_indices"):
        ref("RoiAlign")(X, rois, np.array([0, 2]))


def test_nms_order_and_empty():
    boxes = np.array([[[0, 0, 1, 1], [0, 0.1, 1, 1.1], [0, 5, 1, 6]]], np.float32)
    scores = np.array([[[0.9, 0.95, 0.3]]], np.float32)
    nms = ref("NonMaxSuppression")
    sel = nms(boxes, scores, np.array([3]), np.array([0.5], np.float32))
    np.testing.assert_array_equal(sel, [[0, 0, 1], [0, 0, 2]])
    assert sel.dtype == np.int64
    empty = nms(boxes, scores)
    assert empty.shape == (0, 3) and empty.dtype == np.int64
    only_high = nms(boxes, scores, np.array([3]), np.array([0.5], np.float32),
                    np.array([0.5], np.float32))
    np.testing.assert_array_equal(only_high, [[0, 0, 1]])


def test_gridsample_workspace_declared():
    c = REGISTRY.latest("GridSample").contract
    assert c.workspace([(1, 3, 4, 4), (1, 5, 5, 2)], {}) > 0


# ---------------------------------------------------------------------------------------------
# ImageDecoder


def _encode(pixels: np.ndarray, fmt: str) -> np.ndarray:
    Image = pytest.importorskip("PIL.Image")
    import io

    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=fmt)
    return np.frombuffer(buf.getvalue(), dtype=np.uint8)


_PIXELS = np.random.default_rng(3).integers(0, 256, (5, 7, 3), dtype=np.uint8)


@pytest.mark.parametrize("fmt", ["PNG", "BMP", "PPM", "TIFF"])
def test_image_decoder_lossless_round_trip(fmt):
    Y = ref("ImageDecoder")(_encode(_PIXELS, fmt), pixel_format="RGB")
    assert Y.dtype == np.uint8 and Y.shape == (5, 7, 3)
    np.testing.assert_array_equal(Y, _PIXELS)


def test_image_decoder_bgr_reverses_channels():
    Y = ref("ImageDecoder")(_encode(_PIXELS, "PNG"), pixel_format="BGR")
    np.testing.assert_array_equal(Y, _PIXELS[:, :, ::-1])
    assert Y.flags.c_contiguous


def test_image_decoder_grayscale_is_itu_r_601_luma():
    Y = ref("ImageDecoder")(_encode(_PIXELS, "PNG"), pixel_format="Grayscale")
    assert Y.shape == (5, 7, 1) and Y.dtype == np.uint8
    luma = _PIXELS.astype(np.float64) @ np.array([0.299, 0.587, 0.114])
    assert np.abs(Y[:, :, 0].astype(np.float64) - luma).max() <= 0.5 + 1e-6


def test_image_decoder_gray_source_to_rgb():
    gray = _PIXELS[:, :, 0]
    Y = ref("ImageDecoder")(_encode(gray, "PNG"), pixel_format="RGB")
    np.testing.assert_array_equal(Y, np.repeat(gray[:, :, None], 3, axis=2))


def test_image_decoder_garbage_gives_empty_image():
    pytest.importorskip("PIL")
    junk = np.frombuffer(b"definitely not an image", dtype=np.uint8)
    Y = ref("ImageDecoder")(junk, pixel_format="RGB")
    assert Y.shape == (0, 0, 3) and Y.dtype == np.uint8
    Y = ref("ImageDecoder")(junk[:0], pixel_format="Grayscale")
    assert Y.shape == (0, 0, 1)


def test_image_decoder_rejects_non_uint8_input():
    pytest.importorskip("PIL")
    with pytest.raises(KernelError, match="1-D uint8"):
        ref("ImageDecoder")(np.zeros(4, np.int32), pixel_format="RGB")


def test_image_decoder_without_pillow_names_the_extra(monkeypatch):
    import sys

    # A None entry in sys.modules makes `import PIL` raise ImportError.
    monkeypatch.setitem(sys.modules, "PIL", None)
    monkeypatch.setitem(sys.modules, "PIL.Image", None)
    with pytest.raises(KernelError, match=r"opwarden\[image\]"):
        ref("ImageDecoder")(np.zeros(4, np.uint8), pixel_format="RGB")


def test_gridsample_nearest_rounds_in_float32_like_onnxruntime():
    # Found on an exported spatial-transformer: in float32, (g + 1) / 2 * 15 is exactly 6.5
    # (round half to even -> 6); unnormalized in float64 it is 6.5000003 (-> 7).
    g = np.float32(-0.1333333)
    assert (g + np.float32(1)) / np.float32(2) * np.float32(15) == np.float32(6.5)
    X = np.arange(16 * 4, dtype=np.float32).reshape(1, 1, 16, 4)
    grid = np.array([[[[-1.0, g], [1.0, g]]]], np.float32)  # (1, 1, 2, 2)
    Y = ref("GridSample", 16)(X, grid, align_corners=1, mode="nearest", padding_mode="border")
    np.testing.assert_array_equal(Y, [[[[24.0, 27.0]]]])  # row 6, columns 0 and 3
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    node = helper.make_node("GridSample", ["X", "G"], ["Y"], align_corners=1, mode="nearest",
                            padding_mode="border")
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, X.shape),
         helper.make_tensor_value_info("G", TensorProto.FLOAT, grid.shape)],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(Y, sess.run(None, {"X": X, "G": grid})[0])


@pytest.mark.parametrize("op_type,opset", [("Upsample", 9), ("Resize", 10), ("Resize", 13)])
def test_scaled_output_size_uses_float32_product_like_onnxruntime(op_type, opset):
    # torch exports interpolate(size=dynamic) at opset 9/10 as scales = float32(17 / 9); the
    # size must come out 17 (float32 product), not floor(16.9999995...) = 16.
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    X = np.random.default_rng(0).standard_normal((1, 2, 9, 5)).astype(np.float32)
    scales = np.array([1, 1, 17 / 9, 17 / 5], np.float32)
    inputs = ["X", "", "S"] if opset >= 11 else ["X", "S"]
    node = helper.make_node(op_type, inputs, ["Y"], mode="linear")
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, X.shape),
         helper.make_tensor_value_info("S", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]
                                ).run(None, {"X": X, "S": scales})[0]
    kernel = REGISTRY.resolve(op_type, "", opset)[0]
    Y = kernel(X, None, scales, mode="linear") if opset >= 11 else kernel(X, scales, mode="linear")
    assert Y.shape == want.shape == (1, 2, 17, 17)
    np.testing.assert_allclose(Y, want, rtol=1e-5, atol=1e-6)
