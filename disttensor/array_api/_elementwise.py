"""Elementwise functions of the array API namespace.

Each maps to a NumPy ufunc applied through :meth:`DistArray.__array_ufunc__` (the alignment
rule of :mod:`disttensor.core.array`: the result takes the layout of the first DistArray operand
of the full result shape, the other operands are redistributed; Python scalars are weak, as
in the standard and NumPy 2).  ``real``, ``imag``, ``clip`` and ``round`` go through
:func:`disttensor.routines.ufuncs.elementwise`.  Every call is collective over the operands'
grid.  ``ceil``/``floor``/``trunc``/``round`` of an integer array return a copy of the same
dtype (the standard's rule).  Special cases (NaN, infinities, signed zeros) are NumPy's, which
follow the standard's tables for the functions tested in ``tests/mpi/test_array_api.py``.
"""
from __future__ import annotations

import numpy as np

from ..routines import mathematical as _math
from ..routines.ufuncs import elementwise as _elementwise
from ..core.array import DistArray
from ..core.backend import array_module

UNARY = {
    "abs": np.absolute, "acos": np.arccos, "acosh": np.arccosh, "asin": np.arcsin,
    "asinh": np.arcsinh, "atan": np.arctan, "atanh": np.arctanh, "bitwise_invert": np.invert,
    "ceil": np.ceil, "conj": np.conjugate, "cos": np.cos, "cosh": np.cosh, "exp": np.exp,
    "expm1": np.expm1, "floor": np.floor, "isfinite": np.isfinite, "isinf": np.isinf,
    "isnan": np.isnan, "log": np.log, "log1p": np.log1p, "log2": np.log2, "log10": np.log10,
    "logical_not": np.logical_not, "negative": np.negative, "positive": np.positive,
    "reciprocal": np.reciprocal, "sign": np.sign, "signbit": np.signbit, "sin": np.sin,
    "sinh": np.sinh, "square": np.square, "sqrt": np.sqrt, "tan": np.tan, "tanh": np.tanh,
    "trunc": np.trunc,
}

BINARY = {
    "add": np.add, "atan2": np.arctan2, "bitwise_and": np.bitwise_and,
    "bitwise_left_shift": np.left_shift, "bitwise_or": np.bitwise_or,
    "bitwise_right_shift": np.right_shift, "bitwise_xor": np.bitwise_xor,
    "copysign": np.copysign, "divide": np.divide, "equal": np.equal,
    "floor_divide": np.floor_divide, "greater": np.greater, "greater_equal": np.greater_equal,
    "hypot": np.hypot, "less": np.less, "less_equal": np.less_equal,
    "logaddexp": np.logaddexp, "logical_and": np.logical_and, "logical_or": np.logical_or,
    "logical_xor": np.logical_xor, "maximum": np.maximum, "minimum": np.minimum,
    "multiply": np.multiply, "nextafter": np.nextafter, "not_equal": np.not_equal,
    "pow": np.power, "remainder": np.remainder, "subtract": np.subtract,
}

_INTEGER_IDENTITY = {"ceil", "floor", "trunc"}


def _check_array(x, name):
    if not isinstance(x, DistArray):
        raise TypeError(f"{name}: expected a DistArray, got {type(x).__name__}")


def _unary(name, uf):
    def f(x, /):
        _check_array(x, name)
        if name in _INTEGER_IDENTITY and x.dtype.kind in "biu":
            return x.copy()
        return uf(x)
    f.__name__ = f.__qualname__ = name
    f.__doc__ = f"Elementwise ``numpy.{uf.__name__}`` (collective)."
    return f


def _binary(name, uf):
    def f(x1, x2, /):
        if not isinstance(x1, DistArray) and not isinstance(x2, DistArray):
            raise TypeError(f"{name}: at least one argument must be a DistArray")
        return uf(x1, x2)
    f.__name__ = f.__qualname__ = name
    f.__doc__ = f"Elementwise ``numpy.{uf.__name__}`` (collective; Python scalars are weak)."
    return f


FUNCTIONS = {n: _unary(n, u) for n, u in UNARY.items()}
FUNCTIONS.update({n: _binary(n, u) for n, u in BINARY.items()})


def real(x, /):
    """Real part (a real dtype; a copy for real input)."""
    _check_array(x, "real")
    return _elementwise(lambda u: u.real.copy(), "real", (x,))


def imag(x, /):
    """Imaginary part (a real dtype; zeros for real input)."""
    _check_array(x, "imag")
    return _elementwise(lambda u: u.imag.copy() if u.dtype.kind == "c"
                          else np.zeros_like(u), "imag", (x,))


def clip(x, /, min=None, max=None):  # noqa: A002
    """``x`` limited to ``[min, max]`` (scalars or DistArrays; the dtype of ``x``)."""
    _check_array(x, "clip")
    return _math.clip(x, min, max)


def round(x, /):  # noqa: A001
    """Round half to even (the dtype of ``x``; a copy for integers)."""
    _check_array(x, "round")
    if x.dtype.kind in "biu":
        return x.copy()
    return _math.round(x, 0)


def sign(x, /):
    """``-1``, ``0`` or ``1`` for real ``x``; ``x / |x|`` (``0`` at ``0``) for complex ``x``,
    the standard's definition (computed so, not by ``numpy.sign``, whose complex result can
    differ in the last bit)."""
    _check_array(x, "sign")
    if x.dtype.kind != "c":
        return np.sign(x)

    def f(u):
        xp = array_module(u)
        return u / xp.abs(xp.where(u != 0, u, xp.asarray(1.0, dtype=u.dtype)))
    return _elementwise(f, "sign", (x,))


FUNCTIONS.update(real=real, imag=imag, clip=clip, round=round, sign=sign)
