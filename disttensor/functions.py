"""NumPy functions that dispatch to DistArray implementations via ``__array_function__``
(``np.sum(x)``, ``np.concatenate([x, y])``, ``np.where(c, x, y)``, ...)."""
from __future__ import annotations

import numpy as np

from . import creation, manipulation, reductions
from .indexing import flip

__all__ = ["HANDLED"]


def _red(fn, extra=()):
    def impl(a, axis=None, *args, out=None, keepdims=False, **kwargs):
        if out is not None:
            raise TypeError("out= is not supported for DistArray reductions")
        if args:
            raise TypeError("pass reduction options by keyword")
        kwargs = {k: v for k, v in kwargs.items() if k in extra and v is not None}
        return fn(a, axis=axis, keepdims=bool(keepdims), **kwargs)
    return impl


HANDLED = {
    np.sum: _red(reductions.sum, ("dtype",)),
    np.prod: _red(reductions.prod, ("dtype",)),
    np.mean: _red(reductions.mean, ("dtype",)),
    np.var: _red(reductions.var, ("dtype", "ddof")),
    np.std: _red(reductions.std, ("dtype", "ddof")),
    np.min: _red(reductions.min),
    np.max: _red(reductions.max),
    np.amin: _red(reductions.min),
    np.amax: _red(reductions.max),
    np.argmin: _red(reductions.argmin),
    np.argmax: _red(reductions.argmax),
    np.any: _red(reductions.any),
    np.all: _red(reductions.all),
    np.where: manipulation.where,
    np.concatenate: lambda arrays, axis=0, out=None, dtype=None, casting="same_kind":
        manipulation.concatenate(arrays, axis=axis, dtype=dtype),
    np.transpose: lambda a, axes=None: manipulation.transpose(a, axes),
    np.moveaxis: manipulation.moveaxis,
    np.swapaxes: manipulation.swapaxes,
    np.reshape: lambda a, shape=None, order="C", **kw: manipulation.reshape(a, shape if shape is not None else kw["newshape"]),
    np.flip: lambda m, axis=None: flip(m, range(m.ndim) if axis is None else axis),
    np.copy: lambda a, order="K", subok=False: a.copy(),
    np.shape: lambda a: a.shape,
    np.ndim: lambda a: a.ndim,
    np.size: lambda a, axis=None: a.size if axis is None else a.shape[axis],
    np.zeros_like: lambda a, dtype=None, **kw: creation.zeros_like(a, dtype),
    np.ones_like: lambda a, dtype=None, **kw: creation.ones_like(a, dtype),
    np.empty_like: lambda a, dtype=None, **kw: creation.empty_like(a, dtype),
    np.full_like: lambda a, fill_value, dtype=None, **kw: creation.full_like(a, fill_value, dtype),
}
