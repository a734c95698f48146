"""Index math of the resampling ops (interpolation, adaptive pooling), pure and MPI-free.

Along one axis such an op maps an input of extent ``n`` to ``m`` outputs; output ``o`` reads
the inputs ``[lo[o], hi[o])`` (its interpolation taps, or its adaptive-pooling bin), and both
bounds are non-decreasing in ``o``.  :class:`AxisMap` holds those bounds and an ownership key.

**Ownership.**  Output ``o`` belongs to the block that owns input ``key[o]``, a non-decreasing
index in ``[0, n)``, so every block gets one contiguous (possibly empty) run of outputs and no
output is computed twice:

* interpolation: the input cell holding the output cell's *centre* in the input's
  coordinates, ``floor((2o + 1) n / (2m))`` -- the same for every mode and for either
  ``align_corners``, and for an integer factor ``f`` exactly the block ``[a f, b f)`` of the
  input block ``[a, b)`` (so an upsampled array lines up with its skip connection);
* adaptive pooling: the centre cell of bin ``o``, ``(lo[o] + hi[o] - 1) // 2``, where
  ``lo[o] = floor(o n / m)`` and ``hi[o] = ceil((o + 1) n / m)`` (PyTorch's bins).

**Input halo** (:meth:`AxisMap.halo`): what a block's outputs read outside the block, the
largest need over the blocks (one width per side serves all, as
:class:`disttensor.core.halo.HaloExchange` takes it).  **Output halo**
(:meth:`AxisMap.out_halo`): the outputs other blocks own whose reads meet a block's cells;
an op that sums partial results (adaptive average pooling) adds them into their owners with
the reverse halo exchange of the output, whose adjoint (the forward exchange) is its backward.

The source coordinates follow PyTorch's kernels (``UpSample.h``): nearest and nearest-exact
index in float32 arithmetic as PyTorch does, linear in float64.
"""
from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np

__all__ = ["AxisMap", "adaptive_map", "interp_map", "adaptive_bins", "linear_taps",
           "nearest_index", "interp_scale", "centre_keys"]


@dataclass(frozen=True)
class AxisMap:
    """Output ``o`` of ``m`` reads inputs ``[lo[o], hi[o])`` of ``n`` and is owned by the block
    owning ``key[o]`` (all three non-decreasing; ``lo < hi``)."""

    n: int
    lo: tuple[int, ...]
    hi: tuple[int, ...]
    key: tuple[int, ...]

    @property
    def m(self) -> int:
        return len(self.key)

    def output_offsets(self, in_offsets: Sequence[int]) -> tuple[int, ...]:
        """Output block offsets for input block offsets ``(0, ..., n)`` (same length)."""
        return tuple(bisect_left(self.key, a) if a < self.n else self.m for a in in_offsets)

    def read_range(self, o0: int, o1: int) -> tuple[int, int]:
        """Inputs read by outputs ``[o0, o1)`` (``o0 < o1``)."""
        return self.lo[o0], self.hi[o1 - 1]

    def touched(self, a: int, b: int) -> tuple[int, int]:
        """The outputs ``[p0, p1)`` whose reads meet the inputs ``[a, b)`` (``a < b``)."""
        return bisect_right(self.hi, a), bisect_left(self.lo, b)

    def halo(self, in_offsets: Sequence[int]) -> tuple[int, int]:
        """One ``(lo, hi)`` input halo serving every block of the split ``in_offsets``."""
        out = self.output_offsets(in_offsets)
        need_lo = need_hi = 0
        for a, b, o0, o1 in zip(in_offsets[:-1], in_offsets[1:], out[:-1], out[1:]):
            if o1 > o0:
                r0, r1 = self.read_range(o0, o1)
                need_lo, need_hi = max(need_lo, a - r0), max(need_hi, r1 - b)
        return need_lo, need_hi

    def out_halo(self, in_offsets: Sequence[int]) -> tuple[int, int]:
        """One ``(lo, hi)`` output halo holding, on every block, the outputs its cells
        contribute to but another block owns."""
        out = self.output_offsets(in_offsets)
        need_lo = need_hi = 0
        for a, b, o0, o1 in zip(in_offsets[:-1], in_offsets[1:], out[:-1], out[1:]):
            if b > a:
                p0, p1 = self.touched(a, b)
                need_lo, need_hi = max(need_lo, o0 - p0), max(need_hi, p1 - o1)
        return need_lo, need_hi


def centre_keys(n: int, m: int) -> tuple[int, ...]:
    """``floor((2o + 1) n / (2m))`` for ``o < m``: the input cell holding each output cell's
    centre."""
    return tuple((2 * o + 1) * n // (2 * m) for o in range(m))


def adaptive_bins(n: int, m: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """PyTorch's adaptive-pooling bins: ``floor(o n / m)`` .. ``ceil((o + 1) n / m)``."""
    lo = tuple(o * n // m for o in range(m))
    hi = tuple(-(-(o + 1) * n // m) for o in range(m))
    return lo, hi


@lru_cache(maxsize=512)
def adaptive_map(n: int, m: int) -> AxisMap:
    """The :class:`AxisMap` of adaptive pooling of ``n`` inputs into ``m`` bins (``n, m >= 1``;
    ``m > n`` repeats cells, as PyTorch's)."""
    lo, hi = adaptive_bins(n, m)
    return AxisMap(n, lo, hi, tuple((a + b - 1) // 2 for a, b in zip(lo, hi)))


def interp_scale(n: int, m: int, scale_factor: float | None, align_corners: bool) -> float:
    """PyTorch's ``area_pixel_compute_scale`` (float64): ``(n-1)/(m-1)`` with
    ``align_corners`` (0 for one output), else ``1/scale_factor`` when a scale factor is used,
    else ``n/m``."""
    if align_corners:
        return (n - 1) / (m - 1) if m > 1 else 0.0
    if scale_factor is not None and scale_factor > 0:
        return 1.0 / scale_factor
    return n / m


def nearest_index(n: int, m: int, scale_factor: float | None, exact: bool,
                  shortcuts: bool = False) -> np.ndarray:
    """Source index of every output of nearest (``exact``: nearest-exact) interpolation,
    PyTorch's ``nearest_idx`` / ``nearest_neighbor_exact_compute_source_index`` in float32.
    ``shortcuts``: PyTorch's 2-D nearest kernel copies an axis with ``m == n`` and halves
    ``o`` where ``m == 2n`` whatever the scale factor (its 1-D and 3-D kernels do not)."""
    o = np.arange(m)
    if shortcuts and not exact and m == n:
        return o
    if shortcuts and not exact and m == 2 * n:
        return o >> 1
    s = np.float32(1.0 / scale_factor) if scale_factor is not None and scale_factor > 0 \
        else np.float32(n) / np.float32(m)
    pos = (o.astype(np.float32) + np.float32(0.5)) * s if exact else o.astype(np.float32) * s
    return np.minimum(np.floor(pos).astype(np.int64), n - 1)


def linear_taps(n: int, m: int, scale_factor: float | None, align_corners: bool):
    """``(i0, i1, w0, w1)`` of every output of linear interpolation (PyTorch's
    ``compute_indices_weights_linear``): output = ``w0 x[i0] + w1 x[i1]``."""
    scale = interp_scale(n, m, scale_factor, align_corners)
    o = np.arange(m, dtype=np.float64)
    src = scale * o if align_corners else np.maximum(scale * (o + 0.5) - 0.5, 0.0)
    i0 = src.astype(np.int64)
    w1 = np.clip(src - i0, 0.0, 1.0)
    i1 = i0 + (i0 < n - 1)
    return i0, i1, 1.0 - w1, w1


@lru_cache(maxsize=512)
def interp_map(n: int, m: int, mode: str, scale_factor: float | None,
               align_corners: bool, shortcuts: bool = False) -> AxisMap:
    """The :class:`AxisMap` of interpolating ``n`` inputs to ``m`` outputs; ``mode``
    ``'nearest'``, ``'nearest-exact'`` or ``'linear'``; ``scale_factor``: the factor PyTorch's
    kernel uses (``None`` when the size decides); ``shortcuts``: see :func:`nearest_index`."""
    if mode == "linear":
        i0, i1, _, _ = linear_taps(n, m, scale_factor, align_corners)
        lo, hi = i0, i1 + 1
    else:
        i0 = nearest_index(n, m, scale_factor, mode == "nearest-exact", shortcuts)
        lo, hi = i0, i0 + 1
    return AxisMap(n, tuple(int(v) for v in lo), tuple(int(v) for v in hi), centre_keys(n, m))


def output_extent(n: int, scale_factor: float) -> int:
    """PyTorch's output extent for a scale factor: ``floor(n * scale_factor)``."""
    return int(math.floor(float(n) * scale_factor))
