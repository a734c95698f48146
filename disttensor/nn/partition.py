"""Automatic pipeline partitioning: profile the layers, then cut them by dynamic programming.

A pipeline runs stage ``s`` on the contiguous layers ``ranges[s] = (start, stop)`` of
:func:`~disttensor.nn.module.sequential_layers`.  With ``m`` micro-batches and ``S`` stages,
GPipe and 1F1B both take ``m + S - 1`` slots of the slowest stage per step, so the partition
that minimises the slowest stage minimises the step; the idle share of every stage is the
bubble ``(S - 1) / (m + S - 1)``.

* :func:`profile_layers` (collective) runs each layer forward and backward on a sample
  micro-batch and measures its times, parameter bytes, activation bytes and the bytes of its
  output (what crosses a stage boundary).  Every rank measures, then the maximum over the
  communicator is taken, so every rank gets identical profiles and partitions alike.
* :func:`partition_layers` (pure, no communication) finds the contiguous split minimising
  the slowest stage, exactly (a min-max dynamic program over ``(stage, end layer)``, ties
  broken towards evener stages), subject to a per-stage memory limit; it predicts the step
  time, and names the smallest feasible limit when the given one is too small.
* :func:`auto_partition` does both: what :class:`~disttensor.nn.pipeline.Pipeline` calls for
  ``partition="auto"``.

Cost model (per micro-batch, per rank of a stage):

* stage time = sum over its layers of (forward + backward) + the transfer of its output
  activation to the next stage (when there is one) + the transfer of its input gradient back
  to the previous stage (when there is one); a transfer of ``n`` bytes costs
  ``boundary_cost(n)``.
* stage memory = ``state_factor`` x parameter bytes (default 3: the weights, their gradient and
  SGD's momentum buffer; 4 for Adam) + the saved activations of one micro-batch x the number
  of micro-batches in flight: ``chunks`` for GPipe (all forwards run before the first
  backward), ``min(chunks, S - s)`` for 1F1B on stage ``s`` (0-based).
* a layer's saved activations are *approximated* by its input bytes + its output bytes (ops
  keep their input, their output, or both; this over-counts layers that keep neither and the
  tensors shared by neighbouring layers).  Workspace memory and the allocator are ignored.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from mpi4py import MPI

from ..core.array import DistArray
from ..core.comm import collective

__all__ = ["LayerProfile", "PartitionPlan", "profile_layers", "partition_layers",
           "auto_partition", "link_cost", "SCHEDULES"]

SCHEDULES = ("gpipe", "1f1b")


@dataclass(frozen=True)
class LayerProfile:
    """Measured (or given) costs of one layer for one micro-batch, per rank of a stage.

    ``forward_s``/``backward_s``: seconds; ``param_bytes``: bytes of its parameters;
    ``activation_bytes``: bytes it keeps for backward (approximated by input + output bytes);
    ``output_bytes``: bytes of its output block (sent to the next stage if a cut follows it).
    """
    name: str
    forward_s: float
    backward_s: float
    param_bytes: int = 0
    activation_bytes: int = 0
    output_bytes: int = 0

    @property
    def time_s(self) -> float:
        """Forward + backward seconds."""
        return self.forward_s + self.backward_s


@dataclass(frozen=True)
class PartitionPlan:
    """The result of :func:`partition_layers`.

    ``ranges``: one ``(start, stop)`` per stage, contiguous, covering every layer;
    ``stage_times``: predicted seconds of each stage per micro-batch (forward + backward +
    boundary transfers); ``stage_memory``: predicted bytes per rank of each stage;
    ``predicted_step_s``: ``(chunks + S - 1) * max(stage_times)`` + the non-overlapped
    gradient all-reduce; ``bubble_fraction``: ``(S - 1) / (chunks + S - 1)``; ``balance``:
    ``max / min`` of the stage times (``inf`` if a stage costs nothing)."""
    ranges: tuple
    stage_times: tuple
    stage_memory: tuple
    chunks: int
    schedule: str
    predicted_step_s: float
    allreduce_s: float
    bubble_fraction: float
    balance: float
    layer_names: tuple = ()

    @property
    def stages(self) -> int:
        return len(self.ranges)

    def report(self) -> str:
        """A human-readable table of the stages."""
        lines = [f"pipeline plan: {self.stages} stages, {self.chunks} micro-batches, "
                 f"{self.schedule}; predicted step {self.predicted_step_s * 1e3:.3f} ms "
                 f"(all-reduce {self.allreduce_s * 1e3:.3f} ms), bubble "
                 f"{self.bubble_fraction:.1%}, balance max/min {self.balance:.3f}"]
        for s, ((a, b), t, m) in enumerate(zip(self.ranges, self.stage_times,
                                               self.stage_memory)):
            names = ""
            if self.layer_names:
                first, last = self.layer_names[a], self.layer_names[b - 1]
                names = f"  {first}" + (f" .. {last}" if b - a > 1 else "")
            lines.append(f"  stage {s}: layers [{a}, {b}) {t * 1e3:9.3f} ms/micro-batch "
                         f"{m / 2 ** 20:9.2f} MiB{names}")
        return "\n".join(lines)


# -- cost helpers ---------------------------------------------------------------------------
def link_cost(latency_s: float = 20e-6, bandwidth: float = 2e9) -> Callable[[int], float]:
    """A transfer model ``n bytes -> latency_s + n / bandwidth`` (0 for 0 bytes)."""
    def cost(n: int) -> float:
        return 0.0 if n <= 0 else latency_s + n / bandwidth
    return cost


def _as_cost(c) -> Callable[[int], float]:
    if c is None:
        return lambda n: 0.0
    if callable(c):
        return c
    per_byte = float(c)
    return lambda n: per_byte * n


def _in_flight(schedule: str, chunks: int, stages: int, s: int) -> int:
    """Micro-batches whose activations stage ``s`` holds at once."""
    return chunks if schedule == "gpipe" else min(chunks, stages - s)


def _minmax(n: int, stages: int, cost, feasible=None):
    """Split ``range(n)`` into ``stages`` non-empty contiguous ranges minimising the largest
    ``cost(i, j, s)`` (exact); among optimal splits prefer a small sum of squared costs.
    ``feasible(i, j, s)`` False excludes a range.  Returns ``(value, ranges)`` or
    ``(inf, None)`` when no split is feasible."""
    inf = (math.inf, math.inf)
    # best[s][j]: best (max, sum of squares) for layers [0, j) on stages 0..s
    best = [[inf] * (n + 1) for _ in range(stages)]
    back = [[-1] * (n + 1) for _ in range(stages)]
    for j in range(1, n - stages + 2):
        if feasible is None or feasible(0, j, 0):
            c = cost(0, j, 0)
            best[0][j], back[0][j] = (c, c * c), 0
    for s in range(1, stages):
        for j in range(s + 1, n - stages + s + 2):
            for i in range(s, j):
                prev = best[s - 1][i]
                if prev[0] == math.inf or (feasible is not None and not feasible(i, j, s)):
                    continue
                c = cost(i, j, s)
                cand = (max(prev[0], c), prev[1] + c * c)
                if cand < best[s][j]:
                    best[s][j], back[s][j] = cand, i
    if best[stages - 1][n][0] == math.inf:
        return math.inf, None
    ranges, j = [], n
    for s in range(stages - 1, -1, -1):
        i = back[s][j]
        ranges.append((i, j))
        j = i
    return best[stages - 1][n][0], ranges[::-1]


def partition_layers(costs: Sequence[LayerProfile], stages: int, chunks: int,
                     memory_limit: float | None = None, schedule: str = "gpipe",
                     boundary_cost=None, *, state_factor: float = 3.0,
                     allreduce_cost=None) -> PartitionPlan:
    """The contiguous split of the layers into ``stages`` minimising the slowest stage.

    ``costs``: one :class:`LayerProfile` per layer, in forward order.  ``chunks``: micro-
    batches per step.  ``memory_limit``: bytes per rank a stage may use (``None``: no limit).
    ``schedule``: ``"gpipe"`` or ``"1f1b"`` (how many micro-batches' activations are held).
    ``boundary_cost``: seconds to send ``n`` bytes between stages: a callable ``n ->
    seconds``, a number (seconds per byte), or ``None`` (free).  ``state_factor``: memory of
    the parameters with their gradients and optimizer state, in parameter bytes.
    ``allreduce_cost``: seconds of the gradient all-reduce left after backward (not
    overlapped) for ``n`` parameter bytes (callable or seconds per byte; ``None``: 0), charged
    once per step for the stage with the most parameters.  See the module docstring for the
    cost model.  Pure (no communication): ranks holding the same costs get the same plan.

    Raises ``ValueError`` for ``stages < 1``, ``chunks < 1``, more stages than layers, an
    unknown schedule, or a memory limit no split meets (naming the smallest feasible limit).
    """
    n = len(costs)
    if not isinstance(stages, (int, np.integer)) or stages < 1:
        raise ValueError(f"partition_layers: stages must be an integer >= 1, got {stages!r}")
    if not isinstance(chunks, (int, np.integer)) or chunks < 1:
        raise ValueError(f"partition_layers: chunks must be an integer >= 1, got {chunks!r}")
    if schedule not in SCHEDULES:
        raise ValueError(f"partition_layers: schedule must be one of {SCHEDULES}, "
                         f"got {schedule!r}")
    if stages > n:
        raise ValueError(f"partition_layers: {stages} stages for {n} layers (each stage "
                         "needs at least one layer)")
    stages, chunks = int(stages), int(chunks)
    link = _as_cost(boundary_cost)
    reduce_cost = _as_cost(allreduce_cost)

    def prefix(vals):
        out = [0.0]
        for v in vals:
            out.append(out[-1] + v)
        return out

    t = prefix([c.forward_s + c.backward_s for c in costs])
    p = prefix([c.param_bytes for c in costs])
    act = prefix([c.activation_bytes for c in costs])
    outb = [c.output_bytes for c in costs]

    def time_of(i, j, s=None):
        extra = (link(outb[j - 1]) if j < n else 0.0) + (link(outb[i - 1]) if i > 0 else 0.0)
        return t[j] - t[i] + extra

    def memory_of(i, j, s):
        return (state_factor * (p[j] - p[i])
                + (act[j] - act[i]) * _in_flight(schedule, chunks, stages, s))

    feasible = None
    if memory_limit is not None:
        limit = float(memory_limit)

        def feasible(i, j, s):
            return memory_of(i, j, s) <= limit
    slowest, ranges = _minmax(n, stages, time_of, feasible)
    if ranges is None:
        smallest, _ = _minmax(n, stages, memory_of)
        raise ValueError(f"partition_layers: no split of {n} layers into {stages} stages fits "
                         f"in memory_limit={memory_limit:.6g} bytes per stage ({schedule}, "
                         f"{chunks} micro-batches); the smallest feasible limit is "
                         f"{smallest:.6g} bytes ({smallest / 2 ** 20:.2f} MiB)")
    times = tuple(time_of(i, j) for i, j in ranges)
    mem = tuple(memory_of(i, j, s) for s, (i, j) in enumerate(ranges))
    reduce_s = max(reduce_cost(p[j] - p[i]) for i, j in ranges)
    lo = min(times)
    return PartitionPlan(
        ranges=tuple(ranges), stage_times=times, stage_memory=mem, chunks=chunks,
        schedule=schedule, predicted_step_s=(chunks + stages - 1) * slowest + reduce_s,
        allreduce_s=reduce_s, bubble_fraction=(stages - 1) / (chunks + stages - 1),
        balance=max(times) / lo if lo > 0 else math.inf,
        layer_names=tuple(c.name for c in costs))


# -- profiling ------------------------------------------------------------------------------
def _sync(x) -> None:
    """Wait for the GPU when ``x`` lives there (timings of asynchronous kernels)."""
    from ..core.backend import device_of
    dev = x.device if isinstance(x, DistArray) else (
        device_of(x) if hasattr(x, "shape") else "cpu")
    if dev == "cuda":
        import cupy
        cupy.cuda.Device().synchronize()


def _local_bytes(x) -> int:
    if isinstance(x, DistArray):
        return int(x.local.nbytes)
    return int(getattr(x, "nbytes", 8))


def _as_input(sample):
    """``sample`` as a DistArray: a Tensor's data, or a NumPy array put on a one-rank grid
    over ``COMM_SELF`` (sample axis and spatial axes split, channels whole)."""
    from ..autograd.tensor import Tensor
    if isinstance(sample, Tensor):
        sample = sample.data
    if isinstance(sample, DistArray):
        return sample
    from ..routines.creation import from_global
    from ..core.grid import ProcessGrid
    a = np.asarray(sample)
    if a.ndim < 2:
        raise ValueError(f"profile_layers: a sample of shape {a.shape} has no sample and "
                         "channel axes")
    grid = ProcessGrid((1,) * (a.ndim - 1), comm=MPI.COMM_SELF)
    split = (0, None) + tuple(range(1, a.ndim - 1))
    return from_global(a, grid=grid, split=split)


def _comm_of(sample) -> MPI.Comm:
    """The communicator a sample's profiling agrees over by default: its grid's (COMM_SELF
    for a NumPy array)."""
    from ..autograd.tensor import Tensor
    data = sample.data if isinstance(sample, Tensor) else sample
    return data.grid.comm if isinstance(data, DistArray) else MPI.COMM_SELF


class _Isolated:
    """Context: run a layer's forward/backward without side effects on the model: buffers
    (batch-norm running statistics, dropout counters) and gradients are restored after,
    gradient-ready hooks (a reducer's) are detached, and parameter gradients are kept as
    per-rank shares (no per-layer all-reduce, as under a data-parallel reducer)."""

    def __init__(self, layers, grid):
        self.layers, self.grid = layers, grid

    def __enter__(self):
        self.params, self.buffers = [], []
        seen = set()
        for layer in self.layers:
            for p in layer.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    self.params.append((p, p.grad, p._ready_hooks, p.deferred_reduction))
                    p.grad, p._ready_hooks = None, []
                    p.deferred_reduction = self.grid
            for m in layer.modules():
                for name, b in m._buffers.items():
                    self.buffers.append((m, name, b, None if b is None else b.copy()))
        return self

    def __exit__(self, *exc):
        for p, grad, hooks, deferred in self.params:
            p.grad, p._ready_hooks, p.deferred_reduction = grad, hooks, deferred
        for m, name, b, saved in self.buffers:
            if b is not None and getattr(b, "shape", None) == saved.shape \
                    and hasattr(b, "__setitem__"):
                b[...] = saved
                m._buffers[name] = b
            else:
                m._buffers[name] = saved
        return False


def profile_layers(layers: Sequence, sample, repeats: int = 3, warmup: int = 1,
                   comm: MPI.Comm | None = None) -> list[LayerProfile]:
    """Measure each layer's forward and backward on ``sample`` (collective over ``comm``).

    ``layers``: modules applied one after another (e.g.
    :func:`~disttensor.nn.module.sequential_layers`); ``sample``: one micro-batch input, a
    DistArray or Tensor on the grid the layers run on (every rank of its grid calls), or a
    NumPy array (run on this rank alone, over ``COMM_SELF``).  Layer ``i`` runs on the output
    of layer ``i - 1`` as a fresh leaf, forward then backward of a ones gradient, ``warmup``
    untimed rounds (JIT compilation) then ``repeats`` timed ones; each rank takes the median
    of its rounds, then the maximum over ``comm`` (default: the sample grid's communicator;
    pass a larger one, e.g. a whole pipeline grid, to agree across stages), so the profiles
    are identical on every rank of ``comm``.  Side effects on the model are undone: buffers
    and gradients are restored, and a reducer's hooks do not see these passes.

    Byte counts are per rank (the largest block over ``comm``): ``output_bytes`` the layer's
    output block, ``activation_bytes`` its input + output blocks (an approximation of what it
    saves for backward), ``param_bytes`` its parameters (replicated).
    """
    from ..autograd.tensor import Tensor, filled_like
    comm = _comm_of(sample) if comm is None else comm
    layers = list(layers)
    with collective(comm, "profile_layers", layers=len(layers), repeats=repeats,
                    warmup=warmup):
        x0 = _as_input(sample)
        if not layers:
            raise ValueError("profile_layers: no layers")
        if not isinstance(repeats, int) or repeats < 1 or not isinstance(warmup, int) \
                or warmup < 0:
            raise ValueError(f"profile_layers: repeats must be >= 1 and warmup >= 0, got "
                             f"repeats={repeats!r}, warmup={warmup!r}")
    n = len(layers)
    fwd = [[] for _ in range(n)]
    bwd = [[] for _ in range(n)]
    act = [0] * n
    out_bytes = [0] * n
    with _Isolated(layers, x0.grid):
        for r in range(warmup + repeats):
            x = x0
            for i, layer in enumerate(layers):
                xt = Tensor(x, requires_grad=True)
                _sync(x)
                t0 = time.perf_counter()
                out = layer(xt)
                _sync(out.data)
                t1 = time.perf_counter()
                g = filled_like(out.data, 1) if isinstance(out.data, DistArray) else None
                if out.requires_grad:
                    out.backward(g)
                _sync(out.data)
                t2 = time.perf_counter()
                if r >= warmup:
                    fwd[i].append(t1 - t0)
                    bwd[i].append(t2 - t1)
                act[i] = _local_bytes(x) + _local_bytes(out.data)
                out_bytes[i] = _local_bytes(out.data)
                x = out.data
                for p in layer.parameters():
                    p.grad = None
    mine = np.array([statistics.median(v) for v in fwd] + [statistics.median(v) for v in bwd]
                    + act + out_bytes, dtype=np.float64)
    agreed = np.empty_like(mine)
    comm.Allreduce(mine, agreed, op=MPI.MAX)
    prof = []
    for i, layer in enumerate(layers):
        pbytes = sum(int(p.data.nbytes) for p in layer.parameters())
        prof.append(LayerProfile(name=f"{i}:{type(layer).__name__}",
                                 forward_s=float(agreed[i]), backward_s=float(agreed[n + i]),
                                 param_bytes=pbytes, activation_bytes=int(agreed[2 * n + i]),
                                 output_bytes=int(agreed[3 * n + i])))
    return prof


def auto_partition(layers: Sequence, stages: int, sample, chunks: int,
                   memory_limit: float | None = None, schedule: str = "gpipe",
                   comm: MPI.Comm | None = None) -> list[tuple[int, int]]:
    """Profile ``layers`` on ``sample`` (:func:`profile_layers`, collective over ``comm``)
    and return the partition of :func:`partition_layers` as a list of ``stages`` ``(start,
    stop)`` ranges, identical on every rank of ``comm``.  Stage transfers are costed with
    the latency/bandwidth model measured on ``comm``
    (:func:`disttensor.nn.perfmodel.measure_links`, quick), or :func:`link_cost`'s defaults
    (20 us + 2 GB/s) on one rank.  Bad arguments raise on every rank."""
    layers = list(layers)
    comm = _comm_of(sample) if comm is None else comm
    with collective(comm, "auto_partition", layers=len(layers), stages=stages, chunks=chunks,
                    memory_limit=memory_limit, schedule=schedule):
        if not isinstance(stages, (int, np.integer)) or stages < 1:
            raise ValueError(f"auto_partition: stages must be an integer >= 1, got {stages!r}")
        if stages > len(layers):
            raise ValueError(f"auto_partition: {stages} stages for {len(layers)} layers "
                             "(each stage needs at least one layer)")
        if not isinstance(chunks, (int, np.integer)) or chunks < 1:
            raise ValueError(f"auto_partition: chunks must be an integer >= 1, got {chunks!r}")
        if schedule not in SCHEDULES:
            raise ValueError(f"auto_partition: schedule must be one of {SCHEDULES}, "
                             f"got {schedule!r}")
    prof = profile_layers(layers, sample, comm=comm)
    # stage transfers: the point-to-point alpha-beta model measured on comm (identical on
    # every rank); the fixed link_cost() default where there is no second rank to measure
    link = link_cost()
    if comm.size > 1:
        from .perfmodel.links import measure_links
        link = measure_links(comm, quick=True).p2p
    # identical profiles on every rank: the plan (or the infeasibility error) is the same
    plan = partition_layers(prof, stages, chunks, memory_limit, schedule, boundary_cost=link)
    return [tuple(r) for r in plan.ranges]
