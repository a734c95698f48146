"""``A @ x`` and ``A.T @ y`` of a :class:`~disttensor.sparse.distributed.DistCSBMatrix` with a
DistArray (or a NumPy array: a replicated value, the same on every rank), collective over the
matrix's grid.

Operand rules (checked on every rank, after the ranks agree on the call):

* ``x`` is 1-D ``(n,)`` or 2-D ``(n, k)`` (``n`` the matrix's columns, its rows for ``A.T``),
  else ``ValueError`` with NumPy's matmul message;
* a DistArray ``x`` lives on a grid of the matrix's shape over the same ranks and is split along
  its first axis exactly as :meth:`~DistCSBMatrix.input_distribution` says (the output
  distribution for ``A.T``), or is replicated; its second axis is whole.  Anything else is a
  ``ValueError`` naming both distributions (``A.align_input(x)`` moves it);
* the result dtype is ``np.result_type(A.dtype, x.dtype)`` (float32 or float64).

Results: ``A @ x`` is laid out as :meth:`~DistCSBMatrix.output_distribution`, ``A.T @ y`` as
:meth:`~DistCSBMatrix.input_distribution` (whatever the operand's layout was).
"""
from __future__ import annotations

import numpy as np

from ..core.array import DistArray
from ..core.comm import allreduce
from ..core.entry import agreed, collective_entry, operand_key

__all__ = ["matmul", "check_operand"]

_EXCHANGES = (None, "p2p", "allgather")


def check_operand(a, x, adjoint: bool):
    """Validate ``x`` against ``a`` (see the module doc); returns ``(x, replicated)``."""
    n = a.shape[0] if adjoint else a.shape[1]
    if getattr(x, "device", "cpu") != "cpu" or type(x).__module__.startswith("cupy"):
        raise TypeError("distributed sparse products take CPU (NumPy) blocks only; move the "
                        "operand with x.to_device('cpu')")
    if not isinstance(x, DistArray):
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise TypeError(f"the operand must be a DistArray or an array, got "
                            f"{type(x).__name__}")
        x = np.asarray(x)
    if x.ndim not in (1, 2):
        raise ValueError(f"the operand must be 1-D or 2-D, got {x.ndim}-D")
    if x.shape[0] != n:
        raise ValueError(f"matmul: Input operand 1 has a mismatch in its core dimension 0, "
                         f"with gufunc signature (n?,k),(k,m?)->(n?,m?) (size {x.shape[0]} is "
                         f"different from {n})")
    if np.dtype(x.dtype) not in (np.float32, np.float64):
        raise TypeError(f"the operand must be float32 or float64, got {x.dtype}")
    if not isinstance(x, DistArray):
        return x, True
    if not x.grid.compatible(a.grid) or x.grid.dims != a.grid.dims:
        raise ValueError(f"the operand's grid {x.grid.dims} is not the matrix's grid "
                         f"{a.grid.dims} over the same ranks")
    if all(s is None for s in x.split):
        return x, True
    k = None if x.ndim == 1 else x.shape[1]
    want = a.output_distribution(k) if adjoint else a.input_distribution(k)
    if x.distribution != want:
        raise ValueError(f"the operand's distribution {x.distribution} does not match the "
                         f"matrix's {'row' if adjoint else 'column'} distribution {want} "
                         f"(A.align_input(x) redistributes it)")
    return x, False


@collective_entry
def matmul(a, x, adjoint: bool, exchange: str | None = None) -> DistArray:
    """``a @ x`` (``adjoint``: ``a.T @ x``); see the module doc."""
    comm = a.grid.cart
    with agreed(comm, "DistCSBMatrix.T.matmul" if adjoint else "DistCSBMatrix.matmul",
                a=a._key(), x=operand_key(x), exchange=exchange):
        if exchange not in _EXCHANGES:
            raise ValueError(f"exchange must be 'p2p', 'allgather' or None, got {exchange!r}")
        x, replicated = check_operand(a, x, adjoint)
    vector = x.ndim == 1
    dtype = np.result_type(a.dtype, x.dtype)
    X = x if not isinstance(x, DistArray) else x.local
    X = np.asarray(X, dtype=dtype)
    k = 1 if vector else X.shape[1]
    X = X.reshape(X.shape[0], k)
    lay = a._lay
    if a.layout == "rows":
        Y = _rows_product(a, X, adjoint, replicated, exchange)
    else:
        Y = _blocks_product(a, X, adjoint, replicated)
    kk = None if vector else k
    dist = a.input_distribution(kk) if adjoint else a.output_distribution(kk)
    Y = Y.reshape(dist.block_shape(lay.grid.coords))
    return DistArray(Y, dist, a.grid)


def _rows_product(a, X, adjoint: bool, replicated: bool, exchange):
    lay, halo = a._lay, a.halo
    if not adjoint:
        if replicated:
            xe = X[a.ext]
        else:
            xe = halo.gather(np.ascontiguousarray(X), exchange)
        return a._local_product(xe, False)
    if replicated:  # y whole on every rank: use this rank's rows
        X = X[lay.ro[lay.ri]:lay.ro[lay.ri + 1]]
    Z = np.ascontiguousarray(a._local_product(np.ascontiguousarray(X), True))
    return halo.scatter_add(Z, exchange)


def _blocks_product(a, X, adjoint: bool, replicated: bool):
    lay = a._lay
    grid = lay.grid
    if not adjoint:
        if replicated:
            X = X[lay.co[lay.cj]:lay.co[lay.cj + 1]]
        Y = a._local_product(np.ascontiguousarray(X), False)
        return allreduce(grid.sub_comm([1]), Y, "sum") if grid.dims[1] > 1 else Y
    if replicated:
        X = X[lay.ro[lay.ri]:lay.ro[lay.ri + 1]]
    Z = a._local_product(np.ascontiguousarray(X), True)
    return allreduce(grid.sub_comm([0]), Z, "sum") if grid.dims[0] > 1 else Z
