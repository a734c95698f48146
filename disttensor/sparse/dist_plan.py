"""Pure plans of distributed sparse products (no MPI): the halo of a sparse matrix and the cost
rule that picks how the right-hand side moves.

A matrix in the 1-D row layout gives rank ``r`` the rows ``[ro[r], ro[r+1])``; the entries of
those rows reference a set of global columns, ``ext`` (sorted, unique).  The right-hand side
``x`` is split along its rows by the *column* ownership offsets ``co``: rank ``q`` owns
``x[co[q]:co[q+1]]``.  Rank ``r`` keeps its rows as a local matrix over the compact column
numbering ``0..len(ext)-1`` (local column ``c`` is global column ``ext[c]``), so the product
needs ``x_ext = x[ext]``:

* the part of ``ext`` it owns itself is copied from its own block,
* every other owner ``q`` sends the entries of ``ext`` in its range: since ``ext`` is sorted and
  owners hold contiguous ranges, they arrive as one contiguous piece ``x_ext[a:b]`` (the
  receive list :class:`RecvPlan`); the owner's send list is those global indices minus its
  offset (:func:`send_indices`).

The adjoint ``A.T @ y`` makes the reverse exchange: each rank's partial ``A_loc.T @ y_loc``
(one row per entry of ``ext``) goes back to the owners, who add the pieces into place.

**Cost rule** (:func:`choose_exchange`, alpha-beta, deterministic from agreed per-rank counts):
a message costs ``ALPHA`` seconds plus ``BETA`` seconds per byte.  Ports are full duplex, so
one rank's time is ``ALPHA * max(messages sent, messages received) + BETA * max(bytes sent,
bytes received)``, and a plan costs its slowest rank.

* ``"p2p"`` (point to point, :class:`~disttensor.core.comm.PieceExchange`): rank ``r`` sends
  one message per peer that needs its entries and receives one per owner of its ghosts, with
  exactly the needed entries (``k`` columns each).
* ``"allgather"`` (replicated right-hand side, ``MPI_Allgatherv``; adjoint
  ``MPI_Reduce_scatter``): ``ceil(log2 p)`` message rounds (recursive doubling) and every
  rank receives all of ``x`` it does not own: ``(n - n_r) k`` elements.

The cheaper one wins; ties go to ``"p2p"``.  ``ALPHA = 5 us`` (the order of one MPI message
plus the mpi4py call around it on one node) and ``BETA = 1 / (5 GB/s)`` are assumed constants,
not measured per machine (both are arguments of the functions here).  Few, local
neighbours (a stencil matrix) give ``"p2p"``; a matrix whose rows reference most of ``x`` (a
dense-ish random graph on many ranks) gives ``"allgather"``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["ALPHA", "BETA", "owners", "RecvPlan", "recv_plan", "send_indices", "ExchangeStats",
           "exchange_stats", "exchange_cost", "choose_exchange", "block_of_entries"]

ALPHA = 5e-6          # seconds per message
BETA = 1.0 / 5e9      # seconds per byte


def owners(indices: np.ndarray, offsets: Sequence[int]) -> np.ndarray:
    """Block coordinate owning each global index (``offsets``: ``p + 1`` cumulative block
    bounds; empty blocks never own anything)."""
    off = np.asarray(offsets, dtype=np.int64)
    return np.searchsorted(off, np.asarray(indices, dtype=np.int64), side="right") - 1


@dataclass(frozen=True)
class RecvPlan:
    """What rank ``rank`` needs of ``x`` for its compact columns ``ext``.

    ``own``: the range ``(a, b)`` of ``ext`` this rank owns (``ext[a:b] - offsets[rank]`` are
    indices into its own block); ``recvs``: ``(peer, a, b)`` ranges of ``ext`` owned by other
    ranks, ascending by peer, non-empty, covering the rest of ``ext``."""

    rank: int
    own: tuple[int, int]
    recvs: tuple[tuple[int, int, int], ...]

    @property
    def n_recv(self) -> int:
        return sum(b - a for _, a, b in self.recvs)


def recv_plan(ext: np.ndarray, offsets: Sequence[int], rank: int) -> RecvPlan:
    """The :class:`RecvPlan` of ``rank`` for its sorted unique global columns ``ext``."""
    ext = np.asarray(ext, dtype=np.int64)
    p = len(offsets) - 1
    if ext.size and (ext[0] < 0 or ext[-1] >= offsets[-1]):
        raise IndexError(f"column index out of range [0, {offsets[-1]})")
    if ext.size > 1 and np.any(np.diff(ext) <= 0):
        raise ValueError("ext must be sorted and unique")
    cuts = np.searchsorted(ext, np.asarray(offsets, dtype=np.int64), side="left")
    own = (int(cuts[rank]), int(cuts[rank + 1]))
    recvs = tuple((q, int(cuts[q]), int(cuts[q + 1])) for q in range(p)
                  if q != rank and cuts[q + 1] > cuts[q])
    return RecvPlan(rank, own, recvs)


def send_indices(requested: np.ndarray, offsets: Sequence[int], rank: int) -> np.ndarray:
    """Indices into ``rank``'s own block of the global indices another rank ``requested``
    (they must lie in ``rank``'s range)."""
    req = np.asarray(requested, dtype=np.int64)
    lo, hi = offsets[rank], offsets[rank + 1]
    if req.size and (req.min() < lo or req.max() >= hi):
        raise ValueError(f"requested indices outside rank {rank}'s range [{lo}, {hi})")
    return req - lo


@dataclass(frozen=True)
class ExchangeStats:
    """One rank's side of the point-to-point exchange: message and element counts."""

    msgs_sent: int
    msgs_recv: int
    elems_sent: int
    elems_recv: int
    owned: int          # entries of x this rank owns (its block length)

    def as_tuple(self) -> tuple[int, int, int, int, int]:
        return (self.msgs_sent, self.msgs_recv, self.elems_sent, self.elems_recv, self.owned)


def exchange_stats(plan: RecvPlan, send_lists: Sequence[tuple[int, np.ndarray]],
                   owned: int) -> ExchangeStats:
    """Counts of a rank's receive plan and send lists ``(peer, indices)`` (non-empty ones)."""
    sends = [s for s in send_lists if len(s[1])]
    return ExchangeStats(len(sends), len(plan.recvs), sum(len(s) for _, s in sends),
                         plan.n_recv, int(owned))


def exchange_cost(method: str, stats: Sequence[ExchangeStats | tuple], k: int, itemsize: int,
                  alpha: float = ALPHA, beta: float = BETA) -> float:
    """Estimated seconds of moving ``x`` (``k`` columns of ``itemsize`` bytes) by ``method``
    (``"p2p"`` or ``"allgather"``), given every rank's :class:`ExchangeStats` (see the module
    doc).  One rank: nothing moves (0)."""
    rows = [s.as_tuple() if isinstance(s, ExchangeStats) else tuple(s) for s in stats]
    p = len(rows)
    if p <= 1:
        return 0.0
    width = k * itemsize
    if method == "p2p":
        return max(alpha * max(ms, mr) + beta * max(es, er) * width
                   for ms, mr, es, er, _ in rows)
    if method == "allgather":
        n = sum(r[4] for r in rows)
        rounds = math.ceil(math.log2(p))
        return max(alpha * rounds + beta * (n - r[4]) * width for r in rows)
    raise ValueError(f"unknown exchange method {method!r}")


def choose_exchange(stats: Sequence[ExchangeStats | tuple], k: int, itemsize: int,
                    alpha: float = ALPHA, beta: float = BETA) -> str:
    """``"p2p"`` or ``"allgather"``, whichever :func:`exchange_cost` says is cheaper (ties:
    ``"p2p"``).  The same on every rank given the same (all-gathered) stats."""
    p2p = exchange_cost("p2p", stats, k, itemsize, alpha, beta)
    ag = exchange_cost("allgather", stats, k, itemsize, alpha, beta)
    return "allgather" if ag < p2p else "p2p"


def block_of_entries(rows: np.ndarray, cols: np.ndarray, row_offsets: Sequence[int],
                     col_offsets: Sequence[int] | None, dims: Sequence[int]) -> np.ndarray:
    """Destination rank of each entry ``(rows[i], cols[i])``: on a 1-D grid (``dims = (p,)``,
    ``col_offsets`` ignored) the owner of its row; on a 2-D grid ``(pr, pc)`` the rank
    ``i * pc + j`` (row-major) of the row block ``i`` and column block ``j`` it falls in."""
    ri = owners(rows, row_offsets)
    if len(dims) == 1:
        return ri
    if len(dims) != 2 or col_offsets is None:
        raise ValueError(f"block_of_entries needs a 1-D or 2-D grid, got dims {tuple(dims)}")
    return ri * dims[1] + owners(cols, col_offsets)
