"""Halo'd buffers with their exchanges bound, pooled per layout and reused once unreferenced.

A window op (convolution, pooling) copies its input into a buffer with a halo and exchanges
the halo, at every call of every training step, on the same few layouts.  Made afresh each
time, that is an allocation and a zero fill of the whole buffer plus a
:class:`~disttensor.core.halo.HaloExchange` built from scratch (the views of the buffer's
pieces, the run lists of the strided copies, scratch for the packed pieces, MPI requests).
Here each *layout* -- ``(distribution, grid, halo, periodic flags, dtype)`` -- keeps a few
:class:`Slot`\\ s: a buffer of the halo'd block's shape and a persistent ``HaloExchange``
bound to it, made once.  A steady-state call (:func:`acquire`) takes an idle slot, wraps
its buffer in a new :class:`~disttensor.core.array.DistArray` and, with the exchange, has
nothing left to do but copy the owned block in and post the messages
(``MPI_Startall``/``MPI_Waitall`` on the persistent requests).

When is a slot idle?  When nothing outside the pool refers to its buffer: every array that
shares the buffer's memory (the DistArray handed out, its ``local`` or ``buffer`` view, any
slice of them, a window op's saved state holding it for the backward pass, with
``retain_graph`` or a user keeping the saved tensors) holds a reference to the buffer
object, since NumPy views keep their base alive.  A slot's reference count is taken when the
slot is made (the pool's own references: the exchange's views, scratch and requests);
:func:`acquire` hands a slot out only when the count is back at that figure and no exchange
of it is in flight, so a buffer still in use is never handed out twice.  The test is local:
ranks may take different paths (a pooled slot here, a fresh buffer there); the messages are
the same either way (same private communicator, peers, tags and contents).

Bounds: :data:`PER_LAYOUT` slots per layout (then :func:`acquire` returns ``None`` and the
caller makes a fresh buffer and a one-shot exchange), :data:`MAX_SLOTS` in all (the least
recently used layout is dropped first).  NumPy buffers only (``None`` for GPU blocks: their
kernels run asynchronously, after the last reference may have gone).  :func:`clear` drops
every slot (their memory and requests are freed with them) and the reverse exchanges cached
by :func:`disttensor.core.halo.reverse_window`.
"""
from __future__ import annotations

import sys
import threading
from collections import OrderedDict

import numpy as np
from mpi4py import MPI

from .array import DistArray
from .copies import into
from .entry import nested
from .halo import HaloExchange, clear_caches

__all__ = ["Slot", "acquire", "clear", "PER_LAYOUT", "MAX_SLOTS", "pooled_slots"]

PER_LAYOUT = 4
"""Most slots per layout: a training step holds one per windowed layer of that layout until
its backward pass, and the previous step's graph may hold another."""

MAX_SLOTS = 64
"""Most slots in all."""


class Slot:
    """A halo'd buffer and the persistent :class:`HaloExchange` bound to it (see the module
    docstring).  ``buffer``: the whole local buffer; ``exchange``: its exchange (forward and
    reverse); :meth:`array` wraps the buffer for one use."""

    __slots__ = ("buffer", "exchange", "fill", "_dist", "_grid", "_halo", "_refs")

    def __init__(self, dist, grid, halo, boundary, dtype):
        block = dist.block_shape(grid.coords)
        self.buffer = np.empty(tuple(lo + n + hi for (lo, hi), n in zip(halo, block)),
                               dtype=dtype)
        self._dist, self._grid, self._halo = dist, grid, halo
        # made by this rank alone (the pool's choices are rank-local), so never agreed, at
        # any depth: the window op agreed on everything its halo derives from
        with nested(), nested():
            self.exchange = HaloExchange(DistArray(self.buffer, dist, grid, halo), boundary,
                                         persistent=True).prepare(reverse=True)
        # (both directions made now: the views an exchange makes of the buffer at its first
        # use would otherwise count as a holder for good, and the slot never be idle again)
        self.fill = into(self.buffer[tuple(slice(lo, lo + n) for (lo, _), n in zip(halo, block))])
        # (a function copying a block into the interior, its view of the buffer made now:
        # counted among the pool's own references)
        self._refs = _refcount(self)

    def idle(self) -> bool:
        """Whether nothing outside the pool refers to the buffer and no exchange is in
        flight."""
        return self.exchange._mode is None and _refcount(self) == self._refs

    def array(self) -> DistArray:
        """A new DistArray over the buffer (it holds the slot until it and every view of it
        are gone)."""
        return DistArray(self.buffer, self._dist, self._grid, self._halo)


def _refcount(slot: Slot) -> int:
    return sys.getrefcount(slot.buffer)


_slots: OrderedDict = OrderedDict()   # layout -> [Slot], least recently used first
_lock = threading.Lock()


def acquire(dist, grid, halo, periodic, dtype, src=None):
    """``(array, exchange)``: a new DistArray over an idle slot's buffer (whose halo and owned
    cells hold whatever they last held; ``src``, a block of ``dist`` here, is copied into the
    owned cells when given) and the slot's exchange; the slot is made when none of the layout
    is idle and the bounds allow.  ``None`` when every slot of the layout is in
    use and there are :data:`PER_LAYOUT` of them.  ``halo``: normalized ``(lo, hi)`` per
    axis; ``periodic``: one flag per axis.  Local (no message); the first slot of a layout
    is made with the exchange's validation (errors raised on every rank, as
    :class:`HaloExchange` raises them)."""
    key = (dist, grid, halo, periodic, np.dtype(dtype).str)
    got = None
    with _lock:   # (the test and the claim, the new array, under one lock)
        slots = _slots.get(key)
        if slots is not None:
            _slots.move_to_end(key)
            for s in slots:
                if s.idle():
                    got, out = s, (s.array(), s.exchange)   # (the new array claims it)
                    break
            if got is None and len(slots) >= PER_LAYOUT:
                return None
    if got is not None:
        if src is not None:
            got.fill(src)
        return out
    boundary = tuple("periodic" if p else "zero" for p in periodic)
    s = Slot(dist, grid, halo, boundary, dtype)
    out = s.array(), s.exchange
    if src is not None:
        s.fill(src)
    with _lock:
        _slots.setdefault(key, []).append(s)
        _slots.move_to_end(key)
        while pooled_slots() > MAX_SLOTS and len(_slots) > 1:
            _slots.popitem(last=False)
    return out


def pooled_slots() -> int:
    """How many slots the pool holds."""
    return sum(len(v) for v in _slots.values())


def clear() -> None:
    """Drop every slot and the cached reverse exchanges of
    :func:`disttensor.core.halo.reverse_window` (arrays handed out stay valid: they hold their
    buffers; the persistent requests are freed with their exchanges).  Also run when MPI is
    finalized."""
    with _lock:
        _slots.clear()
    clear_caches()


def _clear_at_finalize() -> None:
    """Free the pooled exchanges' requests while MPI is still up: an attribute on
    ``MPI_COMM_SELF`` is deleted at the start of ``MPI_Finalize`` (as
    :mod:`disttensor.core.comm` frees its datatypes)."""
    try:
        if MPI.Is_finalized() or not MPI.Is_initialized():
            return
        keyval = MPI.Comm.Create_keyval(delete_fn=lambda comm, key, val: clear())
        MPI.COMM_SELF.Set_attr(keyval, None)
    except Exception:  # pragma: no cover - an MPI without attribute callbacks
        pass


_clear_at_finalize()
