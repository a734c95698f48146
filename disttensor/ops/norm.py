"""Distributed batch normalization (training and inference), forward and backward.

Per-channel statistics over the sample and spatial axes of ``x`` ``(N, C, *S)`` (channel axis
not split).  ``stats='global'`` (default): each rank takes its block's per-channel count, mean
and sum of squared deviations in two passes (float64), the ranks holding different parts of
``x`` exchange them with one small Allgather and combine them with Chan et al.'s parallel
formula in rank order (precise where the one-pass ``E[x^2] - E[x]^2`` loses ``mean^2/var``
ulps, and bit-identical on every rank); the result is PyTorch's ``BatchNorm`` on the whole
array: biased variance to normalize, unbiased variance for the running statistics, running
``= (1 - momentum) * running + momentum * batch``.  ``stats='local'`` normalizes each rank's
block with its own statistics (LBANN's local statistics: no all-reduce in forward or for
``dx``); its running statistics are then per rank too.  The backward sums ``[sum dy,
sum dy*xhat]`` with one all-reduce (``'global'``) and always sums ``dgamma``/``dbeta`` over the
ranks, since the parameters are shared.

Both entry points agree on their arguments (the arrays' metadata, the parameter and running
statistics shapes, ``training``, ``momentum``, ``eps``, ``stats``) before any message; the
local statistics kernel (training forward) and the local sums (backward) run inside the
agreeing block, whose all-reduce also agrees on their failure.  Training needs more than one
value per channel in each set of statistics (PyTorch's rule; see "Degenerate inputs" in
``docs/ops.md``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.array import DistArray
from ..core.entry import agreed, collective_entry
from ..core.backend import array_module
from ..core.comm import allreduce
from .local import kernels_for
from ._spatial import array_key, check_gradient_layout, check_layout, param_comm

__all__ = ["batch_norm_forward", "batch_norm_backward", "batch_norm", "BatchNormSaved"]


@dataclass
class BatchNormSaved:
    x: DistArray
    mean: object      # float64 (C,) on the block's device
    invstd: object    # float64 (C,)
    gamma: object
    training: bool
    stats: str
    count: float


def _local_moments(k, a, c: int):
    """This block's per-channel count, mean and sum of squared deviations (float64, on the
    block's device), in two passes over the block: the one-pass ``sum(x^2) - n*mean^2`` loses
    about ``mean^2/var`` ulps (1e-10 relative error of float64 variances was seen in tests)."""
    from ..core.backend import array_module
    xp = array_module(a)
    n = _count(a)
    if n == 0:
        return 0, xp.zeros(c), xp.zeros(c)
    s, _ = k.channel_sums(a)
    mean = xp.asarray(s, dtype=xp.float64) / n
    ones = xp.ones(c, dtype=xp.float64)
    s2, sxx = k.channel_sums_backward(a, a, mean, ones)
    s2, sxx = xp.asarray(s2, dtype=xp.float64), xp.asarray(sxx, dtype=xp.float64)
    # sum((x - m)^2) = sum(x (x - m)) - m (sum(x) - n m), the last term a rounding correction
    m2 = xp.maximum(sxx - mean * (s2 - n * mean), 0.0)
    return n, mean, m2


def _gather_rows(comm, mine):
    """``(comm.size, len(mine))``: every rank's ``mine`` in rank order, on ``mine``'s device
    (NCCL for CuPy arrays where it runs on ``comm``, else MPI through the host).  Collective."""
    from ..core.backend import array_module, to_host
    xp = array_module(mine)
    if xp is not np:
        from ..core.gpucomm import device_allgather
        every = device_allgather(comm, mine)
        if every is not None:
            return every
    host = np.ascontiguousarray(to_host(mine))
    every = np.empty((comm.size, host.size))
    comm.Allgather(host, every)
    return every if xp is np else xp.asarray(every)


def _combine_moments(comm, n_r: int, mean_r, m2_r):
    """Count, mean and sum of squared deviations over the ranks of ``comm`` (or this rank
    alone when ``comm`` is None), combined exactly as Chan et al.'s parallel update, in rank
    order so every rank gets bit-identical results (one all-gather of 2C+1 doubles, on the
    device with NCCL for GPU blocks)."""
    from ..core.backend import array_module
    c = len(mean_r)
    if comm is None or comm.size == 1:
        return float(n_r), mean_r, m2_r
    xp = array_module(mean_r)
    mine = xp.concatenate([xp.asarray([float(n_r)]), mean_r, m2_r])
    every = _gather_rows(comm, mine)
    counts, means, m2s = every[:, 0], every[:, 1:c + 1], every[:, c + 1:]
    n = float(counts.sum())
    if n == 0:
        return 0.0, xp.zeros(c), xp.zeros(c)
    mean = (counts[:, None] * means).sum(axis=0) / n
    m2 = m2s.sum(axis=0) + (counts[:, None] * (means - mean) ** 2).sum(axis=0)
    return n, mean, m2


def _count(a) -> int:
    """Elements per channel of a local ``(N, C, ...)`` block."""
    return int(np.prod(a.shape)) // a.shape[1] if a.shape[1] else 0


def _check_values_per_channel(x: DistArray, stats: str) -> None:
    """Training needs statistics.  No value per channel at all (an empty global batch:
    ``N * prod(S) == 0`` with channels) raises: there is nothing to normalize with and the
    running statistics would silently stay as they are (PyTorch returns early instead).
    Exactly one value per channel (``N * prod(S) == 1``) cannot give a variance and raises,
    PyTorch's rule (``torch.nn.functional._verify_batch_size``).  The one-value rule applies
    to each set of statistics: the whole array for ``stats='global'``, every block for
    ``'local'`` (from the replicated distribution, so every rank decides alike); empty blocks
    of a non-empty batch are fine."""
    d = x.distribution
    if d.shape[1] and int(np.prod((d.shape[0],) + d.shape[2:])) == 0:
        raise ValueError(f"batch norm in training mode got no values per channel (input size "
                         f"{d.shape}): no batch statistics can be computed from an empty batch")
    if stats == "global":
        n = int(np.prod((d.shape[0],) + d.shape[2:]))
        if n == 1:
            raise ValueError(f"Expected more than 1 value per channel when training, got input "
                             f"size {d.shape}")
        return
    # a block with a count of 1 exists iff every axis but the channels has a block of extent 1
    # (the axes are cut over distinct grid axes, so their blocks combine freely)
    if all(1 in (d.sizes(t) if d.split[t] is not None else (d.shape[t],))
           for t in range(d.ndim) if t != 1):
        raise ValueError(f"Expected more than 1 value per channel when training, got a block "
                         f"with one value per channel (stats='local' normalizes every block "
                         f"with its own statistics; input size {d.shape}, split {d.split}, "
                         f"sizes {d.split_sizes})")


@collective_entry
def batch_norm_forward(x: DistArray, gamma, beta, running_mean=None, running_var=None,
                       training: bool = True, momentum: float = 0.1, eps: float = 1e-5,
                       stats: str = "global"):
    """Normalize ``x`` per channel and apply ``gamma``/``beta`` ((C,) arrays on ``x``'s device).
    ``running_mean``/``running_var`` (float arrays, (C,)) are updated in place when training
    and used when not.  Training needs more than one value per channel (PyTorch's rule;
    ``ValueError`` on every rank otherwise); an empty batch gives an empty output.
    Collective (the ranks agree on the arguments; training with ``stats='global'`` combines
    the statistics with one Allgather).  Returns ``(y, saved)``."""
    c = x.shape[1] if x.ndim > 1 else 0
    xp = x.xp
    training = bool(training)
    with agreed(x.grid.cart, "batch_norm_forward", rank_local=training, x=x,
                gamma=array_key(gamma), beta=array_key(beta),
                running_mean=array_key(running_mean), running_var=array_key(running_var),
                training=training, momentum=momentum, eps=eps, stats=stats):
        check_layout(x, "batch_norm")
        if stats not in ("global", "local"):
            raise ValueError(f"stats must be 'global' or 'local', got {stats!r}")
        for name, v in (("gamma", gamma), ("beta", beta), ("running_mean", running_mean),
                        ("running_var", running_var)):
            if v is not None and tuple(v.shape) != (c,):
                raise ValueError(f"batch_norm: {name} must have shape ({c},), got "
                                 f"{tuple(v.shape)}")
        if not training and (running_mean is None or running_var is None):
            raise ValueError("batch_norm in inference mode needs running_mean and running_var")
        k = kernels_for(x.local)
        if training:
            _check_values_per_channel(x, stats)
            # the local statistics inside the agreed block: its all-reduce also agrees on a
            # kernel failure
            n_r, mean_r, m2_r = _local_moments(k, x.local, c)
    if training:
        comm = param_comm(x) if stats == "global" else None
        cnt, mean_h, m2_h = _combine_moments(comm, n_r, mean_r, m2_r)
        mean = xp.asarray(mean_h)
        var = xp.asarray(m2_h / max(cnt, 1.0))
        if running_mean is not None and cnt > 0:
            running_mean *= 1 - momentum
            running_mean += momentum * mean.astype(running_mean.dtype)
        if running_var is not None and cnt > 0:
            unbiased = var * (cnt / (cnt - 1)) if cnt > 1 else xp.full_like(var, np.nan)
            running_var *= 1 - momentum
            running_var += momentum * unbiased.astype(running_var.dtype)
    else:
        mean = xp.asarray(running_mean, dtype=xp.float64)
        var = xp.asarray(running_var, dtype=xp.float64)
        cnt = float(_count(x.local))
    invstd = 1.0 / xp.sqrt(var + eps)
    g64 = xp.asarray(gamma, dtype=xp.float64)
    scale = g64 * invstd
    shift = xp.asarray(beta, dtype=xp.float64) - mean * scale
    y_local = k.bn_forward_apply(x.local, scale, shift)
    saved = BatchNormSaved(x, mean, invstd, gamma, training, stats, cnt)
    return DistArray(y_local, x.distribution, x.grid), saved


@collective_entry
def batch_norm_backward(saved: BatchNormSaved, dy: DistArray, reduce: bool = True):
    """Gradients ``(dx, dgamma, dbeta)`` (collective: one all-reduce of the per-channel sums;
    ``reduce=False`` leaves ``dgamma``/``dbeta`` as per-rank partial sums in ``'local'`` mode
    and inference mode, where ``dx`` does not need them)."""
    x = saved.x
    xp = array_module(dy.local)
    k = kernels_for(dy.local)
    c = x.shape[1]
    with agreed(dy.grid.cart, "batch_norm_backward", rank_local=True, dy=dy,
                training=saved.training, stats=saved.stats, reduce=bool(reduce)):
        check_gradient_layout(dy, x.distribution, "batch-norm")
        s_dy, s_dyx = k.channel_sums_backward(dy.local, x.local, saved.mean, saved.invstd)
    sums = xp.concatenate([xp.asarray(s_dy, dtype=xp.float64),
                           xp.asarray(s_dyx, dtype=xp.float64)])
    comm = param_comm(x)
    if saved.training and saved.stats == "global":
        sums = allreduce(comm, sums, "sum")
        local_sums = sums
    else:
        local_sums = sums
        if reduce:
            sums = allreduce(comm, sums, "sum")
    dbeta, dgamma = sums[:c], sums[c:]
    g64 = xp.asarray(saved.gamma, dtype=xp.float64)
    if saved.training:
        cnt = max(saved.count, 1.0)
        mean_dy = local_sums[:c] / cnt
        mean_dyx = local_sums[c:] / cnt
        dx_local = k.bn_backward_apply(dy.local, x.local, saved.mean, saved.invstd, g64,
                                       mean_dy, mean_dyx)
    else:
        zeros = xp.zeros(c, dtype=xp.float64)
        dx_local = k.bn_backward_apply(dy.local, x.local, saved.mean, saved.invstd, g64, zeros,
                                       zeros)
    dtype = saved.gamma.dtype
    return (DistArray(dx_local, x.distribution, x.grid), dgamma.astype(dtype),
            dbeta.astype(dtype))


def batch_norm(x: DistArray, gamma, beta, running_mean=None, running_var=None,
               training: bool = True, momentum: float = 0.1, eps: float = 1e-5,
               stats: str = "global") -> DistArray:
    """:func:`batch_norm_forward` without the saved state."""
    return batch_norm_forward(x, gamma, beta, running_mean, running_var, training, momentum,
                              eps, stats)[0]
