"""The gather path: ``solve``, ``inv``, ``det``, ``slogdet``, ``cholesky``, ``eigh`` and
``eigvalsh`` on matrices small enough to hold whole on every rank.

Collective over the grid of the first DistArray operand.  The ranks agree the operands'
metadata and check them (at least two dimensions, square, matching ``solve`` shapes) and the
gather guard before any data moves, so bad input raises NumPy's exception on every rank.  The
operands are then all-gathered to every rank (:func:`run_gathered`), LAPACK (NumPy) runs on
every rank, and every rank keeps its block of the result (laid out like the input:
``solve``'s result like ``b``, ``inv``/``cholesky``/eigenvectors like ``a``; eigenvalues,
``det`` and ``slogdet`` replicated).  Errors from LAPACK (singular matrix, not positive
definite) are raised on every rank.

Guard: the operands' total size in bytes must not exceed ``DISTTENSOR_GATHER_LIMIT`` (default
1 GiB, :func:`gather_limit`); beyond it :func:`check_gather_size` raises ``ValueError`` on
every rank before any data moves.  ``svd``, ``matrix_rank`` and ``pinv`` use the same path
for stacks (and ``svd`` with ``full_matrices=True``).
"""
from __future__ import annotations

import numpy as np

from ..core.array import DistArray
from ..core.comm import collective
from ..core.distribution import Distribution
from ..core.entry import agreed, collective_entry, operand_key
from ..core.grid import ProcessGrid
from ..core.memory import check_gather_size, gather_limit  # noqa: F401 - re-exported
from .operands import block_of, check_distarray, check_matrix, check_square, comm_of, operand_pair

__all__ = ["solve", "inv", "det", "slogdet", "cholesky", "eigh", "eigvalsh", "gather_limit",
           "check_gather_size", "run_gathered"]

def _replicated_dist(shape, grid: ProcessGrid) -> Distribution:
    return Distribution(shape, grid.dims, None)


def run_gathered(a: DistArray, fn, *xs):
    """``fn`` of the DistArrays ``xs`` gathered whole (NumPy) on every rank (collective over
    ``a``'s grid; an exception ``fn`` raises on any rank is raised on every rank)."""
    fulls = [x.to_numpy() for x in xs]
    with collective(a.grid.cart):
        return fn(*fulls)


@collective_entry
def solve(a, b) -> DistArray:
    """``numpy.linalg.solve`` by the gather path (collective, guarded by
    ``DISTTENSOR_GATHER_LIMIT``): the result is laid out like ``b`` (replicated when its shape
    differs from ``b``'s)."""
    comm = comm_of(a, b)
    with agreed(comm, "solve", a=operand_key(a), b=operand_key(b)):
        grid, a, b = operand_pair(a, b, "solve")
        check_matrix(a, "solve")
        check_square(a)
        if b.ndim == 0:
            raise ValueError("solve: b must have at least one dimension")
        kb = b.shape[0] if b.ndim == 1 else b.shape[-2]
        if kb != a.shape[-1]:
            raise ValueError(f"solve: a is {a.shape[-2]}x{a.shape[-1]} but b has {kb} rows "
                             f"(shapes {a.shape} and {b.shape})")
        if b.ndim > 1:
            np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        check_gather_size("solve", a, b)
    x = run_gathered(a, np.linalg.solve, a, b)
    d = b.distribution if x.shape == b.shape else _replicated_dist(x.shape, grid)
    return block_of(x, b.grid if x.shape == b.shape else grid, d, b.xp)


def _square_op(call: str, fn, like_a: bool):
    @collective_entry
    def op(a: DistArray) -> DistArray:
        check_distarray(a, call)
        with agreed(a.grid.cart, call, a=a):
            check_matrix(a, call)
            check_square(a)
            check_gather_size(call, a)
        r = run_gathered(a, fn, a)
        if isinstance(r, tuple):
            return tuple(block_of(v, a.grid, _replicated_dist(np.shape(v), a.grid), a.xp)
                         for v in r)
        d = a.distribution if like_a else _replicated_dist(np.shape(r), a.grid)
        return block_of(r, a.grid, d, a.xp)
    op.__name__ = op.__qualname__ = call
    return op


inv = _square_op("inv", np.linalg.inv, True)
inv.__doc__ = ("``numpy.linalg.inv`` by the gather path (collective, guarded); the result "
               "is laid out like ``a``.")
det = _square_op("det", np.linalg.det, False)
det.__doc__ = "``numpy.linalg.det`` by the gather path (collective, guarded); replicated."
slogdet = _square_op("slogdet", lambda a: tuple(np.linalg.slogdet(a)), False)
slogdet.__doc__ = ("``numpy.linalg.slogdet`` by the gather path: ``(sign, logabsdet)``, "
                   "replicated.")
eigvalsh = _square_op("eigvalsh", np.linalg.eigvalsh, False)
eigvalsh.__doc__ = "``numpy.linalg.eigvalsh`` by the gather path; replicated eigenvalues."


@collective_entry
def cholesky(a: DistArray, /, *, upper: bool = False) -> DistArray:
    """``numpy.linalg.cholesky`` by the gather path (collective, guarded); the factor is laid
    out like ``a``; ``LinAlgError`` on every rank when ``a`` is not positive definite."""
    check_distarray(a, "cholesky")
    with agreed(a.grid.cart, "cholesky", a=a, upper=bool(upper)):
        check_matrix(a, "cholesky")
        check_square(a)
        check_gather_size("cholesky", a)
    r = run_gathered(a, lambda m: np.linalg.cholesky(m, upper=bool(upper)), a)
    return block_of(r, a.grid, a.distribution, a.xp)


@collective_entry
def eigh(a: DistArray, UPLO: str = "L"):
    """``numpy.linalg.eigh`` by the gather path (collective, guarded): ``(w, v)`` with the
    eigenvalues ``w`` replicated and the eigenvectors ``v`` laid out like ``a``."""
    check_distarray(a, "eigh")
    with agreed(a.grid.cart, "eigh", a=a, UPLO=UPLO):
        check_matrix(a, "eigh")
        check_square(a)
        if UPLO not in ("L", "U"):
            raise ValueError("UPLO argument must be 'L' or 'U'")
        check_gather_size("eigh", a)
    w, v = run_gathered(a, lambda m: tuple(np.linalg.eigh(m, UPLO=UPLO)), a)
    return (block_of(w, a.grid, _replicated_dist(w.shape, a.grid), a.xp),
            block_of(v, a.grid, a.distribution, a.xp))
