"""Measured compute: :class:`LayerTimer` times layers on local blocks, and the optimizer step.

* **Compute** (measured): each layer's forward and backward are timed on a block of the
  slowest rank's local shape, run on a one-rank grid over ``COMM_SELF``: for a windowed
  layer the block is that rank's read window (its block with the halo it reads) and the
  padding is its local padding (at global boundaries only), so the local kernel solves
  exactly the problem the rank solves (and tunes it the same way: the first planning on a
  machine also tunes the convolution algorithms of every candidate block, cached on disk).
  Timings are cached per (layer geometry, shape, dtype).  Every rank times the same blocks at
  the same time, a barrier before each round (so ranks sharing cores measure the
  oversubscribed speed they will run at); the slowest rank's time of each round, the median
  over rounds, is used (:class:`LayerTimer`).

:meth:`LayerTimer.time_all` and :func:`optimizer_time` are collective over their
communicator and return the same figures on every rank.
"""
from __future__ import annotations

import math
import os
import statistics
import time
from typing import Sequence

import numpy as np
from mpi4py import MPI

__all__ = ["LayerTimer", "layer_key", "optimizer_time"]


def _median_time(fn, repeats: int) -> float:
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def layer_key(layer) -> tuple:
    """What identifies a layer's computation: its type, ``extra_repr`` and parameter shapes
    (the timing cache's key, and what :func:`~.plan.plan_grid` agrees across ranks)."""
    return (type(layer).__name__, layer.extra_repr(),
            tuple(tuple(p.data.shape) for p in layer.parameters()))


class LayerTimer:
    """Times layers on local blocks over ``COMM_SELF``, collectively over ``comm``, with a
    cache per (layer geometry, shape, dtype).

    :meth:`time_all` takes a list of ``(layer, shape, input_grad)`` jobs that must be the
    same on every rank of ``comm``; every rank runs them in that order (a barrier before each
    block and round, so ranks measure concurrently) and one ``Allreduce(MAX)`` makes the
    result identical everywhere.
    A block that fails to run gives ``inf`` on every rank.  The rounds of a block are
    synchronised (a barrier before each) and the slowest rank's time of each round is
    taken before the median over rounds: the step waits for the slowest rank of every
    layer."""

    def __init__(self, comm: MPI.Comm, dtype, device: str = "cpu", repeats: int = 2,
                 warmup: int = 1, chunk_bytes: int = 256 * 2 ** 20):
        self.comm, self.dtype, self.device = comm, np.dtype(dtype), device
        self.repeats, self.warmup = int(repeats), int(warmup)
        self.chunk_bytes = int(chunk_bytes)
        self.cache: dict = {}

    def _prepared(self, layer, shape, input_grad: bool):
        """A function timing one round of ``layer`` on a block of ``shape``: forward,
        backward; returns ``(forward_s, backward_s)`` (local: the caller synchronises).
        Side effects on the layer are undone (as
        :func:`~disttensor.nn.partition.profile_layers` does)."""
        from ...autograd.tensor import Tensor, filled_like
        from ...core.array import DistArray
        from ...routines.creation import from_global
        from ...core.grid import ProcessGrid
        from ..amp import autocast
        from ..partition import _Isolated, _sync
        a = np.random.default_rng(0).standard_normal(shape).astype(self.dtype)
        grid = ProcessGrid((1,) * (len(shape) - 1), comm=MPI.COMM_SELF)
        x = from_global(a, grid=grid, split=(0, None) + tuple(range(1, len(shape) - 1)),
                        device=self.device)
        state = {}  # the output's layout, for the ones gradient (known after one forward)

        def run():  # autocast: mixed precision times float16 blocks on float32 weights
            with _Isolated([layer], grid), autocast():
                xt = Tensor(x, requires_grad=input_grad)
                tmpl = state.get("out")
                g = None if tmpl is None else filled_like(tmpl, 1)
                t0 = time.perf_counter()
                y = layer(xt)
                _sync(y.data)
                t1 = time.perf_counter()
                if y.requires_grad:
                    if g is None and isinstance(y.data, DistArray):
                        state["out"] = y.data
                        g = filled_like(y.data, 1)  # first (warm-up) round only
                    y.backward(g)
                _sync(y.data)
                t2 = time.perf_counter()
            return t1 - t0, t2 - t1
        return run, x.local.nbytes

    def time_all(self, jobs: Sequence[tuple]) -> list[tuple[float, float]]:
        """``(forward_s, backward_s)`` per ``(layer, shape, input_grad)`` job (collective):
        the median over rounds of the slowest rank's time in each round.  ``input_grad``:
        whether backward computes the gradient of the layer's input (not for the first
        layer, whose input is the data).  The rounds of the distinct blocks are interleaved
        (in chunks of at most ``chunk_bytes`` of inputs), so drifting load hits them alike.
        The convolutions' online tuning is off meanwhile (``DISTTENSOR_CONV_TUNE_ONLINE``):
        their plans are tuned at the first (warm-up) call, so the rounds time settled plans."""
        old = os.environ.get("DISTTENSOR_CONV_TUNE_ONLINE")
        os.environ["DISTTENSOR_CONV_TUNE_ONLINE"] = "off"
        try:
            return self._time_all(jobs)
        finally:
            if old is None:
                os.environ.pop("DISTTENSOR_CONV_TUNE_ONLINE", None)
            else:
                os.environ["DISTTENSOR_CONV_TUNE_ONLINE"] = old

    def _time_all(self, jobs: Sequence[tuple]) -> list[tuple[float, float]]:
        tune = os.environ.get("DISTTENSOR_CONV_TUNE", "")  # the kernels' algorithm choice
        keys = [(layer_key(layer), tuple(shape), bool(ig), self.dtype.str, tune)
                for layer, shape, ig in jobs]
        todo, seen = [], set()
        for k, (layer, shape, ig) in zip(keys, jobs):
            if k not in self.cache and k not in seen and len(shape):
                seen.add(k)
                todo.append((k, layer, tuple(shape), ig))
        R = self.repeats
        mine = np.zeros((len(todo), R, 2))
        start = 0
        while start < len(todo):
            runs, nbytes, stop = [], 0, start
            while stop < len(todo) and (stop == start or nbytes < self.chunk_bytes):
                k, layer, shape, ig = todo[stop]
                try:
                    run, nb = self._prepared(layer, shape, ig)
                    nbytes += nb
                except Exception:  # noqa: BLE001 - an unrunnable block: inf on every rank
                    run = None
                runs.append(run)
                stop += 1
            for r in range(self.warmup + R):
                for j, run in enumerate(runs):
                    # one barrier per block and round on every rank, whatever failed where:
                    # the ranks run each block together and never lose step
                    self.comm.Barrier()
                    if run is None:
                        mine[start + j] = math.inf
                        continue
                    try:
                        t = run()
                    except Exception:  # noqa: BLE001
                        runs[j] = None
                        mine[start + j] = math.inf
                        continue
                    if r >= self.warmup:
                        mine[start + j, r - self.warmup] = t
            start = stop
        agreed = np.empty_like(mine)
        self.comm.Allreduce(mine, agreed, op=MPI.MAX)
        for j, (k, _, _, _) in enumerate(todo):
            self.cache[k] = (float(np.median(agreed[j, :, 0])),
                             float(np.median(agreed[j, :, 1])))
        return [self.cache.get(k, (0.0, 0.0)) if len(shape) else (0.0, 0.0)
                for k, (_, shape, _) in zip(keys, jobs)]


def optimizer_time(params, optimizer: str, dtype, comm, repeats: int) -> float:
    """Seconds of one optimizer step over copies of ``params`` (collective: max over
    ranks)."""
    from .. import optim
    from ..module import Parameter
    if optimizer == "none":
        return 0.0
    copies = [Parameter(p.data.copy()) for p in params]
    for c in copies:
        c.grad = c.data * 0 + 1
    opt = {"sgd": lambda ps: optim.SGD(ps, lr=1e-3, momentum=0.9),
           "adamw": lambda ps: optim.AdamW(ps, lr=1e-3)}.get(
        optimizer, lambda ps: optim.Adam(ps, lr=1e-3))(copies)
    if not copies:
        return 0.0
    opt.step()
    mine = _median_time(opt.step, repeats)
    return float(comm.allreduce(mine, op=MPI.MAX))
