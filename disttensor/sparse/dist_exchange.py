"""How the right-hand side of a row-distributed sparse product moves (collective, CPU blocks).

:class:`RowHalo` is the communication of one matrix in the 1-D row layout (see
:mod:`disttensor.sparse.dist_plan` for the plan and the cost rule): built once with the matrix
(one ``MPI_Alltoall`` of counts and one ``MPI_Alltoallv`` of the requested column indices,
then one ``MPI_Allgather`` of every rank's message/element counts for the cost rule), it
gathers ``x_ext = x[ext]`` for ``A @ x`` and scatters-adds the partial ``A_loc.T @ y`` back to
the owners for ``A.T @ y``, by

* ``"p2p"``: a persistent :class:`~disttensor.core.comm.PieceExchange` per right-hand-side
  width and dtype on a private duplicate of the grid communicator (each ghost range of
  ``x_ext`` is received in place, each send list packed by ``np.take``), or
* ``"allgather"``: ``MPI_Allgatherv`` of ``x`` (adjoint: ``MPI_Reduce_scatter``).
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..core.comm import PieceExchange, mpi_type, private_comm
from ..core.watchdog import waiting
from .dist_plan import choose_exchange, exchange_stats, recv_plan, send_indices

__all__ = ["RowHalo"]

_TAG = 0x5350  # 'SP'


class RowHalo:
    """The halo exchange of rank ``comm.rank`` for its sorted compact columns ``ext`` over
    the column ownership ``col_offsets`` (collective to create)."""

    def __init__(self, comm: MPI.Comm, ext: np.ndarray, col_offsets):
        self.comm = comm
        self.rank = comm.rank
        self.size = comm.size
        self.ext = np.asarray(ext, dtype=np.int64)
        self.col_offsets = tuple(int(o) for o in col_offsets)
        self.n = self.col_offsets[-1]
        self.plan = recv_plan(self.ext, self.col_offsets, self.rank)
        a, b = self.plan.own
        self.own_local = self.ext[a:b] - self.col_offsets[self.rank]
        self.sends: list[tuple[int, np.ndarray]] = []
        owned = self.col_offsets[self.rank + 1] - self.col_offsets[self.rank]
        if self.size > 1:
            self.pcomm = private_comm(comm, "sparse")
            self.sends = self._requests()
            st = exchange_stats(self.plan, self.sends, owned)
            self.stats = [tuple(s) for s in comm.allgather(st.as_tuple())]
        else:
            self.pcomm = comm
            self.stats = [exchange_stats(self.plan, [], owned).as_tuple()]
        self._counts = np.diff(np.asarray(self.col_offsets, dtype=np.int64))
        self._cache: dict = {}
        # the rows reference exactly this rank's own block, in order: x_ext is x's block
        # (used on one rank)
        self.identity = not self.plan.recvs and len(self.ext) == owned and (
            owned == 0 or int(self.ext[0]) == self.col_offsets[self.rank])

    def _requests(self) -> list[tuple[int, np.ndarray]]:
        """Tell every owner which of its entries this rank needs; learn what to send."""
        p, comm = self.size, self.comm
        want = np.zeros(p, dtype=np.int64)
        for q, a, b in self.plan.recvs:
            want[q] = b - a
        got = np.empty(p, dtype=np.int64)
        comm.Alltoall(want, got)
        sdispl = np.concatenate(([0], np.cumsum(want)[:-1]))
        rdispl = np.concatenate(([0], np.cumsum(got)[:-1]))
        sendbuf = np.concatenate([self.ext[a:b] for _, a, b in self.plan.recvs]
                                 or [np.empty(0, np.int64)])
        recvbuf = np.empty(int(got.sum()), dtype=np.int64)
        comm.Alltoallv([sendbuf, (want, sdispl), MPI.INT64_T],
                       [recvbuf, (got, rdispl), MPI.INT64_T])
        return [(q, send_indices(recvbuf[rdispl[q]:rdispl[q] + got[q]], self.col_offsets,
                                 self.rank)) for q in range(p) if got[q]]

    # -- the method ------------------------------------------------------------------------
    def method(self, k: int, itemsize: int, force: str | None = None) -> str:
        """``"local"`` on one rank, else ``force`` or the cost rule's choice (the same on
        every rank: the stats are all-gathered)."""
        if self.size == 1:
            return "local"
        return force or choose_exchange(self.stats, k, itemsize)

    def _p2p(self, k: int, dtype: np.dtype, adjoint: bool):
        key = (k, dtype.str, adjoint)
        ent = self._cache.get(key)
        if ent is None:
            ext_buf = np.empty((len(self.ext), k), dtype=dtype)
            packs = [np.empty((len(idx), k), dtype=dtype) for _, idx in self.sends]
            ranges = [(q, ext_buf[a:b]) for q, a, b in self.plan.recvs]
            if adjoint:   # partials of the ghost rows go back; the owners' pieces come in
                ex = PieceExchange(self.pcomm, [(q, _TAG + 1, v) for q, v in ranges],
                                   [(q, _TAG + 1, s) for (q, _), s in zip(self.sends, packs)])
            else:
                ex = PieceExchange(self.pcomm,
                                   [(q, _TAG, s) for (q, _), s in zip(self.sends, packs)],
                                   [(q, _TAG, v) for q, v in ranges])
            ent = self._cache[key] = (ext_buf, packs, ex)
        return ent

    # -- forward: x_ext = x[ext] -----------------------------------------------------------
    def gather(self, X: np.ndarray, force: str | None = None) -> np.ndarray:
        """``x[ext]`` (``(len(ext), k)``) from this rank's block ``X`` (``(n_r, k)``) of the
        column-split right-hand side (collective)."""
        k = X.shape[1]
        method = self.method(k, X.dtype.itemsize, force)
        if method == "local":   # (other ranks may need this one's entries: never skip)
            return X if self.identity else X[self.ext]
        if method == "allgather":
            return self._allgather(X)[self.ext]
        ext_buf, packs, ex = self._p2p(k, X.dtype, False)
        for (_, idx), buf in zip(self.sends, packs):
            np.take(X, idx, axis=0, out=buf)
        ex.start()
        a, b = self.plan.own
        np.take(X, self.own_local, axis=0, out=ext_buf[a:b])
        ex.finish()
        return ext_buf

    def _allgather(self, X: np.ndarray) -> np.ndarray:
        k = X.shape[1]
        full = np.empty((self.n, k), dtype=X.dtype)
        t = mpi_type(X.dtype)
        counts = self._counts * k
        displs = np.asarray(self.col_offsets[:-1], dtype=np.int64) * k
        with waiting(self.comm, "MPI_Allgatherv (sparse right-hand side)"):
            self.comm.Allgatherv([np.ascontiguousarray(X), t], [full, (counts, displs), t])
        return full

    # -- adjoint: the owners add the partials of their entries --------------------------------
    def scatter_add(self, Z: np.ndarray, force: str | None = None) -> np.ndarray:
        """The block ``(n_r, k)`` of ``sum over ranks of scatter(ext, Z_rank)`` (collective):
        the adjoint of :meth:`gather`."""
        k = Z.shape[1]
        n_r = len(self._counts) and int(self._counts[self.rank])
        out = np.zeros((n_r, k), dtype=Z.dtype)
        method = self.method(k, Z.dtype.itemsize, force)
        if method == "local":
            out[self.ext] = Z
            return out
        if method == "allgather":
            full = np.zeros((self.n, k), dtype=Z.dtype)
            full[self.ext] = Z
            t = mpi_type(Z.dtype)
            with waiting(self.comm, "MPI_Reduce_scatter (sparse adjoint)"):
                self.comm.Reduce_scatter([full, t], [out, t], self._counts * k, op=MPI.SUM)
            return out
        ext_buf, packs, ex = self._p2p(k, Z.dtype, True)
        ext_buf[...] = Z
        ex.start()
        a, b = self.plan.own
        out[self.own_local] += Z[a:b]
        ex.finish()
        for (_, idx), buf in zip(self.sends, packs):
            out[idx] += buf
        return out
