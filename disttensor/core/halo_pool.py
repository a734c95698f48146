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

A convolution asks for *margins* (part of the layout): its slot's buffer then lies inside a
zero-initialised store with room for the zero padding the kernel adds at global boundaries,
and the read window with its padding is one C-contiguous array that the direct kernels read
in place (:class:`Slot`, :mod:`disttensor.core.padded_store`).

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
from .padded_store import register

__all__ = ["Slot", "acquire", "clear", "PER_LAYOUT", "MAX_SLOTS", "pooled_slots", "NO_MARGINS"]

PER_LAYOUT = 4
"""Most slots per layout: a training step holds one per windowed layer of that layout until
its backward pass, and the previous step's graph may hold another."""

MAX_SLOTS = 64
"""Most slots in all."""


class Slot:
    """A halo'd buffer and the persistent :class:`HaloExchange` bound to it (see the module
    docstring).  ``buffer``: the whole local buffer; ``exchange``: its exchange (forward and
    reverse); :meth:`array` wraps the buffer for one use.

    The buffer lies inside a zero-padded *store* (:mod:`disttensor.core.padded_store`): an
    array with ``margins`` (``(lo, hi)`` per axis) of extra cells around the halo'd block,
    made zero once and never written (``buffer`` is a view that leaves them out).  With the
    halo cells beyond a non-periodic global boundary, which every exchange zeroes, they are
    the zero padding a convolution adds there, so a kernel padding a window of the buffer
    reads the store itself (:func:`~disttensor.core.padded_store.padded_view`).  Without
    margins the store is the buffer."""

    __slots__ = ("buffer", "store", "exchange", "fill", "_dist", "_grid", "_halo", "_refs")

    def __init__(self, dist, grid, halo, boundary, dtype, margins=None):
        block = dist.block_shape(grid.coords)
        margins = margins or NO_MARGINS.get(len(block)) or ((0, 0),) * len(block)
        ext = tuple(lo + n + hi for (lo, hi), n in zip(halo, block))
        self.store = np.zeros(tuple(a + e + b for (a, b), e in zip(margins, ext)), dtype=dtype)
        self.buffer = self.store if not any(a or b for a, b in margins) else \
            self.store[tuple(slice(a, a + e) for (a, _), e in zip(margins, ext))]
        register(self.store, _data_box(dist, grid, halo, boundary, margins, ext))
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


NO_MARGINS = {n: ((0, 0),) * n for n in range(1, 9)}
"""No margins, per number of axes (the default of :func:`acquire`)."""


def _data_box(dist, grid, halo, boundary, margins, ext):
    """The store's cells that may hold non-zero values (index space of the store): the
    halo'd block less its halo beyond a non-periodic global boundary (zeroed by every
    exchange) and less the margins."""
    coords = grid.coords
    periodic = [b == "periodic" for b in boundary]
    box = []
    for t, ((lo, _), (m, _), e) in enumerate(zip(halo, margins, ext)):
        a = dist.offsets[t][dist.axis_coord(t, coords)]   # global index of the block's start
        if periodic[t]:
            first, stop = 0, e
        else:   # buffer cell i holds global index a - lo + i
            first, stop = max(0, lo - a), max(0, min(e, dist.shape[t] - a + lo))
        box.append((m + first, m + max(first, stop)))
    return tuple(box)


def _refcount(slot: Slot) -> int:
    # (views of the buffer hold the store, the array handed out holds the buffer itself)
    return sys.getrefcount(slot.buffer) + sys.getrefcount(slot.store)


_slots: OrderedDict = OrderedDict()   # layout -> [Slot], least recently used first
_lock = threading.Lock()


def acquire(dist, grid, halo, periodic, dtype, src=None, margins=None):
    """``(array, exchange)``: a new DistArray over an idle slot's buffer (whose halo and owned
    cells hold whatever they last held; ``src``, a block of ``dist`` here, is copied into the
    owned cells when given) and the slot's exchange; the slot is made when none of the layout
    is idle and the bounds allow.  ``None`` when every slot of the layout is in
    use and there are :data:`PER_LAYOUT` of them.  ``margins``: ``(lo, hi)`` extra zero
    cells per axis around the halo'd block in the slot's store (:class:`Slot`; part of the
    layout: slots with other margins are not shared).  ``halo``: normalized ``(lo, hi)`` per
    axis; ``periodic``: one flag per axis.  Local (no message); the first slot of a layout
    is made with the exchange's validation (errors raised on every rank, as
    :class:`HaloExchange` raises them)."""
    margins = margins or NO_MARGINS.get(dist.ndim) or ((0, 0),) * dist.ndim
    key = (dist, grid, halo, periodic, np.dtype(dtype).str, margins)
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
    s = Slot(dist, grid, halo, boundary, dtype, margins)
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
