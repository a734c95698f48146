"""``eig`` and ``eigvals``: eigenvalues of general square matrices by the gather path.

Collective over ``a``'s grid: the ranks agree ``a``'s metadata, check it (at least two
dimensions, square: NumPy's ``LinAlgError``) and the gather guard (``DISTTENSOR_GATHER_LIMIT``,
:func:`~.gather_path.check_gather_size`) before any data moves; ``a`` is then gathered whole
on every rank and NumPy's ``eig`` (LAPACK ``geev``) runs there; its errors (NaN or inf
entries, no convergence) are raised on every rank.  Every rank computes on the same data with
the same library, so all get the same (complex or real, as NumPy decides from the values)
results.  Layout: the eigenvalues ``(..., n)`` with the batch axes split like ``a``'s and
the last axis whole (replicated for one matrix), the eigenvectors laid out like ``a``.
``eig`` returns a plain ``(w, v)`` tuple (NumPy: the named tuple ``EigResult``).
"""
from __future__ import annotations

import numpy as np

from ..core.array import DistArray
from ..core.entry import agreed, collective_entry
from .gather_path import check_gather_size, run_gathered
from .operands import batch_layout, block_of, check_distarray, check_matrix, check_square

__all__ = ["eig", "eigvals"]


def _checked(a, call: str) -> None:
    check_distarray(a, call)
    with agreed(a.grid.cart, call, a=a):
        check_matrix(a, call)
        check_square(a)
        check_gather_size(call, a)


@collective_entry
def eig(a: DistArray):
    """``numpy.linalg.eig`` by the gather path (collective, guarded): ``(w, v)``, ``w`` split
    like ``a``'s batch axes (replicated for one matrix), ``v`` laid out like ``a``."""
    _checked(a, "eig")
    w, v = run_gathered(a, lambda m: tuple(np.linalg.eig(m)), a)
    return (block_of(w, a.grid, batch_layout(a, w.shape), a.xp),
            block_of(v, a.grid, a.distribution, a.xp))


@collective_entry
def eigvals(a: DistArray) -> DistArray:
    """``numpy.linalg.eigvals`` by the gather path (collective, guarded); laid out as
    :func:`eig`'s ``w``."""
    _checked(a, "eigvals")
    w = run_gathered(a, np.linalg.eigvals, a)
    return block_of(w, a.grid, batch_layout(a, w.shape), a.xp)
