"""Logic functions (NumPy's "Logic functions": comparison): ``isclose``, ``allclose``,
``array_equal``.

``isclose`` is elementwise under the alignment rule of :mod:`disttensor.core.array` (the
result takes the layout of the first DistArray operand of the full shape; the others are
redistributed; NumPy arrays and scalars are replicated values).  ``allclose`` and
``array_equal`` return a Python ``bool``, the same on every rank (one all-reduce of the
elementwise result).  All collective over the operands' grid.  (``all``/``any`` are
reductions: :mod:`disttensor.routines.reductions`.)
"""
from __future__ import annotations

import numpy as np

from ..core.array import DistArray
from ..core.entry import agreed, collective_entry, operand_key
from ..core.backend import array_module
from . import reductions
from ._operands import anchor
from .ufuncs import elementwise, operand_shape

__all__ = ["isclose", "allclose", "array_equal"]


@collective_entry
def isclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False) -> DistArray:
    """Elementwise ``numpy.isclose`` (alignment rule)."""
    return elementwise(lambda u, v, **kw: array_module(u).isclose(u, v, **kw), "isclose",
                       (a, b), rtol=float(rtol), atol=float(atol), equal_nan=bool(equal_nan))


@collective_entry
def allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False) -> bool:
    """Whether every element is close (``bool``, the same on every rank)."""
    return bool(reductions.all(isclose(a, b, rtol, atol, equal_nan)).item())


@collective_entry
def array_equal(a, b, equal_nan=False) -> bool:
    """Same shape and equal elements (``bool``, the same on every rank)."""
    first = anchor((a, b))
    with agreed(None if first is None else first.grid.cart, "array_equal",
                a=operand_key(a), b=operand_key(b), equal_nan=bool(equal_nan)):
        if first is None:
            raise TypeError("array_equal needs a DistArray operand")
        same = operand_shape(a) == operand_shape(b)
    if not same:
        return False

    def eq(u, v):
        xp = array_module(u) if hasattr(u, "shape") else np
        r = xp.equal(u, v)
        if equal_nan:
            r = r | (xp.isnan(u) & xp.isnan(v))
        return r
    return bool(reductions.all(elementwise(eq, "equal", (a, b))).item())

