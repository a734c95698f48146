"""Any-to-any block redistribution and its adjoint.

``redistribute_blocks`` moves one array from distribution ``src`` to distribution ``dst`` in a
single collective step: every piece (the intersection of this rank's source block with a
destination block) is one point-to-point message on a private duplicate of the communicator,
and pieces a rank keeps are copied locally while the messages fly.  Contiguous pieces move
straight from the source block / into the destination block; the others are packed (see
:class:`disttensor.core.comm.PieceExchange` for why not MPI subarray datatypes, and for GPU
blocks).
Point to point rather than ``MPI_Alltoallv``/``Alltoallw``: a rank talks only to the ranks its
block meets, which is few for the usual redistributions on large grids, and nothing is sent
to or copied through itself.

The adjoint ``R*`` of a redistribution ``R`` maps a ``dst`` block back to a ``src`` block,
*adding* every received piece into place: where ``dst`` replicates data, ``R`` copies one
source element to several ranks and ``R*`` sums them; where ``src`` is replicated, ``R`` reads
from one chosen replica and ``R*`` writes only to that replica.  So ``<R x, y> = <x, R* y>``
with the inner product summed over all ranks' local blocks.

Per-call cost (CPU blocks): the plan's slices are computed once per ``(src, dst, rank)`` and
cached; the contiguous scratch that non-contiguous pieces are packed into (and received into)
comes from a process-wide pool of reusable buffers (:class:`ScratchPool`, capped at
``DISTTENSOR_SCRATCH_MB``, default 512 MiB), so a repeated redistribution neither allocates
nor page-faults its scratch; contiguous pieces move straight from/to the blocks.  What is
left per call is what any exchange of these pieces must do: pack the non-contiguous sends,
copy the kept piece, move the messages, unpack (``bench/redistribute_bench.py`` compares it
with a hand-written pack + ``MPI_Alltoallv`` + unpack).
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from functools import lru_cache

import numpy as np
from mpi4py import MPI

from . import buffer_pool as _pool
from .backend import array_module
from .comm import PieceExchange, copy_into, private_comm
from .distribution import Box, Distribution
from .plans import CommPlan, redistribution_plan
from .watchdog import waiting

__all__ = ["plan", "redistribute_blocks", "redistribute_adjoint_blocks", "ScratchPool",
           "scratch_pool"]


@lru_cache(maxsize=512)
def plan(src: Distribution, dst: Distribution, rank: int) -> CommPlan:
    """Cached :func:`disttensor.core.plans.redistribution_plan`."""
    return redistribution_plan(src, dst, rank)


def _index(box: Box):
    """Index of ``box`` in an array (``...`` for a 0-d box, so that indexing gives a view)."""
    return box.slices() if len(box.start) else Ellipsis


@lru_cache(maxsize=512)
def _slices(src: Distribution, dst: Distribution, rank: int):
    """The plan's pieces as indices, empty ones left out: ``(sends, recvs, local)`` with
    ``sends``/``recvs`` ``(peer, index)`` pairs and ``local`` ``(src index, dst index)``."""
    p = plan(src, dst, rank)
    return (tuple((t.peer, _index(t.box)) for t in p.sends if t.box.size),
            tuple((t.peer, _index(t.box)) for t in p.recvs if t.box.size),
            tuple((_index(a), _index(b)) for a, b in p.local if b.size))


class ScratchPool:
    """Reusable contiguous byte buffers for packing, keyed by exact size, least recently used
    dropped beyond ``limit`` bytes held.  :meth:`take` hands a buffer out (removing it from
    the pool, so two exchanges in flight, or two threads, never share one); :meth:`give`
    returns it.  A buffer that an MPI call may still write (a failed wait) is never given
    back."""

    def __init__(self, limit: int):
        self.limit = int(limit)
        self._free: OrderedDict = OrderedDict()   # (nbytes, serial) -> buffer
        self._held = 0
        self._serial = 0
        self._lock = threading.Lock()

    def take(self, nbytes: int, dtype, shape):
        buf = None
        with self._lock:
            for key in self._free:
                if key[0] == nbytes:
                    buf = self._free.pop(key)
                    self._held -= nbytes
                    break
        if buf is None:
            buf = np.empty(nbytes, dtype=np.uint8)
        return buf.view(dtype).reshape(shape)

    def give(self, arr) -> None:
        base = arr.base if arr.base is not None else arr
        while isinstance(base, np.ndarray) and base.base is not None:
            base = base.base
        if not isinstance(base, np.ndarray) or base.dtype != np.uint8 or base.nbytes > self.limit:
            return
        with self._lock:
            self._serial += 1
            self._free[(base.nbytes, self._serial)] = base
            self._held += base.nbytes
            while self._held > self.limit:
                (n, _), _ = self._free.popitem(last=False)
                self._held -= n

    def clear(self) -> None:
        with self._lock:
            self._free.clear()
            self._held = 0


_WARM_RECV = os.environ.get("DISTTENSOR_REDIST_WARM_RECV", "1") not in ("0", "")

scratch_pool = ScratchPool(int(float(os.environ.get("DISTTENSOR_SCRATCH_MB", "512")) * 2 ** 20))


def _exchange_cpu(comm: MPI.Comm, sends, recvs, local, accumulate: bool,
                  direct: bool = True) -> None:
    """Point-to-point exchange of NumPy pieces: ``sends``/``recvs`` are ``(peer, view)``,
    ``local`` ``(dst view, src view)`` copied (or added, with ``accumulate``) while the
    messages fly; received pieces are copied (added) into their views.  ``direct``: a
    contiguous received piece lands straight in its view; else it goes through pooled
    scratch too (for a freshly allocated output: MPI writing into never-touched pages takes a
    page fault per page inside the transfer, measured slower than a warm receive plus a
    copy that faults them in)."""
    pool = scratch_pool
    reqs, unpack, scratch = [], [], []
    for peer, v in recvs:
        if direct and v.flags.c_contiguous and not accumulate:
            buf = v
        else:
            buf = pool.take(v.nbytes, v.dtype, v.shape)
            unpack.append((v, buf))
        reqs.append(comm.Irecv([buf, MPI.BYTE], peer, 0))
    for peer, v in sends:
        if v.flags.c_contiguous:
            buf = v
        else:
            buf = pool.take(v.nbytes, v.dtype, v.shape)
            scratch.append(buf)
            copy_into(buf, v)
        reqs.append(comm.Isend([buf, MPI.BYTE], peer, 0))
    for d, s in local:
        if accumulate:
            d += s
        else:
            copy_into(d, s)
    if reqs:
        with waiting(comm, "MPI_Waitall (redistribution)"):
            MPI.Request.Waitall(reqs)   # raises: the scratch is dropped, never reused
    for v, buf in unpack:
        if accumulate:
            v += buf
        else:
            copy_into(v, buf)
        pool.give(buf)
    for buf in scratch:
        pool.give(buf)


def _check_block(a, want, what: str) -> None:
    if tuple(a.shape) != tuple(want):
        raise ValueError(f"{what} has shape {tuple(a.shape)}, the distribution's block here is "
                         f"{tuple(want)}")


def redistribute_blocks(comm: MPI.Comm, src_local, src: Distribution, dst: Distribution,
                        out=None):
    """Collective: return this rank's block of ``dst`` given its block ``src_local`` of
    ``src`` (``comm`` ranks numbered as both grids).  ``out``, if given, is written into.
    ``src_local`` may be any view (non-contiguous, transposed, the interior of a halo buffer)."""
    rank = comm.rank
    sends, recvs, local = _slices(src, dst, rank)
    xp = array_module(src_local)
    _check_block(src_local, src.rank_box(rank).shape, "the local source block")
    my_dst_shape = dst.rank_box(rank).shape
    fresh = out is None
    if fresh:   # (NumPy: recycled once unreferenced, no allocation in a steady step)
        out = _pool.empty(tuple(my_dst_shape), src_local.dtype) if xp is np else \
            xp.empty(my_dst_shape, dtype=src_local.dtype)
    else:
        _check_block(out, my_dst_shape, "out")
    if xp is np and type(src_local) is np.ndarray and type(out) is np.ndarray:
        pcomm = private_comm(comm, "redistribute") if comm.size > 1 else comm
        _exchange_cpu(pcomm, [(p, src_local[i]) for p, i in sends],
                      [(p, out[i]) for p, i in recvs],
                      [(out[d], src_local[s]) for s, d in local], accumulate=False,
                      direct=not (fresh and _WARM_RECV))
        return out
    ex = None
    if comm.size > 1:  # private_comm is collective on first use: every rank gets it
        ex = PieceExchange(private_comm(comm, "redistribute"),
                           [(p, 0, src_local[i]) for p, i in sends],
                           [(p, 0, out[i]) for p, i in recvs], persistent=False)
        ex.start()
    for s, d in local:
        copy_into(out[d], src_local[s])
    if ex is not None:
        ex.finish()
    return out


def redistribute_adjoint_blocks(comm: MPI.Comm, dst_local, src: Distribution, dst: Distribution):
    """Collective adjoint of :func:`redistribute_blocks`: a block of ``src`` holding the sum
    of every piece of ``dst_local`` that the forward map copied from this rank."""
    rank = comm.rank
    sends, recvs, local = _slices(src, dst, rank)
    xp = array_module(dst_local)
    _check_block(dst_local, dst.rank_box(rank).shape, "the local block")
    out = xp.zeros(src.rank_box(rank).shape, dtype=dst_local.dtype)
    if xp is np and type(dst_local) is np.ndarray:
        pcomm = private_comm(comm, "redistribute") if comm.size > 1 else comm
        _exchange_cpu(pcomm, [(p, dst_local[i]) for p, i in recvs],
                      [(p, out[i]) for p, i in sends],
                      [(out[s], dst_local[d]) for s, d in local], accumulate=True)
        return out
    ex = None
    if comm.size > 1:
        ex = PieceExchange(private_comm(comm, "redistribute"),
                           [(p, 0, dst_local[i]) for p, i in recvs],
                           [(p, 0, out[i]) for p, i in sends],
                           accumulate=True, persistent=False)
        ex.start()
    for s, d in local:
        out[s] += dst_local[d]
    if ex is not None:
        ex.finish()
    return out
