"""Zero-padded stores: arrays whose cells outside a *data box* are kept zero, so that a kernel
which pads a window of one with zeros can read the store itself instead of copying the window
into zero-padded scratch (local, no MPI, pure NumPy).

A window op's halo'd buffer is such a store when it is made with room around it: the pooled
buffers of :mod:`disttensor.core.halo_pool` are, their extra *margins* (cells outside the
halo'd block, never written) and their halo cells beyond a non-periodic global boundary
(zeroed by every halo exchange) being exactly the zero padding that a convolution adds at a
global boundary.  :func:`register` records a store and its data box; :func:`padded_view` is
what a kernel asks: given a window ``x`` (a view of some array) and the padding it is about to
add (``lo`` cells before the window per spatial axis, a padded extent ``size``), the padded
operand as a C-contiguous view of the store when the store holds it, else ``None`` (the caller
then pads into scratch as before).  The answer is the store's memory: callers must not write
to it.

When does the store hold it?  When ``x`` is a unit-step box of the store covering all of its
channels (axis 1) and any run of samples (axis 0), the padding ``lo`` / ``size`` spans the
store's whole spatial extent, and ``x`` covers the data box (every cell outside ``x`` then lies
outside the data box: zero).  Leading spatial axes of extent 1 that ``x`` has and the store
has not (a 1-d or 2-d window lifted to 3 axes) are taken as unpadded.

The contract a store's owner keeps: every cell outside the data box is zero whenever a kernel
reads a window of it (a halo'd buffer: after its exchange began).  Entries go with their
stores (weak references), so a dead store's address never matches.
"""
from __future__ import annotations

import threading
import weakref

import numpy as np

__all__ = ["register", "padded_view", "registered"]

_stores: dict = {}   # id(store) -> (weakref to store, data box, address, {window: answer})
_lock = threading.Lock()
_ANSWERS_MAX = 64     # windows remembered per store (a layer asks about one or two)
_MISSING = object()


def register(store: np.ndarray, data_box) -> None:
    """Record ``store`` (a C-contiguous NumPy array owning its memory) as a zero-padded store
    whose cells outside ``data_box`` (``(lo, hi)`` per axis, in the store's index space) are
    zero whenever a kernel reads it (see the module docstring)."""
    if store.base is not None or not store.flags.c_contiguous:
        raise ValueError("a padded store must be a C-contiguous array owning its memory")
    box = tuple((int(a), int(b)) for a, b in data_box)
    if len(box) != store.ndim:
        raise ValueError(f"data box {box} needs one (lo, hi) pair per axis of the store "
                         f"({store.ndim})")
    key = id(store)

    def forget(_ref, key=key):
        with _lock:
            entry = _stores.get(key)
            if entry is not None and entry[0] is _ref:
                del _stores[key]
    with _lock:
        _stores[key] = (weakref.ref(store, forget), box, store.ctypes.data, {})


def registered() -> int:
    """How many live stores are recorded."""
    with _lock:
        return sum(1 for entry in _stores.values() if entry[0]() is not None)


def padded_view(x, lo, size):
    """The zero-padded operand ``embed(x, lo, size)`` would make (zeros of spatial extent
    ``size`` with ``x`` at offset ``lo`` per spatial axis; axes 0 and 1 kept), as a
    C-contiguous view of the store ``x`` is a window of, or ``None`` when ``x`` is not such
    a window or the store does not hold that operand (module docstring).  Read-only use.
    The answer for a window (its shape, strides, dtype and place in the store) is kept with
    the store, so a repeated call costs a few dictionary look-ups."""
    if type(x) is not np.ndarray:
        return None
    base = x.base
    if base is None:
        return None
    entry = _stores.get(id(base))
    if entry is None or entry[0]() is not base:
        return None
    answers = entry[3]
    key = (x.shape, x.strides, x.dtype, x.ctypes.data - entry[2], tuple(lo), tuple(size))
    got = answers.get(key, _MISSING)
    if got is _MISSING:
        got = _locate(base, entry[1], x.shape, x.strides, x.dtype, key[3], key[4], key[5])
        if len(answers) >= _ANSWERS_MAX:
            answers.clear()
        answers[key] = got
    if got is None:
        return None
    n0, n1, shape = got
    view = base[n0:n1]
    return view if shape is None else view.reshape(shape)


def _locate(base, box, xshape, xstrides, dtype, off, lo, size):
    """``(n0, n1, shape)``: the samples of the store that are the padded operand (``shape``:
    its shape where lifted axes are added, else ``None``), or ``None`` (module docstring).
    Pure in its arguments (``off``: the window's byte offset in the store)."""
    nd = base.ndim
    extra = len(xshape) - nd                 # lifted leading spatial axes (extent 1)
    if extra < 0 or len(lo) != len(xshape) - 2 or len(size) != len(xshape) - 2 \
            or base.dtype != dtype:
        return None
    for t in range(2, 2 + extra):
        if xshape[t] != 1 or lo[t - 2] != 0 or size[t - 2] != 1:
            return None
    shape = xshape[:2] + xshape[2 + extra:]
    strides = xstrides[:2] + xstrides[2 + extra:]
    item = base.itemsize
    if off < 0 or off % item:
        return None
    off //= item
    start = []
    for t in range(nd - 1, -1, -1):          # the window's first cell, per axis
        off, i = divmod(off, base.shape[t]) if t else (0, off)
        start.append(i)
    start.reverse()
    for t in range(nd):
        if shape[t] > 1 and strides[t] != base.strides[t]:
            return None
        if start[t] + shape[t] > base.shape[t]:
            return None
    if start[1] != 0 or shape[1] != base.shape[1]:
        return None
    for t in range(2, nd):
        s = t - 2 + extra                    # the axis in lo / size
        a, b = box[t]
        if start[t] != lo[s] or size[s] != base.shape[t] \
                or a < start[t] or b > start[t] + shape[t]:
            return None
    out = (shape[0],) + tuple(xshape[1:2]) + tuple(int(v) for v in size)
    return start[0], start[0] + shape[0], (out if extra else None)
