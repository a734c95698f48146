"""The NumPy methods of :class:`~disttensor.core.array.DistArray` (``x.sum()``, ``x.ravel()``,
``x.clip(0, 1)``, ...): the mixin :class:`NumPyMethods`, which ``DistArray`` inherits.

Each method takes ``numpy.ndarray``'s signature and runs what ``np.<name>(x, ...)`` runs on
a DistArray: the entry of the ``__array_function__`` table
(:mod:`disttensor.routines.array_function`, with the linalg and fft tables), so a method and
its function never differ; the table and the routines are imported when a method is first
called (the foundation imports nothing above it at module level).  Every method is
collective over the array's grid, like the routine it calls, and lays its result out as that
routine's docstring says.

Differences from ``numpy.ndarray``:

* results are new DistArrays, never views: ``ravel``, ``real``, ``imag``, ``squeeze``,
  ``swapaxes``, ``diagonal`` and ``reshape`` copy (``x.real`` of a real array too); ``real``
  and ``imag`` cannot be assigned to (``x.real[...] = v`` writes into a copy);
* ``out=`` raises ``TypeError`` (as do ``where=``/``initial=`` where the reduction lacks them);
* ``tolist`` gathers the array on every rank (``DISTTENSOR_GATHER_LIMIT`` applies);
* in place, as NumPy: ``sort`` and ``partition`` (the result is written back into the
  blocks), ``fill`` (the ranks agree on the value), ``put``
  (:func:`disttensor.routines.fancy_indexing.put`);
* not provided: ``view`` (a DistArray has no raw buffer to reinterpret across ranks: use
  ``astype``), ``ptp`` (gone from ``ndarray`` in NumPy 2: ``np.ptp(x)``), ``resize``,
  ``byteswap``, ``tobytes``, ``dump``.
"""
from __future__ import annotations

import numbers

import numpy as np

from .entry import agreed, collective_entry, operand_key

__all__ = ["NumPyMethods"]

#: NumPy's "argument not given" marker (the array-function table drops it)
_NOVALUE = getattr(np, "_NoValue", None)


def _np(func):
    """The DistArray implementation of ``numpy.<func>`` (the ``__array_function__`` table)."""
    from ..routines.array_function import implementation
    return implementation(func)


class NumPyMethods:
    """``numpy.ndarray``'s methods for DistArray (module docstring); every one collective."""

    __slots__ = ()

    # -- reductions (disttensor.routines.reductions, .searching) --------------------------------
    def sum(self, axis=None, dtype=None, out=None, keepdims=False, initial=_NOVALUE,
            where=True):
        return _np(np.sum)(self, axis=axis, dtype=dtype, out=out, keepdims=keepdims,
                           initial=initial, where=where)

    def prod(self, axis=None, dtype=None, out=None, keepdims=False, initial=_NOVALUE,
             where=True):
        return _np(np.prod)(self, axis=axis, dtype=dtype, out=out, keepdims=keepdims,
                            initial=initial, where=where)

    def mean(self, axis=None, dtype=None, out=None, keepdims=False, *, where=True):
        return _np(np.mean)(self, axis=axis, dtype=dtype, out=out, keepdims=keepdims,
                            where=where)

    def var(self, axis=None, dtype=None, out=None, ddof=0, keepdims=False, *, where=True,
            mean=_NOVALUE, correction=_NOVALUE):
        return _np(np.var)(self, axis=axis, dtype=dtype, out=out, ddof=ddof, keepdims=keepdims,
                           where=where, mean=mean, correction=correction)

    def std(self, axis=None, dtype=None, out=None, ddof=0, keepdims=False, *, where=True,
            mean=_NOVALUE, correction=_NOVALUE):
        return _np(np.std)(self, axis=axis, dtype=dtype, out=out, ddof=ddof, keepdims=keepdims,
                           where=where, mean=mean, correction=correction)

    def min(self, axis=None, out=None, keepdims=False, initial=_NOVALUE, where=True):
        return _np(np.min)(self, axis=axis, out=out, keepdims=keepdims, initial=initial,
                           where=where)

    def max(self, axis=None, out=None, keepdims=False, initial=_NOVALUE, where=True):
        return _np(np.max)(self, axis=axis, out=out, keepdims=keepdims, initial=initial,
                           where=where)

    def argmin(self, axis=None, out=None, *, keepdims=False):
        return _np(np.argmin)(self, axis=axis, out=out, keepdims=keepdims)

    def argmax(self, axis=None, out=None, *, keepdims=False):
        return _np(np.argmax)(self, axis=axis, out=out, keepdims=keepdims)

    def any(self, axis=None, out=None, keepdims=False, *, where=True):
        return _np(np.any)(self, axis=axis, out=out, keepdims=keepdims, where=where)

    def all(self, axis=None, out=None, keepdims=False, *, where=True):
        return _np(np.all)(self, axis=axis, out=out, keepdims=keepdims, where=where)

    def trace(self, offset=0, axis1=0, axis2=1, dtype=None, out=None):
        return _np(np.trace)(self, offset, axis1, axis2, dtype, out)

    # -- scans, sorting, searching ------------------------------------------------------------
    def cumsum(self, axis=None, dtype=None, out=None):
        return _np(np.cumsum)(self, axis, dtype, out)

    def cumprod(self, axis=None, dtype=None, out=None):
        return _np(np.cumprod)(self, axis, dtype, out)

    def _write_back(self, result) -> None:
        """``result`` (this array's shape) into this array's blocks, in place."""
        if result.distribution != self.distribution or result.grid.dims != self.grid.dims:
            result = result.redistribute(grid=self.grid, distribution=self.distribution)
        self.local[...] = result.local

    def sort(self, axis=-1, kind=None, order=None, *, stable=None) -> None:
        """Sort in place along ``axis`` (the sorted array is written back into the blocks)."""
        self._write_back(_np(np.sort)(self, axis, kind, order, stable=stable))

    def partition(self, kth, axis=-1, kind="introselect", order=None) -> None:
        """Partition in place around the ``kth`` elements (``np.partition``, written back)."""
        self._write_back(_np(np.partition)(self, kth, axis, kind, order))

    def argpartition(self, kth, axis=-1, kind="introselect", order=None):
        return _np(np.argpartition)(self, kth, axis, kind, order)

    def argsort(self, axis=-1, kind=None, order=None, *, stable=None):
        return _np(np.argsort)(self, axis, kind, order, stable=stable)

    def nonzero(self):
        return _np(np.nonzero)(self)

    def searchsorted(self, v, side="left", sorter=None):
        return _np(np.searchsorted)(self, v, side, sorter)

    # -- elementwise --------------------------------------------------------------------------
    def clip(self, min=None, max=None, out=None, **kwargs):
        return _np(np.clip)(self, min, max, out, **kwargs)

    def round(self, decimals=0, out=None):
        return _np(np.round)(self, decimals, out)

    def conj(self):
        return np.conjugate(self)

    def conjugate(self):
        return np.conjugate(self)

    @property
    def real(self):
        """The real part (a copy, also of a real array)."""
        return _np(np.real)(self)

    @property
    def imag(self):
        """The imaginary part (a copy; zeros for a real array)."""
        return _np(np.imag)(self)

    def dot(self, b, out=None):
        return _np(np.dot)(self, b, out)

    # -- shape and selection ------------------------------------------------------------------
    def transpose(self, *axes):
        if len(axes) == 1 and (axes[0] is None or not isinstance(axes[0], numbers.Integral)):
            axes = axes[0]
        return _np(np.transpose)(self, axes or None)

    def reshape(self, *shape, order="C"):
        """``order='C'`` (and ``'A'``); ``'F'`` reads and writes the elements in column-major
        order (the transposes move no data)."""
        if len(shape) == 1 and not isinstance(shape[0], numbers.Integral):
            shape = shape[0]
        if order == "F":
            t = _np(np.transpose)
            shape = (shape,) if isinstance(shape, numbers.Integral) else tuple(shape)
            return t(_np(np.reshape)(t(self), shape[::-1]))
        if order not in ("C", "A"):
            raise ValueError(f"order must be one of 'C', 'F', 'A' (got {order!r})")
        return _np(np.reshape)(self, shape)

    def ravel(self, order="C"):
        from ..routines.manipulation import ravel
        return ravel(self, order)

    def flatten(self, order="C"):
        from ..routines.manipulation import ravel
        return ravel(self, order)

    def squeeze(self, axis=None):
        return _np(np.squeeze)(self, axis)

    def swapaxes(self, axis1, axis2):
        return _np(np.swapaxes)(self, axis1, axis2)

    def repeat(self, repeats, axis=None):
        return _np(np.repeat)(self, repeats, axis)

    def take(self, indices, axis=None, out=None, mode="raise"):
        return _np(np.take)(self, indices, axis, out, mode)

    def diagonal(self, offset=0, axis1=0, axis2=1):
        return _np(np.diagonal)(self, offset, axis1, axis2)

    def put(self, indices, values, mode="raise") -> None:
        """``a.flat[indices] = values`` in place
        (:func:`disttensor.routines.fancy_indexing.put`)."""
        from ..routines.fancy_indexing import put
        put(self, indices, values, mode)

    # -- filling and conversion ---------------------------------------------------------------
    @collective_entry
    def fill(self, value) -> None:
        """Set every element to the scalar ``value`` in place (the ranks agree on it; NumPy's
        conversion error on every rank)."""
        if hasattr(value, "distribution"):  # a 0-d (or size-1) DistArray: its value
            value = value.item()
        with agreed(self.grid.cart, "fill", x=self, value=operand_key(value)):
            cell = np.empty((), dtype=self.dtype)
            cell[()] = value
        self.local[...] = cell if self.xp is np else self.xp.asarray(cell)

    def tolist(self):
        """The values as nested Python lists on every rank (gathers the whole array)."""
        return self.to_numpy().tolist()
