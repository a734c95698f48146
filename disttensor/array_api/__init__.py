"""``disttensor.array_api``: the Python array API standard (version 2024.12) namespace for
DistArrays.

``x.__array_namespace__()`` returns this module, so code written against the standard
(``xp = array_namespace(x); xp.sum(xp.sin(x), axis=0)``) runs on distributed arrays.  Every
function is collective over the grid of its DistArray arguments (the default grid for
creation functions) and keeps the contracts of the modules it wraps: creation
(:mod:`._creation`), elementwise (:mod:`._elementwise`), statistical, manipulation, utility,
indexing and searching (:mod:`._functions`), data types (:mod:`._dtypes`).  Sorting, set,
scan, ``nonzero``/``searchsorted``, linear algebra (``matmul``, ``tensordot``, ``vecdot``
and the ``linalg`` extension) and the ``fft`` extension come from
:mod:`disttensor.routines.sorting`, ``.searching``, ``.sets`` and ``.scans``,
:mod:`disttensor.linalg` and :mod:`disttensor.fft`, looked up when first used: a name whose
provider is missing raises ``AttributeError`` naming the module that would provide it.
:func:`coverage` lists what is provided.

Extensions beyond the standard (keyword-only, so portable code never sees them):
``grid``/``split``/``sizes`` on creation functions and ``asarray``.  Mixed-kind promotion
(integer with floating) follows NumPy in the operators; :func:`result_type` raises for it.
"""
from __future__ import annotations

import importlib

import numpy as _np

from ._creation import *  # noqa: F401,F403
from ._creation import __all__ as _creation_all
from ._dtypes import (bool, can_cast, complex64, complex128, finfo, float32, float64,  # noqa: A004
                      iinfo, int8, int16, int32, int64, isdtype, result_type, uint8, uint16,
                      uint32, uint64)
from ._elementwise import FUNCTIONS as _ELEMENTWISE
from ._functions import *  # noqa: F401,F403
from ._functions import __all__ as _functions_all
from ._info import __array_namespace_info__  # noqa: F401

__array_api_version__ = "2024.12"

e, inf, nan, pi, newaxis = _np.e, _np.inf, _np.nan, _np.pi, None

globals().update(_ELEMENTWISE)

#: names of the standard provided by other modules (first module that has it wins)
_SORT, _SEARCH, _SETS, _SCANS = (("disttensor.routines." + m,)
                                  for m in ("sorting", "searching", "sets", "scans"))
_LAZY = {
    "argsort": _SORT, "sort": _SORT, "searchsorted": _SEARCH, "nonzero": _SEARCH,
    "unique_all": _SETS, "unique_counts": _SETS, "unique_inverse": _SETS,
    "unique_values": _SETS, "isin": _SETS, "cumulative_sum": _SCANS,
    "cumulative_prod": _SCANS,
    "matmul": ("disttensor.linalg",), "tensordot": ("disttensor.linalg",),
    "vecdot": ("disttensor.linalg",),
}
_EXTENSIONS = {"linalg": "disttensor.array_api.linalg", "fft": "disttensor.fft"}

#: every function name of the 2024.12 standard (main namespace; extensions separately)
STANDARD_FUNCTIONS = (
    # creation
    "arange", "asarray", "empty", "empty_like", "eye", "from_dlpack", "full", "full_like",
    "linspace", "meshgrid", "ones", "ones_like", "tril", "triu", "zeros", "zeros_like",
    # data types
    "astype", "can_cast", "finfo", "iinfo", "isdtype", "result_type",
    # elementwise
    *sorted(_ELEMENTWISE),
    # indexing
    "take", "take_along_axis",
    # linear algebra
    "matmul", "matrix_transpose", "tensordot", "vecdot",
    # manipulation
    "broadcast_arrays", "broadcast_shapes", "broadcast_to", "concat", "expand_dims", "flip",
    "moveaxis", "permute_dims", "repeat", "reshape", "roll", "squeeze", "stack", "tile",
    "unstack",
    # searching
    "argmax", "argmin", "count_nonzero", "nonzero", "searchsorted", "where",
    # set
    "isin", "unique_all", "unique_counts", "unique_inverse", "unique_values",
    # sorting
    "argsort", "sort",
    # statistical
    "cumulative_prod", "cumulative_sum", "max", "mean", "min", "prod", "std", "sum", "var",
    # utility
    "all", "any", "diff",
    # inspection
    "__array_namespace_info__",
)


def _provider(name: str):
    for mod in _LAZY.get(name, ()):
        try:
            m = importlib.import_module(mod)
        except ImportError:
            continue
        f = getattr(m, name, None)
        if f is not None:
            return f
    return None


#: the standard's signatures of the names provided by other modules: the namespace exposes a
#: wrapper with exactly this signature that calls the provider
_LAZY_SIGNATURES = {
    "argsort": "x, /, *, axis=-1, descending=False, stable=True",
    "sort": "x, /, *, axis=-1, descending=False, stable=True",
    "searchsorted": "x1, x2, /, *, side='left', sorter=None",
    "nonzero": "x, /",
    "unique_all": "x, /", "unique_counts": "x, /", "unique_inverse": "x, /",
    "unique_values": "x, /",
    "isin": "x1, x2, /, *, invert=False",
    "cumulative_sum": "x, /, *, axis=None, dtype=None, include_initial=False",
    "cumulative_prod": "x, /, *, axis=None, dtype=None, include_initial=False",
    "matmul": "x1, x2, /", "tensordot": "x1, x2, /, *, axes=2",
    "vecdot": "x1, x2, /, *, axis=-1",
}
_WRAPPERS: dict = {}


def _wrapper(name: str, provider):
    """A function with the standard's signature of ``name`` that calls ``provider``."""
    sig = _LAZY_SIGNATURES[name]
    pos, _, kw = sig.partition("/")
    pos_names = [p.strip() for p in pos.split(",") if p.strip()]
    kw_names = [p.split("=")[0].strip() for p in kw.split(",") if "=" in p]
    call = ", ".join(pos_names + [f"{k}={k}" for k in kw_names])
    src = f"def {name}({sig}):\n    return _f({call})\n"
    ns = {"_f": provider}
    exec(compile(src, f"<disttensor.array_api.{name}>", "exec"), ns)  # noqa: S102
    f = ns[name]
    f.__doc__ = provider.__doc__
    f.__module__ = __name__
    f.__wrapped_provider__ = provider
    return f


def __getattr__(name: str):
    if name in _LAZY:
        f = _provider(name)
        if f is None:
            raise AttributeError(f"disttensor.array_api.{name} needs {' or '.join(_LAZY[name])}"
                                 f", which does not provide {name!r} (yet)")
        w = _WRAPPERS.get(name)
        if w is None or w.__wrapped_provider__ is not f:
            w = _WRAPPERS[name] = _wrapper(name, f)
        return w
    if name in _EXTENSIONS:
        try:
            return importlib.import_module(_EXTENSIONS[name])
        except ImportError:
            raise AttributeError(f"the {name} extension needs {_EXTENSIONS[name]}, which is "
                                 "not available") from None
    raise AttributeError(f"module 'disttensor.array_api' has no attribute {name!r}")


def coverage() -> dict:
    """``{'provided': [...], 'missing': [...]}`` over :data:`STANDARD_FUNCTIONS` (a function
    is provided when the namespace resolves it and it is not ``from_dlpack``'s stub)."""
    provided, missing = [], []
    for n in STANDARD_FUNCTIONS:
        try:
            globals()[n] if n in globals() else __getattr__(n)
            (missing if n == "from_dlpack" else provided).append(n)
        except AttributeError:
            missing.append(n)
    return {"provided": provided, "missing": missing}


__all__ = (["__array_api_version__", "e", "inf", "nan", "pi", "newaxis", "bool", "int8",
            "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32",
            "float64", "complex64", "complex128", "finfo", "iinfo", "isdtype", "result_type",
            "can_cast", "__array_namespace_info__", "coverage"]
           + list(_creation_all) + list(_functions_all) + sorted(_ELEMENTWISE))
