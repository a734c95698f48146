"""``--prune-to S``: gradual (or one-shot) magnitude pruning during training, and the run
summary's pruning line (final sparsity; the dense head's inference time, dense against its
CSB-sparse twin).

:func:`make_pruner` builds the :class:`~disttensor.nn.prune.GradualPruning` over the layers
``--prune-layers`` names (``dense``: every Linear; ``conv``: every convolution; ``all``),
ranked together (``--prune-scope global``, the default) or per layer, on Zhu
& Gupta's schedule from ``--prune-start`` to ``--prune-end`` (default 3/4 of the run's steps)
every ``--prune-frequency`` steps (``--prune-schedule oneshot``: all at ``--prune-start``).
Its layers get masks of ones at once, so a checkpoint holding masks loads (``--resume``).
"""
from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from ..autograd import Tensor, no_grad
from .. import nn
from ..core.comm import collective
from ..core.grid import ProcessGrid
from ..nn import prune
from ..nn.layers import Linear, _ConvNd
from ..nn.sparse_layers import SparseLinear
from ..routines.creation import from_global

__all__ = ["make_pruner", "head_inference_times", "pruning_line"]

_KINDS = {"dense": (Linear,), "conv": (_ConvNd,), "all": (Linear, _ConvNd)}


def make_pruner(args, model, comm, total_steps: int, pipelined: bool):
    """The run's :class:`~disttensor.nn.prune.GradualPruning`, or ``None`` without
    ``--prune-to``.  Collective over ``comm``."""
    if args.prune_to is None:
        return None
    with collective(comm):
        if pipelined:
            raise ValueError("--prune-to is not supported with --stages > 1 (each stage holds "
                             "other layers)")
        pairs = prune.prunable_weights(model, _KINDS[args.prune_layers])
        if not pairs:
            raise ValueError(f"--prune-layers {args.prune_layers}: the model has no such layer")
    start = args.prune_start
    end = start if args.prune_schedule == "oneshot" else \
        (args.prune_end if args.prune_end is not None else max(start, (3 * total_steps) // 4))
    pruner = prune.GradualPruning(pairs, args.prune_to, start, end,
                                  max(args.prune_frequency, 1), scope=args.prune_scope,
                                  comm=comm)
    for m, n in pairs:
        if prune.mask_of(m, n) is None:
            prune.identity(m, n, comm=comm)
    return pruner


def _head_input(head):
    first = next((m for m in head.modules() if isinstance(m, Linear)), None)
    return None if first is None else first.in_features


def head_inference_times(model, batch: int, comm, repeats: int = 20) -> dict:
    """Median seconds of the model's dense head (``model.head``) forward on ``batch`` random
    feature vectors, as trained (dense kernels, pruned weights) and with its Linear layers as
    :class:`~disttensor.nn.SparseLinear` (CSB).  Measured on rank 0 over ``COMM_SELF``,
    broadcast (collective over ``comm``).  Empty dict when the model has no dense head."""
    head = getattr(model, "head", None)
    features = _head_input(head) if isinstance(head, nn.Sequential) else None
    if features is None:
        return {}
    out = None
    if comm.rank == 0:
        sparse = nn.Sequential(*[SparseLinear.from_dense(m) if isinstance(m, Linear) else m
                                 for m in head])
        dtype = next(iter(head.parameters())).data.dtype
        x = np.random.default_rng(0).standard_normal((batch, features)).astype(dtype)
        xd = Tensor(from_global(x, grid=ProcessGrid((1,), comm=MPI.COMM_SELF),
                                split=(0, None)))
        times = {}
        for key, net in (("dense_s", head), ("sparse_s", sparse)):
            net.eval()
            with no_grad():
                net(xd)
                samples = []
                for _ in range(repeats):
                    t = time.perf_counter()
                    net(xd)
                    samples.append(time.perf_counter() - t)
            times[key] = float(np.median(samples))
        head.train()
        out = times
    return comm.bcast(out, root=0)


def pruning_line(sparsity: float, times: dict) -> str:
    """The run summary's pruning line."""
    line = f"pruned: final sparsity {sparsity:.1%} of the pruned layers' weights"
    if times:
        line += (f"; dense head inference dense {times['dense_s'] * 1e3:.3f} ms, sparse (CSB) "
                 f"{times['sparse_s'] * 1e3:.3f} ms "
                 f"({times['dense_s'] / max(times['sparse_s'], 1e-12):.2f}x)")
    return line
