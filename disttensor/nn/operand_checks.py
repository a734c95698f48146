"""Operand rules of the differentiable layer functions: what an activation must be, and
PyTorch's dtype rule for parameters.

* :func:`activation`: the activation argument of a layer function must be a
  :class:`~disttensor.autograd.Tensor` holding a :class:`~disttensor.DistArray` (or a bare
  DistArray); anything else (a NumPy array, a list, a tensor of a replicated array) raises
  ``TypeError`` naming the function, the argument and what it got, as PyTorch's
  ``linear(): argument 'input' must be Tensor, not numpy.ndarray``.  There is no communicator
  to agree on before such an argument is recognised, so the error is raised by each rank that
  passed it, before any communication (a program that passes the same kind on every rank
  raises the same error on every rank).
* :func:`compute_params`: outside :func:`disttensor.nn.amp.autocast` a parameter whose dtype
  differs from the activation's raises ``RuntimeError`` ("expected input and weight to have
  the same dtype ..."), as PyTorch does; inside autocast parameters are cast to the
  activation's dtype for the op (float32 master weights with float16/bfloat16 activations)
  and their gradients cast back.  Batch norm, as PyTorch's on CPU, also takes float32
  parameters with float16/bfloat16 input outside autocast.  The rule reads replicated
  metadata only (the activation's global dtype, the parameters' dtypes), so the ranks decide
  alike; a rank whose metadata differs makes the check collective: the passing ranks record
  it as a deferred call (:func:`disttensor.core.agreement.defer`, no message), the failing
  ones raise inside an agreed block, and the op's own agreement then raises on every rank.
"""
from __future__ import annotations

import numpy as np

from ..autograd.tensor import Tensor
from ..core import agreement
from ..core.array import DistArray
from ..core.entry import agreed
from .amp import is_autocast_enabled

__all__ = ["activation", "compute_params", "type_name"]

_LOW_PRECISION = ("float16", "bfloat16")


def type_name(v) -> str:
    """``numpy.ndarray``, ``list``, ``disttensor.autograd.Tensor`` ...: as PyTorch names it."""
    t = type(v)
    mod = t.__module__.split(".")[0]
    return t.__name__ if mod == "builtins" else f"{mod}.{t.__name__}"


def activation(fn: str, x, what: str = "input") -> DistArray:
    """The DistArray of the activation ``x`` of layer function ``fn``; ``TypeError`` unless
    ``x`` is a Tensor holding a DistArray or a DistArray (module docstring)."""
    v = x.data if isinstance(x, Tensor) else x
    if isinstance(v, DistArray):
        return v
    if isinstance(x, Tensor):
        raise TypeError(f"{fn}(): argument {what!r} must be Tensor of a DistArray (activations "
                        f"are distributed), not a Tensor of {type_name(v)}")
    raise TypeError(f"{fn}(): argument {what!r} must be Tensor, not {type_name(x)} (wrap a "
                    "DistArray: disttensor.autograd.Tensor(dt.from_global(a, grid=...)))")


def _allowed(fn_mixed: bool, x_dtype, p_dtype) -> bool:
    if p_dtype == x_dtype:
        return True
    if is_autocast_enabled():
        return np.dtype(p_dtype).kind == "f" and (np.dtype(x_dtype).kind == "f" or
                                                  str(x_dtype) in _LOW_PRECISION)
    return fn_mixed and str(x_dtype) in _LOW_PRECISION and np.dtype(p_dtype) == np.float32


def compute_params(fn: str, xv: DistArray, params: dict, *, cast: bool = True,
                   mixed_low_precision: bool = False) -> list:
    """The values of ``params`` (``{name: Tensor | array | None}``, e.g. ``weight``, ``bias``)
    for an op on activation ``xv``: checked against PyTorch's dtype rule (module docstring)
    and, with ``cast``, cast to ``xv``'s dtype (a copy only where the dtypes differ).
    ``mixed_low_precision``: float32 parameters with float16/bfloat16 input are allowed
    outside autocast (batch norm)."""
    vals = [p.data if isinstance(p, Tensor) else p for p in params.values()]
    xd = xv.dtype
    bad = None
    for n, v in zip(params, vals):
        if v is not None and v.dtype != xd and not _allowed(mixed_low_precision, xd, v.dtype):
            bad = (n, v)
            break
    comm = xv.grid.cart
    if bad is None:
        if comm.size > 1 and agreement.deferring():
            agreement.defer(comm, fn + " dtypes", (("input", xd.str), ("params", tuple(
                None if v is None else v.dtype.str for v in vals))))
    else:
        name, v = bad
        dtypes = tuple(None if v is None else str(v.dtype) for v in vals)
        with agreed(comm, f"{fn} dtypes", input=str(xd), params=dtypes):
            raise RuntimeError(
                f"{fn}(): expected input and {name} to have the same dtype, but got input "
                f"{xd} and {name} {v.dtype} (cast the model, e.g. model.double() / "
                f"model.to(dtype=...), or the input with astype; mixed precision runs inside "
                f"disttensor.nn.amp.autocast())")
    if not cast:
        return vals
    return [v if v is None or v.dtype == xv.dtype else v.astype(xv.dtype) for v in vals]
