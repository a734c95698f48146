"""Elementwise NumPy ufuncs on DistArrays, and the alignment rule for mixed operands.

See the module docstring of :mod:`disttensor.core.array` for the rule; :func:`result_layout` and
:func:`align` implement it and are shared by ``where``, ``__setitem__`` and ``concatenate``.
:func:`elementwise` applies any elementwise local function under the rule (``clip``,
``round``, ``isclose``, ``real``/``imag``...).  Every call is collective over the grid of the
DistArray operands: operands of another layout are redistributed to the result's.
"""
from __future__ import annotations

import numbers

import numpy as np

from ..core.array import DistArray, _check_grids
from ..core.agreement import defer, deferring, token
from ..core.agreement import enabled as agreement_enabled
from ..core.entry import agreed, canon, collective_entry, operand_key
from ..core.entry import depth as entry_depth
from ..core.backend import array_module, to_device
from ..core.distribution import Distribution
from ..core.grid import ProcessGrid

__all__ = ["array_ufunc", "result_layout", "align", "operand_shape", "elementwise",
           "elementwise_layout", "block_result"]

# (np.fmin/np.fmax are not here: their reductions skip NaN, reductions.min/max propagate it)
_REDUCE = {np.add: "sum", np.multiply: "prod", np.minimum: "min", np.maximum: "max",
           np.logical_and: "all", np.logical_or: "any"}


def operand_shape(x) -> tuple[int, ...]:
    if isinstance(x, DistArray):
        return x.shape
    return tuple(np.shape(x))


def _is_array_like(x) -> bool:
    return isinstance(x, np.ndarray) or type(x).__module__.startswith("cupy")


def result_layout(operands, shape) -> tuple[ProcessGrid, Distribution]:
    """The (grid, distribution) of an elementwise result of ``shape`` (alignment rule)."""
    dists = [x for x in operands if isinstance(x, DistArray)]
    if not dists:
        raise TypeError("no DistArray operand")
    for x in dists:
        if x.shape == tuple(shape):
            return x.grid, x.distribution
    grid = dists[0].grid
    nd = len(shape)
    split: list[int | None] = [None] * nd
    sizes: list = [None] * nd
    used = set()
    for j in range(nd):
        for x in dists:
            i = j - (nd - x.ndim)
            if i < 0 or x.shape[i] != shape[j] or x.grid.dims != grid.dims:
                continue
            g = x.split[i]
            if g is not None and g not in used:
                split[j] = g
                sizes[j] = x.distribution.sizes(i)
                used.add(g)
            break
    return grid, Distribution(shape, grid.dims, split, sizes)


def align(x, grid: ProcessGrid, dist: Distribution, device: str):
    """This rank's part of operand ``x`` that NumPy-broadcasts against the local block of
    ``dist`` (collective when ``x`` is a DistArray that must be redistributed)."""
    if isinstance(x, (list, tuple)):  # nested sequences are arrays, as in NumPy
        x = np.asarray(x)
    if isinstance(x, DistArray):
        _check_grids(x.grid, grid)
        if x.distribution == dist and x.grid.dims == grid.dims:
            local = x.local
        else:
            nd, od = dist.ndim, x.ndim
            split, sizes = [], []
            for i in range(od):
                j = i + nd - od
                if x.shape[i] == dist.shape[j] and not (x.shape[i] == 1 and dist.split[j] is None):
                    split.append(dist.split[j])
                    sizes.append(dist.sizes(j) if dist.split[j] is not None else None)
                else:
                    split.append(None)
                    sizes.append(None)
            target = Distribution(x.shape, dist.grid_dims, split, sizes)
            if target == x.distribution:
                local = x.local
            else:
                local = x.redistribute(grid=grid, distribution=target).local
        if x.device != device:
            local = to_device(local, device)
        return local
    if _is_array_like(x):
        shp = x.shape
        if len(shp) > dist.ndim:
            raise ValueError(f"operand of shape {shp} does not broadcast to {dist.shape}")
        block = dist.block_slices(grid.coords)
        sl = tuple(slice(None) if n == 1 else block[i + dist.ndim - len(shp)]
                   for i, n in enumerate(shp))
        return to_device(x[sl], device)
    return x  # scalar


def _device_of_operands(dists) -> str:
    devs = {x.device for x in dists}
    if len(devs) > 1:
        raise ValueError("operands live on different devices (cpu and cuda); move one with "
                         "x.to_device(...)")
    return devs.pop()


def elementwise_layout(operands) -> tuple[ProcessGrid, Distribution, str]:
    """``(grid, distribution, device)`` of the elementwise result of ``operands`` (the
    alignment rule; pure).  Raises for operands that do not broadcast, that live on grids over
    other ranks or on different devices: call it inside the agreement block."""
    shape = np.broadcast_shapes(*[operand_shape(o) for o in operands])
    grid, dist = result_layout(operands, shape)
    device = _device_of_operands([o for o in operands if isinstance(o, DistArray)])
    for o in operands:
        if isinstance(o, DistArray):
            _check_grids(o.grid, grid)
    return grid, dist, device


def block_result(r, grid: ProcessGrid, dist: Distribution) -> DistArray:
    """The local result ``r`` of an elementwise function as this rank's block of ``dist``
    (materialized when every operand was broadcast; no messages)."""
    block = dist.block_shape(grid.coords)
    xp = array_module(r) if hasattr(r, "shape") else np
    r = xp.asarray(r)
    if tuple(r.shape) != block:
        r = xp.broadcast_to(r, block).copy()
    return DistArray(r, dist, grid)


@collective_entry
def elementwise(fn, name: str, operands, /, **kwargs) -> DistArray:
    """``fn(*local operands, **kwargs)`` under the alignment rule of :mod:`disttensor.core.array`:
    the result takes the layout of the first DistArray operand of the full result shape;
    other operands are redistributed, NumPy arrays and scalars are replicated values.
    ``fn`` must be elementwise (its result has the broadcast shape)."""
    ops = [np.asarray(o) if isinstance(o, (list, tuple)) else o for o in operands]
    anchor = next((o for o in ops if isinstance(o, DistArray)), None)
    with agreed(None if anchor is None else anchor.grid.cart, name,
                **{f"x{i}": operand_key(o) for i, o in enumerate(ops, 1)},
                **{k: canon(v) if not isinstance(v, DistArray) else v
                   for k, v in kwargs.items()}):
        if anchor is None:
            raise TypeError(f"{name} needs at least one DistArray operand")
        grid, dist, device = elementwise_layout(ops)
    locs = [align(o, grid, dist, device) for o in ops]
    return block_result(fn(*locs, **kwargs), grid, dist)


def _may_fail_on_data(ufunc, locals_) -> bool:
    if ufunc is np.power and any(getattr(v, "dtype", None) is not None and v.dtype.kind in "iu"
                                 for v in locals_[1:]):
        return True
    return any(v in ("raise", "call") for v in np.geterr().values())


def array_ufunc(ufunc, method, inputs, kwargs):
    if method == "reduce" and ufunc in _REDUCE:
        from . import reductions
        (x,) = inputs
        out = kwargs.get("out")
        if not isinstance(x, DistArray) or (out is not None and out != (None,)):
            return NotImplemented
        op = _REDUCE[ufunc]
        options = {"where"} if op in ("any", "all") else {"where", "initial"}
        if set(kwargs) - {"axis", "keepdims", "dtype", "out"} - options:
            return NotImplemented  # options not implemented are never ignored
        more = {k: kwargs[k] for k in options if k in kwargs}
        if "dtype" in kwargs and op in ("sum", "prod"):
            more["dtype"] = kwargs["dtype"]
        return getattr(reductions, op)(
            x, axis=kwargs.get("axis", 0), keepdims=kwargs.get("keepdims", False), **more)
    if method != "__call__":  # reduce, accumulate, outer, at, reduceat
        from .ufunc_methods import ufunc_method
        return ufunc_method(ufunc, method, inputs, kwargs)
    if ufunc.signature is not None:  # gufuncs: np.matmul, np.vecdot (disttensor.linalg)
        from ..linalg import GUFUNCS
        impl = GUFUNCS.get(ufunc)
        return NotImplemented if impl is None else impl(*inputs, **kwargs)
    return _call(ufunc, inputs, kwargs)


def _first_distarray(values):
    for v in values:
        if isinstance(v, DistArray):
            return v
        if isinstance(v, tuple):
            d = _first_distarray(v)
            if d is not None:
                return d
    return None


_SCALAR_TYPES = (int, float, complex, bool)
_NAMES = tuple(f"x{i}" for i in range(1, 33))


def _call(ufunc, inputs, kwargs):
    """``ufunc(*inputs, **kwargs)``: the aligned fast path where it applies, else the agreed
    path (:func:`_agreed_call`)."""
    if not kwargs or (len(kwargs) == 1 and "out" in kwargs):
        res = _aligned_call(ufunc, inputs, kwargs.get("out"))
        if res is not None:
            return res
    return _agreed_call(ufunc, inputs, kwargs)


def _aligned_call(ufunc, inputs, out):
    """The fast path of a call that moves no data: every DistArray operand (and ``out=``) has
    the layout of the first (same grid object, equal distribution, same device), the others are
    Python or NumPy scalars, no keyword but ``out=``.  The ufunc runs on the local blocks; the
    result has the operands' layout.  On more than one rank the call's agreement is deferred
    (:func:`disttensor.core.agreement.defer`: agreed with the next call that communicates over
    the grid); calls whose failure could depend on the data on one rank (integer powers,
    ``np.seterr(...='raise')``) and calls that raise are left to the agreed path.  Returns
    ``None`` where the fast path does not apply (nothing was computed or written then)."""
    anchor = atok = None
    locs, toks = [], []
    for v in inputs:
        t = type(v)
        if t is DistArray:
            tok = v.__dict__.get("_agreement_token") or token(v)
            if anchor is None:
                anchor, atok = v, tok
            elif v._grid is not anchor._grid or tok[5] != atok[5] or (
                    tok[1] is not atok[1] and tok[1] != atok[1]):
                return None
            locs.append(v._local)
        elif t in _SCALAR_TYPES or isinstance(v, np.generic):
            tok = ("scalar", t.__name__)
            locs.append(v)
        else:
            return None
        toks.append(tok)
    if anchor is None or len(locs) > len(_NAMES):
        return None
    if out is not None:
        out = out if isinstance(out, tuple) else (out,)
        if len(out) != ufunc.nout:
            return None
        for o in out:
            if type(o) is not DistArray or o._grid is not anchor._grid:
                return None
            tok = o.__dict__.get("_agreement_token") or token(o)
            if tok[5] != atok[5] or (tok[1] is not atok[1] and tok[1] != atok[1]):
                return None
        out_tok = tuple(o.__dict__["_agreement_token"] for o in out)
    cart = anchor._grid.cart
    deferred = False
    if cart.size > 1:
        if ufunc is np.power or _may_fail_on_data(ufunc, locs):
            return None  # (a negative integer exponent may be on one rank only)
        if entry_depth() == 0 and agreement_enabled():
            if not deferring():
                return None  # eager agreement: the agreed path
            deferred = True
    try:
        if out is None:
            res = ufunc(*locs)
        else:
            res = ufunc(*locs, out=tuple(o._local for o in out))
    except Exception:  # noqa: BLE001 - raised again by the agreed path, on every rank
        if deferred:
            return None
        raise
    if deferred:
        named = tuple(zip(_NAMES, toks))
        defer(cart, ufunc.__name__, named if out is None else named + (("out", out_tok),))
    if out is not None:
        return out[0] if ufunc.nout == 1 else out
    if ufunc.nout == 1:
        return _wrap_block(res, anchor)
    return tuple(_wrap_block(r, anchor) for r in res)


def _wrap_block(r, anchor: DistArray) -> DistArray:
    if isinstance(r, np.generic):  # a 0-d block: NumPy returns a scalar
        r = np.asarray(r)
    return DistArray(r, anchor._dist, anchor._grid)


@collective_entry
def _agreed_call(ufunc, inputs, kwargs):
    """``ufunc(*inputs, **kwargs)`` with at least one DistArray among the inputs, ``out=`` or
    ``where=`` (collective: the ranks agree on the ufunc, the operands' metadata, the types
    of scalar operands and the keyword arguments before any operand is redistributed)."""
    inputs = tuple(np.asarray(x) if isinstance(x, (list, tuple)) else x for x in inputs)
    supported = all(isinstance(x, (DistArray, numbers.Number, np.generic, bool))
                    or _is_array_like(x) for x in inputs)
    anchor = _first_distarray(inputs + tuple(kwargs.values()))
    comm = anchor.grid.cart if anchor is not None else None
    # operands named as NumPy does (x1, x2, ...), so a mismatch message describes each alone
    with agreed(comm, ufunc.__name__, **{f"x{i}": operand_key(x) for i, x in enumerate(inputs, 1)},
                **{k: operand_key(v) if k == "where" else v for k, v in kwargs.items()}):
        if not supported:
            return_not_implemented = True
        else:
            return_not_implemented = False
            out = kwargs.pop("out", None)
            if out is not None:
                out = out if isinstance(out, tuple) else (out,)
                if any(not isinstance(o, DistArray) for o in out if o is not None):
                    raise TypeError("out= of a ufunc on DistArrays must be DistArrays")
            where = kwargs.pop("where", True)
            shapes = [operand_shape(x) for x in inputs]
            if where is not True:
                shapes.append(operand_shape(where))
            try:
                shape = np.broadcast_shapes(*shapes)
            except ValueError:
                raise ValueError(f"operands could not be broadcast together with shapes "
                                 f"{' '.join(str(s) for s in shapes)}") from None
            dists = [x for x in inputs if isinstance(x, DistArray)]
            if out is not None:
                dists += [o for o in out if o is not None]
            device = _device_of_operands(dists)
            if out is not None and out[0] is not None:
                o = out[0]
                if o.shape != tuple(shape):
                    raise ValueError(f"out has shape {o.shape} but the result has shape "
                                     f"{tuple(shape)}")
                grid, dist = o.grid, o.distribution
            else:
                grid, dist = result_layout(
                    list(inputs) + ([where] if where is not True else []), shape)
            for d in dists + ([where] if isinstance(where, DistArray) else []):
                _check_grids(d.grid, grid)
            if out is not None:
                for o in out:
                    if o is not None and (o.distribution != dist or o.grid.dims != grid.dims):
                        raise ValueError("all out= arrays must share one distribution")
    if return_not_implemented:
        return NotImplemented
    locals_ = [align(x, grid, dist, device) for x in inputs]
    if where is not True:
        kwargs["where"] = align(where, grid, dist, device)
    if out is not None:
        kwargs["out"] = tuple(None if o is None else o.local for o in out)
    if _may_fail_on_data(ufunc, locals_):
        # a failure that depends on the values (an integer to a negative power, a floating
        # point error under np.seterr(...='raise')) may hit only some ranks: agree on it
        from ..core.comm import collective
        with collective(grid.cart):
            res = ufunc(*locals_, **kwargs)
    else:
        res = ufunc(*locals_, **kwargs)
    if ufunc.nout == 1:
        res = (res,)
    wrapped = []
    for k, r in enumerate(res):
        if out is not None and out[k] is not None:
            wrapped.append(out[k])
        else:
            block = dist.block_shape(grid.coords)
            if tuple(getattr(r, "shape", ())) != block:  # every operand was broadcast
                xp = array_module(r) if hasattr(r, "shape") else np
                r = xp.broadcast_to(xp.asarray(r), block).copy()
            wrapped.append(DistArray(r, dist, grid))
    return wrapped[0] if ufunc.nout == 1 else tuple(wrapped)
