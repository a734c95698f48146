"""``map_overlap``: a function on every rank's block extended by its neighbours' cells (Dask's).

The block is copied into a buffer with a halo of ``depth`` cells per side and axis, the halo
is filled by :class:`~disttensor.core.halo.HaloExchange` (neighbours' cells, straight from
their owners, also from ranks further away when a block is thinner than ``depth``) and, beyond
the global boundary, by the boundary rule (:class:`~disttensor.core.halo.EdgeFill`), and ``fn``
runs on the extended block; ``trim=True`` cuts ``depth`` cells off each side of its result.

Split phase (``stencil=True``): the exchange is begun; ``fn`` runs on the *interior*, the
owned block plus the halo along the axes whose halo needs no message (axes not cut into
several blocks, with boundary ``'none'``, ``'periodic'`` or zero), and its result is kept
``depth`` cells away from the edges along the other axes; the exchange ends and ``fn`` runs
on the *rims* (one window per side of every axis with messages, the ranges the interior
could not produce).  This is exact when ``fn`` is a stencil: each result cell depends only on
the input cells within ``depth`` of it, the same way everywhere (not on the block's position
or extent), and ``fn`` returns an array of its input's shape.
"""
from __future__ import annotations

import contextlib
import numbers
from collections import OrderedDict

from ..core.array import DistArray
from ..core.entry import agreed, canon, collective_entry, dtype_key, nested, operand_key
from ..core.halo import EdgeFill, HaloExchange, check_edge_modes
from ._operands import check_array
from .blocks import assemble, call_local

__all__ = ["map_overlap"]

_NAMED = ("none", "periodic", "reflect", "nearest")


def _per_axis(value, nd: int, what: str, default):
    """An entry per axis from one value, a sequence, or a dict ``{axis: value}``."""
    if isinstance(value, dict):
        out = [default] * nd
        for k, v in value.items():
            if not isinstance(k, numbers.Integral) or not -nd <= k < nd:
                raise ValueError(f"{what} names axis {k!r} of a {nd}-d array")
            out[k % nd] = v
        return out
    if isinstance(value, (list, tuple)):
        if len(value) != nd:
            raise ValueError(f"{what} {tuple(value)} needs one entry per axis ({nd})")
        return list(value)
    return [value] * nd


def normalize_depth(depth, nd: int) -> tuple[tuple[int, int], ...]:
    """``depth`` (an int, one per axis, ``(lo, hi)`` pairs, or a dict) as ``(lo, hi)`` pairs."""
    out = []
    for d in _per_axis(0 if depth is None else depth, nd, "depth", 0):
        pair = (d, d) if isinstance(d, numbers.Integral) else tuple(d)
        if len(pair) != 2 or not all(isinstance(v, numbers.Integral) for v in pair):
            raise TypeError(f"depth entries must be integers or (lo, hi) pairs, got {d!r}")
        if min(pair) < 0:
            raise ValueError(f"depth must be >= 0, got {d!r}")
        out.append((int(pair[0]), int(pair[1])))
    return tuple(out)


def normalize_boundary_modes(boundary, nd: int) -> tuple:
    """Per axis ``'none'``, ``'periodic'``, ``'reflect'``, ``'nearest'`` or ``('constant', v)``
    (a number, ``'constant'``/``'zero'`` for 0)."""
    out = []
    for b in _per_axis("none" if boundary is None else boundary, nd, "boundary", "none"):
        if b is None:
            b = "none"
        if isinstance(b, str):
            if b in ("constant", "zero", "zeros"):
                out.append(("constant", 0))
            elif b in _NAMED:
                out.append(b)
            else:
                raise ValueError(f"boundary must be 'none', 'periodic', 'reflect', 'nearest', "
                                 f"'constant' or a number, got {b!r}")
        elif isinstance(b, numbers.Number) and not isinstance(b, bool):
            out.append(("constant", b))
        else:
            raise ValueError(f"boundary must be 'none', 'periodic', 'reflect', 'nearest', "
                             f"'constant' or a number, got {b!r}")
    return tuple(out)


class _Workspace:
    """A halo buffer of one layout with its exchange, edge fill and window math, kept between
    calls (:func:`_workspace`): ``x``'s block is copied into it on every call."""

    def __init__(self, x: DistArray, halo, modes):
        shape = tuple(lo + n + hi for (lo, hi), n in zip(halo, x.local_shape))
        self.h = DistArray(x.xp.empty(shape, dtype=x.dtype), x.distribution, x.grid, halo)
        # the exchange leaves zeros and periodic images; the rest is filled axis after axis,
        # and a zero axis after a filled one is filled again (its corners are zero, as np.pad's)
        edge = []
        for m in modes:
            zero_left = m == ("constant", 0) and all(e is None for e in edge)
            edge.append(None if m in ("none", "periodic") or zero_left else m)
        self.edge = tuple(edge)
        with nested():
            self.ex = HaloExchange(
                self.h, tuple("periodic" if m == "periodic" else "zero" for m in modes))
            self.fill = EdgeFill(self.h, self.edge) if any(e is not None for e in edge) \
                else None
        self.win = _Windows(self.h, halo, modes)
        self.busy = False


_WORKSPACES: OrderedDict = OrderedDict()
_KEEP = 4   # layouts whose workspace is kept (least recently used dropped)


@contextlib.contextmanager
def _workspace(x: DistArray, halo, modes):
    """The kept workspace of ``x``'s layout (a new one when none is, or when it is in use: a
    function that calls map_overlap again), ``x``'s block copied in."""
    key = (x.grid, x.grid.cart.py2f(), x.distribution, x.dtype.str, x.device, halo, modes)
    ws = _WORKSPACES.get(key)
    if ws is None or ws.busy:
        ws = _Workspace(x, halo, modes)
        if key not in _WORKSPACES:
            _WORKSPACES[key] = ws
            while len(_WORKSPACES) > _KEEP:
                _WORKSPACES.popitem(last=False)
    else:
        _WORKSPACES.move_to_end(key)
    ws.h.local[...] = x.local
    ws.busy = True
    try:
        yield ws
    finally:
        ws.busy = False


class _Windows:
    """Index math of one rank's buffer: which buffer range along each axis ``fn`` may see
    (``'none'`` hides the cells beyond the boundary) and how to cut a result region out."""

    def __init__(self, x: DistArray, halo, modes):
        d = x.distribution
        box = d.block_box(x.grid.coords)
        self.halo, self.n = halo, x.local_shape
        self.valid = []
        for t, ((lo, hi), m) in enumerate(zip(halo, modes)):
            b0 = box.start[t] - lo
            if m == "none":
                w0, w1 = max(b0, 0) - b0, min(box.stop[t] + hi, d.shape[t]) - b0
            else:
                w0, w1 = 0, lo + self.n[t] + hi
            self.valid.append((w0, max(w0, w1)))

    def window(self, region, owned_only=()):
        """Buffer slices ``fn`` reads to produce ``region`` (owned coordinates per axis) and the
        slices of its result that are ``region``.  Axes in ``owned_only`` read the owned cells
        only (the interior pass)."""
        src, cut = [], []
        for t, (r0, r1) in enumerate(region):
            lo, hi = self.halo[t]
            v0, v1 = self.valid[t]
            if t in owned_only:
                w0, w1 = lo, lo + self.n[t]
            else:
                w0, w1 = max(r0, v0), min(r1 + lo + hi, v1)
            src.append(slice(w0, w1))
            cut.append(slice(r0 + lo - w0, r1 + lo - w0))
        return tuple(src), tuple(cut)


def _trimmed(r, cut, name):
    if r.ndim != len(cut):
        raise ValueError(f"{name}: with trim=True fn must return blocks with the input's "
                         f"{len(cut)} axes, got {r.ndim}; use trim=False")
    if any(s.stop > n for s, n in zip(cut, r.shape)):
        raise ValueError(f"{name}: fn returned a block of shape {r.shape}, smaller than its "
                         f"input plus the depth trim=True removes; use trim=False")
    return r[cut]


@collective_entry
def map_overlap(fn, x, depth=None, boundary=None, trim=True, *, dtype=None, stencil=False,
                **kwargs):
    """``fn`` on every rank's block extended by ``depth`` cells of its neighbours on each side,
    Dask's ``map_overlap`` (collective).

    * ``depth``: an int, one per axis, a dict ``{axis: depth}``, or ``(lo, hi)`` pairs.  A depth
      larger than a neighbour's block reaches the ranks beyond it; larger than the whole axis
      is allowed for ``'periodic'`` and ``'none'`` only.
    * ``boundary`` (one, one per axis, or a dict): beyond the global edges the extended block
      holds ``'periodic'``: the other end (``np.pad`` ``'wrap'``), ``'reflect'``: the mirror
      image with the edge cell repeated (``np.pad`` ``'symmetric'``, Dask's ``'reflect'``),
      ``'nearest'``: the edge cell (``'edge'``), a number or ``'constant'``/``'zero'`` (0): that
      constant; ``'none'`` (the default, as Dask): nothing, ``fn`` sees a block extended only
      inward at a global edge.
    * ``trim=True``: ``depth`` cells (only the cells actually added, for ``'none'``) are cut off
      each side of ``fn``'s result, which must then have the input's number of axes; the result
      has ``x``'s layout when ``fn`` keeps the shape.  ``trim=False``: the blocks as ``fn``
      returned them (the layout from their extents, see
      :func:`~disttensor.routines.blocks.map_blocks`).
    * ``dtype``: cast the blocks to it; ``kwargs`` go to ``fn``.
    * ``stencil=True`` declares ``fn`` a stencil (see the module docstring) and overlaps the
      halo messages with ``fn`` on the interior; needs ``trim=True``.

    The input is not modified (its block is copied into a buffer with the halo).  ``fn`` runs
    on every rank, empty blocks included; its exceptions, and blocks that do not fit together,
    raise on every rank.  Differences from Dask: one array only; no ``block_info``; eager."""
    with agreed(None if not isinstance(x, DistArray) else x.grid.cart, "map_overlap", fn=fn,
                x=operand_key(x), depth=canon(depth), boundary=canon(boundary),
                trim=trim, dtype=dtype_key(dtype), stencil=stencil,
                kwargs={k: operand_key(v) for k, v in kwargs.items()}):
        check_array(x, "x")
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        nd = x.ndim
        halo = normalize_depth(depth, nd)
        modes = normalize_boundary_modes(boundary, nd)
        if stencil and not trim:
            raise ValueError("map_overlap: stencil=True needs trim=True")
        halo = tuple((min(lo, n), min(hi, n)) if m == "none" else (lo, hi)
                     for (lo, hi), m, n in zip(halo, modes, x.shape))
        for t, ((lo, hi), m, n) in enumerate(zip(halo, modes, x.shape)):
            if m != "periodic" and max(lo, hi) > n:
                raise ValueError(f"depth {max(lo, hi)} on axis {t} is larger than the axis "
                                 f"({n}) with boundary {m if isinstance(m, str) else m[1]!r}")
        check_edge_modes(x.shape, halo, modes)
    with _workspace(x, halo, modes) as ws:
        return _apply(fn, x, ws, halo, trim, stencil, dtype_key(dtype), kwargs)


def _apply(fn, x, ws, halo, trim, stencil, dtype, kwargs):
    """map_overlap's work after the agreement (collective: the exchange, the edge fill and
    :func:`~disttensor.routines.blocks.assemble`)."""
    dist, nd = x.distribution, x.ndim
    h, ex, fill, win, edge = ws.h, ws.ex, ws.fill, ws.win, ws.edge
    full = tuple((0, n) for n in h.local_shape)
    # axes whose halo needs messages or the edge fill: the interior pass stays off their halo
    moving = tuple(t for t in range(nd) if halo[t] != (0, 0) and (
        (dist.split[t] is not None and len(dist.offsets[t]) > 2) or edge[t] is not None))
    inner = [(min(halo[t][0], h.local_shape[t]),) for t in range(nd)]
    inner = [(a, max(a, h.local_shape[t] - halo[t][1])) for t, (a,) in enumerate(inner)]
    split_phase = stencil and moving and all(inner[t][1] > inner[t][0] for t in moving)
    if not split_phase:
        ex.exchange()
        if fill is not None:
            fill.run()
        src, cut = win.window(full)
        r, err = call_local(fn, h.buffer[src], **kwargs)
        if err is None and trim:
            r, err = call_local(_trimmed, x.xp.asarray(r), cut, "map_overlap")
        return assemble("map_overlap", x.grid, r, err, dist.split, dtype=dtype,
                        operands=[h.buffer])
    ex.begin()
    out, err = None, None
    region = tuple(inner[t] if t in moving else full[t] for t in range(nd))
    src, cut = win.window(region, owned_only=moving)
    r, err = call_local(fn, h.buffer[src], **kwargs)
    if err is None:
        r, err = call_local(_trimmed, x.xp.asarray(r), cut, "map_overlap")
    if err is None:
        out = x.xp.empty(h.local_shape, dtype=r.dtype)
        out[tuple(slice(a, b) for a, b in region)] = r
    ex.end()
    if fill is not None:
        fill.run()
    for k, t in enumerate(moving):   # the rims: per side, the ranges the interior lacked
        for side in ((0, inner[t][0]), (inner[t][1], h.local_shape[t])):
            if err is not None or side[0] == side[1]:
                continue
            rim = [inner[u] if u in moving[:k] else full[u] for u in range(nd)]
            rim[t] = side
            src, cut = win.window(rim)
            r, err = call_local(fn, h.buffer[src], **kwargs)
            if err is None:
                r, err = call_local(_trimmed, x.xp.asarray(r), cut, "map_overlap")
            if err is None:
                out[tuple(slice(a, b) for a, b in rim)] = r
    return assemble("map_overlap", x.grid, out, err, dist.split, dtype=dtype,
                    operands=[h.buffer])
