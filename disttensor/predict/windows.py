"""The geometry of nnU-Net's sliding-window inference (pure NumPy, no communication).

* :func:`window_starts`: the window origins along one axis, nnU-Net v2's
  ``compute_steps_for_sliding_window``: ``n = ceil((size - window) / (step * window)) + 1``
  windows whose origins ``round(i * (size - window) / (n - 1))`` spread evenly from 0 to
  ``size - window`` (so the last window ends at the volume's edge and neighbours overlap by
  at least ``1 - step`` of a window);
* :func:`window_boxes`: every window of a volume, as global slices, in C order;
* :func:`gaussian_importance`: the importance map of one window, a separable Gaussian
  ``exp(-sum_a (i_a - c_a)**2 / (2 sigma_a**2))`` with centre ``c_a = window_a // 2`` and
  ``sigma_a = sigma_scale * window_a`` (nnU-Net: 1/8), maximum 1 at the centre, positive
  everywhere (nnU-Net's ``gaussian_filter`` of a delta, without its truncation at 4 sigma);
* :func:`weight_block`: the summed importance of all windows over one box of the volume
  (each rank computes its own block's denominator of the blending, no message).
"""
from __future__ import annotations

import itertools
import math

import numpy as np

__all__ = ["window_starts", "window_boxes", "gaussian_importance", "weight_block",
           "padded_extent"]


def window_starts(size: int, window: int, step: float = 0.5) -> list[int]:
    """Origins of the windows of extent ``window`` covering ``0..size`` with a step of
    ``step * window`` at most (``size >= window >= 1``, ``0 < step <= 1``)."""
    if window < 1 or size < window:
        raise ValueError(f"a window of {window} voxels does not fit an axis of {size}")
    if not 0 < step <= 1:
        raise ValueError(f"the window step is a fraction in (0, 1], got {step}")
    n = int(math.ceil((size - window) / (step * window))) + 1
    if n == 1:
        return [0]
    actual = (size - window) / (n - 1)
    return [int(np.round(actual * i)) for i in range(n)]


def window_boxes(shape, window, step: float = 0.5) -> list[tuple[slice, ...]]:
    """Every window of the spatial ``shape`` (``window`` per axis), as global slices."""
    per_axis = [window_starts(n, w, step) for n, w in zip(shape, window)]
    return [tuple(slice(s, s + w) for s, w in zip(starts, window))
            for starts in itertools.product(*per_axis)]


def gaussian_importance(window, sigma_scale: float = 1.0 / 8, dtype=np.float64) -> np.ndarray:
    """The importance map of a window of extents ``window`` (see the module docstring)."""
    out = np.ones((), dtype=np.float64)
    for w in window:
        i = np.arange(w, dtype=np.float64)
        sigma = sigma_scale * w
        g = np.exp(-((i - w // 2) ** 2) / (2 * sigma ** 2))
        out = np.multiply.outer(out, g)
    return out.astype(dtype)


def weight_block(block: tuple[slice, ...], boxes, importance: np.ndarray) -> np.ndarray:
    """The sum of ``importance`` placed at every window of ``boxes`` over the region
    ``block`` (global slices with step 1) of the volume: the blending's denominator there."""
    out = np.zeros(tuple(s.stop - s.start for s in block), dtype=np.float64)
    for box in boxes:
        lo = [max(b.start, w.start) for b, w in zip(block, box)]
        hi = [min(b.stop, w.stop) for b, w in zip(block, box)]
        if any(h <= l for l, h in zip(lo, hi)):
            continue
        dst = tuple(slice(l - b.start, h - b.start) for l, h, b in zip(lo, hi, block))
        src = tuple(slice(l - w.start, h - w.start) for l, h, w in zip(lo, hi, box))
        out[dst] += importance[src]
    return out


def padded_extent(size: int, multiple: int, at_least: int = 1) -> int:
    """``size`` rounded up to a multiple of ``multiple``, and at least ``at_least``."""
    n = max(size, at_least)
    return -(-n // multiple) * multiple
