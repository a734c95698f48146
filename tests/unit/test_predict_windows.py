"""The sliding-window geometry of ``disttensor.predict`` (pure NumPy): nnU-Net's window
origins, the Gaussian importance map, the blending denominator per block, and the options."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from disttensor.predict.arguments import output_kind, parse_args
from disttensor.predict.windows import (gaussian_importance, padded_extent, weight_block,
                                        window_boxes, window_starts)


def _nnunet_steps(image, tile, step):
    # nnU-Net v2's compute_steps_for_sliding_window, one axis
    target = tile * step
    n = int(np.ceil((image - tile) / target)) + 1
    actual = (image - tile) / (n - 1) if n > 1 else 99999999999
    return [int(np.round(actual * i)) for i in range(n)]


@pytest.mark.parametrize("size,window", [(8, 8), (9, 8), (13, 8), (16, 8), (17, 8),
                                         (64, 16), (100, 32), (33, 32)])
@pytest.mark.parametrize("step", [0.5, 0.25, 1.0])
def test_window_starts_match_nnunet(size, window, step):
    s = window_starts(size, window, step)
    assert s == _nnunet_steps(size, window, step)
    assert s[0] == 0 and s[-1] == size - window
    assert all(b - a <= step * window for a, b in zip(s, s[1:]))


def test_window_starts_bad_input():
    with pytest.raises(ValueError, match="does not fit"):
        window_starts(7, 8)
    with pytest.raises(ValueError, match="fraction"):
        window_starts(16, 8, 0)


def test_window_boxes_cover_the_volume():
    shape, window = (13, 10, 9), (8, 8, 8)
    boxes = window_boxes(shape, window)
    cover = np.zeros(shape, int)
    for b in boxes:
        assert all(s.stop - s.start == w for s, w in zip(b, window))
        cover[b] += 1
    assert cover.min() >= 1
    assert len(boxes) == 3 * 2 * 2


def test_gaussian_importance():
    g = gaussian_importance((8, 6, 5))
    assert g.shape == (8, 6, 5) and g.max() == 1.0 and g[4, 3, 2] == 1.0 and g.min() > 0
    # separable, sigma = window / 8 along each axis
    i = np.arange(8)
    np.testing.assert_allclose(g[:, 3, 2], np.exp(-(i - 4) ** 2 / (2 * 1.0 ** 2)))
    np.testing.assert_allclose(g, np.einsum("i,j,k->ijk", g[:, 3, 2], g[4, :, 2], g[4, 3, :]))
    assert gaussian_importance((4,), dtype=np.float32).dtype == np.float32


def test_weight_block_equals_the_global_sum():
    shape, window = (13, 10, 9), (8, 8, 4)
    boxes = window_boxes(shape, window)
    imp = gaussian_importance(window)
    full = np.zeros(shape)
    for b in boxes:
        full[b] += imp
    for lo in itertools.product((0, 3, 7), (0, 5), (0, 4)):
        block = tuple(slice(a, min(a + 6, n)) for a, n in zip(lo, shape))
        np.testing.assert_allclose(weight_block(block, boxes, imp), full[block])
    empty = weight_block((slice(3, 3), slice(0, 2), slice(0, 2)), boxes, imp)
    assert empty.shape == (0, 2, 2)


def test_padded_extent():
    assert padded_extent(13, 4) == 16 and padded_extent(16, 4) == 16
    assert padded_extent(5, 4, 8) == 8 and padded_extent(9, 1, 8) == 9


def test_options():
    args, rest = parse_args(["unet3d", "--checkpoint", "c.h5", "--data", "v.h5", "--out",
                             "a.h5", "b.zarr", "--mode", "sliding", "--unet-widths", "8,16:16,32"])
    assert args.out == ["a.h5", "b.zarr"] and args.mode == "sliding" and args.step == 0.5
    assert rest == ["--unet-widths", "8,16:16,32"]
    assert [output_kind(p) for p in ("x.csv", "x.H5", "x.hdf5", "x.zarr/")] == \
        ["csv", "hdf5", "hdf5", "zarr"]
    with pytest.raises(ValueError, match="unknown extension"):
        output_kind("x.txt")
