"""Pure index math of read-time crops and augmentation (no MPI, no I/O).

A *view* says how one sample is seen in a batch: the crop window (``offset``, ``size`` in the
sample's spatial ``D,H,W`` coordinates), the flips of the crop's axes and a permutation of
them.  With ``X`` the whole sample ``(C, D, H, W)``, the sample as seen is::

    Xc = X[:, o0:o0+c0, o1:o1+c1, o2:o2+c2]                  # crop
    Xf = np.flip(Xc, [1 + a for a in range(3) if flips[a]])  # flips
    Xo = np.transpose(Xf, (0, 1 + perm[0], 1 + perm[1], 1 + perm[2]))

so output spatial axis ``a`` is crop axis ``perm[a]`` and the output spatial shape is
``(c[perm[0]], c[perm[1]], c[perm[2]])``.  :func:`read_box` turns a rank's output block (a box
in ``Xo``'s spatial coordinates) into the box of ``X`` to read (a hyperslab: the mirror image
of the block where an axis is flipped, the permuted axes' ranges), and :func:`orient` turns
the block read into the output block (a NumPy view: reversed strides and a transpose, no
copy).  So a flipped, permuted, spatially split sample costs no messages: every rank reads
exactly the elements of its own output block.  Label volumes (``D,H,W``) are seen through the
same view.

:func:`draw_view` draws a view from ``numpy.random.default_rng([seed, epoch, sample,
STREAM])``: crop offsets (uniform over the valid positions, per axis), then flips (each axis
with probability 1/2), then a permutation (uniform over the 6), always all three in that
order, whether used or not, so that switching augmentation on does not move the crops.  The
view is a function of ``(seed, epoch, sample)`` and the shapes only: the same on every rank
and on any grid.  Property-tested in ``tests/unit/test_io_augment.py`` against ``np.flip`` /
``np.transpose`` of whole arrays.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["View", "STREAM", "identity_view", "draw_view", "check_crop", "read_box", "orient",
           "apply_view"]

#: Fourth seed word of the view generator (keeps its draws apart from other uses of a seed).
STREAM = 0x61756720  # 'aug '


@dataclass(frozen=True)
class View:
    """Crop window ``offset``/``size`` (``D,H,W`` of the sample), ``flips`` of the crop's axes,
    ``perm``: output spatial axis ``a`` is crop axis ``perm[a]``."""

    offset: tuple[int, int, int]
    size: tuple[int, int, int]
    flips: tuple[bool, bool, bool] = (False, False, False)
    perm: tuple[int, int, int] = (0, 1, 2)

    @property
    def out_shape(self) -> tuple[int, int, int]:
        return tuple(self.size[p] for p in self.perm)

    @property
    def is_identity(self) -> bool:
        return not any(self.flips) and self.perm == (0, 1, 2)


def identity_view(spatial: Sequence[int]) -> View:
    return View((0, 0, 0), tuple(int(n) for n in spatial))


def check_crop(spatial: Sequence[int], crop: Sequence[int] | None, permute: bool = False):
    """The crop size (``spatial`` when ``crop`` is None) after checking it: 3 positive ints, no
    larger than the sample (``ValueError``), and cubic when axes are permuted (a permutation
    must not change the shape)."""
    spatial = tuple(int(n) for n in spatial)
    if crop is None:
        size = spatial
    else:
        if isinstance(crop, (int, np.integer)):
            crop = (int(crop),) * 3
        try:
            size = tuple(int(c) for c in crop)
            ok = len(size) == 3 and all(int(c) == c for c in crop)
        except (TypeError, ValueError):
            ok = False
        if not ok or min(size) < 1:
            raise ValueError(f"crop must be a positive int or 3 positive ints (D, H, W), got "
                             f"{crop!r}")
        if any(c > n for c, n in zip(size, spatial)):
            raise ValueError(f"crop {size} is larger than the samples' spatial shape "
                             f"{spatial}")
    if permute and len(set(size)) != 1:
        raise ValueError(f"axis permutations need cubic {'crops' if crop else 'samples'}, got "
                         f"{size}")
    return size


def draw_view(seed: int, epoch: int, sample: int, spatial: Sequence[int],
              size: Sequence[int], random_crop: bool = True, flip: bool = False,
              permute: bool = False) -> View:
    """The view of ``sample`` in ``epoch`` (see the module docstring).  ``random_crop=False``:
    the centred window ``(n - c) // 2``."""
    rng = np.random.default_rng([int(seed), int(epoch), int(sample), STREAM])
    spatial = tuple(int(n) for n in spatial)
    size = tuple(int(c) for c in size)
    room = [n - c + 1 for n, c in zip(spatial, size)]
    drawn = tuple(int(v) for v in rng.integers(0, room))
    flips = tuple(bool(v) for v in rng.integers(0, 2, 3))
    perm = tuple(int(v) for v in rng.permutation(3))
    offset = drawn if random_crop else tuple((n - c) // 2 for n, c in zip(spatial, size))
    return View(offset, size, flips if flip else (False,) * 3, perm if permute else (0, 1, 2))


def read_box(view: View, start: Sequence[int], stop: Sequence[int]) \
        -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(start, stop)`` in the whole sample's spatial coordinates of the elements that make the
    output block ``[start, stop)`` (output spatial coordinates, 3 axes)."""
    rs, re = [0, 0, 0], [0, 0, 0]
    for a in range(3):
        b = view.perm[a]                         # crop axis of output axis a
        lo, hi = int(start[a]), int(stop[a])
        if view.flips[b]:
            lo, hi = view.size[b] - hi, view.size[b] - lo
        rs[b], re[b] = view.offset[b] + lo, view.offset[b] + hi
    return tuple(rs), tuple(re)


def orient(view: View, block: np.ndarray, lead: int = 1) -> np.ndarray:
    """The output block from ``block``, the box :func:`read_box` named (``lead`` leading
    non-spatial axes, e.g. 1 for ``C``, 0 for a label volume): flips, then the permutation, as
    a view of ``block``."""
    if view.is_identity:
        return block
    idx = tuple([slice(None)] * lead + [slice(None, None, -1) if f else slice(None)
                                        for f in view.flips])
    out = block[idx]
    return np.transpose(out, tuple(range(lead)) + tuple(lead + p for p in view.perm))


def apply_view(view: View, sample: np.ndarray, lead: int = 1) -> np.ndarray:
    """The serial reference: the whole ``sample`` as seen through ``view`` (crop, ``np.flip``,
    ``np.transpose``)."""
    sl = tuple([slice(None)] * lead + [slice(o, o + c) for o, c in zip(view.offset, view.size)])
    x = sample[sl]
    axes = [lead + a for a in range(3) if view.flips[a]]
    if axes:
        x = np.flip(x, axes)
    return np.transpose(x, tuple(range(lead)) + tuple(lead + p for p in view.perm))
