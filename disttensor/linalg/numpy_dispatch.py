"""NumPy dispatch of the linalg functions: :data:`HANDLED_FUNCTIONS` (``np.dot``,
``np.tensordot``, ``np.einsum``, ``np.inner``,
``np.outer``, ``np.kron``, ``np.trace``, ``np.diagonal``, ``np.cross`` and
``np.linalg.*``, reached through ``DistArray.__array_function__``) and :data:`GUFUNCS`
(``np.matmul``, NumPy 2's ``np.vecdot``: gufuncs, reached through ``__array_ufunc__``, see
:mod:`disttensor.routines.ufuncs`).

Each entry takes NumPy's signature and calls the distributed function (so it is collective
like it); ``out=`` and keywords the distributed function does not support raise ``TypeError``
(``np.linalg.matrix_rank``'s absolute ``tol=`` too: only ``rtol=`` is supported).
"""
from __future__ import annotations

import numpy as np

from .contractions import (cross, diagonal, inner, kron, matrix_transpose, outer, tensordot,
                           trace, vecdot)
from .decompositions import qr, svd, svdvals
from .eigen import eig, eigvals
from .einsum import einsum
from .gather_path import cholesky, det, eigh, eigvalsh, inv, slogdet, solve
from .least_squares import lstsq
from .matrix_functions import matrix_power, matrix_rank, pinv
from .matrix_product import matmul
from .norms import cond, matrix_norm, norm, vector_norm

__all__ = ["HANDLED_FUNCTIONS", "GUFUNCS"]


def _no_out(name, kwargs):
    if kwargs.pop("out", None) is not None:
        raise TypeError(f"out= is not supported for DistArray {name}")
    if kwargs:
        raise TypeError(f"{name}: unsupported keyword argument(s) {sorted(kwargs)}")


def _np_dot(a, b, out=None):
    _no_out("dot", {"out": out})
    na = a.ndim if hasattr(a, "ndim") else np.ndim(a)
    nb = b.ndim if hasattr(b, "ndim") else np.ndim(b)
    if na > 2 or nb > 2:
        return tensordot(a, b, axes=([na - 1], [max(nb - 2, 0)]))
    if na == 0 or nb == 0:
        return np.multiply(a, b)
    return matmul(a, b)


def _np_einsum(subscripts, *operands, **kwargs):
    """``np.einsum``: ``optimize`` is ignored (greedy order), ``dtype``/``casting``/``order``
    and ``out=`` raise ``TypeError``."""
    _no_out("einsum", {k: v for k, v in kwargs.items() if k not in ("optimize",)})
    return einsum(subscripts, *operands)


def _np_vecdot(x1, x2, /, *, axis=-1, **kwargs):
    _no_out("vecdot", kwargs)
    return vecdot(x1, x2, axis=axis)


def _np_matmul(x1, x2, /, **kwargs):
    _no_out("matmul", kwargs)
    return matmul(x1, x2)


def _np_matrix_rank(A, tol, hermitian, rtol):
    """``numpy.linalg.matrix_rank``: ``tol`` is absolute in NumPy; only ``rtol`` (or neither)
    is supported here."""
    if tol is not None:
        raise TypeError("matrix_rank of a DistArray takes rtol=, not the absolute tol=")
    return matrix_rank(A, rtol=rtol)


# gufuncs (np.matmul, np.vecdot) reach DistArrays through __array_ufunc__, see ufuncs.py
GUFUNCS = {np.matmul: _np_matmul}
if hasattr(np, "vecdot"):
    GUFUNCS[np.vecdot] = _np_vecdot

HANDLED_FUNCTIONS = {
    np.dot: _np_dot,
    np.tensordot: lambda a, b, axes=2: tensordot(a, b, axes),
    np.einsum: _np_einsum,
    np.inner: inner,
    np.kron: kron,
    np.outer: lambda a, b, out=None: (_no_out("outer", {"out": out}), outer(a, b))[1],
    np.trace: lambda a, offset=0, axis1=0, axis2=1, dtype=None, out=None:
        (_no_out("trace", {"out": out}), trace(a, offset, axis1, axis2, dtype))[1],
    np.diagonal: lambda a, offset=0, axis1=0, axis2=1: diagonal(a, offset, axis1, axis2),
    np.cross: lambda a, b, axisa=-1, axisb=-1, axisc=-1, axis=None:
        cross(a, b, axis=-1 if axis is None else axis),
    np.linalg.norm: lambda x, ord=None, axis=None, keepdims=False: norm(x, ord, axis, keepdims),
    np.linalg.qr: lambda a, mode="reduced": qr(a, mode),
    np.linalg.svd: lambda a, full_matrices=True, compute_uv=True, hermitian=False:
        svd(a, full_matrices, compute_uv, hermitian),
    np.linalg.solve: solve,
    np.linalg.inv: inv,
    np.linalg.det: det,
    np.linalg.slogdet: slogdet,
    np.linalg.cholesky: lambda a, /, *, upper=False: cholesky(a, upper=upper),
    np.linalg.eigh: lambda a, UPLO="L": eigh(a, UPLO),
    np.linalg.eigvalsh: lambda a, UPLO="L": eigvalsh(a),
    np.linalg.eig: eig,
    np.linalg.eigvals: eigvals,
    np.linalg.lstsq: lambda a, b, rcond=None: lstsq(a, b, rcond),
    np.linalg.cond: lambda x, p=None: cond(x, p),
    np.linalg.matrix_power: matrix_power,
    np.linalg.matrix_rank: lambda A, tol=None, hermitian=False, *, rtol=None:
        _np_matrix_rank(A, tol, hermitian, rtol),
    np.linalg.pinv: lambda a, rcond=None, hermitian=False, *, rtol=None:
        pinv(a, rtol=rtol if rcond is None else rcond),
}
# numpy.linalg's array API names (NumPy 2), where they are functions rather than gufuncs
for _name, _fn in (("matmul", _np_matmul), ("tensordot", tensordot), ("vecdot", _np_vecdot),
                   ("matrix_norm", matrix_norm), ("vector_norm", vector_norm), ("outer", outer),
                   ("svdvals", svdvals), ("matrix_transpose", matrix_transpose),
                   ("cross", cross),
                   ("trace", lambda x, /, *, offset=0, dtype=None:
                       trace(x, offset, -2, -1, dtype)),
                   ("diagonal", lambda x, /, *, offset=0: diagonal(x, offset, -2, -1))):
    _f = getattr(np.linalg, _name, None)
    if _f is not None and not isinstance(_f, np.ufunc):
        HANDLED_FUNCTIONS[_f] = _fn
del _name, _fn, _f
