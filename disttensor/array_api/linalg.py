"""The array API's ``linalg`` extension (``xp.linalg``): :mod:`disttensor.linalg` with the
standard's signatures.  Most functions are :mod:`disttensor.linalg`'s own; ``diagonal`` and
``trace`` act on the last two axes (NumPy's ``axis1=0, axis2=1`` defaults differ), and the
operands are positional-only where the standard says so.  Every function is collective."""
from __future__ import annotations

from .. import linalg as _L

__all__ = ["cholesky", "cross", "det", "diagonal", "eigh", "eigvalsh", "inv", "matmul",
           "matrix_norm", "matrix_power", "matrix_rank", "matrix_transpose", "outer", "pinv",
           "qr", "slogdet", "solve", "svd", "svdvals", "tensordot", "trace", "vecdot",
           "vector_norm"]

cross = _L.cross
matrix_norm = _L.matrix_norm
matrix_power = _L.matrix_power
matrix_rank = _L.matrix_rank
pinv = _L.pinv
vecdot = _L.vecdot
vector_norm = _L.vector_norm


def cholesky(x, /, *, upper: bool = False):
    return _L.cholesky(x, upper=upper)


def det(x, /):
    return _L.det(x)


def diagonal(x, /, *, offset: int = 0):
    """The diagonals of the matrices on the last two axes."""
    return _L.diagonal(x, offset, -2, -1)


def eigh(x, /):
    return _L.eigh(x)


def eigvalsh(x, /):
    return _L.eigvalsh(x)


def inv(x, /):
    return _L.inv(x)


def matmul(x1, x2, /):
    return _L.matmul(x1, x2)


def matrix_transpose(x, /):
    return _L.matrix_transpose(x)


def outer(x1, x2, /):
    return _L.outer(x1, x2)


def qr(x, /, *, mode: str = "reduced"):
    """TSQR (``mode='reduced'``; ``'complete'`` raises ``ValueError``)."""
    return _L.qr(x, mode)


def slogdet(x, /):
    return _L.slogdet(x)


def solve(x1, x2, /):
    return _L.solve(x1, x2)


def svd(x, /, *, full_matrices: bool = True):
    return _L.svd(x, full_matrices=full_matrices)


def svdvals(x, /):
    return _L.svdvals(x)


def tensordot(x1, x2, /, *, axes=2):
    return _L.tensordot(x1, x2, axes)


def trace(x, /, *, offset: int = 0, dtype=None):
    """The traces of the matrices on the last two axes."""
    return _L.trace(x, offset, -2, -1, dtype)
