"""The process grid of a training run when ``--grid`` is not given.

:func:`plan_grid` ranks the grids by the step time that :mod:`disttensor.nn.perfmodel`
predicts (collective over ``comm``; the ranking goes to rank 0's output) and falls back to
:func:`choose_grid`, a fixed rule (data parallel first, then spatial cuts), when the planner
cannot handle the model.  A grid is ``(sample, depth, height, width)``.
"""
from __future__ import annotations

import math
import time

import numpy as np
from mpi4py import MPI

from .. import nn
from ..core.comm import collective
from .builders import build_model
from .data import num_classes

__all__ = ["choose_grid", "plan_grid"]


def choose_grid(nranks: int, batch: int, spatial: tuple[int, int, int]) -> tuple[int, ...]:
    """Default grid ``(sample, d, h, w)``: as many ranks on the sample axis as divide both the
    rank count and the global batch (data parallelism needs no halo), the rest cut the
    samples spatially along depth, then height (``MPI.Compute_dims`` balance)."""
    s = math.gcd(nranks, batch)
    rest = nranks // s
    if rest == 1:
        return (s, 1, 1, 1)
    d, h = MPI.Compute_dims(rest, 2)
    return (s, d, h, 1)


def plan_grid(args, comm, sample_shape, probe, segmentation, progress, nranks: int,
              batch: int) -> tuple[int, ...]:
    """No ``--grid``: rank the grids of ``nranks`` ranks by the step time the performance
    model predicts for a batch of ``batch`` samples (:func:`disttensor.nn.perfmodel.plan_grid`,
    quick mode, collective over ``comm``) and take the fastest; the ranked table goes to
    rank 0's output.  With pipeline stages, the per-stage grid is planned for the whole model
    on one micro-batch (a proxy: every stage runs on the same grid).  A model the planner
    cannot handle falls back to :func:`choose_grid` (on every rank alike: planning errors are
    collective)."""
    if segmentation:
        args.classes = num_classes(probe, comm)
    with collective(comm):
        model = build_model(args, sample_shape, np.random.default_rng(args.seed))
    t0 = time.perf_counter()
    try:
        plan = nn.perfmodel.plan_grid(model, sample_shape, batch, nranks, comm=comm,
                                      optimizer=args.optimizer,
                                      bucket_bytes=int(args.bucket_mb * 2 ** 20),
                                      overlap=not args.no_overlap, quick=True,
                                      dtype="float16" if args.amp else args.dtype)
    except ValueError as e:
        dims = choose_grid(nranks, args.batch_size, sample_shape[1:])
        progress.say(f"grid planning failed ({e}); default grid {dims}")
        return dims
    progress.say(plan.report(top=5) + f"\nchosen grid (sample, d, h, w) = {plan.best.grid} "
                 f"(planned in {time.perf_counter() - t0:.1f} s; --grid overrides)")
    return plan.best.grid
