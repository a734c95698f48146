"""Any-to-any block redistribution and its adjoint.

``redistribute_blocks`` moves one array from distribution ``src`` to distribution ``dst`` in a
single collective step: on CPU an ``MPI_Alltoallw`` whose send and receive datatypes are
subarray types of the local blocks (no pack copy); on GPU (or any non-NumPy block) the
pieces are packed into one contiguous buffer per direction and moved with ``MPI_Alltoallv``
(through host memory unless MPI is CUDA-aware).  Pieces a rank keeps are copied locally.

The adjoint ``R*`` of a redistribution ``R`` maps a ``dst`` block back to a ``src`` block,
*adding* every received piece into place: where ``dst`` replicates data, ``R`` copies one
source element to several ranks and ``R*`` sums them; where ``src`` is replicated, ``R`` reads
from one chosen replica and ``R*`` writes only to that replica.  So ``<R x, y> = <x, R* y>``
with the inner product summed over all ranks' local blocks.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
from mpi4py import MPI

from .backend import array_module, to_host
from .comm import host_staging, mpi_type, subarray_type
from .distribution import Distribution
from .plans import CommPlan, redistribution_plan

__all__ = ["plan", "redistribute_blocks", "redistribute_adjoint_blocks"]


@lru_cache(maxsize=512)
def plan(src: Distribution, dst: Distribution, rank: int) -> CommPlan:
    """Cached :func:`disttensor.plans.redistribution_plan`."""
    return redistribution_plan(src, dst, rank)


def _alltoallw(comm: MPI.Comm, sendbuf: np.ndarray, sends, recvbuf: np.ndarray, recvs) -> None:
    """One Alltoallw; ``sends``/``recvs`` are ``(peer, box)`` pairs in the buffers' own
    coordinates (buffers C-contiguous)."""
    size = comm.size
    scount, rcount = [0] * size, [0] * size
    stypes, rtypes = [MPI.BYTE] * size, [MPI.BYTE] * size
    zeros = [0] * size
    for peer, box in sends:
        scount[peer] = 1
        stypes[peer] = subarray_type(sendbuf.dtype, sendbuf.shape, box.start, box.shape)
    for peer, box in recvs:
        rcount[peer] = 1
        rtypes[peer] = subarray_type(recvbuf.dtype, recvbuf.shape, box.start, box.shape)
    comm.Alltoallw([sendbuf, (scount, zeros), stypes], [recvbuf, (rcount, zeros), rtypes])


def _alltoallv_packed(comm: MPI.Comm, dtype, send_pieces, recv_sizes, xp):
    """Alltoallv of contiguous pieces.  ``send_pieces``: ``(peer, flat array)``;
    ``recv_sizes``: ``(peer, n)``.  Returns ``{peer: flat received array}`` (device of ``xp``)."""
    size = comm.size
    scounts, rcounts = [0] * size, [0] * size
    for peer, piece in send_pieces:
        scounts[peer] = int(piece.size)
    for peer, n in recv_sizes:
        rcounts[peer] = int(n)
    sdispl = np.concatenate([[0], np.cumsum(scounts)[:-1]]).astype(int).tolist()
    rdispl = np.concatenate([[0], np.cumsum(rcounts)[:-1]]).astype(int).tolist()
    order = sorted(send_pieces, key=lambda p: p[0])
    if order:
        sendbuf = xp.concatenate([p.reshape(-1) for _, p in order])
    else:
        sendbuf = xp.empty(0, dtype=dtype)
    recvbuf = xp.empty(int(sum(rcounts)), dtype=dtype)
    staged = xp is not np and host_staging(sendbuf)
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()
    sb = to_host(sendbuf) if staged else sendbuf
    rb = np.empty(recvbuf.size, dtype=dtype) if staged else recvbuf
    t = mpi_type(np.dtype(dtype))
    comm.Alltoallv([sb, (scounts, sdispl), t], [rb, (rcounts, rdispl), t])
    if staged:
        recvbuf = xp.asarray(rb)
    return {peer: recvbuf[rdispl[peer]:rdispl[peer] + rcounts[peer]] for peer, _ in recv_sizes}


def redistribute_blocks(comm: MPI.Comm, src_local, src: Distribution, dst: Distribution,
                        out=None):
    """Collective: return this rank's block of ``dst`` given its block ``src_local`` of
    ``src`` (``comm`` ranks numbered as both grids).  ``out``, if given, is written into."""
    p = plan(src, dst, comm.rank)
    xp = array_module(src_local)
    my_dst_shape = dst.rank_box(comm.rank).shape
    if out is None:
        out = xp.empty(my_dst_shape, dtype=src_local.dtype)
    for sbox, dbox in p.local:
        out[dbox.slices()] = src_local[sbox.slices()]
    if comm.size == 1:
        return out
    if xp is np and src_local.ndim > 0:
        sbuf = np.ascontiguousarray(src_local)
        rbuf = out if out.flags.c_contiguous else np.empty(out.shape, out.dtype)
        _alltoallw(comm, sbuf, [(t.peer, t.box) for t in p.sends],
                   rbuf, [(t.peer, t.box) for t in p.recvs])
        if rbuf is not out:
            for t in p.recvs:
                out[t.box.slices()] = rbuf[t.box.slices()]
        return out
    pieces = [(t.peer, xp.ascontiguousarray(src_local[t.box.slices()])) for t in p.sends]
    got = _alltoallv_packed(comm, src_local.dtype, pieces,
                            [(t.peer, t.box.size) for t in p.recvs], xp)
    for t in p.recvs:
        out[t.box.slices()] = got[t.peer].reshape(t.box.shape)
    return out


def redistribute_adjoint_blocks(comm: MPI.Comm, dst_local, src: Distribution, dst: Distribution):
    """Collective adjoint of :func:`redistribute_blocks`: a block of ``src`` holding the sum
    of every piece of ``dst_local`` that the forward map copied from this rank."""
    p = plan(src, dst, comm.rank)
    xp = array_module(dst_local)
    out = xp.zeros(src.rank_box(comm.rank).shape, dtype=dst_local.dtype)
    for sbox, dbox in p.local:
        out[sbox.slices()] += dst_local[dbox.slices()]
    if comm.size == 1:
        return out
    pieces = [(t.peer, xp.ascontiguousarray(dst_local[t.box.slices()])) for t in p.recvs]
    got = _alltoallv_packed(comm, dst_local.dtype, pieces,
                            [(t.peer, t.box.size) for t in p.sends], xp)
    for t in p.sends:  # at most one piece per peer (a box meets a box once)
        out[t.box.slices()] += got[t.peer].reshape(t.box.shape)
    return out
