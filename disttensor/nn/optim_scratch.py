"""The scratch path of the optimizers' NumPy updates: temporaries in buffers the optimizer
keeps (one per slot and dtype, grown to the largest parameter; the view for each shape kept),
coefficients in 0-d arrays of the parameter's dtype, so that a steady ``step`` asks NumPy for
no memory.  The updates written with them run the same operations in the same order as the
plain expressions, so they give the same bits; nothing here enters ``state_dict``.  Local (no
MPI), NumPy only (CuPy arrays and ndarray subclasses take the plain expressions)."""
from __future__ import annotations

import numpy as np

__all__ = ["_in_place_ok", "_scratch", "_coefficients"]


def _in_place_ok(d, grad) -> bool:
    """Whether the update may run on scratch buffers: a NumPy parameter and a NumPy gradient
    of its shape and dtype (anything else, CuPy arrays and ndarray subclasses included, takes
    the plain expressions; both give the same bits).  Every size: with its views kept per
    shape and its coefficients in 0-d arrays of the parameter's dtype, the scratch path is
    no slower than the plain expressions even on parameters of a few elements."""
    return (type(d) is np.ndarray and type(grad) is np.ndarray and grad.dtype == d.dtype
            and grad.shape == d.shape)


def _scratch(opt, slot: str, like) -> np.ndarray:
    """A scratch array shaped like ``like`` from ``opt``'s buffers (one per slot and dtype,
    grown to the largest parameter seen; valid until the next request of the slot).  Not
    part of the state: ``state_dict`` never sees them.  The view for each shape is kept, so
    a steady step makes no array here."""
    key = (slot, like.shape, like.dtype)
    try:
        return opt._scratch_views[key]
    except AttributeError:
        opt._scratch_views, opt._scratch_buffers = {}, {}
    except KeyError:
        pass
    views, bufs = opt._scratch_views, opt._scratch_buffers
    bkey = (slot, like.dtype.str)
    buf = bufs.get(bkey)
    n = like.size
    if buf is None or buf.size < n:
        buf = bufs[bkey] = np.empty(max(n, 1), dtype=like.dtype)
        for k in [k for k in views if k[0] == slot and k[2] == like.dtype]:
            del views[k]                 # (views of the outgrown buffer)
    v = views[key] = buf[:n].reshape(like.shape)
    return v


def _coefficients(opt, slot: str, dtype, *values) -> tuple:
    """``values`` (Python numbers) as 0-d arrays of ``dtype``, kept by ``opt`` and refilled
    at each call whose values differ from the last call's of the ``slot`` (or hold a zero,
    which compares equal to one of the other sign): a NumPy
    operation with such an operand makes no array of its own (a Python float operand becomes
    a new 0-d array, and another one cast to the array's dtype, in every call) and gives the
    same bits (a weak Python float is cast to ``dtype`` the same way)."""
    key = (slot, dtype)
    try:
        last, arrs = opt._coefficient_arrays[key]
    except (AttributeError, KeyError):
        if "_coefficient_arrays" not in opt.__dict__:
            opt._coefficient_arrays = {}
        last, arrs = None, ()
    if len(arrs) != len(values):
        arrs = tuple(np.zeros((), dtype) for _ in values)
    if values != last or 0.0 in values:     # (a zero may change sign: refilled)
        for z, v in zip(arrs, values):
            z[()] = v
        opt._coefficient_arrays[key] = (values, arrs)
    return arrs
