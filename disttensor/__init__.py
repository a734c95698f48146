"""disttensor: NumPy-style distributed arrays over MPI process grids.

A :class:`DistArray` is a global N-d array whose blocks live on the ranks of a
:class:`ProcessGrid` under an explicit block :class:`Distribution`.  This namespace holds the
NumPy-style functions (``dt.zeros``, ``dt.sum``, ``dt.concatenate``, ``dt.matmul``, ...) and
``dt.linalg``, ``dt.fft``, ``dt.random``, ``dt.npyio``; the other subpackages load when imported
(``import disttensor.nn``): ``array_api``, ``ops`` (distributed CNN ops), ``autograd``, ``nn``,
``io`` (parallel HDF5), ``sparse`` (Compressed Sparse Blocks matrices).

Where things live: ``docs/architecture.md`` (the layers in import order: ``core/`` the
foundation, ``routines/`` the NumPy front by the sections of NumPy's manual, then ``linalg/``,
``fft/``, ``ops/``, ``io/``, ``sparse/``, ``autograd/``, ``nn/``, ``train/``); the array library:
``docs/arrays.md``; training: ``docs/training.md``.
"""
import os as _os
import sys as _sys

if "numpy" not in _sys.modules:
    # OpenBLAS reads this when NumPy loads it: idle BLAS threads then sleep almost at once
    # instead of spinning against the Numba threads of the CPU kernels, which alternate with
    # GEMMs (~1.3x faster convolutions on 2 cores, bench/README.md).  Only when NumPy is not
    # loaded yet and the user did not choose.
    _os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

from numpy import (absolute, abs, add, arccos, arcsin, arctan, arctan2, ceil, clip, conj, cos,
                   cosh, divide, equal, exp, expm1, floor, floor_divide, fmax, fmin, greater,
                   greater_equal, hypot, isfinite, isinf, isnan, less, less_equal, log, log10,
                   log1p, log2, logical_and, logical_not, logical_or, logical_xor, maximum,
                   minimum, mod, multiply, negative, not_equal, power, reciprocal, remainder,
                   rint, sign, sin, sinh, sqrt, square, subtract, tan, tanh, true_divide, trunc)

from .core import watchdog as _watchdog  # noqa: F401  (DISTTENSOR_COLLECTIVE_TIMEOUT, at import)
from .core.agreement import ArgumentMismatchError
from .core.array import DistArray
from .core.comm import CollectiveError
from .core.distribution import Distribution
from .core.grid import ProcessGrid, get_default_grid, set_default_grid
from .core.halo import HaloExchange
from .core.profiler import profile  # the step profiler: with dt.profile(grid) as prof: ...
from .routines import npyio  # parallel .npy: dt.npyio.save / dt.npyio.load
from .routines.creation import (arange, empty, empty_like, eye, from_global, full, full_like,
                                linspace, meshgrid, ones, ones_like, tril, triu, zeros,
                                zeros_like)
from .routines.logic import allclose, array_equal, isclose
from .routines.manipulation import (broadcast_arrays, broadcast_to, concatenate, expand_dims,
                                    flip, moveaxis, repeat, reshape, roll, squeeze, stack,
                                    swapaxes, tile, transpose, unstack)
from .routines.manipulation import (array_split, atleast_1d, atleast_2d, atleast_3d,
                                    column_stack, dsplit, dstack, hsplit, hstack, ravel, rot90,
                                    split, vsplit, vstack)
from .routines.padding import pad
from .routines.fancy_indexing import put
from .routines.blocks import apply_along_axis, map_blocks
from .routines.stencils import map_overlap
from .routines.reductions import (all, any, max, mean, min, nanmax, nanmean, nanmin, nanprod,
                                  nanstd, nansum, nanvar, prod, std, sum, var)
from .routines.scans import cumprod, cumsum, cumulative_prod, cumulative_sum
from .routines.searching import (argmax, argmin, argwhere, count_nonzero, nanargmax, nanargmin,
                                 nonzero, searchsorted, where)
from .routines.sets import unique, unique_all, unique_counts, unique_inverse, unique_values
from .routines.sorting import argpartition, argsort, lexsort, partition, sort, sort_complex
from .routines.statistics import (median, nanmedian, nanpercentile, nanquantile, percentile,
                                  quantile)
from .routines.histograms import (bincount, digitize, histogram, histogram2d, histogram_bin_edges,
                                  histogramdd)
from .routines.averages import average, corrcoef, cov, ptp
from .routines.calculus import convolve, gradient, interp, nan_to_num, trapezoid
from .routines.indexing import take
from .routines.mathematical import diff, round  # noqa: A004  (NumPy's names)
from numpy import (bitwise_and, bitwise_invert, bitwise_left_shift, bitwise_not, bitwise_or,
                   bitwise_right_shift, bitwise_xor, invert, left_shift, right_shift)
from numpy import (bool, complex64, complex128, float16, float32, float64,  # noqa: A004
                   int8, int16, int32, int64, intp, uint8, uint16, uint32, uint64)
from numpy import e, inf, nan, newaxis, pi
from . import fft, linalg, random  # NumPy's subpackages: dt.fft, dt.linalg, dt.random
from .linalg import einsum, matmul, tensordot, vecdot
from .linalg import inner, kron, outer

__version__ = "0.1.0"


def from_local(local, grid=None, split=None, sizes=None, distribution=None) -> DistArray:
    """Wrap per-rank blocks into a DistArray (collective); see :meth:`DistArray.from_local`."""
    return DistArray.from_local(local, grid=grid, split=split, sizes=sizes, distribution=distribution)


def redistribute(x: DistArray, grid=None, split=None, sizes=None, distribution=None) -> DistArray:
    return x.redistribute(grid=grid, split=split, sizes=sizes, distribution=distribution)


def astype(x: DistArray, dtype) -> DistArray:
    return x.astype(dtype)


def asarray(a, dtype=None, *, grid=None, split=None, sizes=None, device=None,
            copy=None) -> DistArray:
    """NumPy's ``asarray`` for DistArrays (collective).  A DistArray is returned as it is, cast
    to ``dtype``, moved to ``device`` or redistributed to ``grid``/``split``/``sizes`` when
    those are given (``copy=True`` copies it); anything else (a NumPy array, nested lists, a
    scalar: the same value on every rank) is distributed with :func:`from_global` (split along
    axis 0 of the default grid unless ``grid``/``split`` say otherwise).  ``copy=False`` with
    data that is not a DistArray raises ``ValueError`` (it is always copied)."""
    import numpy as _np
    if isinstance(a, DistArray):
        y = a
        if dtype is not None and _np.dtype(dtype) != y.dtype:
            y = y.astype(dtype)
        if device is not None and device != y.device:
            y = y.to_device(device)
        if grid is not None or split is not None or sizes is not None:
            y = y.redistribute(grid=grid, split=split, sizes=sizes)
        return y.copy() if copy and y is a else y
    if copy is False:
        raise ValueError("asarray(copy=False): data that is not a DistArray is always copied")
    return from_global(_np.asarray(a, dtype=dtype), grid=grid, split=split, sizes=sizes,
                       device="cpu" if device is None else device)
