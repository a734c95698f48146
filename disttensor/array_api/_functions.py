"""Statistical, manipulation, utility, indexing, searching and data type functions of the
array API namespace: thin keyword-only wrappers of :mod:`disttensor.routines.reductions`,
:mod:`disttensor.routines.manipulation`, :mod:`disttensor.routines.indexing`,
:mod:`disttensor.routines.searching` and :mod:`disttensor.routines.mathematical` (see those
modules for output distributions and algorithms).  All collective."""
from __future__ import annotations

import numpy as np

from ..routines import indexing as _i
from ..routines import manipulation as _m
from ..routines import mathematical as _math
from ..routines import reductions as _r
from ..routines import searching as _search
from ..core.array import DistArray
from ._dtypes import as_dtype

__all__ = ["max", "mean", "min", "prod", "std", "sum", "var", "all", "any", "diff",
           "broadcast_arrays", "broadcast_to", "concat", "expand_dims", "flip", "moveaxis",
           "permute_dims", "repeat", "reshape", "roll", "squeeze", "stack", "tile", "unstack",
           "take", "take_along_axis", "argmax", "argmin", "count_nonzero", "where", "astype",
           "broadcast_shapes", "matrix_transpose"]


def _ax(axis):
    return tuple(axis) if isinstance(axis, list) else axis


def _dtype(dtype):
    return None if dtype is None else as_dtype(dtype)


# -- statistical ------------------------------------------------------------------------------
def max(x, /, *, axis=None, keepdims=False):  # noqa: A001
    return _r.max(x, axis=_ax(axis), keepdims=keepdims)


def min(x, /, *, axis=None, keepdims=False):  # noqa: A001
    return _r.min(x, axis=_ax(axis), keepdims=keepdims)


def mean(x, /, *, axis=None, keepdims=False):
    return _r.mean(x, axis=_ax(axis), keepdims=keepdims)


def prod(x, /, *, axis=None, dtype=None, keepdims=False):
    return _r.prod(x, axis=_ax(axis), dtype=_dtype(dtype), keepdims=keepdims)


def sum(x, /, *, axis=None, dtype=None, keepdims=False):  # noqa: A001
    return _r.sum(x, axis=_ax(axis), dtype=_dtype(dtype), keepdims=keepdims)


def std(x, /, *, axis=None, correction=0.0, keepdims=False):
    return _r.std(x, axis=_ax(axis), ddof=correction, keepdims=keepdims)


def var(x, /, *, axis=None, correction=0.0, keepdims=False):
    return _r.var(x, axis=_ax(axis), ddof=correction, keepdims=keepdims)


# -- utility ------------------------------------------------------------------------------------
def all(x, /, *, axis=None, keepdims=False):  # noqa: A001
    return _r.all(x, axis=_ax(axis), keepdims=keepdims)


def any(x, /, *, axis=None, keepdims=False):  # noqa: A001
    return _r.any(x, axis=_ax(axis), keepdims=keepdims)


def diff(x, /, *, axis=-1, n=1, prepend=None, append=None):
    return _math.diff(x, n, axis, prepend, append)


# -- manipulation ------------------------------------------------------------------------------
def broadcast_arrays(*arrays):
    return _m.broadcast_arrays(*arrays)


def broadcast_to(x, /, shape):
    return _m.broadcast_to(x, shape)


def concat(arrays, /, *, axis=0):
    return _m.concatenate(arrays, axis=axis)


def expand_dims(x, /, axis=0):
    return _m.expand_dims(x, axis)


def flip(x, /, *, axis=None):
    if not isinstance(x, DistArray):
        raise TypeError(f"flip: expected a DistArray, got {type(x).__name__}")
    return _m.flip(x, tuple(range(x.ndim)) if axis is None else axis)


def moveaxis(x, source, destination, /):
    return _m.moveaxis(x, source, destination)


def permute_dims(x, /, axes):
    return _m.transpose(x, axes)


def repeat(x, repeats, /, *, axis=None):
    return _m.repeat(x, repeats, axis)


def reshape(x, /, shape, *, copy=None):
    """Always a new array (``copy=False`` raises ``ValueError``: DistArray reshapes never
    alias the input)."""
    if copy is False:
        raise ValueError("reshape(copy=False): a DistArray reshape always copies")
    return _m.reshape(x, shape)


def roll(x, /, shift, *, axis=None):
    return _m.roll(x, shift, axis)


def squeeze(x, /, axis):
    return _m.squeeze(x, axis)


def stack(arrays, /, *, axis=0):
    return _m.stack(arrays, axis)


def tile(x, repetitions, /):
    return _m.tile(x, repetitions)


def unstack(x, /, *, axis=0):
    return _m.unstack(x, axis)


# -- indexing and searching ---------------------------------------------------------------------
def take(x, indices, /, *, axis=None):
    if axis is None and x.ndim != 1:
        raise ValueError("take: axis is required for arrays of more than one dimension")
    return _i.take(x, indices, 0 if axis is None else axis)


def take_along_axis(x, indices, /, *, axis=-1):
    return _i.take_along_axis(x, indices, axis)


def argmax(x, /, *, axis=None, keepdims=False):
    return _search.argmax(x, axis=axis, keepdims=keepdims)


def argmin(x, /, *, axis=None, keepdims=False):
    return _search.argmin(x, axis=axis, keepdims=keepdims)


def count_nonzero(x, /, *, axis=None, keepdims=False):
    """Number of non-zero elements (``int64``)."""
    return _r.sum(np.not_equal(x, 0), axis=_ax(axis), dtype=np.int64, keepdims=keepdims)


def where(condition, x1, x2, /):
    return _search.where(condition, x1, x2)


# -- data types and linear algebra basics ---------------------------------------------------------
def astype(x, dtype, /, *, copy=True, device=None):
    y = x.astype(as_dtype(dtype), copy=copy)
    return y if device is None or device == y.device else y.to_device(device)


def broadcast_shapes(*shapes):
    return tuple(np.broadcast_shapes(*shapes))


def matrix_transpose(x, /):
    if not isinstance(x, DistArray) or x.ndim < 2:
        raise ValueError("matrix_transpose needs an array of at least 2 dimensions")
    return _m.swapaxes(x, -1, -2)
