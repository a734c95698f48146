"""Distributed max and average pooling (1-D, 2-D, 3-D), forward and backward.

Same decomposition as :mod:`.convolution`: outputs are owned by the block owning their window
centre (kernel != stride and windows crossing block boundaries are fine), each rank exchanges the halo
its outputs read and pads only at global boundaries (``-inf`` for max, zero for average, as
PyTorch).  Backward routes gradients into the rank's read window, halo cells included (a max
that sits in a neighbour's cell), and the reverse halo exchange adds them to their owners.

Both entry points agree on their arguments (mode, window geometry, the arrays' metadata) before
any message; where no halo is exchanged first (the forward of a window that reads only owned
cells, the backward always) the local kernel runs inside the agreeing block, so its failure
agreement and the argument agreement are one all-reduce.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.array import DistArray
from ..core.entry import agreed, canon, collective_entry
from ..core.comm import collective
from ..core.distribution import Distribution
from .local import kernels_for
from .window import normalize_padding, normalize_tuple
from ._spatial import (WindowPlan, check_extents, check_gradient_layout, check_layout,
                       halo_gradient, halo_input, lift, lift3, meaning, spatial_windows, unlift,
                       window_plan)

__all__ = ["pool", "pool_forward", "pool_backward", "PoolSaved", "max_pool", "avg_pool"]


@dataclass
class PoolSaved:
    x_dist: Distribution
    plan: WindowPlan
    mode: str
    nd: int
    kernel3: tuple
    stride3: tuple
    count_include_pad: bool
    argmax: object          # local argmax (max pooling) or None
    read_shape: tuple       # spatial shape of the read window


def _pool_geometry(x: DistArray, mode: str, kernel, stride, padding):
    """Validated ``(nd, kernel, stride, padding, plan)`` of a pooling (pure; raises on bad
    arguments)."""
    if mode not in ("max", "avg"):
        raise ValueError(f"pooling mode must be 'max' or 'avg', got {mode!r}")
    nd = check_layout(x, f"{mode}_pool")
    check_extents(x, f"{mode}_pool")
    kernel = normalize_tuple(kernel, nd, "kernel")
    stride = kernel if stride is None else normalize_tuple(stride, nd, "stride")
    padding = normalize_padding(padding, nd, kernel)
    for k, (lo, hi) in zip(kernel, padding):
        if max(lo, hi) > k // 2:
            raise ValueError(f"pooling padding {padding} must be at most half the kernel "
                             f"{kernel} on each side")
    windows = spatial_windows(nd, kernel, stride, (1,) * nd, padding)
    return nd, kernel, stride, padding, window_plan(x.distribution, windows, x.grid.coords)


def _pool_keys(x: DistArray, kernel, stride, padding) -> dict:
    nd = x.ndim - 2
    k = meaning(normalize_tuple, kernel, nd, "kernel")
    return dict(kernel=k, stride=k if stride is None else meaning(normalize_tuple, stride, nd,
                                                                   "stride"),
                padding=meaning(lambda p: normalize_padding(
                    p, nd, normalize_tuple(kernel, nd, "kernel")), padding))


@collective_entry
def pool_forward(x: DistArray, mode: str, kernel, stride=None, padding=0,
                 count_include_pad: bool = True):
    """Pooling of ``x`` ``(N, C, *S)``: ``mode`` ``'max'`` or ``'avg'``, ``kernel`` int or per
    axis, ``stride`` defaults to ``kernel``, ``padding`` int / per-axis / (lo, hi) pairs, each
    side at most half the kernel (as PyTorch).  Collective.  Returns ``(y, saved)``."""
    # the geometry first (pure), so that the ranks know whether a halo exchange comes before
    # the kernel: when none does, the kernel runs inside the agreeing block (one all-reduce
    # agrees on the arguments and on a kernel failure)
    try:
        geometry, err = _pool_geometry(x, mode, kernel, stride, padding), None
    except Exception as e:  # noqa: BLE001 - raised inside the agreed block, on every rank
        geometry, err = None, e
    direct = geometry is not None and not geometry[-1].needs_exchange
    y_local = argmax = None
    read_shape = ()
    with agreed(x.grid.cart, "pool_forward", rank_local=direct, x=x, mode=mode,
                **_pool_keys(x, kernel, stride, padding),
                count_include_pad=canon(count_include_pad)):
        if err is not None:
            raise err
        nd, kernel, stride, padding, plan = geometry

        def run(xin):
            if not plan.has_output:
                return (x.xp.zeros(plan.out_dist.block_shape(x.grid.coords), dtype=x.dtype),
                        None, ())
            win = xin.buffer[plan.read]
            y, am = kernels_for(win).pool_forward(
                lift(win, nd), mode, lift3(kernel, nd, 1), lift3(stride, nd, 1),
                lift3(plan.pad_lo, nd, 0), lift3(plan.pad_hi, nd, 0), count_include_pad)
            return unlift(y, nd), None if am is None else unlift(am, nd), tuple(win.shape[2:])
        if direct:
            y_local, argmax, read_shape = run(x)
    if not direct:
        xin = halo_input(x, plan)
        with collective(x.grid.cart):  # a kernel failure on one rank raises on all
            y_local, argmax, read_shape = run(xin)
    y = DistArray(y_local, plan.out_dist, x.grid)
    saved = PoolSaved(x.distribution, plan, mode, nd, lift3(kernel, nd, 1), lift3(stride, nd, 1),
                      count_include_pad, argmax, read_shape)
    return y, saved


@collective_entry
def pool_backward(saved: PoolSaved, dy: DistArray) -> DistArray:
    """Gradient with respect to the pooling input for the output gradient ``dy`` (distributed
    like the output).  Collective (reverse halo exchange)."""
    plan, nd = saved.plan, saved.nd
    with agreed(dy.grid.cart, "pool_backward", rank_local=True, dy=dy, mode=saved.mode):
        check_gradient_layout(dy, plan.out_dist, "pooling")
        if plan.has_output:
            g = kernels_for(dy.local).pool_backward(
                lift(dy.local, nd), None if saved.argmax is None else lift(saved.argmax, nd),
                saved.mode, lift3(saved.read_shape, nd, 1), saved.kernel3, saved.stride3,
                lift3(plan.pad_lo, nd, 0), lift3(plan.pad_hi, nd, 0), saved.count_include_pad)
            g = unlift(g, nd)
        else:
            g = dy.local[:0]
    return halo_gradient(g, saved.x_dist, dy.grid, plan)


def pool(x: DistArray, mode: str, kernel, stride=None, padding=0,
         count_include_pad: bool = True) -> DistArray:
    """:func:`pool_forward` without the saved state."""
    return pool_forward(x, mode, kernel, stride, padding, count_include_pad)[0]


def max_pool(x: DistArray, kernel, stride=None, padding=0) -> DistArray:
    return pool(x, "max", kernel, stride, padding)


def avg_pool(x: DistArray, kernel, stride=None, padding=0, count_include_pad: bool = True
             ) -> DistArray:
    return pool(x, "avg", kernel, stride, padding, count_include_pad)
