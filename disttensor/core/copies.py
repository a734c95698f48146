"""Fast copies and zero fills of strided boxes of NumPy arrays (halo faces, redistribution
pieces): local, no MPI.

NumPy's copy loops over the innermost axis; when that is a short contiguous run (a halo face
of width 3 along the last axis: 3 elements per row), the per-row overhead dominates (measured
5x slower than needed).  Here the trailing axes contiguous in both arrays are merged into one
void element, so the loop runs once per run with a fixed-size memcpy.  :func:`copy_into`
(one copy) merges only where the runs lie within the last axis (a box cut along it): where
they span several trailing axes (a box cut along an outer axis: a depth face, the owned part
of a depth window), NumPy merges those axes itself and its own copy is the faster one (2-4x on
such boxes of 16-512 KiB, the merged views alone costing some 8 us a copy).
:func:`copier` and :func:`zero_filler` make the merged views once, for views copied or zeroed
many times (a persistent exchange's pieces), where the void copy is as fast or faster on any
box.  Re-exported by :mod:`disttensor.core.comm`.
"""
from __future__ import annotations

import functools
import math

import numpy as np

__all__ = ["copy_into", "copier", "into", "fill_zero", "zero_filler"]


def _trailing_run_axis(a: np.ndarray) -> int:
    """Smallest ``k`` such that axes ``k..ndim-1`` of ``a`` form one contiguous run."""
    k, expected = a.ndim, a.itemsize
    while k > 0 and (a.shape[k - 1] == 1 or a.strides[k - 1] == expected):
        expected *= a.shape[k - 1]
        k -= 1
    return k


def _merged_axis(dst: np.ndarray, src: np.ndarray) -> int | None:
    """The axis from which the trailing axes of ``dst`` and ``src`` (same shape) are merged
    into runs (:func:`_as_runs`), or ``None`` where NumPy's own copy is as fast: the runs
    common to both arrays must lie within the last axis (NumPy merges contiguous trailing
    axes by itself) and be longer than one element."""
    k = max(_trailing_run_axis(dst), _trailing_run_axis(src))
    n = dst.ndim
    if k != n - 1 or dst.shape[-1] <= 1:
        return None
    return k


def _as_runs(a: np.ndarray, k: int) -> np.ndarray:
    """View of ``a`` whose axes ``k..`` (contiguous) are one void element each."""
    run = math.prod(a.shape[k:])
    try:  # (a reshape that must not copy: half the cost of as_strided, ~4 against ~8 us)
        merged = np.reshape(a, a.shape[:k] + (run,), copy=False)
    except (ValueError, TypeError):   # (a NumPy without reshape's copy argument)
        merged = np.lib.stride_tricks.as_strided(a, shape=a.shape[:k] + (run,),
                                                 strides=a.strides[:k] + (a.itemsize,))
    return merged.view(np.dtype((np.void, run * a.itemsize)))


def copy_into(dst, src) -> None:
    """``dst[...] = src`` for arrays of the same shape and dtype, fast for strided boxes.

    NumPy's copy loops over the innermost axis; when that is a short contiguous run (a halo
    face of width 3 along the last axis: 3 elements per row), the per-row overhead dominates
    (measured 5x slower than needed).  Here the trailing axes contiguous in both arrays are
    merged into one void element, so the loop runs once per run with a fixed-size memcpy."""
    if (type(dst) is np.ndarray and type(src) is np.ndarray and dst.shape == src.shape
            and dst.dtype == src.dtype and not dst.dtype.hasobject and dst.ndim
            and not (dst.flags.c_contiguous and src.flags.c_contiguous)):
        k = _merged_axis(dst, src)
        if k is not None:
            np.copyto(_as_runs(dst, k), _as_runs(src, k))
            return
    dst[...] = src


def copier(dst, src):
    """A function of no arguments doing :func:`copy_into` ``(dst, src)``, for a pair of views
    copied many times (a persistent exchange's pack and unpack): the merged-run views are made
    once here instead of at every copy (``as_strided`` and the run search cost ~8 us a copy)."""
    if (type(dst) is np.ndarray and type(src) is np.ndarray and dst.shape == src.shape
            and dst.dtype == src.dtype and not dst.dtype.hasobject and dst.ndim):
        if not (dst.flags.c_contiguous and src.flags.c_contiguous):
            # (made once: the merged views cost nothing per copy, and the void copy beats
            # NumPy's own loop on short runs whichever axis cuts the box)
            k = max(_trailing_run_axis(dst), _trailing_run_axis(src))
            if k < dst.ndim and math.prod(dst.shape[k:]) > 1:
                return functools.partial(np.copyto, _as_runs(dst, k), _as_runs(src, k))
        return functools.partial(np.copyto, dst, src)
    return functools.partial(copy_into, dst, src)


def into(dst):
    """A function of one array ``src`` doing ``dst[...] = src``, for a view ``dst`` filled
    many times from different sources (the interior of a pooled halo'd buffer).  Where
    ``dst``'s contiguous runs lie within its last axis (a halo on the last axis), its
    merged-run view is made once and a C-contiguous source of the same shape and dtype is
    viewed as runs at each call: the void copy beats NumPy's own loop on such boxes
    (64-byte rows of 4x16x8x16x16 float32: 26 against 49 us).  Elsewhere (runs spanning
    several axes, which NumPy merges itself) and for any other source it is NumPy's copy or
    :func:`copy_into`."""
    if type(dst) is np.ndarray and dst.ndim and not dst.dtype.hasobject \
            and not dst.flags.c_contiguous and dst.shape[-1] > 1 \
            and _trailing_run_axis(dst) == dst.ndim - 1:
        k = dst.ndim - 1
        runs = _as_runs(dst, k)
        shape, dtype = dst.shape, dst.dtype

        def fill(src) -> None:
            if type(src) is np.ndarray and src.shape == shape and src.dtype == dtype \
                    and src.flags.c_contiguous:
                np.copyto(runs, src.view(runs.dtype))
            else:
                copy_into(dst, src)
        return fill
    if type(dst) is np.ndarray:
        return functools.partial(np.copyto, dst)
    return functools.partial(copy_into, dst)


def zero_filler(a):
    """A function of one ignored argument doing :func:`fill_zero` ``(a)``, the merged-run view
    made once (for a view zeroed many times, as :func:`copier`)."""
    if type(a) is np.ndarray and a.ndim and not a.flags.c_contiguous and not a.dtype.hasobject:
        k = _trailing_run_axis(a)
        if k < a.ndim and math.prod(a.shape[k:]) > 1:
            v = _as_runs(a, k)
            zero = np.zeros((), dtype=v.dtype)
            return lambda value: v.__setitem__(Ellipsis, zero)
    return lambda value: fill_zero(a)


def fill_zero(a) -> None:
    """``a[...] = 0``, fast for strided boxes (see :func:`copy_into`)."""
    if type(a) is np.ndarray and a.ndim and not a.flags.c_contiguous and not a.dtype.hasobject:
        k = _trailing_run_axis(a)
        if k < a.ndim and math.prod(a.shape[k:]) > 1:
            v = _as_runs(a, k)
            v[...] = np.zeros((), dtype=v.dtype)
            return
    a[...] = np.zeros((), dtype=a.dtype) if type(a) is np.ndarray else 0
