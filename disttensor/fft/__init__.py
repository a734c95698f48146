"""Distributed FFTs of DistArrays (the ``numpy.fft`` API, slab/pencil transposes).

Functions
---------
``fftn ifftn rfftn irfftn`` (``s``, ``axes``, ``norm``, ``out_split``), the 1-D forms
``fft ifft rfft irfft hfft ihfft`` (``n``, ``axis``), the 2-D forms ``fft2 ifft2 rfft2
irfft2``, ``fftfreq rfftfreq`` (distributed 1-D arrays), ``fftshift ifftshift`` and
:func:`gaussian_random_field`.  All are collective over the array's grid; the ranks agree on
every metadata argument before any data moves, and bad input raises the same NumPy-like
exception on every rank.  ``np.fft.fftn(x)`` and the other ``numpy.fft`` functions dispatch
here through ``__array_function__`` (:data:`HANDLED_FUNCTIONS`).  Semantics are NumPy 2's.

Modules (each docstring states its contract):

* :mod:`.transpose_plan` -- :func:`plan_transposes` (pure): which axes are transformed
  locally and which redistributions move a split out of the way (one per split transformed
  axis: one for a slab, two for a pencil), and the output layout that results.
* :mod:`.transforms` -- the transforms (N-d, 1-D, 2-D, Hermitian), their argument rules, cost
  and error bound.
* :mod:`.frequencies` -- ``fftfreq``, ``rfftfreq``, ``fftshift``, ``ifftshift``.
* :mod:`.random_field` -- :func:`gaussian_random_field`.
* :mod:`.numpy_dispatch` -- :data:`HANDLED_FUNCTIONS`.

Example: a Gaussian random field of spectrum ``P(k)`` on a 2x2 pencil grid::

    import numpy as np, disttensor as dt
    g = dt.ProcessGrid((2, 2))
    f = dt.fft.gaussian_random_field((64, 64, 64), lambda k: k ** -3.0, grid=g, seed=1)
    F = dt.fft.rfftn(f)   # split (None, 0, 1): pencils along axis 0

which is ``irfftn(rfftn(w) * sqrt(P(|k|)))`` for white noise ``w`` from
``disttensor.random.default_rng(seed).normal`` (the same field whatever the grid).
"""
from __future__ import annotations

from .frequencies import fftfreq, fftshift, ifftshift, rfftfreq
from .numpy_dispatch import HANDLED_FUNCTIONS
from .random_field import gaussian_random_field
from .transforms import (fft, fft2, fftn, hfft, ifft, ifft2, ifftn, ihfft, irfft, irfft2, irfftn,
                         rfft, rfft2, rfftn)
from .transpose_plan import plan_transposes

__all__ = ["fft", "ifft", "rfft", "irfft", "hfft", "ihfft", "fft2", "ifft2", "rfft2",
           "irfft2", "fftn", "ifftn", "rfftn", "irfftn", "fftfreq", "rfftfreq", "fftshift",
           "ifftshift", "plan_transposes", "gaussian_random_field", "HANDLED_FUNCTIONS"]
