"""Machinery shared by the distributed window ops (convolution, pooling, upsampling).

* :func:`window_plan` (pure, cached): for an input distribution and one :class:`AxisWindow`
  per spatial axis, the output distribution (centre ownership, see :mod:`.window`), the halo
  widths of the input, and what this rank reads from its halo'd buffer and pads locally.
* :func:`halo_input` gives the input with that halo exchanged (no copy, no message when the
  halo is empty); :func:`halo_gradient` is its adjoint: a gradient computed on the read window
  is added into a zero buffer with the same halo and sent back with the reverse exchange.
* :func:`lift` / :func:`unlift` turn ``(N, C, *S)`` local blocks with 1 or 2 spatial axes into
  the 3-axis layout the local kernels take.
* :func:`param_comm`: the communicator over which parameter gradients and statistics are
  summed: the ranks holding *different* parts of the array (its split grid axes), so replicas
  are not counted twice.

Layout is ``N, C, *spatial`` with 1 to 3 spatial axes; the channel axis must not be split.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..array import DistArray
from ..distribution import Distribution
from .window import AxisWindow

__all__ = ["WindowPlan", "window_plan", "check_layout", "halo_input", "halo_gradient", "lift",
           "unlift", "lift3", "param_comm", "spatial_windows"]


@dataclass(frozen=True)
class WindowPlan:
    """What one rank does for a window op.

    ``out_dist``: output distribution; ``halo``: (lo, hi) halo per tensor axis of the input;
    ``read``: slices of the halo'd input buffer this rank's outputs read (clipped to the global
    array); ``pad_lo``/``pad_hi``: padding the local kernel adds per spatial axis (non-zero only
    at global boundaries); ``has_output``: whether this rank owns any output."""

    out_dist: Distribution
    halo: tuple[tuple[int, int], ...]
    read: tuple[slice, ...]
    pad_lo: tuple[int, ...]
    pad_hi: tuple[int, ...]
    has_output: bool
    periodic: tuple[bool, ...] = ()   # per tensor axis: halo boundary (circular padding)

    @property
    def needs_exchange(self) -> bool:
        return any(lo or hi for lo, hi in self.halo)


@lru_cache(maxsize=1024)
def window_plan(dist: Distribution, windows: tuple[AxisWindow, ...], coords: tuple[int, ...]
                ) -> WindowPlan:
    """Plan of a window op with ``windows[i]`` on tensor axis ``2 + i`` for the rank at grid
    ``coords`` (pure; the same on every rank up to ``coords``)."""
    out_dist = dist
    halo = [(0, 0)] * dist.ndim
    read = []
    pad_lo, pad_hi = [], []
    has_output = True
    for t in range(dist.ndim):
        c = dist.axis_coord(t, coords)
        a, b = dist.block_range(t, c)
        if t < 2:  # samples and channels: all of them (channel-agnostic plans)
            read.append(slice(None))
            has_output &= b > a
            continue
        w = windows[t - 2]
        n = dist.shape[t]
        offs = dist.offsets[t]
        out_offs = w.output_offsets(offs)
        m = out_offs[-1]
        if dist.split[t] is not None:
            out_dist = out_dist.with_sizes(
                t, [q - p for p, q in zip(out_offs[:-1], out_offs[1:])], extent=m)
        else:
            out_dist = out_dist.with_sizes(t, None, extent=m)
        hl, hh = w.halo(offs)
        halo[t] = (hl, hh)
        o0, o1 = out_offs[c], out_offs[c + 1]
        if o1 <= o0:
            has_output = False
            read.append(slice(hl, hl))
            pad_lo.append(0)
            pad_hi.append(0)
            continue
        lo, hi = w.read_range(o0, o1, n)
        read.append(slice(lo - a + hl, hi - a + hl))
        pl, ph = w.local_pads(o0, o1, n)
        pad_lo.append(pl)
        pad_hi.append(ph)
    periodic = (False, False) + tuple(w.periodic for w in windows)
    return WindowPlan(out_dist, tuple(halo), tuple(read), tuple(pad_lo), tuple(pad_hi),
                      has_output, periodic)


def spatial_windows(nd: int, kernel, stride, dilation, padding, periodic: bool = False
                    ) -> tuple[AxisWindow, ...]:
    """One :class:`AxisWindow` per spatial axis from normalized per-axis tuples."""
    return tuple(AxisWindow(k, s, d, lo, hi, periodic)
                 for k, s, d, (lo, hi) in zip(kernel, stride, dilation, padding))


def check_layout(x: DistArray, what: str, min_spatial: int = 1) -> int:
    """Raise (on every rank: the check is on replicated metadata) unless ``x`` is
    ``N, C, *spatial`` with 1..3 spatial axes and an unsplit channel axis; returns the number
    of spatial axes."""
    nd = x.ndim - 2
    if not min_spatial <= nd <= 3:
        raise ValueError(f"{what} takes arrays of layout (N, C, *spatial) with 1 to 3 spatial "
                         f"axes, got shape {x.shape}")
    if x.split[1] is not None:
        raise ValueError(f"{what}: the channel axis (1) must not be split (split={x.split}); "
                         "redistribute first")
    return nd


def halo_input(x: DistArray, plan: WindowPlan) -> DistArray:
    """``x`` with the plan's halo filled from its neighbours (collective when a halo is
    needed; ``x`` itself when not)."""
    if not plan.needs_exchange:
        return x
    if x.halo == plan.halo:
        xh = x
    else:
        xh = x.with_halo(plan.halo)
    xh.halo_exchange(_boundary(plan)).exchange()
    return xh


def _boundary(plan: WindowPlan):
    return tuple("periodic" if p else "zero" for p in plan.periodic) if any(plan.periodic) \
        else "zero"


def halo_gradient(local_grad, x_dist: Distribution, grid, plan: WindowPlan) -> DistArray:
    """Adjoint of :func:`halo_input` followed by reading ``plan.read``: ``local_grad`` (the
    gradient on this rank's read window) is added into a buffer with the plan's halo, whose
    halo cells are then sent back and added into their owners (collective when a halo is
    needed).  Returns a halo-free DistArray with distribution ``x_dist``."""
    from ..backend import array_module
    xp = array_module(local_grad)
    block = x_dist.block_shape(grid.coords)
    buf_shape = tuple(lo + n + hi for (lo, hi), n in zip(plan.halo, block))
    if not plan.needs_exchange and plan.has_output and tuple(local_grad.shape) == buf_shape:
        return DistArray(local_grad, x_dist, grid)  # the read window is the whole block
    buf = xp.zeros(buf_shape, dtype=local_grad.dtype)
    if plan.has_output:
        buf[plan.read] = local_grad
    if not plan.needs_exchange:
        return DistArray(buf, x_dist, grid)
    g = DistArray(buf, x_dist, grid, plan.halo)
    g.halo_exchange(_boundary(plan)).reverse()
    return DistArray(xp.ascontiguousarray(g.local), x_dist, grid)


def lift(a, nd: int):
    """``(N, C, *S)`` with ``nd`` spatial axes -> ``(N, C, D, H, W)`` (leading axes of 1)."""
    if nd == 3:
        return a
    return a.reshape(a.shape[:2] + (1,) * (3 - nd) + a.shape[2:])


def unlift(a, nd: int):
    if nd == 3:
        return a
    return a.reshape(a.shape[:2] + a.shape[5 - nd:])


def lift3(values: tuple, nd: int, fill) -> tuple:
    """Per-spatial-axis tuple -> 3 entries (``fill`` for the lifted leading axes)."""
    return (fill,) * (3 - nd) + tuple(values)


def param_comm(x: DistArray):
    """Communicator over the ranks holding different parts of ``x`` (its split grid axes);
    collective on first use for a grid (every rank reaches it)."""
    gaxes = tuple(g for g in x.split if g is not None)
    return x.grid.sub_comm(gaxes)
