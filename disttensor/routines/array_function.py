"""NumPy functions that dispatch to DistArray implementations via ``__array_function__``
(``np.sum(x)``, ``np.concatenate([x, y])``, ``np.where(c, x, y)``, ...)."""
from __future__ import annotations

import numpy as np

from . import creation
from . import manipulation
from . import reductions
from .indexing import flip

__all__ = ["HANDLED"]


_NOVALUE = getattr(np, "_NoValue", object())


def _red(fn, params, extra=()):
    """``np.<reduction>`` for DistArrays.  ``params`` are NumPy's parameter names after ``a``
    (so positional arguments bind as in NumPy); ``extra`` are those passed on to ``fn``.
    Options DistArray reductions do not implement (``out=``, ``where=``, ``initial=``,
    ``mean=``) raise ``TypeError`` instead of being ignored."""
    def impl(a, *args, **kwargs):
        if len(args) > len(params):
            raise TypeError(f"{fn.__name__}() takes at most {len(params) + 1} positional arguments")
        for name, v in zip(params, args):
            if name in kwargs:
                raise TypeError(f"{fn.__name__}() got multiple values for argument '{name}'")
            kwargs[name] = v
        kwargs = {k: v for k, v in kwargs.items() if v is not _NOVALUE}
        if kwargs.pop("out", None) is not None:
            raise TypeError("out= is not supported for DistArray reductions")
        where = kwargs.pop("where", True)
        if where is not True:
            raise TypeError("where= is not supported for DistArray reductions")
        for name in ("initial", "mean"):
            if name in kwargs:
                raise TypeError(f"{name}= is not supported for DistArray reductions")
        if "correction" in kwargs:  # NumPy 2 spelling of ddof
            c = kwargs.pop("correction")
            if kwargs.get("ddof", 0) != 0:
                raise ValueError("ddof and correction can't be provided simultaneously.")
            kwargs["ddof"] = c
        unknown = set(kwargs) - set(extra) - {"axis", "keepdims"}
        if unknown:
            raise TypeError(f"{fn.__name__}() got unexpected keyword argument(s) {sorted(unknown)}")
        kw = {k: v for k, v in kwargs.items() if k in extra and v is not None}
        return fn(a, axis=kwargs.get("axis"), keepdims=bool(kwargs.get("keepdims", False)), **kw)
    return impl


_SUM = ("axis", "dtype", "out", "keepdims", "initial", "where")
_MEAN = ("axis", "dtype", "out", "keepdims")
_VAR = ("axis", "dtype", "out", "ddof", "keepdims")
_MIN = ("axis", "out", "keepdims", "initial", "where")
_ARG = ("axis", "out")
_ANY = ("axis", "out", "keepdims")


HANDLED = {
    np.sum: _red(reductions.sum, _SUM, ("dtype",)),
    np.prod: _red(reductions.prod, _SUM, ("dtype",)),
    np.mean: _red(reductions.mean, _MEAN, ("dtype",)),
    np.var: _red(reductions.var, _VAR, ("dtype", "ddof")),
    np.std: _red(reductions.std, _VAR, ("dtype", "ddof")),
    np.min: _red(reductions.min, _MIN),
    np.max: _red(reductions.max, _MIN),
    np.amin: _red(reductions.min, _MIN),
    np.amax: _red(reductions.max, _MIN),
    np.argmin: _red(reductions.argmin, _ARG),
    np.argmax: _red(reductions.argmax, _ARG),
    np.any: _red(reductions.any, _ANY),
    np.all: _red(reductions.all, _ANY),
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
from .manipulation import dims as _shaping  # noqa: E402
HANDLED.update(_shaping.HANDLED_FUNCTIONS)
from .. import linalg as _linalg  # noqa: E402
HANDLED.update(_linalg.HANDLED_FUNCTIONS)
from .. import fft as _fft  # noqa: E402
HANDLED.update(_fft.HANDLED_FUNCTIONS)
from . import sorting as _sorting  # noqa: E402
HANDLED.update(_sorting.HANDLED_FUNCTIONS)
from . import npyio as _npyio  # noqa: E402
HANDLED.update(_npyio.HANDLED_FUNCTIONS)
