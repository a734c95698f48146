"""Data types of the array API namespace: the dtype objects (NumPy ``dtype`` instances, so
``x.dtype == xp.float64`` holds for a DistArray ``x``), ``finfo``, ``iinfo``, ``isdtype``,
``result_type`` and ``can_cast`` with the standard's promotion table.

Promotion: within a kind (bool; signed integers; unsigned integers; mixed signed/unsigned
integers up to 64 bits; real floating; complex floating; real with complex floating) the
result is the standard's (which NumPy 2 follows).  Python scalars are weak (``int`` takes the
array's integer dtype, ``float`` a floating one, ``complex`` a complex one).  The standard
leaves mixed-kind promotion (integer with floating, ``int64`` with ``uint64``, bool with
numbers) undefined: :func:`result_type` raises ``TypeError`` for it, as ``array_api_strict``
does, while the arithmetic operators and functions follow NumPy there (documented extension).
"""
from __future__ import annotations

import numpy as np

__all__ = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
           "float32", "float64", "complex64", "complex128", "finfo", "iinfo", "isdtype",
           "result_type", "can_cast", "ALL_DTYPES", "default_dtypes", "as_dtype"]

bool = np.dtype("bool")  # noqa: A001 - the standard's name
int8, int16, int32, int64 = (np.dtype(f"int{b}") for b in (8, 16, 32, 64))
uint8, uint16, uint32, uint64 = (np.dtype(f"uint{b}") for b in (8, 16, 32, 64))
float32, float64 = np.dtype("float32"), np.dtype("float64")
complex64, complex128 = np.dtype("complex64"), np.dtype("complex128")

ALL_DTYPES = {"bool": bool, "int8": int8, "int16": int16, "int32": int32, "int64": int64,
              "uint8": uint8, "uint16": uint16, "uint32": uint32, "uint64": uint64,
              "float32": float32, "float64": float64, "complex64": complex64,
              "complex128": complex128}

_KINDS = {
    "bool": lambda d: d.kind == "b",
    "signed integer": lambda d: d.kind == "i",
    "unsigned integer": lambda d: d.kind == "u",
    "integral": lambda d: d.kind in "iu",
    "real floating": lambda d: d.kind == "f",
    "complex floating": lambda d: d.kind == "c",
    "numeric": lambda d: d.kind in "iufc",
}


def default_dtypes() -> dict:
    return {"real floating": float64, "complex floating": complex128, "integral": int64,
            "indexing": int64}


def as_dtype(d) -> np.dtype:
    """A dtype of the standard (``TypeError`` for anything else)."""
    if hasattr(d, "dtype") and not isinstance(d, (np.dtype, type)):
        d = d.dtype
    try:
        dt = np.dtype(d)
    except TypeError:
        raise TypeError(f"{d!r} is not an array API data type") from None
    if dt not in ALL_DTYPES.values():
        raise TypeError(f"{dt} is not an array API data type")
    return dt


def finfo(type, /):  # noqa: A002 - the standard's parameter name
    """Machine limits of a floating dtype (or of an array's dtype): ``bits``, ``eps``,
    ``max``, ``min``, ``smallest_normal``, ``dtype``."""
    dt = as_dtype(type)
    if dt.kind not in "fc":
        raise ValueError(f"finfo needs a floating data type, got {dt}")
    return np.finfo(dt)


def iinfo(type, /):  # noqa: A002
    """Machine limits of an integer dtype: ``bits``, ``max``, ``min``, ``dtype``."""
    dt = as_dtype(type)
    if dt.kind not in "iu":
        raise ValueError(f"iinfo needs an integer data type, got {dt}")
    return np.iinfo(dt)


def isdtype(dtype, kind) -> bool:
    """Whether ``dtype`` is of ``kind``: a dtype, a kind name of the standard ('bool',
    'signed integer', 'unsigned integer', 'integral', 'real floating', 'complex floating',
    'numeric'), or a tuple of those."""
    dt = as_dtype(dtype)
    if isinstance(kind, tuple):
        return any(isdtype(dt, k) for k in kind)
    if isinstance(kind, str):
        if kind not in _KINDS:
            raise ValueError(f"unknown data type kind {kind!r}")
        return _KINDS[kind](dt)
    return dt == as_dtype(kind)


def _category(dt: np.dtype) -> str:
    return {"b": "b", "i": "int", "u": "int", "f": "fc", "c": "fc"}[dt.kind]


def _promote(a: np.dtype, b: np.dtype) -> np.dtype:
    if a == b:
        return a
    if _category(a) != _category(b):
        raise TypeError(f"{a} and {b} cannot be type promoted together (mixed kinds are not "
                        "defined by the array API standard)")
    r = np.result_type(a, b)
    if r.kind == "f" and _category(a) == "int":  # int64 with uint64: NumPy's float64
        raise TypeError(f"{a} and {b} cannot be type promoted together (no integer dtype "
                        "holds both)")
    return r


def _scalar_ok(dt: np.dtype, s) -> bool:
    import builtins
    if isinstance(s, builtins.bool):
        return dt.kind == "b"
    if isinstance(s, int):
        return dt.kind in "iufc"
    if isinstance(s, float):
        return dt.kind in "fc"
    if isinstance(s, complex):
        return dt.kind == "c" or dt.kind == "f"
    return False


def result_type(*arrays_and_dtypes):
    """The dtype of the standard's type promotion of arrays, dtypes and Python scalars
    (at least one array or dtype; ``TypeError`` for combinations the standard leaves
    undefined)."""
    import builtins
    dts, scalars = [], []
    for a in arrays_and_dtypes:
        if isinstance(a, (builtins.bool, int, float, complex)):
            scalars.append(a)
        else:
            dts.append(as_dtype(a))
    if not dts:
        raise ValueError("at least one array or dtype is required")
    r = dts[0]
    for d in dts[1:]:
        r = _promote(r, d)
    for s in scalars:
        if not _scalar_ok(r, s):
            raise TypeError(f"Python {type(s).__name__} cannot be promoted with {r}")
        if isinstance(s, complex) and r.kind == "f":
            r = np.result_type(r, np.complex64)
    return r


def can_cast(from_, to, /) -> builtins_bool:  # noqa: F821 - annotation only
    """Whether ``from_`` (a dtype or array) promotes to ``to`` under the standard's rules."""
    f, t = as_dtype(from_), as_dtype(to)
    try:
        return _promote(f, t) == t
    except TypeError:
        return False


builtins_bool = type(True)
