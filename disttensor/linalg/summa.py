"""SUMMA: the product of two matrices both split ``(r, c)`` over the same two grid axes.

``summa(a, b, grid)`` with ``a`` ``(m, k)`` and ``b`` ``(k, n)`` split over grid axes ``r``
(rows) and ``c`` (columns) of ``grid``, blocks of any sizes (uneven and empty blocks are
fine), returns ``C = a @ b`` ``(m, n)`` split ``(r, c)`` with ``a``'s row blocks and ``b``'s
column blocks.  Collective over ``grid``.

The ``k`` axis is cut at the union of ``a``'s column and ``b``'s row block boundaries, and
each piece into panels at most :data:`_PANEL` wide.  For each panel the owning grid column
broadcasts its ``a`` panel along the grid rows (``grid.sub_comm([c])``) and the owning grid
row its ``b`` panel along the grid columns (``grid.sub_comm([r])``), and every rank adds
``A_panel @ B_panel`` to its block.  The next panel's broadcasts are posted (``Ibcast``)
before the current panel's product runs.  Panels travel through host memory (CuPy blocks are
copied to the host for the broadcast).  Per rank: ``ceil(m/p_r) k + k ceil(n/p_c)`` elements
received; the sums run in panel order.
"""
from __future__ import annotations

import numpy as np

from ..core.array import DistArray
from ..core.backend import array_module, to_host
from ..core.comm import mpi_type
from ..core.distribution import Distribution
from ..core.grid import ProcessGrid

__all__ = ["summa"]


def _ibcast_panel(comm, buf, root: int):
    """Non-blocking broadcast of a (NumPy or CuPy, contiguous) panel; returns (request, array
    to use after the wait)."""
    if comm.size == 1:
        return None, buf
    host = to_host(buf)
    req = comm.Ibcast([host, mpi_type(host.dtype)], root=root)
    return req, host


_PANEL = 1024  # SUMMA panel width cap: more, narrower panels overlap better, cost more calls


def summa(a: DistArray, b: DistArray, grid: ProcessGrid) -> DistArray:
    """SUMMA for ``a`` and ``b`` both split ``(r, c)`` over the same grid (see module doc)."""
    r, c = a.split
    da, db = a.distribution, b.distribution
    xp = a.xp
    dtype = np.result_type(a.dtype, b.dtype)
    ao, bo = da.offsets[1], db.offsets[0]
    cuts = sorted(set(ao) | set(bo))
    row_comm, col_comm = grid.sub_comm([c]), grid.sub_comm([r])
    my_c, my_r = grid.coords[c], grid.coords[r]
    mloc, nloc = a.local.shape[0], b.local.shape[1]
    out = xp.zeros((mloc, nloc), dtype=dtype)
    segs = [(k0, min(k0 + _PANEL, k1)) for c0, k1 in zip(cuts[:-1], cuts[1:])
            for k0 in range(c0, k1, _PANEL)]

    def post(k0, k1):
        ca, rb = da.owner_coord(1, k0), db.owner_coord(0, k0)
        if my_c == ca:
            pa = xp.ascontiguousarray(a.local[:, k0 - ao[ca]:k1 - ao[ca]], dtype=dtype)
        else:
            pa = xp.empty((mloc, k1 - k0), dtype=dtype)
        if my_r == rb:
            pb = xp.ascontiguousarray(b.local[k0 - bo[rb]:k1 - bo[rb], :], dtype=dtype)
        else:
            pb = xp.empty((k1 - k0, nloc), dtype=dtype)
        ra, ha = _ibcast_panel(row_comm, pa, ca)
        rbq, hb = _ibcast_panel(col_comm, pb, rb)
        return ra, ha, rbq, hb

    pending = post(*segs[0]) if segs else None
    for i in range(len(segs)):
        ra, ha, rbq, hb = pending
        for q in (ra, rbq):
            if q is not None:
                q.Wait()
        pending = post(*segs[i + 1]) if i + 1 < len(segs) else None
        pa = ha if array_module(ha) is xp else xp.asarray(ha)
        pb = hb if array_module(hb) is xp else xp.asarray(hb)
        out += pa @ pb
    return DistArray(out, Distribution((a.shape[0], b.shape[1]), grid.dims, (r, c),
                                       (da.sizes(0) if r is not None else None,
                                        db.sizes(1) if c is not None else None)), grid)
