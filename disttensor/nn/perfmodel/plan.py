"""The training grid: :func:`plan_grid` ranks the candidate grids by predicted step time.

:func:`enumerate_grids` lists the candidate grids ``(sample, d, h, w)`` of a rank count
(pure); :func:`plan_grid` analyses each (:mod:`.geometry`), excludes the invalid ones and
those over the memory limit, times the distinct local blocks (:mod:`.timing`), measures the
links (:mod:`.links`) and predicts each grid's step (:mod:`.prediction`).  Collective over
its communicator; the resulting :class:`GridPlan` is identical on every rank.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from mpi4py import MPI

from ...core.comm import collective
from ..module import Module, sequential_layers
from ..parallel import DEFAULT_BUCKET_BYTES
from .geometry import InvalidGrid, analyze_layers, timing_layer
from .links import LinkModel, measure_links
from .prediction import OPTIMIZER_STATE, GridPrediction, estimate_memory, predict_grid
from .timing import LayerTimer, layer_key, optimizer_time

__all__ = ["GridPlan", "enumerate_grids", "plan_grid"]


# -- candidate grids -----------------------------------------------------------------------------
def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_grids(nranks: int, batch: int, spatial: Sequence[int],
                    symmetric: bool = True) -> list[tuple[int, int, int, int]]:
    """Every grid ``(s, d, h, w)`` with ``s * d * h * w == nranks`` and ``s`` dividing
    ``batch``, ``d``/``h``/``w`` at most the extents ``spatial`` (pure).  With ``symmetric``,
    on axes of equal extent only the non-increasing splits are kept (``(2, 1)`` not ``(1, 2)``:
    the same blocks up to a permutation, and cutting outer axes gives contiguous blocks).
    Sorted by ``s`` descending, then the spatial splits descending."""
    if nranks < 1 or batch < 1:
        raise ValueError(f"enumerate_grids: nranks and batch must be >= 1, got {nranks}, "
                         f"{batch}")
    spatial = tuple(int(n) for n in spatial)
    if len(spatial) != 3:
        raise ValueError(f"enumerate_grids: 3 spatial extents expected, got {spatial}")
    out = []
    for s in _divisors(nranks):
        if batch % s:
            continue
        rest = nranks // s
        for d in _divisors(rest):
            for h in _divisors(rest // d):
                w = rest // (d * h)
                split = (d, h, w)
                if any(p > n for p, n in zip(split, spatial)):
                    continue
                if symmetric and any(spatial[i] == spatial[i + 1] and split[i] < split[i + 1]
                                     for i in range(2)):
                    continue
                if symmetric and spatial[0] == spatial[2] and split[0] < split[2]:
                    continue
                out.append((s, d, h, w))
    return sorted(out, key=lambda g: (-g[0], tuple(-v for v in g[1:])))


# -- the plan ----------------------------------------------------------------------------------
@dataclass
class GridPlan:
    """:func:`plan_grid`'s result (identical on every rank): ``ranked`` predictions of the
    feasible grids, fastest first; ``excluded`` ``(grid, reason)`` of the others; ``links``
    the measured link model."""
    ranked: list
    excluded: list = field(default_factory=list)
    links: LinkModel = LinkModel()
    memory_limit: float | None = None

    @property
    def best(self) -> GridPrediction:
        return self.ranked[0]

    def report(self, top: int | None = None) -> str:
        """A short ranked table (``top`` rows; all when ``None``) and the exclusions."""
        rows = self.ranked if top is None else self.ranked[:top]
        lines = [f"grid plan (predicted step per grid (sample, d, h, w); links: p2p "
                 f"{self.links.p2p.alpha * 1e6:.1f} us + {self.links.p2p.bandwidth / 1e9:.2f} "
                 f"GB/s, all-reduce {self.links.allreduce.alpha * 1e6:.1f} us + "
                 f"{self.links.allreduce.bandwidth / 1e9:.2f} GB/s, per op "
                 f"{self.links.op_forward_s * 1e6:.0f}/{self.links.op_backward_s * 1e6:.0f} us "
                 "forward/backward):"]
        for k, p in enumerate(rows):
            lines.append(f"  {k + 1}. {'x'.join(map(str, p.grid)):10s} {p.step_s * 1e3:9.2f} ms"
                         f"  (compute+halo {(p.forward_s + p.backward_s) * 1e3:8.2f}, "
                         f"all-reduce {p.allreduce_s * 1e3:6.2f}, optimizer "
                         f"{p.optimizer_s * 1e3:6.2f})  {p.memory['total'] / 2 ** 20:8.1f} MiB")
        if top is not None and len(self.ranked) > top:
            lines.append(f"  ... {len(self.ranked) - top} more")
        for g, why in self.excluded:
            lines.append(f"  excluded {'x'.join(map(str, g))}: {why}")
        return "\n".join(lines)


def plan_grid(model: Module, input_shape: Sequence[int], batch: int, nranks: int | None = None,
              memory_limit: float | None = None, *, comm: MPI.Comm | None = None,
              optimizer: str = "adam", bucket_bytes: int = DEFAULT_BUCKET_BYTES,
              overlap: bool = True, halo_overlap: bool | None = None,
              candidates: Sequence[Sequence[int]] | None = None, quick: bool = False,
              repeats: int | None = None, links: LinkModel | None = None,
              timer: LayerTimer | None = None, dtype=None,
              tune_kernels: bool | None = None, machine=None) -> GridPlan:
    """Rank the grids ``(sample, d, h, w)`` of ``nranks`` ranks for training ``model`` on a
    global batch of ``batch`` samples of shape ``input_shape`` ``(C, D, H, W)`` by predicted
    step time (collective over ``comm``, an ``MPI.Comm`` or a ``ProcessGrid``, default
    ``COMM_WORLD``; the result is identical on every rank).

    ``nranks``: ranks of the grid (default ``comm.size``; the links are measured on ``comm``
    whatever it is). ``memory_limit``: bytes per rank; grids predicted over it
    (:func:`estimate_memory`) are excluded before any timing.
    ``optimizer``: ``sgd``, ``adam``, ``adamw`` (its state and step time); ``bucket_bytes``
    and ``overlap``: the gradient reducer's; ``halo_overlap``: whether windowed ops overlap
    their halo exchange (default: on GPU only, as the convolution does); ``candidates``: the
    grids to consider (default :func:`enumerate_grids`); ``quick``: 3 timed rounds per block
    instead of 5 and fewer message sizes (a few seconds on small models); ``repeats``: timed
    rounds per block; ``links``/``timer``: reuse earlier measurements; ``dtype``: of the
    activations (default: the parameters'; ``float16`` for mixed precision);
    ``tune_kernels``: let the convolution kernels tune their algorithms on every candidate
    block as the run will (default: not in ``quick`` mode, where the algorithms come from
    their cost models, ``DISTTENSOR_CONV_TUNE=heuristic``, unless that variable is set:
    tuning every candidate's blocks costs seconds per layer on the first planning on a
    machine; the tuned choices are cached on disk); ``machine``: a
    :class:`~.machine.Machine` description to predict on instead of measuring this one
    (:func:`~.simulate.simulate` of the model's layers on ``nranks`` of its devices: nothing
    timed, no communication but the argument agreement; the result is a
    :class:`~.simulate.SimulatedPlan`).

    Every candidate is analysed (:func:`analyze_layers`), its distinct local blocks timed
    (:class:`LayerTimer`), and predicted (:func:`predict_grid`); see the package docstring
    (:mod:`disttensor.nn.perfmodel`) and :mod:`.prediction` for the model and its
    assumptions.  Raises ``ValueError`` on every rank for bad arguments, a model that cannot
    be modelled, or when no grid is valid and fits."""
    comm = MPI.COMM_WORLD if comm is None else comm
    if not isinstance(comm, MPI.Comm) and hasattr(comm, "comm"):  # a ProcessGrid
        comm = comm.comm
    raw_shape = input_shape
    layers = sequential_layers(model)
    params = list(model.parameters())
    device = getattr(params[0], "device", "cpu") if params else "cpu"
    with collective(comm, "plan_grid", input_shape=repr(raw_shape), batch=batch, nranks=nranks,
                    memory_limit=memory_limit, optimizer=optimizer, bucket_bytes=bucket_bytes,
                    overlap=overlap, halo_overlap=halo_overlap, quick=quick,
                    repeats=repeats, tune_kernels=tune_kernels,
                    layers=[layer_key(l) for l in layers],
                    candidates=None if candidates is None else [tuple(c) for c in candidates],
                    dtype=None if dtype is None else str(dtype),
                    machine=None if machine is None else repr(machine)):
        try:
            dtype = np.dtype(dtype if dtype is not None else
                             params[0].data.dtype if params else "float32")
        except TypeError:
            raise ValueError(f"plan_grid: dtype {dtype!r} is not a NumPy dtype") from None
        nranks = comm.size if nranks is None else nranks
        try:
            input_shape = tuple(int(v) for v in raw_shape)
        except (TypeError, ValueError):
            raise ValueError(f"plan_grid: input_shape must be (C, D, H, W), got "
                             f"{raw_shape!r}") from None
        if not isinstance(batch, (int, np.integer)) or batch < 1:
            raise ValueError(f"plan_grid: batch must be a positive integer, got {batch!r}")
        if not isinstance(nranks, (int, np.integer)) or nranks < 1:
            raise ValueError(f"plan_grid: nranks must be a positive integer, got {nranks!r}")
        if len(input_shape) != 4 or min(input_shape) < 1:
            raise ValueError(f"plan_grid: input_shape must be (C, D, H, W), got {input_shape}")
        if optimizer not in OPTIMIZER_STATE:
            raise ValueError(f"plan_grid: optimizer must be one of {tuple(OPTIMIZER_STATE)}, "
                             f"got {optimizer!r}")
        if memory_limit is not None and not memory_limit > 0:
            raise ValueError(f"plan_grid: memory_limit must be positive bytes, got "
                             f"{memory_limit!r}")
        if not layers:
            raise ValueError("plan_grid: the model has no layers")
        grids = enumerate_grids(nranks, batch, input_shape[1:]) if candidates is None else \
            [tuple(int(v) for v in c) for c in candidates]
        for g in grids:
            if len(g) != 4 or math.prod(g) != nranks:
                raise ValueError(f"plan_grid: candidate {g} is not a 4-axis grid of {nranks} "
                                 "ranks")
        if not grids:
            raise ValueError(f"plan_grid: no grid of {nranks} ranks has a sample axis dividing "
                             f"the batch {batch}")
        owner = {id(p): i for i, layer in enumerate(layers) for p in layer.parameters()}
        param_layers = [(owner.get(id(p), 0), int(p.data.size) * max(4, p.data.dtype.itemsize))
                        for p in params if p.requires_grad]
        pbytes = sum(n for _, n in param_layers)
        geoms, excluded = {}, []
        for g in grids:
            try:
                gl = analyze_layers(layers, input_shape, batch, g, dtype.itemsize)
            except InvalidGrid as e:
                excluded.append((g, str(e)))
                continue
            mem = estimate_memory(gl, pbytes, OPTIMIZER_STATE[optimizer])["total"]
            if memory_limit is not None and mem > memory_limit:
                excluded.append((g, f"predicted {mem / 2 ** 20:.1f} MiB per rank over the "
                                    f"limit {memory_limit / 2 ** 20:.1f} MiB"))
                continue
            geoms[g] = gl
    if machine is not None:
        from .simulate import simulate
        if memory_limit is not None:
            machine = machine.with_(memory_bytes=min(machine.memory_bytes,
                                                     memory_limit + machine.reserved_bytes))
        with collective(comm):
            return simulate(layers, input_shape, batch, nranks, machine,
                            candidates=grids, optimizer=optimizer,
                            halo_overlap=True if halo_overlap is None else halo_overlap,
                            bucket_bytes=bucket_bytes, overlap=overlap,
                            itemsize=dtype.itemsize)
    # everything above is pure given agreed arguments: every rank has the same geometries
    # (grids over the memory limit are excluded before any timing)
    links = measure_links(comm, quick=quick) if links is None else links
    reps = repeats or (3 if quick else 5)
    timer = LayerTimer(comm, dtype, device, repeats=reps, warmup=1) if timer is None else timer

    with collective(comm):
        jobs = [(timing_layer(layer, gm), gm.time_shape, i > 0) for g, gl in geoms.items()
                for i, (layer, gm) in enumerate(zip(layers, gl))]
    tune = (not quick) if tune_kernels is None else bool(tune_kernels)
    env = "DISTTENSOR_CONV_TUNE"
    saved_env = os.environ.get(env)
    if not tune and saved_env is None:
        os.environ[env] = "heuristic"
    try:
        measured = timer.time_all(jobs)
    finally:
        if not tune and saved_env is None:
            os.environ.pop(env, None)
    opt_s = optimizer_time(params, optimizer, dtype, comm, reps)
    ranked, k = [], 0
    for g, gl in geoms.items():
        ts = measured[k:k + len(gl)]
        k += len(gl)
        if any(math.isinf(f) or math.isinf(b) for f, b in ts):
            bad = next(gm.name for (f, b), gm in zip(ts, gl) if math.isinf(f + b))
            excluded.append((g, f"layer {bad} failed to run on its local block"))
            continue
        pred = predict_grid(g, gl, ts, links, param_layers, opt_s, bucket_bytes, overlap,
                            device == "cuda" if halo_overlap is None else halo_overlap,
                            OPTIMIZER_STATE[optimizer])
        ranked.append(pred)
    ranked.sort(key=lambda p: (p.step_s, p.grid))
    with collective(comm):
        if not ranked:
            raise ValueError("plan_grid: no valid grid fits: " + "; ".join(
                f"{'x'.join(map(str, g))}: {why}" for g, why in excluded))
    return GridPlan(ranked, excluded, links, memory_limit)
