"""The measured links of a communicator, the alpha-beta models of :mod:`.prediction`.

* **Links** (measured): a latency/bandwidth (alpha-beta) model ``t(n) = alpha + beta n`` of
  point-to-point exchange between neighbours (the library's halo exchange of faces of
  several sizes on a 1-D grid of all ranks, all at once) and of ``Allreduce`` over the
  whole communicator (what the gradient reducer uses), fitted by least squares on relative
  error (:meth:`AlphaBeta.fit`), slowest rank; and the overhead every distributed op pays
  per pass over its one-rank cost (:class:`LinkModel`, :func:`measure_links`).

:class:`AlphaBeta` and :class:`LinkModel` are plain values (``AlphaBeta.fit`` is pure);
:func:`measure_links` is collective over its communicator and returns the same
:class:`LinkModel` on every rank.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from mpi4py import MPI

__all__ = ["AlphaBeta", "LinkModel", "measure_links"]


@dataclass(frozen=True)
class AlphaBeta:
    """``t(n) = alpha + beta * n`` seconds for ``n`` bytes (``0`` for ``n <= 0``)."""
    alpha: float = 0.0
    beta: float = 0.0

    def __call__(self, nbytes: float, messages: int = 1) -> float:
        if nbytes <= 0 or messages <= 0:
            return 0.0
        return messages * self.alpha + nbytes * self.beta

    @property
    def bandwidth(self) -> float:
        """Bytes per second (``inf`` when ``beta`` is 0)."""
        return math.inf if self.beta <= 0 else 1.0 / self.beta

    @classmethod
    def fit(cls, sizes: Sequence[float], times: Sequence[float]) -> "AlphaBeta":
        """Least-squares fit of ``t = alpha + beta n`` minimising the *relative* error (each
        equation divided by its time, so small and large messages weigh alike); both
        coefficients clamped to ``>= 0`` (a negative one is refitted with it fixed at 0).
        Needs at least two distinct sizes; pure."""
        n = np.asarray(sizes, dtype=np.float64)
        t = np.asarray(times, dtype=np.float64)
        if n.shape != t.shape or n.size < 2 or np.unique(n).size < 2:
            raise ValueError(f"AlphaBeta.fit needs >= 2 distinct sizes with one time each, "
                             f"got sizes {list(n)} and times {list(t)}")
        w = 1.0 / np.maximum(t, 1e-12)
        a = np.stack([w, n * w], axis=1)
        (alpha, beta), *_ = np.linalg.lstsq(a, t * w, rcond=None)
        if beta < 0:
            alpha, beta = float(np.sum(w * w * t) / np.sum(w * w)), 0.0
        if alpha < 0:
            beta = max(float(np.sum(w * w * n * t) / np.sum(w * w * n * n)), 0.0)
            alpha = 0.0
        return cls(float(alpha), float(beta))


@dataclass(frozen=True)
class LinkModel:
    """Measured links of a communicator: ``p2p`` between neighbours (per message),
    ``allreduce`` over all ranks (``nranks`` of them), and the overhead a distributed op
    pays per forward / backward pass over what it costs on one rank (``op_forward_s``,
    ``op_backward_s``: agreeing its arguments in a small all-reduce, the synchronisation that
    implies, bookkeeping; measured on an activation of a small block)."""
    p2p: AlphaBeta = AlphaBeta()
    allreduce: AlphaBeta = AlphaBeta()
    nranks: int = 1
    op_forward_s: float = 0.0
    op_backward_s: float = 0.0

def measure_links(comm: MPI.Comm, quick: bool = False, repeats: int | None = None) -> LinkModel:
    """Fit the alpha-beta models of ``comm`` (collective; identical result on every rank).

    Point to point: halo exchanges (:meth:`~disttensor.core.array.DistArray.exchange_halo`, the
    library's own, with its packing and private communicator) of one face of several sizes
    with each neighbour along a 1-D grid of all ranks, every rank at once (an inner rank
    receives two pieces); all-reduce: ``Allreduce`` of float32 arrays of several sizes over
    ``comm``.  The rounds of all sizes are interleaved, a barrier before each; the slowest
    rank's time of each round, the median over ``repeats`` rounds, is fitted
    (:meth:`AlphaBeta.fit`, per piece for the exchange).  Also measures the per-op overhead
    (:class:`LinkModel`).  On one rank everything is zero (no neighbour, nothing to
    agree)."""
    from ...routines.creation import from_global
    from ...core.grid import ProcessGrid
    if comm.size == 1:
        return LinkModel(nranks=1)
    p2p_sizes = [16, 65536, 1 << 20] if quick else [16, 4096, 65536, 1 << 20, 4 << 20]
    red_sizes = [8, 65536, 1 << 20] if quick else [8, 4096, 65536, 1 << 20, 8 << 20]
    reps = repeats or (5 if quick else 9)
    size = comm.size
    grid = ProcessGrid((size,), comm=comm)
    pieces = min(size - 1, 2)
    tasks = []
    for n in p2p_sizes:
        k = max(n // 4, 1)
        x = from_global(np.zeros((2 * size, k), np.float32), grid=grid, split=(0, None))
        h = x.with_halo(((1, 1), (0, 0))).halo_exchange()
        tasks.append(h.exchange)
    for n in red_sizes:
        sbuf = np.zeros(max(n // 4, 1), dtype=np.float32)
        rbuf = np.empty_like(sbuf)
        tasks.append(lambda sbuf=sbuf, rbuf=rbuf: comm.Allreduce(sbuf, rbuf))
    mine = np.zeros((reps, len(tasks)))
    for r in range(reps + 1):
        for j, task in enumerate(tasks):
            comm.Barrier()
            t0 = time.perf_counter()
            task()
            if r:
                mine[r - 1, j] = time.perf_counter() - t0
    agreed = np.empty_like(mine)
    comm.Allreduce(mine, agreed, op=MPI.MAX)
    med = np.median(agreed, axis=0)
    k = len(p2p_sizes)
    of, ob = _op_overhead(comm, 21 if quick else 41)
    return LinkModel(p2p=AlphaBeta.fit(p2p_sizes, med[:k] / pieces),
                     allreduce=AlphaBeta.fit(red_sizes, med[k:]), nranks=size,
                     op_forward_s=of, op_backward_s=ob)


def _op_overhead(comm: MPI.Comm, rounds: int, width: int = 1 << 18) -> tuple[float, float]:
    """Per-pass overhead of a distributed op on ``comm`` (collective): a LeakyReLU forward
    and backward on a block of 2 x ``width`` float32 per rank (about a millisecond of work,
    so the ranks synchronise after computing, as between layers: with more ranks than
    cores that costs more than a synchronisation of idle ranks), split over all ranks,
    minus the same on ``COMM_SELF``; interleaved rounds (a barrier before each), the
    slowest rank's time per round, the median over rounds of the per-round difference,
    clamped at 0."""
    from ...autograd.tensor import Tensor, filled_like
    from ...routines.creation import from_global
    from ...core.grid import ProcessGrid
    from ..layers import LeakyReLU
    layer = LeakyReLU()
    xs = []
    for c, n in ((comm, comm.size), (MPI.COMM_SELF, 1)):
        grid = ProcessGrid((n,), comm=c)
        a = np.ones((2 * n, width), np.float32)
        xs.append((c, from_global(a, grid=grid, split=(0, None))))
    times = np.zeros((rounds, 2, 2))
    for r in range(rounds + 1):
        for j, (c, x) in enumerate(xs):
            g = filled_like(x, 1)
            comm.Barrier()
            t0 = time.perf_counter()
            y = layer(Tensor(x, requires_grad=True))
            t1 = time.perf_counter()
            y.backward(g)
            t2 = time.perf_counter()
            if r:
                times[r - 1, j] = (t1 - t0, t2 - t1)
    agreed = np.empty_like(times)
    comm.Allreduce(times, agreed, op=MPI.MAX)
    diff = np.median(agreed[:, 0] - agreed[:, 1], axis=0)  # paired by round: drift cancels
    return max(float(diff[0]), 0.0), max(float(diff[1]), 0.0)
