"""Gaussian random fields of a given power spectrum: :func:`gaussian_random_field`.

Collective over the grid; the ranks agree the seed and the layout first.  The field is made by
one :func:`~.transforms.rfftn` of white noise, a scaling of each rank's own block of
wavenumbers (no messages) and one :func:`~.transforms.irfftn`, then put back in the noise's
layout.  Example, on a 2x2 pencil grid::

    import numpy as np, disttensor as dt
    g = dt.ProcessGrid((2, 2))
    f = dt.fft.gaussian_random_field((64, 64, 64), lambda k: k ** -3.0, grid=g, seed=1)
"""
from __future__ import annotations

import numpy as np

from ..core.array import DistArray
from ..core.entry import agreed, collective_entry
from ..core.redistribute import redistribute_blocks
from ..routines.creation import _grid, layout_args
from .transforms import irfftn, rfftn

__all__ = ["gaussian_random_field"]


def _kmag(F: DistArray, shape):
    """|k| (cycles per sample) on ``F``'s local block, ``F`` an :func:`rfftn` of ``shape``."""
    sl = F.local_slices
    k2 = 0.0
    nd = len(shape)
    for t in range(nd):
        f = np.fft.rfftfreq(shape[t]) if t == nd - 1 else np.fft.fftfreq(shape[t])
        v = f[sl[t]]
        k2 = k2 + (v ** 2).reshape([-1 if u == t else 1 for u in range(nd)])
    return np.sqrt(k2)


@collective_entry
def gaussian_random_field(shape, power, grid=None, seed=0, split=None) -> DistArray:
    """A real Gaussian random field of spectrum ``power`` (collective).

    ``power(k)`` maps an array of wavenumbers ``|k|`` (cycles per sample, ``k > 0``) to the
    power spectrum.  The field is ``irfftn(rfftn(w) * sqrt(P(|k|)))`` with the ``k = 0`` mode
    set to zero (a zero-mean field) and ``w`` white noise ``N(0, 1)`` from
    ``disttensor.random.default_rng(seed).normal``, so ``E |rfftn(f)_k|^2 = N P(|k|)`` with
    ``N = prod(shape)``, and the field is the same (to rounding) on any grid and split.
    Output: float64 of ``shape`` with split ``split`` (default: the grid's default)."""
    from ..random import default_rng
    g = _grid(grid)
    with agreed(g.cart, "gaussian_random_field", seed=seed,
                **layout_args(shape, g, split, None)):
        if not callable(power):
            raise TypeError("power must be callable")
        shape = tuple(int(n) for n in shape)
        if len(shape) < 1 or any(n < 1 for n in shape):
            raise ValueError(f"shape must have positive extents, got {shape}")
    w = default_rng(seed).normal(0.0, 1.0, shape, grid=g, split=split)
    W = rfftn(w)
    k = _kmag(W, shape)
    amp = np.zeros_like(k)
    pos = k > 0
    amp[pos] = np.sqrt(power(k[pos]))
    W = DistArray(W.local * amp, W.distribution, W.grid)
    f = irfftn(W, s=shape)
    if f.distribution != w.distribution:
        f = DistArray(redistribute_blocks(g.cart, f.local, f.distribution, w.distribution),
                      w.distribution, g)
    return f
