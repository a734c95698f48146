"""Any-to-any block redistribution and its adjoint.

``redistribute_blocks`` moves one array from distribution ``src`` to distribution ``dst`` in a
single collective step: every piece (the intersection of this rank's source block with a
destination block) is one point-to-point message on a private duplicate of the communicator,
and pieces a rank keeps are copied locally while the messages fly.  Contiguous pieces move
straight from the source block / into the destination block; the others are packed (see
:class:`disttensor.comm.PieceExchange` for why not MPI subarray datatypes, and for GPU blocks).
Point to point rather than ``MPI_Alltoallv``/``Alltoallw``: a rank talks only to the ranks its
block meets, which is few for the usual redistributions on large grids, and nothing is sent
to or copied through itself.

The adjoint ``R*`` of a redistribution ``R`` maps a ``dst`` block back to a ``src`` block,
*adding* every received piece into place: where ``dst`` replicates data, ``R`` copies one
source element to several ranks and ``R*`` sums them; where ``src`` is replicated, ``R`` reads
from one chosen replica and ``R*`` writes only to that replica.  So ``<R x, y> = <x, R* y>``
with the inner product summed over all ranks' local blocks.
"""
from __future__ import annotations

from functools import lru_cache

from mpi4py import MPI

from .backend import array_module
from .comm import PieceExchange, copy_into, private_comm
from .distribution import Box, Distribution
from .plans import CommPlan, redistribution_plan

__all__ = ["plan", "redistribute_blocks", "redistribute_adjoint_blocks"]


@lru_cache(maxsize=512)
def plan(src: Distribution, dst: Distribution, rank: int) -> CommPlan:
    """Cached :func:`disttensor.plans.redistribution_plan`."""
    return redistribution_plan(src, dst, rank)


def _view(a, box: Box):
    """The part of ``a`` in ``box`` as a view (also for 0-d arrays)."""
    return a[box.slices()] if a.ndim else a[...]


def _check_block(a, want, what: str) -> None:
    if tuple(a.shape) != tuple(want):
        raise ValueError(f"{what} has shape {tuple(a.shape)}, the distribution's block here is "
                         f"{tuple(want)}")


def redistribute_blocks(comm: MPI.Comm, src_local, src: Distribution, dst: Distribution,
                        out=None):
    """Collective: return this rank's block of ``dst`` given its block ``src_local`` of
    ``src`` (``comm`` ranks numbered as both grids).  ``out``, if given, is written into.
    ``src_local`` may be any view (non-contiguous, transposed, the interior of a halo buffer)."""
    p = plan(src, dst, comm.rank)
    xp = array_module(src_local)
    _check_block(src_local, src.rank_box(comm.rank).shape, "the local source block")
    my_dst_shape = dst.rank_box(comm.rank).shape
    if out is None:
        out = xp.empty(my_dst_shape, dtype=src_local.dtype)
    else:
        _check_block(out, my_dst_shape, "out")
    ex = None
    if comm.size > 1:  # private_comm is collective on first use: every rank gets it
        ex = PieceExchange(private_comm(comm, "redistribute"),
                           [(t.peer, 0, _view(src_local, t.box)) for t in p.sends],
                           [(t.peer, 0, _view(out, t.box)) for t in p.recvs])
        ex.start()
    for sbox, dbox in p.local:
        copy_into(_view(out, dbox), _view(src_local, sbox))
    if ex is not None:
        ex.finish()
    return out


def redistribute_adjoint_blocks(comm: MPI.Comm, dst_local, src: Distribution, dst: Distribution):
    """Collective adjoint of :func:`redistribute_blocks`: a block of ``src`` holding the sum
    of every piece of ``dst_local`` that the forward map copied from this rank."""
    p = plan(src, dst, comm.rank)
    xp = array_module(dst_local)
    _check_block(dst_local, dst.rank_box(comm.rank).shape, "the local block")
    out = xp.zeros(src.rank_box(comm.rank).shape, dtype=dst_local.dtype)
    ex = None
    if comm.size > 1:
        ex = PieceExchange(private_comm(comm, "redistribute"),
                           [(t.peer, 0, _view(dst_local, t.box)) for t in p.recvs],
                           [(t.peer, 0, _view(out, t.box)) for t in p.sends],
                           accumulate=True)
        ex.start()
    for sbox, dbox in p.local:
        _view(out, sbox)[...] += _view(dst_local, dbox)
    if ex is not None:
        ex.finish()
    return out
