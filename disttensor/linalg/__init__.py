"""Distributed linear algebra: ``matmul``/``@``, ``tensordot``, ``vecdot``, ``einsum``,
``inner``, ``outer``, ``kron``, ``trace``, ``diagonal``, ``cross``, norms, TSQR ``qr``,
``svd``, and
``solve``/``inv``/``det``/``cholesky``/``eigh``/``slogdet`` through a guarded gather path.

Every function here is collective over the grid of its first DistArray operand; the ranks
agree the operands' metadata and the options before any data moves, and bad input (shape
mismatch, non-square ``solve``, 1-D ``qr``, ...) raises the same NumPy-like exception on every
rank.  NumPy arrays passed next to a DistArray are treated as replicated values (every rank
must pass the same).  Operands on different grids over the same ranks are fine (data moves).

Modules (each docstring states its contract):

* :mod:`.matrix_product` -- ``matmul``: the aligned product, the redistribution plans and the
  cost rule that picks one, the output distribution; :mod:`.summa` -- SUMMA for operands split
  over two grid axes.
* :mod:`.contractions` -- ``tensordot``, ``inner`` (as a batched matmul), ``outer``,
  ``kron``, ``vecdot``, ``diagonal``, ``trace``, ``cross``, ``matrix_transpose``.
* :mod:`.einsum` -- ``einsum`` of any number of operands (greedy pairwise order), ``...``.
* :mod:`.norms` -- ``vector_norm``, ``matrix_norm``, ``norm``.
* :mod:`.decompositions` -- TSQR ``qr``, ``svd``, ``svdvals``.
* :mod:`.gather_path` -- ``solve``, ``inv``, ``det``, ``slogdet``, ``cholesky``, ``eigh``,
  ``eigvalsh``: operands gathered whole on every rank (at most ``DISTTENSOR_GATHER_LIMIT``
  bytes, :func:`gather_limit`), LAPACK on every rank.
* :mod:`.matrix_functions` -- ``matrix_rank``, ``pinv``, ``matrix_power``.
* :mod:`.least_squares` -- ``lstsq`` (TSQR of ``[a | b]`` for tall ``a``, else gathered).
* :mod:`.eigen` -- ``eig``, ``eigvals`` (gather path); ``cond`` is in :mod:`.norms`.
* :mod:`.numpy_dispatch` -- ``np.matmul``, ``np.dot``, ``np.einsum``, ``np.linalg.*`` on
  DistArrays (:data:`HANDLED_FUNCTIONS`, :data:`GUFUNCS`).
* :mod:`.operands` -- the shared operand checks and layout helpers.
"""
from __future__ import annotations

from .contractions import (cross, diagonal, inner, kron, matrix_transpose, outer, tensordot,
                           trace, vecdot)
from .decompositions import qr, svd, svdvals
from .eigen import eig, eigvals
from .einsum import einsum
from .gather_path import cholesky, det, eigh, eigvalsh, gather_limit, inv, slogdet, solve
from .least_squares import lstsq
from .matrix_functions import matrix_power, matrix_rank, pinv
from .matrix_product import matmul
from .norms import cond, matrix_norm, norm, vector_norm
from .numpy_dispatch import GUFUNCS, HANDLED_FUNCTIONS  # noqa: F401  (GUFUNCS: for ufuncs.py)

__all__ = ["matmul", "tensordot", "vecdot", "einsum", "inner", "outer", "kron", "trace",
           "diagonal", "cross",
           "norm", "vector_norm", "matrix_norm", "qr", "svd", "svdvals", "solve", "inv", "det",
           "slogdet", "cholesky", "eigh", "eigvalsh", "matrix_transpose", "gather_limit",
           "matrix_rank", "pinv", "matrix_power", "lstsq", "cond", "eig", "eigvals",
           "HANDLED_FUNCTIONS"]
