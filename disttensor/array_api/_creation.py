"""Creation functions of the array API namespace.

Every function is collective over the grid (the default grid unless ``grid=`` is given) and
takes the standard's arguments plus the keyword-only extensions ``grid``, ``split`` and
``sizes`` of :mod:`disttensor.routines.creation` (the layout; default: axis 0 split over all
ranks of a 1-D grid, the default split of :func:`disttensor.core.layout.default_split`).  ``device`` is
``'cpu'`` or ``'cuda'`` (``None``: ``'cpu'``).  Default dtypes: ``float64``, ``int64``,
``complex128``, ``bool`` (see ``__array_namespace_info__().default_dtypes()``).
"""
from __future__ import annotations

import builtins

import numpy as np

from ..routines import creation as _c
from ..core.array import DistArray
from ._dtypes import as_dtype, float64, int64

__all__ = ["asarray", "arange", "empty", "empty_like", "eye", "from_dlpack", "full",
           "full_like", "linspace", "meshgrid", "ones", "ones_like", "tril", "triu", "zeros",
           "zeros_like"]


def _dev(device) -> str:
    return "cpu" if device is None else device


def _dt(dtype, default=float64):
    return default if dtype is None else as_dtype(dtype)


def _layout(shape, split):
    nd = 1 if isinstance(shape, (int, np.integer)) else len(tuple(shape))
    return split if split is not None else ((0,) + (None,) * (nd - 1) if nd else ())


def asarray(obj, /, *, dtype=None, device=None, copy=None, grid=None, split=None, sizes=None):
    """A DistArray from a DistArray (cast/copied/moved as asked), a NumPy array, a Python
    scalar or nested sequences (every rank passes the same value; split along axis 0 of the
    default grid unless ``split``/``grid`` say otherwise).  ``copy=False`` raises
    ``ValueError`` when a copy is needed (always, for data that is not a DistArray)."""
    if isinstance(obj, DistArray):
        y = obj
        if dtype is not None and as_dtype(dtype) != y.dtype:
            if copy is False:
                raise ValueError("asarray(copy=False) would need a cast")
            y = y.astype(as_dtype(dtype))
        if device is not None and device != y.device:
            if copy is False:
                raise ValueError("asarray(copy=False) would need a device transfer")
            y = y.to_device(device)
        if grid is not None or split is not None or sizes is not None:
            if copy is False:
                raise ValueError("asarray(copy=False) would need a redistribution")
            y = y.redistribute(grid=grid, split=split, sizes=sizes)
        if copy and y is obj:
            y = y.copy()
        return y
    if copy is False:
        raise ValueError("asarray(copy=False): data that is not a DistArray is always copied")
    if isinstance(obj, builtins.bool) or (dtype is None and isinstance(obj, (list, tuple))
                                          and _all_bool(obj)):
        a = np.asarray(obj, dtype=np.bool_ if dtype is None else as_dtype(dtype))
    elif isinstance(obj, int) and dtype is None:
        a = np.asarray(obj, dtype=int64)
    else:
        a = np.asarray(obj, dtype=None if dtype is None else as_dtype(dtype))
    if a.dtype.kind in "OUSV":
        raise TypeError(f"asarray: unsupported data type {a.dtype}")
    return _c.from_global(a, grid=grid, split=_layout(a.shape, split) if a.ndim else None,
                          sizes=sizes, device=_dev(device))


def _all_bool(seq) -> bool:
    for e in seq:
        if isinstance(e, (list, tuple)):
            if not _all_bool(e):
                return False
        elif not isinstance(e, (builtins.bool, np.bool_)):
            return False
    return True


def arange(start, /, stop=None, step=1, *, dtype=None, device=None, grid=None, split=None,
           sizes=None):
    if dtype is None:
        ints = all(isinstance(v, int) for v in (start, step) + ((stop,) if stop is not None else ()))
        dtype = int64 if ints else float64
    return _c.arange(start, stop, step, dtype=as_dtype(dtype), grid=grid, split=split,
                     sizes=sizes, device=_dev(device))


def empty(shape, *, dtype=None, device=None, grid=None, split=None, sizes=None):
    return _c.empty(shape, dtype=_dt(dtype), grid=grid, split=_layout(shape, split),
                    sizes=sizes, device=_dev(device))


def zeros(shape, *, dtype=None, device=None, grid=None, split=None, sizes=None):
    return _c.zeros(shape, dtype=_dt(dtype), grid=grid, split=_layout(shape, split),
                    sizes=sizes, device=_dev(device))


def ones(shape, *, dtype=None, device=None, grid=None, split=None, sizes=None):
    return _c.ones(shape, dtype=_dt(dtype), grid=grid, split=_layout(shape, split),
                   sizes=sizes, device=_dev(device))


def _fill_dtype(fill_value):
    if isinstance(fill_value, builtins.bool):
        return np.dtype(np.bool_)
    if isinstance(fill_value, int):
        return int64
    if isinstance(fill_value, float):
        return float64
    if isinstance(fill_value, complex):
        return np.dtype(np.complex128)
    return np.asarray(fill_value).dtype


def full(shape, fill_value, *, dtype=None, device=None, grid=None, split=None, sizes=None):
    dt = _fill_dtype(fill_value) if dtype is None else as_dtype(dtype)
    return _c.full(shape, fill_value, dtype=dt, grid=grid, split=_layout(shape, split),
                   sizes=sizes, device=_dev(device))


def _like(fn, x, dtype, device, *args):
    y = fn(x, *args, dtype=None if dtype is None else as_dtype(dtype))
    return y if device is None or device == y.device else y.to_device(device)


def empty_like(x, /, *, dtype=None, device=None):
    return _like(_c.empty_like, x, dtype, device)


def zeros_like(x, /, *, dtype=None, device=None):
    return _like(_c.zeros_like, x, dtype, device)


def ones_like(x, /, *, dtype=None, device=None):
    return _like(_c.ones_like, x, dtype, device)


def full_like(x, /, fill_value, *, dtype=None, device=None):
    return _like(_c.full_like, x, dtype, device, fill_value)


def eye(n_rows, n_cols=None, /, *, k=0, dtype=None, device=None, grid=None, split=None,
        sizes=None):
    return _c.eye(n_rows, n_cols, k=k, dtype=_dt(dtype), grid=grid,
                  split=_layout((n_rows, n_rows), split), sizes=sizes, device=_dev(device))


def linspace(start, stop, /, num, *, dtype=None, device=None, endpoint=True, grid=None,
             split=None, sizes=None):
    if dtype is None:
        dtype = np.dtype(np.complex128) if isinstance(start, complex) or isinstance(
            stop, complex) else float64
    dtype = as_dtype(dtype)
    if dtype.kind == "c":  # NumPy's complex formula on the global indices of each block
        x = _c.empty((int(num),), dtype=np.complex128, grid=grid,
                     split=split if split is not None else (0,), sizes=sizes)
        (i,) = _c.local_index_grid(x)
        div = (num - 1) if endpoint else num
        start_c, stop_c = np.complex128(start), np.complex128(stop)
        delta = stop_c - start_c
        y = i.astype(np.complex128)
        if div > 0:
            step = delta / div
            y = y / div * delta if step == 0 else y * step
        else:
            y = y * delta
        y = y + start_c
        if endpoint and num > 1:
            y = np.where(i == num - 1, stop_c, y)
        x.local[...] = y
        z = x.astype(dtype) if dtype != x.dtype else x
        return z if device in (None, "cpu") else z.to_device(device)
    return _c.linspace(start, stop, num, endpoint=endpoint, dtype=as_dtype(dtype), grid=grid,
                       split=split if split is not None else (0,), sizes=sizes,
                       device=_dev(device))


def meshgrid(*arrays, indexing="xy"):
    return _c.meshgrid(*arrays, indexing=indexing)


def tril(x, /, *, k=0):
    return _c.tril(x, k)


def triu(x, /, *, k=0):
    return _c.triu(x, k)


def from_dlpack(x, /, *, device=None, copy=None):
    raise NotImplementedError(
        "from_dlpack: a DLPack capsule describes one local buffer, not a distributed array; "
        "wrap per-rank blocks with disttensor.from_local(...) or use asarray on global data")
