"""Pipeline parallelism with data parallelism across pipeline groups (GroPipe).

A model too large for one device is cut into ``S`` *stages* (contiguous runs of its layers,
:func:`~disttensor.nn.module.sequential_layers`); the mini-batch is cut into ``chunks``
micro-batches that flow through the stages one after another, so the stages work on different
micro-batches at the same time.  ``G`` pipeline *groups* run the same pipeline on different
samples (data parallelism), and each stage may itself be spatially parallel.

Grid
----
``grid`` has dims ``(G, S, *spatial)`` for the default ``stage_axis=1`` (any axis may be the
stage axis).  The ranks with the same stage coordinate form that stage's grid,
:attr:`Pipeline.stage_grid`: the grid without the stage axis (``(G, d, h, w)``), over
``grid.sub_comm(every axis but stage_axis)``, whose coordinates are this rank's grid
coordinates without the stage axis.  It is exactly the ``(sample, d, h, w)`` grid of the rest
of the library: activations of a stage are DistArrays on it, split over the groups along the
sample axis and over the spatial axes inside a group.  A rank talks to the ranks of the
neighbouring stages with the same other coordinates, over a private duplicate of
``grid.sub_comm([stage_axis])`` (whose rank is the stage index).

Parameters
----------
Every rank builds the whole model from the same seed (checked: the replicas are compared at
construction); the pipeline keeps this rank's layers as :attr:`Pipeline.stage_module` (a
``Sequential``) and :meth:`Pipeline.parameters` yields only those, so an optimizer built on
them updates this stage; ``pipe.to("cuda")`` moves only this stage's layers to the device
(the other stages' copies stay on the host, unused).  The gradients of a stage's parameters
are summed over the stage grid (groups x spatial ranks) by a
:class:`~disttensor.nn.parallel.GradientReducer` in
accumulation mode (:meth:`~disttensor.nn.parallel.GradientReducer.accumulate`): every
micro-batch's backward adds its shares into the bucket buffers, and the bucketed
``MPI_Iallreduce`` starts only during the last micro-batch's backward (GroPipe's delayed,
partition-local gradient communication), overlapped with what is left of it.

A step (:meth:`Pipeline.train_step`)
------------------------------------
* Micro-batches without communication: the sample axis of ``x`` (and ``y``) must be split over
  its grid axis in equal blocks of ``B / P`` samples (``P`` = the extent of that axis, the
  number of groups; ``P = 1`` for an unsplit sample axis), and ``B % (P * chunks) == 0``.
  Micro-batch ``j`` is ``local[j*b:(j+1)*b]`` of every rank's block (``b = B / (P * chunks)``):
  a DistArray of ``b * P`` samples spread over all the groups, distributed like ``x``
  otherwise.
* Loss: ``loss_fn(out_j, y_j) / chunks`` per micro-batch, so for a loss that is a mean over
  the batch (MSE, cross-entropy) the sum over micro-batches is the mini-batch loss and the
  gradients equal those of the unpipelined step.
* Stage ``s > 0`` wraps what it receives as a leaf ``Tensor(a, requires_grad=True)``; the
  backward of a stage ``s < S-1`` runs ``out.backward(received_grad)`` and sends the leaf's
  gradient back.  Activations and gradients move point to point between stage neighbours as
  the contiguous local block, with non-blocking sends completed at the end of the step, so
  neither schedule can deadlock.  An activation is preceded by a small pickled header (its
  :class:`~disttensor.core.distribution.Distribution`, dtype and device) only when the layout of
  ``x`` differs from the previous step's (stage 0 tells the pipeline the layout of ``x`` in
  the one broadcast a step starts with; the layers' output layouts follow from it, so the
  headers of the last step are reused); a gradient is sent laid out like the activation it
  belongs to, which the receiver knows, so it never needs one.  Device (CuPy) blocks go
  through host memory unless MPI is CUDA-aware.
* Schedules: ``"gpipe"`` (every forward, then every backward in reverse micro-batch order;
  all ``chunks`` activation graphs are alive at the peak) and ``"1f1b"`` (PipeDream-flush:
  stage ``s`` runs ``min(S-s-1, chunks)`` warm-up forwards, then alternates one forward and one
  backward, then the remaining backwards; at most ``S - s`` graphs alive on stage ``s``).
  Both compute the same gradients.
* Batch norm uses micro-batch statistics (torchgpipe's default): each micro-batch is
  normalized with the statistics of that micro-batch (across the groups, since a micro-batch
  spans them), and running statistics are updated once per micro-batch.  A model with batch
  norm therefore matches the unpipelined run only for ``chunks=1``.
* The step returns the mini-batch loss (the sum of the scaled micro-batch losses) as a float,
  the same on every rank (broadcast from the last stage), and records its timing in
  :attr:`Pipeline.last_stats`: ``forward_s`` and ``backward_s`` (this rank's compute time,
  the gradient all-reduce wait included in backward), ``wait_s`` (blocked on receives and
  send completion), ``wall_s`` and ``bubble = 1 - (forward_s + backward_s) / wall_s``.

Checkpoints: each rank's ``model`` is current only in this stage's layers;
:meth:`Pipeline.full_state_dict` gathers the whole trained state on every rank (and
``pipe.model.load_state_dict(state)`` loads one: the stage layers are the model's own).

Evaluation: :meth:`Pipeline.forward` passes a whole batch through the stages without
recording a graph (no micro-batching) and returns the output on the ranks of the last stage,
``None`` on the others (no broadcast: the output can be large, and the last stage is where
the targets live).

Errors: bad configuration (a partition that does not cover the layers contiguously, the wrong
number of stages, more stages than layers, ``chunks < 1``, a batch the groups and chunks do not
divide) raises the same ``ValueError`` on every rank of the grid.  An exception raised inside a
stage's layers during a step is collective within that stage (as the ops make it) but leaves
the other stages waiting for their neighbours: validate data before training.

Usage::

    grid = dt.ProcessGrid((2, 2, 1, 1, 1))            # 2 groups x 2 stages
    pipe = nn.Pipeline(model, grid, chunks=4, partition=[(0, 6), (6, 11)], schedule="1f1b")
    opt = nn.optim.SGD(pipe.parameters(), lr=0.01, momentum=0.9)
    x = dt.from_global(xb, grid=pipe.stage_grid, split=(0, None, 1, 2, 3))
    y = dt.from_global(yb, grid=pipe.stage_grid, split=(0, None))
    opt.zero_grad(); loss = pipe.train_step(x, y, F.mse_loss); opt.step()
"""
from __future__ import annotations

import numbers
import pickle
import time

import numpy as np
from mpi4py import MPI

from ..core.array import DistArray
from ..autograd.tensor import Tensor, no_grad
from ..core.backend import array_module, to_device, to_host
from ..core.comm import collective, cuda_aware_mpi
from ..core.grid import ProcessGrid
from ..core.watchdog import waiting
from .module import Module, Sequential, sequential_layers
from .parallel import DEFAULT_BUCKET_BYTES, GradientReducer, check_replicas

__all__ = ["Pipeline", "balanced_partition", "check_partition"]

SCHEDULES = ("gpipe", "1f1b")

# message kinds (tag = kind + _KINDS * micro-batch index)
_ACT_HEAD, _ACT_DATA, _GRAD_HEAD, _GRAD_DATA, _EVAL_HEAD, _EVAL_DATA = range(6)
_KINDS = 6


def check_partition(partition, nlayers: int, stages: int) -> list[tuple[int, int]]:
    """``partition`` as a list of ``(start, stop)`` pairs, or ``ValueError``: it must hold one
    non-empty range per stage, covering ``range(nlayers)`` contiguously in order (pure)."""
    try:
        ranges = [(int(a), int(b)) for a, b in partition]
        if any(r != tuple(p) for r, p in zip(ranges, partition)):
            raise TypeError
    except (TypeError, ValueError):
        raise ValueError(f"partition must be a list of (start, stop) layer index pairs, got "
                         f"{partition!r}") from None
    if len(ranges) != stages:
        raise ValueError(f"partition {ranges} has {len(ranges)} ranges for {stages} stages")
    at = 0
    for a, b in ranges:
        if a != at:
            raise ValueError(f"partition {ranges} must cover the {nlayers} layers contiguously "
                             f"in order: a range starts at {a}, expected {at}")
        if b <= a:
            raise ValueError(f"partition {ranges}: range ({a}, {b}) is empty (every stage "
                             "needs at least one layer)")
        at = b
    if at != nlayers:
        raise ValueError(f"partition {ranges} covers layers [0, {at}) but the model has "
                         f"{nlayers} layers")
    return ranges


def balanced_partition(costs, stages: int, idle=None) -> list[tuple[int, int]]:
    """Contiguous non-empty ranges of ``len(costs)`` layers over ``stages`` stages minimizing
    the largest stage sum of ``costs``; among those, the fewest stages made only of layers
    flagged in ``idle`` (e.g. layers without parameters: a stage of them has nothing to train).
    Two exact dynamic programs (the min-max, then the fewest idle stages under it); ties go to
    the split whose earlier stages end first.  Pure."""
    n = len(costs)
    if not 1 <= stages <= n:
        raise ValueError(f"cannot cut {n} layers into {stages} non-empty stages")
    pre = np.concatenate([[0.0], np.cumsum(np.asarray(costs, dtype=np.float64))])
    busy = np.concatenate([[0], np.cumsum([not f for f in (idle or [False] * n)])])
    inf = float("inf")

    def solve(value, combine):
        # best[k][i]: best value cutting the first i layers into k stages
        best = [[inf] * (n + 1) for _ in range(stages + 1)]
        cut = [[0] * (n + 1) for _ in range(stages + 1)]
        best[0][0] = 0.0
        for k in range(1, stages + 1):
            for i in range(k, n - (stages - k) + 1):
                for j in range(k - 1, i):
                    v = combine(best[k - 1][j], value(j, i))
                    if v < best[k][i]:
                        best[k][i], cut[k][i] = v, j
        return best[stages][n], cut

    top, cut = solve(lambda j, i: pre[i] - pre[j], max)
    if idle is not None:
        limit = top * (1 + 1e-12)
        _, cut = solve(lambda j, i: inf if pre[i] - pre[j] > limit else
                       float(busy[i] == busy[j]), lambda a, b: a + b)
    ranges, i = [], n
    for k in range(stages, 0, -1):
        j = cut[k][i]
        ranges.append((j, i))
        i = j
    return ranges[::-1]


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


class Pipeline(Module):
    """``model`` cut into the stages of ``grid``'s stage axis, trained with micro-batches (see
    the module docstring).  Collective construction over ``grid``.

    Parameters
    ----------
    model : the whole model, built identically (same seed) on every rank.
    grid : ``ProcessGrid`` with dims ``(G, S, *spatial)`` (stage axis ``stage_axis``).
    chunks : micro-batches per mini-batch (``>= 1``).
    partition : ``S`` ``(start, stop)`` ranges over ``sequential_layers(model)``; or
        ``"params"``: balanced by parameter count (plus one per layer, so parameter-free
        layers spread too), and among the balanced ones the fewest stages without
        parameters; or ``"auto"``:
        :func:`disttensor.nn.partition.auto_partition` on the measured layer costs of
        ``sample`` (one micro-batch: a global NumPy array, distributed on the stage grid
        for the measurement like ``x``, or a DistArray/Tensor the profiler runs as it is),
        with ``memory_limit``.  Measuring runs every layer on every stage once (the whole
        model must fit for it).
    schedule : ``"gpipe"`` or ``"1f1b"``.
    bucket_bytes, overlap : of the stage's :class:`GradientReducer`.
    """

    def __init__(self, model: Module, grid: ProcessGrid, chunks: int = 1,
                 partition="params", schedule: str = "gpipe", stage_axis: int = 1,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, overlap: bool = True, *,
                 sample=None, memory_limit=None):
        super().__init__()
        comm = grid.cart if isinstance(grid, ProcessGrid) else MPI.COMM_WORLD
        spec = partition if isinstance(partition, str) else \
            _canon_partition(partition)
        with collective(comm, "Pipeline", chunks=chunks, partition=spec, schedule=schedule,
                        stage_axis=stage_axis, bucket_bytes=bucket_bytes, overlap=overlap,
                        memory_limit=memory_limit):
            if not isinstance(grid, ProcessGrid):
                raise TypeError(f"Pipeline: grid must be a ProcessGrid, got "
                                f"{type(grid).__name__}")
            if not isinstance(model, Module):
                raise TypeError(f"Pipeline: model must be a Module, got {type(model).__name__}")
            if grid.ndim < 2:
                raise ValueError(f"Pipeline: the grid {grid.dims} needs a stage axis and at "
                                 "least one other (groups)")
            if not _is_int(stage_axis) or not 0 <= stage_axis < grid.ndim:
                raise ValueError(f"Pipeline: stage_axis {stage_axis!r} is not an axis of the "
                                 f"grid {grid.dims}")
            if not _is_int(chunks) or chunks < 1:
                raise ValueError(f"Pipeline: chunks must be a positive integer, got {chunks!r}")
            if chunks * _KINDS > MPI.COMM_WORLD.Get_attr(MPI.TAG_UB):
                raise ValueError(f"Pipeline: chunks={chunks} is more micro-batches than MPI "
                                 "tags can tell apart")
            if schedule not in SCHEDULES:
                raise ValueError(f"Pipeline: schedule must be one of {SCHEDULES}, got "
                                 f"{schedule!r}")
            layers = sequential_layers(model)
            stages = grid.dims[stage_axis]
            if stages > len(layers):
                raise ValueError(f"Pipeline: {stages} stages but the model has only "
                                 f"{len(layers)} layers")
            if isinstance(partition, str):
                if partition not in ("params", "auto"):
                    raise ValueError(f"Pipeline: partition must be a list of (start, stop) "
                                     f"ranges, 'params' or 'auto', got {partition!r}")
                if partition == "auto" and sample is None:
                    raise ValueError("Pipeline: partition='auto' needs sample= (one "
                                     "micro-batch input on the stage grid) to measure layers")
            else:
                check_partition(partition, len(layers), stages)
        check_replicas(model, grid.cart, "Pipeline model")
        axes = [a for a in range(grid.ndim) if a != stage_axis]
        stage_grid = ProcessGrid(tuple(grid.dims[a] for a in axes), comm=grid.sub_comm(axes))
        if partition == "params":
            ranges = balanced_partition([m.num_parameters() + 1 for m in layers], stages,
                                        idle=[m.num_parameters() == 0 for m in layers])
        elif partition == "auto":
            from .partition import auto_partition
            if not isinstance(sample, (DistArray, Tensor)):
                # one global micro-batch: profile it laid out as the stages will hold it
                from ..routines.creation import from_global
                a = np.asarray(sample)
                split = (0, None) + tuple(range(1, min(a.ndim - 1, stage_grid.ndim)))
                sample = from_global(a, grid=stage_grid, split=split[:a.ndim])
            ranges = check_partition(
                auto_partition(layers, stages, sample, chunks, memory_limit=memory_limit,
                               schedule=schedule, comm=grid.cart), len(layers), stages)
        else:
            ranges = check_partition(partition, len(layers), stages)
        stage = grid.coords[stage_axis]
        start, stop = ranges[stage]
        self.stage_module = Sequential(*layers[start:stop])
        params = [p for p in self.stage_module.parameters() if p.requires_grad]
        p2p = grid.sub_comm([stage_axis]).Dup()
        reducer = GradientReducer(params, stage_grid, bucket_bytes, overlap) if params else None
        if reducer is not None:
            reducer.accumulate(chunks)
        for name, value in dict(model=model, grid=grid, stage_grid=stage_grid,
                                stage_axis=stage_axis, stages=stages, stage=stage,
                                chunks=int(chunks), schedule=schedule, partition=ranges,
                                reducer=reducer, _p2p=p2p,
                                _sends=[], _layout=None, _heads={},
                                last_stats={}).items():
            object.__setattr__(self, name, value)
        assert p2p.rank == stage, (p2p.rank, stage)

    # -- point to point between stage neighbours ----------------------------------------------
    def _send(self, a: DistArray, dest: int, kind: int, j: int, head: bool) -> None:
        """Post the block of ``a`` to stage ``dest`` (non-blocking), after its header (the
        distribution, dtype and device, pickled) when ``head``."""
        block = a.local
        device = "cpu" if array_module(block) is np else "cuda"
        if device == "cuda":
            if cuda_aware_mpi():
                import cupy
                block = cupy.ascontiguousarray(block)
                cupy.cuda.get_current_stream().synchronize()
            else:
                block = to_host(block)
        block = np.ascontiguousarray(block) if array_module(block) is np else block
        tag = kind + _KINDS * j
        if head:
            h = pickle.dumps((a.distribution, a.dtype.str, device), protocol=5)
            self._sends.append((self._p2p.Isend([h, MPI.BYTE], dest, tag), h))
        self._sends.append((self._p2p.Isend([block, MPI.BYTE], dest, tag + 1), block))

    def _recv(self, source: int, kind: int, j: int, meta=None) -> tuple[DistArray, tuple]:
        """Receive what :meth:`_send` posted (blocking): ``(DistArray on the stage grid,
        meta)``; ``meta = (distribution, dtype, device)`` is given when known (no header was
        sent), else read from the header."""
        tag = kind + _KINDS * j
        if meta is None:
            status = MPI.Status()
            with waiting(self._p2p, "pipeline receive from a neighbouring stage"):
                self._p2p.Probe(source, tag, status)
                head = bytearray(status.Get_count(MPI.BYTE))
                self._p2p.Recv([head, MPI.BYTE], source, tag)
            meta = pickle.loads(head)
        dist, dtype, device = meta
        shape = dist.block_shape(self.stage_grid.coords)
        on_device = device == "cuda" and cuda_aware_mpi()
        if on_device:
            import cupy
            block = cupy.empty(shape, dtype=dtype)
        else:
            block = np.empty(shape, dtype=dtype)
        status = MPI.Status()
        with waiting(self._p2p, "pipeline receive from a neighbouring stage"):
            self._p2p.Recv([block, MPI.BYTE], source, tag + 1, status)
        if status.Get_count(MPI.BYTE) != block.nbytes:  # a cached layout that went stale
            raise RuntimeError(f"Pipeline: stage {self.stage} expected {block.nbytes} bytes "
                               f"from stage {source}, got {status.Get_count(MPI.BYTE)}")
        if device == "cuda" and not on_device:
            block = to_device(block, "cuda")
        return DistArray(block, dist, self.stage_grid), meta

    def _complete_sends(self) -> None:
        if self._sends:
            with waiting(self._p2p, "pipeline sends to neighbouring stages"):
                MPI.Request.Waitall([r for r, _ in self._sends])
            self._sends.clear()

    # -- micro-batches --------------------------------------------------------------------------
    def _check_on_stage_grid(self, a, where: str, what: str) -> None:
        """Raise unless ``a`` is a DistArray on :attr:`stage_grid` (local: the caller runs it
        inside its collective entry)."""
        if not isinstance(a, DistArray):
            raise TypeError(f"{where}: {what} must be a DistArray on the stage grid, got "
                            f"{type(a).__name__}")
        if not a.grid.same_as(self.stage_grid):
            raise ValueError(f"{where}: {what} lives on a grid of dims {a.grid.dims}, not on "
                             f"the stage grid {self.stage_grid.dims} (pipe.stage_grid)")

    def _split_info(self, a: DistArray, what: str, batch: int | None = None):
        """Number of sample blocks ``P`` of ``a`` (validated: equal blocks, divisible by
        ``P * chunks``, on the stage grid)."""
        self._check_on_stage_grid(a, "Pipeline.train_step", what)
        if a.ndim < 1:
            raise ValueError(f"Pipeline.train_step: {what} needs a sample axis")
        n = a.shape[0]
        if batch is not None and n != batch:
            raise ValueError(f"Pipeline.train_step: {what} holds {n} samples, x holds {batch}")
        g = a.split[0]
        p = 1 if g is None else self.stage_grid.dims[g]
        if n % (p * self.chunks):
            raise ValueError(f"Pipeline.train_step: a batch of {n} samples cannot be cut into "
                             f"{self.chunks} micro-batches over {p} sample blocks (groups): "
                             f"it must be divisible by {p * self.chunks}")
        if g is not None and a.distribution.sizes(0) != (n // p,) * p:
            raise ValueError(f"Pipeline.train_step: {what} must split its samples in equal "
                             f"blocks over the groups, got {a.distribution.sizes(0)}")
        return p

    def _micro(self, a: DistArray, p: int, j: int) -> DistArray:
        b = a.shape[0] // (p * self.chunks)
        dist = a.distribution.with_sizes(0, None if a.split[0] is None else (b,) * p,
                                         extent=b * p)
        local = a.xp.ascontiguousarray(a.local[j * b:(j + 1) * b])
        return DistArray(local, dist, self.stage_grid)

    # -- training ---------------------------------------------------------------------------------
    def train_step(self, x, y, loss_fn) -> float:
        """One training step over the mini-batch (collective over the whole grid): forward and
        backward of every micro-batch under the schedule, the stage gradients summed over the
        stage grid into each parameter's ``.grad`` (added to what ``.grad`` holds: call the
        optimizer's ``zero_grad`` first).  ``x``: the mini-batch ``(B, C, *S)``, a DistArray
        (or Tensor) on :attr:`stage_grid` (read on stage 0, may be ``None`` elsewhere), its
        samples in equal blocks over the groups; ``y``: the targets on the stage grid, their
        samples split like ``x``'s (read on the last stage, may be ``None`` elsewhere);
        ``loss_fn(out, target) -> Tensor`` (a mean over the batch).  Returns the mini-batch
        loss, the same float on every rank; timing in :attr:`last_stats`."""
        S, s, m = self.stages, self.stage, self.chunks
        first, last = s == 0, s == S - 1
        x = x.data if isinstance(x, Tensor) else x
        y = y.data if isinstance(y, Tensor) else y
        # what stage 0 was given, told down the pipeline: the batch size for the checks, and
        # whether the activations are laid out as in the last step (then no headers move)
        key = None
        if first and isinstance(x, DistArray):
            key = (x.shape[0], x.distribution, x.dtype.str, x.device)
        if S > 1:
            key = self._p2p.bcast(key, root=0)
        batch = None if key is None else key[0]
        repeat = key is not None and key == self._layout
        heads = self._heads if repeat else {}
        with collective(self.grid.cart, "Pipeline.train_step", chunks=m):
            if not callable(loss_fn):
                raise TypeError("Pipeline.train_step: loss_fn must be callable")
            if first:
                px = self._split_info(x, "x")
            if last and batch is not None:
                py = self._split_info(y, "y", batch)
                gx = key[1].split[0]
                px_ = 1 if gx is None else self.stage_grid.dims[gx]
                if py != px_ or (py > 1 and y.split[0] != gx):
                    # micro-batch j must hold the same samples of x and y
                    raise ValueError(f"Pipeline.train_step: y must split its samples over the "
                                     f"same grid axis as x ({key[1].split[0]}), got "
                                     f"{y.split[0]}")
        wall0 = time.perf_counter()
        stats = dict(forward_s=0.0, backward_s=0.0, wait_s=0.0)
        live: dict[int, tuple] = {}
        losses: list[float] = []

        def forward(j):
            t0 = time.perf_counter()
            if first:
                inp = Tensor(self._micro(x, px, j))
            else:
                a, heads[j] = self._recv(s - 1, _ACT_HEAD, j, heads.get(j))
                t1 = time.perf_counter()
                stats["wait_s"] += t1 - t0
                t0 = t1
                inp = Tensor(a, requires_grad=True)
            out = self.stage_module(inp)
            if last:
                out = loss_fn(out, Tensor(self._micro(y, py, j))) * (1.0 / m)
                losses.append(out.item())
            else:
                self._send(out.data, s + 1, _ACT_HEAD, j, head=not repeat)
            live[j] = (inp, out)
            stats["forward_s"] += time.perf_counter() - t0

        def backward(j):
            inp, out = live.pop(j)
            t0 = time.perf_counter()
            grad = None
            if not last:
                # sent laid out like this stage's output: no header needed
                o = out.data
                grad, _ = self._recv(s + 1, _GRAD_HEAD, j,
                                     (o.distribution, o.dtype.str, o.device))
                t1 = time.perf_counter()
                stats["wait_s"] += t1 - t0
                t0 = t1
            if out.requires_grad:
                if self.reducer is not None:
                    self.reducer.arm()
                out.backward(grad)
            if not first:
                g = inp.grad
                if g is None:
                    g = DistArray(inp.data.xp.zeros_like(inp.data.local),
                                  inp.data.distribution, self.stage_grid)
                elif g.distribution != inp.data.distribution:
                    g = g.redistribute(distribution=inp.data.distribution)
                if g.dtype != inp.data.dtype:
                    g = g.astype(inp.data.dtype)
                self._send(g, s - 1, _GRAD_HEAD, j, head=False)
            stats["backward_s"] += time.perf_counter() - t0

        try:
            if self.schedule == "gpipe":
                for j in range(m):
                    forward(j)
                for j in reversed(range(m)):
                    backward(j)
            else:
                warm = min(S - s - 1, m)
                for j in range(warm):
                    forward(j)
                for i in range(m - warm):
                    forward(warm + i)
                    backward(i)
                for j in range(m - warm, m):
                    backward(j)
            t0 = time.perf_counter()
            self._complete_sends()
            stats["wait_s"] += time.perf_counter() - t0
        finally:
            live.clear()
        object.__setattr__(self, "_layout", key)
        object.__setattr__(self, "_heads", heads)
        loss = float(sum(losses)) if last else None
        if S > 1:
            loss = self._p2p.bcast(loss, root=S - 1)
        wall = time.perf_counter() - wall0
        busy = stats["forward_s"] + stats["backward_s"]
        stats.update(wall_s=wall, bubble=max(0.0, 1.0 - busy / wall) if wall > 0 else 0.0)
        object.__setattr__(self, "last_stats", stats)
        return loss

    # -- evaluation ---------------------------------------------------------------------------
    def forward(self, x):
        """The model's output for the whole batch ``x`` (a DistArray or Tensor on
        :attr:`stage_grid`, read on stage 0, may be ``None`` elsewhere), without recording a
        graph and without micro-batching (collective over the grid).  Returns a ``Tensor`` on
        the ranks of the last stage, ``None`` on the others."""
        S, s = self.stages, self.stage
        xa = x.data if isinstance(x, Tensor) else x
        with collective(self.grid.cart, "Pipeline.forward"):
            if s == 0:
                self._check_on_stage_grid(xa, "Pipeline.forward", "x")
        with no_grad():
            if s == 0:
                inp = xa if xa.grid is self.stage_grid else \
                    DistArray(xa.buffer, xa.distribution, self.stage_grid, xa.halo)
            else:
                inp, _ = self._recv(s - 1, _EVAL_HEAD, 0)
            out = self.stage_module(Tensor(inp))
            if s < S - 1:
                self._send(out.data, s + 1, _EVAL_HEAD, 0, head=True)
                self._complete_sends()
                return None
        return out

    def full_state_dict(self) -> dict:
        """The whole model's state dict (the names of ``model.state_dict()``) with every
        entry taken from the stage that trains it, on every rank (for checkpoints: only this
        stage's entries of the local ``model`` are current).  Collective over the grid: one
        all-gather of the stages' entries along each pipeline line (host copies; the whole
        state passes through every rank's memory)."""
        own = {id(v) for v in self.stage_module.state_dict().values()}
        full = self.model.state_dict()
        mine = {n: np.array(to_host(v)) for n, v in full.items() if id(v) in own}
        parts = self.allgather_stages(mine)
        out = {}
        for n in full:
            src = next((part for part in parts if n in part), None)
            out[n] = src[n] if src is not None else np.array(to_host(full[n]))
        return out

    def allgather_stages(self, obj) -> list:
        """``obj`` of every stage of this rank's pipeline line, in stage order (collective
        over the grid: a pickled all-gather among the ranks that differ only in their stage
        coordinate).  For state that each stage holds for its own layers (optimizer state in
        checkpoints)."""
        return self._p2p.allgather(obj) if self.stages > 1 else [obj]

    def release(self) -> None:
        """Free the stage reducer's, the stage grid's and the pipeline's communicators
        (collective; once; DistArrays on :attr:`stage_grid` are unusable after it)."""
        if self.reducer is not None:
            self.reducer.release()
            object.__setattr__(self, "reducer", None)
        if self._p2p != MPI.COMM_NULL:
            self._p2p.Free()
            self.stage_grid.free()

    def extra_repr(self) -> str:
        return (f"stage={self.stage}/{self.stages}, partition={self.partition}, "
                f"chunks={self.chunks}, schedule={self.schedule!r}")


def _canon_partition(partition):
    """A partition argument as nested tuples for the ranks' agreement (never raises)."""
    try:
        return tuple(tuple(int(v) for v in r) for r in partition)
    except Exception:  # noqa: BLE001 - invalid: validation raises on every rank
        return repr(partition)
