"""Iterative solvers on distributed sparse matrices, in the style of ``scipy.sparse.linalg``
(collective over the matrix's grid).

* :func:`cg`: conjugate gradients for a symmetric positive definite
  :class:`~disttensor.sparse.DistCSBMatrix`, optionally Jacobi-preconditioned.
* :func:`power_iteration` and :func:`eigsh` (``k=1``, ``which="LM"`` only): the eigenvalue of
  largest magnitude of a symmetric matrix (a graph's adjacency: its largest eigenvalue).

Vectors are DistArrays laid out like ``A @ x``'s result (:meth:`output_distribution`); ``b``,
``x0`` in another layout on the same ranks are redistributed first.  The iterations work on
the local blocks: per CG step one product (plus, when the matrix's column distribution differs
from its row distribution -- always in the 2-D ``"blocks"`` layout -- one redistribution of the
search direction) and two all-reduces of two numbers.  Dot products sum each element once
(replicas along grid axis 1 of the block layout are not counted twice).

Differences from SciPy: ``rtol`` defaults to ``1e-10`` (SciPy: ``1e-5``); ``M`` is ``None``,
``"jacobi"`` (the inverse diagonal), a DistArray (multiplied elementwise: an inverse
diagonal) or a callable ``r -> z`` on DistArrays (SciPy: a LinearOperator); ``info`` is
``0`` on convergence, else the number of iterations made (as SciPy's).
"""
from __future__ import annotations

import math

import numpy as np

from ..core.array import DistArray
from ..core.entry import agreed, collective_entry, operand_key
from ..core.redistribute import redistribute_blocks
from .dist_products import _blocks_product, _rows_product
from .distributed import DistCSBMatrix
from .laplacian import hashed_uniform

__all__ = ["cg", "power_iteration", "eigsh"]


class _Operator:
    """``A @ p`` on local blocks of the output distribution (no agreement per call)."""

    def __init__(self, a: DistCSBMatrix, dtype):
        self.a = a
        self.dtype = np.dtype(dtype)
        self.out_d = a.output_distribution()
        self.in_d = a.input_distribution()
        self.comm = a.grid.cart
        self.same = self.out_d == self.in_d
        # the communicator over which the vectors' blocks are disjoint
        self.dot_comm = self.comm if a.layout == "rows" or a.grid.dims[1] == 1 else \
            a.grid.sub_comm([0])

    def __call__(self, p: np.ndarray) -> np.ndarray:
        a = self.a
        x = p if self.same else redistribute_blocks(self.comm, p, self.out_d, self.in_d)
        X = np.ascontiguousarray(x).reshape(-1, 1)
        if a.layout == "rows":
            y = _rows_product(a, X, False, False, None)
        else:
            y = _blocks_product(a, X, False, False)
        return y.reshape(-1)

    def dots(self, *pairs) -> np.ndarray:
        """Global dot products of local block pairs, in one all-reduce."""
        local = np.array([float(np.dot(u, v)) for u, v in pairs])
        if self.dot_comm.size == 1:
            return local
        out = np.empty_like(local)
        self.dot_comm.Allreduce(local, out)
        return out

    def vector(self, local: np.ndarray) -> DistArray:
        return DistArray(local, self.out_d, self.a.grid)

    def local_of(self, v, what: str) -> np.ndarray:
        if isinstance(v, DistArray):
            if v.shape != self.out_d.shape:
                raise ValueError(f"{what} has shape {v.shape}, the matrix needs "
                                 f"{self.out_d.shape}")
            if v.distribution != self.out_d or v.grid.dims != self.a.grid.dims:
                v = v.redistribute(self.a.grid, split=self.out_d.split,
                                   sizes=list(self.out_d.split_sizes))
            return np.array(v.local, dtype=self.dtype)
        v = np.asarray(v)
        if v.shape != self.out_d.shape:
            raise ValueError(f"{what} has shape {v.shape}, the matrix needs {self.out_d.shape}")
        return np.array(v[self.out_d.block_slices(self.a.grid.coords)], dtype=self.dtype)


def _check_square(a, name: str) -> None:
    if not isinstance(a, DistCSBMatrix):
        raise TypeError(f"{name} needs a DistCSBMatrix, got {type(a).__name__}")
    if a.shape[0] != a.shape[1]:
        raise ValueError(f"{name} needs a square matrix, got shape {a.shape}")


@collective_entry
def cg(A: DistCSBMatrix, b, x0=None, *, rtol: float = 1e-10, atol: float = 0.0,
       maxiter: int | None = None, M=None, callback=None):
    """Solve ``A x = b`` by conjugate gradients (``A`` symmetric positive definite).

    Stops when ``||b - A x|| <= max(rtol * ||b||, atol)`` (the recursively updated residual)
    or after ``maxiter`` iterations (default ``10 n``).  Returns ``(x, info)``: ``x`` a DistArray
    laid out as ``A.output_distribution()``, ``info`` 0 on convergence else the iterations
    made.  ``callback(xk)`` (a DistArray) runs after each iteration on every rank."""
    comm = A.grid.cart if isinstance(A, DistCSBMatrix) else None
    mkey = M if isinstance(M, (str, type(None))) else operand_key(M)
    with agreed(comm, "sparse.linalg.cg", A=A._key() if comm else None, b=operand_key(b),
                x0=operand_key(x0), rtol=rtol, atol=atol, maxiter=maxiter, M=mkey,
                callback=callback is not None):
        _check_square(A, "cg")
        if not (rtol >= 0 and atol >= 0):
            raise ValueError(f"rtol and atol must be non-negative, got {rtol} and {atol}")
        if maxiter is not None and (int(maxiter) != maxiter or maxiter < 0):
            raise ValueError(f"maxiter must be a non-negative integer, got {maxiter!r}")
        if isinstance(M, str) and M != "jacobi":
            raise ValueError(f"M must be None, 'jacobi', a DistArray or a callable, got {M!r}")
        dtype = np.result_type(A.dtype, getattr(b, "dtype", np.float64))
        op = _Operator(A, dtype)
    bl = op.local_of(b, "b")
    x = op.local_of(x0, "x0") if x0 is not None else np.zeros_like(bl)
    precond = _preconditioner(A, M, op)
    maxiter = 10 * A.shape[0] if maxiter is None else int(maxiter)
    r = bl - op(x) if x0 is not None else bl.copy()
    (bnorm2, rr) = op.dots((bl, bl), (r, r))
    tol = max(rtol * math.sqrt(bnorm2), atol)
    if math.sqrt(rr) <= tol:
        return op.vector(x), 0
    z = precond(r)
    p = z.copy()
    rz = op.dots((r, z))[0] if precond is not _identity else rr
    for it in range(1, maxiter + 1):
        q = op(p)
        pq = op.dots((p, q))[0]
        alpha = rz / pq
        x += alpha * p
        r -= alpha * q
        if precond is _identity:
            rr = op.dots((r, r))[0]
            rz_new = rr
            z = r
        else:
            z = precond(r)
            rr, rz_new = op.dots((r, r), (r, z))
        if callback is not None:
            callback(op.vector(x.copy()))
        if math.sqrt(rr) <= tol:
            return op.vector(x), 0
        p *= rz_new / rz
        p += z
        rz = rz_new
    return op.vector(x), maxiter


def _identity(r):
    return r


def _preconditioner(A, M, op: _Operator):
    if M is None:
        return _identity
    if isinstance(M, str):  # "jacobi"
        d = A._diag.astype(op.dtype)
        zero = bool(np.any(d == 0))
        if op.comm.allreduce(zero) if op.comm.size > 1 else zero:
            raise ValueError("M='jacobi' needs a diagonal without zeros")
        inv = 1.0 / d
        return lambda r: inv * r
    if isinstance(M, DistArray) or hasattr(M, "shape"):
        inv = op.local_of(M, "M")
        return lambda r: inv * r
    if callable(M):
        return lambda r: op.local_of(M(op.vector(r.copy())), "M(r)")
    raise TypeError(f"M must be None, 'jacobi', a DistArray or a callable, got "
                    f"{type(M).__name__}")


@collective_entry
def power_iteration(A: DistCSBMatrix, x0=None, *, tol: float = 1e-8, maxiter: int = 10_000,
                    seed: int = 0):
    """The eigenvalue of largest magnitude of the symmetric ``A`` and its unit eigenvector.

    Iterates ``v <- A v / ||A v||`` from ``x0`` (default: positive numbers hashed from
    ``seed`` and the global index, the same on any grid) until the residual
    ``||A v - lam v|| <= tol |lam|`` (``lam = v . A v``, the Rayleigh quotient, whose error is
    then about ``tol^2 |lam|`` times the ratio to the spectral gap).  Returns
    ``(lam, v, info)``: ``info`` 0 on convergence else the iterations made.  Converges
    slowly when the two largest magnitudes are close (and not at all for ``lam`` and ``-lam``,
    e.g. a bipartite graph)."""
    comm = A.grid.cart if isinstance(A, DistCSBMatrix) else None
    with agreed(comm, "sparse.linalg.power_iteration", A=A._key() if comm else None,
                x0=operand_key(x0), tol=tol, maxiter=maxiter, seed=seed):
        _check_square(A, "power_iteration")
        if not tol > 0 or int(maxiter) != maxiter or maxiter < 1:
            raise ValueError(f"tol must be positive and maxiter a positive integer, got "
                             f"{tol!r} and {maxiter!r}")
        op = _Operator(A, A.dtype)
    if x0 is None:
        sl = op.out_d.block_slices(A.grid.coords)[0]
        v = 0.5 + hashed_uniform(seed, np.arange(sl.start, sl.stop)).astype(op.dtype)
    else:
        v = op.local_of(x0, "x0")
    nv = math.sqrt(op.dots((v, v))[0])
    if nv == 0:
        raise ValueError("the start vector is zero")
    v /= nv
    lam = 0.0
    for it in range(1, int(maxiter) + 1):
        w = op(v)
        lam, ww = op.dots((v, w), (w, w))
        if ww == 0:
            return 0.0, op.vector(v), 0
        res = w - lam * v   # (not ww - lam^2: cancellation would hide residuals < 1e-8)
        if math.sqrt(op.dots((res, res))[0]) <= tol * abs(lam):
            return float(lam), op.vector(w / math.sqrt(ww)), 0
        v = w / math.sqrt(ww)
    return float(lam), op.vector(v), int(maxiter)


def eigsh(A: DistCSBMatrix, k: int = 1, which: str = "LM", v0=None, maxiter=None,
          tol: float = 0.0, return_eigenvectors: bool = True):
    """``scipy.sparse.linalg.eigsh`` lite: only ``k=1``, ``which="LM"``, by
    :func:`power_iteration` (``tol=0``: 1e-8).  Returns ``(w, v)`` (``w`` a NumPy array of one
    eigenvalue, ``v`` a DistArray ``(n,)``), or ``w`` alone; ``RuntimeError`` on every rank
    if it did not converge."""
    if k != 1 or which != "LM":
        raise NotImplementedError("eigsh here computes only k=1, which='LM'")
    lam, v, info = power_iteration(A, v0, tol=tol or 1e-8,
                                   maxiter=10_000 if maxiter is None else maxiter)
    if info:
        raise RuntimeError(f"eigsh: no convergence after {info} iterations")
    w = np.array([lam])
    return (w, v) if return_eigenvectors else w
