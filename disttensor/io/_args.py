"""Arguments of the :mod:`disttensor.io` entry points as the ranks compare and check them.

The entry points agree their metadata arguments across the ranks before any file is opened
(:mod:`disttensor.core.agreement`); the functions here put an argument in the form in which
equal values compare equal (a ``Path`` and the same ``str``; ``'f4'`` and ``np.float32``;
small attribute arrays by value).  Anything they cannot normalize is passed on as it is, for
the entry point's own validation to report.  :func:`usable_device` checks a ``device=``
argument.  Nothing here communicates.
"""
from __future__ import annotations

import os

import numpy as np

from ..core.backend import normalize_device, xp_for

__all__ = ["arg_path", "arg_paths", "arg_dtype", "arg_attrs", "usable_device"]


def arg_path(p):
    """A path argument as it is agreed across ranks: ``str`` and ``os.PathLike`` alike (a
    ``Path`` on one rank and the same ``str`` on another are the same file); anything else as
    it is (validation reports it)."""
    return os.fspath(p) if isinstance(p, (str, bytes, os.PathLike)) else p


def arg_paths(source):
    """:func:`arg_path` of a path or of each path of a list/tuple."""
    if isinstance(source, (list, tuple)):
        return [arg_path(s) for s in source]
    return arg_path(source)


def arg_dtype(dtype):
    """A dtype argument as it is agreed (``'f4'``, ``np.float32`` and ``np.dtype('f4')`` are the
    same); ``None`` and anything NumPy rejects as it is."""
    if dtype is None:
        return None
    try:
        return np.dtype(dtype).str
    except Exception:  # noqa: BLE001 - validation reports it
        return dtype


def arg_attrs(attrs):
    """HDF5 attributes as they are agreed: by value (small NumPy arrays as lists, since an
    array argument is otherwise compared by shape and dtype only); anything else as it is."""
    if not isinstance(attrs, dict):
        return attrs
    return {k: v.tolist() if isinstance(v, np.ndarray) and v.size <= 4096
            and not v.dtype.hasobject else v for k, v in attrs.items()}


def usable_device(device) -> str:
    """``device`` normalized (``'cpu'`` or ``'cuda'``), checking now that a GPU is there for
    ``'cuda'`` (``ValueError`` for an unknown device, ``RuntimeError`` without a GPU), so that
    the error comes before any file is opened."""
    device = normalize_device(device)
    if device != "cpu":
        xp_for(device)
    return device
