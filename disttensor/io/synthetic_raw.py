"""Synthetic samples in the raw CosmoFlow format: int16 particle counts drawn from a log-normal
density field (``python -m disttensor.io.synthetic --layout raw``).

The raw format
--------------
The NERSC "cosmoUniverse" files of CosmoFlow (the ones LBANN's Distconv and the MLPerf HPC
preparation scripts read) hold one universe per HDF5 file: ``full``, a ``D,H,W,C`` int16 array
of particle counts per voxel (``C = 4`` redshifts, ``512^3`` voxels), and ``unitPar``, the 4
cosmological parameters scaled to a unit range.  :class:`~disttensor.io.SampleDataset` reads
them with ``channels_last=True`` (each rank its ``D,H,W,C`` hyperslab, transposed locally),
typically with ``dtype='float32'``, ``log1p=True`` (or ``divide_by_mean=True``) and crops.

The synthetic model
-------------------
Sample ``i`` has four parameters drawn uniformly in :data:`RAW_PARAM_RANGES` (mapped linearly
to the targets ``unitPar`` in ``[-1, 1]``, in the order of :data:`RAW_PARAM_NAMES`):

* ``g_c``: the unit-variance Gaussian random field of the regression task
  (:func:`~disttensor.io.synthetic.transfer_functions`: power-law spectrum of index ``slope``,
  smoothed at ``sigma * c / 2`` for channel ``c``; one white-noise realization for all
  channels, periodic ``size^3`` grid);
* the density ``rho_c = DENSITY * exp(a_c * g_c - a_c^2 / 2)`` (log-normal, mean
  :data:`RAW_DENSITY` = 32 particles per voxel), whose log-density standard deviation
  ``a_c = amplitude * (1 + growth * c / (C - 1))`` grows from channel to channel as structure
  grows between CosmoFlow's redshifts;
* the counts ``x_c ~ Poisson(rho_c)`` per voxel, clipped to ``[0, 32767]`` (int16).

So every target drives the field's statistics: ``amplitude`` the spread of ``log(1 + x)``,
``growth`` how that spread changes across the channels, ``slope`` and ``sigma`` its two-point
correlation across scales and channels (what the regression task's targets drive, seen through
shot noise).  A linear fit on
summary statistics of ``log(1 + x)`` explains most of each target's variance on held-out
samples (``tests/unit/test_io_synthetic_raw.py``).

Sample ``i`` is a pure function of ``(seed, i, size, channels)``
(``numpy.random.default_rng([seed, i, 2])``): any number of ranks writes the same files.
"""
from __future__ import annotations

import numpy as np

__all__ = ["RAW_PARAM_NAMES", "RAW_PARAM_RANGES", "RAW_DENSITY", "RAW_DTYPE",
           "synthetic_raw_sample"]

RAW_PARAM_NAMES = ("sigma", "amplitude", "slope", "growth")
#: Ranges the parameters are drawn from: smoothing scale (voxels), standard deviation of the
#: log-density in channel 0, spectral index, relative growth of that deviation up to the last
#: channel.
RAW_PARAM_RANGES = {"sigma": (1.0, 3.0), "amplitude": (0.3, 0.8), "slope": (-3.0, 0.0),
                    "growth": (0.0, 1.0)}
#: Mean particles per voxel.
RAW_DENSITY = 32.0
#: dtype of the counts (as in the cosmoUniverse files).
RAW_DTYPE = np.dtype(np.int16)
_RAW_STREAM = 2  # third seed word


def synthetic_raw_sample(index: int, size: int = 64, channels: int = 4,
                         seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Sample ``index``: counts ``x`` of shape ``(size, size, size, channels)`` (``D,H,W,C``,
    int16) and targets ``unitPar`` of shape ``(4,)`` (float32); see the module docstring."""
    from .synthetic import transfer_functions
    if index < 0 or seed < 0:
        raise ValueError(f"index and seed must be >= 0, got {index}, {seed}")
    if size < 2 or channels < 1:
        raise ValueError(f"need size >= 2 and channels >= 1, got {size}, {channels}")
    rng = np.random.default_rng([int(seed), int(index), _RAW_STREAM])
    u = rng.uniform(size=len(RAW_PARAM_NAMES))
    p = {n: RAW_PARAM_RANGES[n][0] + ui * (RAW_PARAM_RANGES[n][1] - RAW_PARAM_RANGES[n][0])
         for n, ui in zip(RAW_PARAM_NAMES, u)}
    f = np.fft.rfftn(rng.standard_normal((size,) * 3))
    tf = transfer_functions(size, channels, p["sigma"], p["slope"])
    x = np.empty((size,) * 3 + (channels,), dtype=RAW_DTYPE)
    for c in range(channels):
        a = p["amplitude"] * (1.0 + p["growth"] * c / max(channels - 1, 1))
        g = np.fft.irfftn(f * tf[c], s=(size,) * 3, axes=(0, 1, 2))
        rho = RAW_DENSITY * np.exp(a * g - 0.5 * a * a)
        x[..., c] = np.minimum(rng.poisson(rho), np.iinfo(RAW_DTYPE).max)
    return x, (2.0 * u - 1.0).astype(np.float32)
