"""ChannelShuffle (channels last): the fast variant against the reference and a direct index map."""

from __future__ import annotations

import numpy as np
import pytest

from opwarden import native
from opwarden.errors import KernelError, OpwardenError
from opwarden.kernels.cpu.shuffle import channel_shuffle
from opwarden.ops.fused import ChannelShuffle


@pytest.mark.parametrize(
    "shape, group, dtype",
    [
        ((1, 56, 56, 112), 4, np.float32),
        ((2, 3, 5, 12), 3, np.float32),
        ((2, 3, 5, 12), 12, np.float64),
        ((4, 6), 2, np.int64),
        ((7,), 1, np.float32),
        ((0, 3, 8), 2, np.float32),
    ],
)
def test_fast_matches_reference_and_index_map(shape, group, dtype):
    x = (np.arange(np.prod(shape)) % 251).astype(dtype).reshape(shape)
    c = shape[-1]
    idx = np.array([(p % group) * (c // group) + p // group for p in range(c)])
    want = x[..., idx]  # Y[..., j*g + i] = X[..., i*(C/g) + j]
    np.testing.assert_array_equal(ChannelShuffle(x, group=group), want)
    out = np.empty_like(x)
    got = channel_shuffle(x, group=group, out=out)
    assert got is out
    np.testing.assert_array_equal(got, want)
    # A strided (non-contiguous) input view gives the same result.
    xs = np.repeat(x, 2, axis=0)[::2]
    np.testing.assert_array_equal(channel_shuffle(xs, group=group), want)


@pytest.mark.skipif(not native.available(), reason="compiled path off")
@pytest.mark.parametrize("group", [2, 3, 4, 5, 8])  # the constant-group loops and the general
@pytest.mark.parametrize("shape", [(1, 14, 14, 120), (3, 7, 360), (2, 1, 1, 240)])
def test_compiled_shuffle_is_the_numpy_copies(shape, group, monkeypatch):
    rng = np.random.default_rng(group)
    x = rng.standard_normal(shape).astype(np.float32)
    x.reshape(-1)[::7] = np.nan  # (a copy: NaN bits pass as they are)
    got = channel_shuffle(x, group=group, out=np.empty_like(x))
    monkeypatch.setattr(native, "available", lambda: False)
    want = channel_shuffle(x, group=group, out=np.empty_like(x))  # the NumPy copies
    assert got.tobytes() == want.tobytes()
    c = shape[-1]
    idx = np.array([(p % group) * (c // group) + p // group for p in range(c)])
    assert want.tobytes() == x[..., idx].tobytes()


@pytest.mark.parametrize("fn", [ChannelShuffle, channel_shuffle])
def test_group_must_divide_channels(fn):
    with pytest.raises(KernelError, match="divisible by group=5") as e:
        fn(np.zeros((2, 12), np.float32), group=5)
    assert isinstance(e.value, OpwardenError)


@pytest.mark.parametrize("group", [1, 2, 3, 4, 12])
def test_gradient_is_the_inverse_shuffle(group):
    from opwarden.verify import gradcheck

    x = np.random.default_rng(group).standard_normal((2, 3, 12))
    result = gradcheck(ChannelShuffle, [x], {"group": group})
    assert result.ok, result.detail


@pytest.mark.parametrize("shape, group", [((2, 5, 7, 12), 3), ((9, 12), 4), ((2, 2, 3, 5, 8), 2)])
def test_banded_copies_into_padded_and_strided_outputs(shape, group, monkeypatch):
    """Per-group copies in bands (tiny bands here, so every band boundary is crossed) into the
    interior of a padded buffer and into a view with a strided last axis."""
    from opwarden.kernels.cpu import shuffle as ks

    monkeypatch.setattr(ks, "BAND_BYTES", 64)
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    want = ChannelShuffle(x, group=group)
    pad = np.zeros(tuple(d + 2 for d in shape[:-1]) + shape[-1:], np.float32)
    interior = tuple(slice(1, -1) for _ in shape[:-1])
    ks.shuffle_into(x, group, pad[interior])
    np.testing.assert_array_equal(pad[interior], want)
    border = np.ones(pad.shape, bool)
    border[interior] = False
    assert not pad[border].any()  # nothing written outside the interior
    wide = np.zeros(shape[:-1] + (2 * shape[-1],), np.float32)
    ks.shuffle_into(x, group, wide[..., ::2])
    np.testing.assert_array_equal(wide[..., ::2], want)
    assert not wide[..., 1::2].any()
