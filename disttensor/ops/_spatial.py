"""Machinery shared by the distributed window ops (convolution, pooling, upsampling).

* :func:`window_plan` (pure, cached): for an input distribution and one :class:`AxisWindow`
  per spatial axis, the output distribution (centre ownership, see :mod:`.window`), the halo
  widths of the input, and what this rank reads from its halo'd buffer and pads locally.
* :func:`halo_input` gives the input with that halo exchanged (no copy, no message when the
  halo is empty); :func:`halo_gradient` is its adjoint: a gradient computed on the read window
  is added into a zero buffer with the same halo and sent back with the reverse exchange.
  ``halo_input(x, plan, padded=True)`` (a convolution) puts the halo'd buffer inside a store
  with room for the plan's local zero padding (:func:`operand_margins`), so the read window
  and its padding are one array the direct kernels read in place.
* :func:`lift` / :func:`unlift` turn ``(N, C, *S)`` local blocks with 1 or 2 spatial axes into
  the 3-axis layout the local kernels take.
* :func:`param_comm`: the communicator over which parameter gradients and statistics are
  summed: the ranks holding *different* parts of the array (its split grid axes), so replicas
  are not counted twice.
* :func:`meaning`, :func:`array_key` and :func:`check_extents`: argument agreement keys and
  the degenerate-input check the ops share (see "Argument agreement" in ``docs/ops.md``).

Layout is ``N, C, *spatial`` with 1 to 3 spatial axes; the channel axis must not be split.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..core import agreement as _agreement
from ..core.array import DistArray
from ..core.entry import canon, nested
from ..core.distribution import Distribution
from ..core import halo_pool
from ..core.halo import HaloExchange
from .window import AxisWindow

__all__ = ["WindowPlan", "window_plan", "Region", "overlap_regions", "check_layout",
           "halo_input", "begin_halo_input", "operand_margins", "halo_boundary", "halo_gradient",
           "zero_halo_buffer", "lift", "unlift", "lift3", "with_channels", "check_gradient_layout", "param_comm", "spatial_windows",
           "meaning", "check_extents", "array_key"]


@dataclass(frozen=True)
class WindowPlan:
    """What one rank does for a window op.

    ``out_dist``: output distribution; ``halo``: (lo, hi) halo per tensor axis of the input;
    ``read``: slices of the halo'd input buffer this rank's outputs read (clipped to the global
    array); ``pad_lo``/``pad_hi``: padding the local kernel adds per spatial axis (non-zero only
    at global boundaries); ``has_output``: whether this rank owns any output; ``margins``: the
    cells a store around the halo'd buffer needs for the read window and its padding to be
    the whole store (:func:`operand_margins`; ``None``: cannot be)."""

    out_dist: Distribution
    halo: tuple[tuple[int, int], ...]
    read: tuple[slice, ...]
    pad_lo: tuple[int, ...]
    pad_hi: tuple[int, ...]
    has_output: bool
    periodic: tuple[bool, ...] = ()   # per tensor axis: halo boundary (circular padding)
    margins: tuple | None = None      # operand_margins(self, owned block shape)

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
    plan = WindowPlan(out_dist, tuple(halo), tuple(read), tuple(pad_lo), tuple(pad_hi),
                      has_output, periodic)
    margins = operand_margins(plan, dist.block_shape(coords))
    return WindowPlan(out_dist, tuple(halo), tuple(read), tuple(pad_lo), tuple(pad_hi),
                      has_output, periodic, margins)


def operand_margins(plan: WindowPlan, block: tuple) -> tuple | None:
    """``(lo, hi)`` cells per tensor axis to leave around a halo'd buffer of ``block`` (the
    owned block's shape) so that the plan's read window padded by ``pad_lo`` / ``pad_hi``
    is the whole store (:class:`disttensor.core.halo_pool.Slot`): the padding beyond the
    buffer.  ``None`` where that cannot be (the window leaves out buffer cells on some axis:
    the kernel then pads a copy) or nothing is gained (no output).  Pure; kept in the plan
    (:attr:`WindowPlan.margins`)."""
    if not plan.has_output:
        return None
    out = [(0, 0), (0, 0)]
    for t in range(2, len(block)):
        (hl, hh), sl = plan.halo[t], plan.read[t]
        ext = hl + block[t] + hh
        first = sl.start - plan.pad_lo[t - 2]
        stop = sl.stop + plan.pad_hi[t - 2]
        if (first > 0) or (stop < ext):
            return None
        out.append((-first, stop - ext))
    return tuple(out)


@dataclass(frozen=True)
class Region:
    """A box of this rank's outputs and what computing it reads: ``out`` slices of the local
    output block, ``read`` slices of the halo'd input buffer, local padding per spatial axis."""

    out: tuple[slice, ...]
    read: tuple[slice, ...]
    pad_lo: tuple[int, ...]
    pad_hi: tuple[int, ...]


@lru_cache(maxsize=1024)
def overlap_regions(dist: Distribution, windows: tuple[AxisWindow, ...],
                    coords: tuple[int, ...]) -> tuple[Region | None, tuple[Region, ...]]:
    """This rank's outputs cut into an *interior* box, whose windows read only cells the rank
    owns (computable while the halo exchange is in flight), and *shell* boxes that read halo
    cells (computed after it).  Onion decomposition over the spatial axes: shell ``i`` holds
    the outputs inside the interior range on the axes before ``i`` and outside it on axis
    ``i``.  Empty boxes are left out; ``interior`` is ``None`` when empty.  Pure."""
    plan = window_plan(dist, windows, coords)
    if not plan.has_output:
        return None, ()
    axes = []   # per spatial axis: (o0, o1, q0, q1, a, hl, n, w)
    for i, w in enumerate(windows):
        t = 2 + i
        c = dist.axis_coord(t, coords)
        a, b = dist.block_range(t, c)
        out_offs = w.output_offsets(dist.offsets[t])
        o0, o1 = out_offs[c], out_offs[c + 1]
        n = dist.shape[t]
        inside = [o for o in range(o0, o1)
                  if w.read_range(o, o + 1, n)[0] >= a and w.read_range(o, o + 1, n)[1] <= b]
        q0, q1 = (inside[0], inside[-1] + 1) if inside else (o0, o0)
        axes.append((o0, o1, q0, q1, a, plan.halo[t][0], n, w))

    def region(ranges):
        out, read, plo, phi = [slice(None), slice(None)], [slice(None), slice(None)], [], []
        for (o0, _, _, _, a, hl, n, w), (r0, r1) in zip(axes, ranges):
            lo, hi = w.read_range(r0, r1, n)
            out.append(slice(r0 - o0, r1 - o0))
            read.append(slice(lo - a + hl, hi - a + hl))
            pl, ph = w.local_pads(r0, r1, n)
            plo.append(pl)
            phi.append(ph)
        return Region(tuple(out), tuple(read), tuple(plo), tuple(phi))

    interior_ranges = [(q0, q1) for (_, _, q0, q1, *_rest) in axes]
    interior = region(interior_ranges) if all(q1 > q0 for q0, q1 in interior_ranges) else None
    shells = []
    for i, (o0, o1, q0, q1, *_rest) in enumerate(axes):
        for r0, r1 in ((o0, q0), (q1, o1)):
            if r1 <= r0:
                continue
            ranges = interior_ranges[:i] + [(r0, r1)] + [(ax[0], ax[1]) for ax in axes[i + 1:]]
            if all(b > a for a, b in ranges):
                shells.append(region(ranges))
    return interior, tuple(shells)


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


def check_extents(x: DistArray, what: str) -> None:
    """Raise unless every spatial extent of ``x`` is positive or ``x`` is empty through its
    sample or channel axis (PyTorch's rule for convolutions: "only zero batch or zero channel
    inputs are supported"; a window over an empty axis would read padding only)."""
    if x.shape[0] and x.shape[1] and 0 in x.shape[2:]:
        raise ValueError(f"{what}: spatial extent 0 in input shape {x.shape}; only a zero "
                         "batch or zero channels may make the input empty")


def meaning(normalize, value, *args):
    """What an argument means, for argument agreement: ``normalize(value, *args)``, so that two
    spellings of one value (``padding=1`` and ``padding=((1, 1), (1, 1))``) agree; the spelling
    itself (lists as tuples) when it does not normalize (the validation inside the agreed
    block raises then).  A normalized per-axis tuple whose entries are all one int is that int
    (the common case, and much cheaper to digest than nested tuples: ``agreement.token``
    costs a few microseconds per tuple); the arrays' metadata, agreed alongside, fixes the
    number of axes, so this loses nothing.  Cached for module-level ``normalize`` functions
    and arguments made of ints, strings and ``None`` (a training step passes the same few at
    every call)."""
    key = (normalize, value, args) if (_plain(value) and _plain(args)
                                       and "<" not in normalize.__qualname__) else None
    if key is not None:
        hit = _MEANINGS.get(key, _MISSING)
        if hit is not _MISSING:
            return hit
    try:
        v = normalize(value, *args)
    except Exception:  # noqa: BLE001 - invalid: agree on the spelling
        return canon(value)
    if isinstance(v, tuple) and v:
        leaves = _leaves(v)
        if type(leaves[0]) is int and all(e == leaves[0] and type(e) is int for e in leaves):
            v = leaves[0]
    if key is not None:
        if len(_MEANINGS) > 4096:
            _MEANINGS.clear()
        _MEANINGS[key] = v
    return v


_MEANINGS: dict = {}
_MISSING = object()


def _plain(v) -> bool:
    """Whether ``v`` is made of ints, strings and ``None`` only (exact types: ``True`` and
    ``1.0`` would equal ``1`` as a dictionary key), in tuples."""
    t = type(v)
    if t is int or t is str or v is None:
        return True
    return t is tuple and all(_plain(e) for e in v)


def array_key(a):
    """A replicated array argument (weight, bias, batch-norm parameter or statistics) as the
    ranks agree on it: its shape and dtype, as a short string (``agreement.token`` reads a
    string at once but walks its whole type dispatch for an array: ~1 against ~6 us, which
    adds up over a training step's calls); the array itself under ``DISTTENSOR_DEBUG=1``,
    where arrays are compared by value."""
    if a is None or _agreement.DEBUG:
        return a
    try:
        key = a.dtype.str   # (dtype.name takes ~2 us; a cached name ~0.1)
        name = _DTYPE_NAMES.get(key)
        if name is None:
            name = _DTYPE_NAMES[key] = a.dtype.name
        return f"array(shape={tuple(a.shape)}, dtype={name})"
    except Exception:  # noqa: BLE001 - not an array: agree on it as it is
        return a


_DTYPE_NAMES: dict = {}


def _leaves(v: tuple) -> list:
    out = []
    for e in v:
        out.extend(_leaves(e) if isinstance(e, tuple) else (e,))
    return out


def halo_input(x: DistArray, plan: WindowPlan, padded: bool = False) -> DistArray:
    """``x`` with the plan's halo filled from its neighbours (collective when a halo is
    needed; ``x`` itself when not).

    Call it from inside a collective entry point, after that entry point's agreed block
    agreed on ``x`` and the window geometry the plan derives from: the halo buffer and the
    exchange then add no agreement all-reduce of their own (:func:`disttensor.core.entry.nested`;
    one op call agrees once).  The buffer and its exchange come from the pool of
    :mod:`disttensor.core.halo_pool` where one of the layout is free (made once per layout,
    persistent requests), else they are made for this call.

    ``padded=True`` (a convolution, which pads its read window with zeros): the pooled
    buffer lies in a store with room for the plan's local padding (:func:`operand_margins`),
    so the read window and its zero padding are one C-contiguous array that the direct
    kernels read in place of a padded copy (:mod:`disttensor.core.padded_store`)."""
    if not plan.needs_exchange:
        return x
    with nested():
        xh, ex = _halo_copy(x, plan, padded)
        ex.exchange()
    return xh


def begin_halo_input(x: DistArray, plan: WindowPlan, padded: bool = False):
    """Split-phase :func:`halo_input`: ``(x with the plan's halo, started exchange)``; call
    ``end()`` on the exchange before reading halo cells (collective; same precondition and
    ``padded`` as :func:`halo_input`)."""
    with nested():
        xh, ex = _halo_copy(x, plan, padded)
        return xh, ex.begin()


def _periodic(plan: WindowPlan, ndim: int) -> tuple:
    return plan.periodic or (False,) * ndim


def _halo_copy(x: DistArray, plan: WindowPlan, padded: bool = False):
    """``(x copied into a buffer with the plan's halo, that buffer's exchange, not
    started)``: a pooled buffer where the layout has a free one (NumPy blocks; with room
    for the plan's local padding when ``padded``), else a new one (``x`` itself when it has
    the plan's halo already)."""
    if x.halo == plan.halo:
        return x, HaloExchange(x, halo_boundary(plan), persistent=False)
    if type(x.local) is np.ndarray:
        got = halo_pool.acquire(x.distribution, x.grid, plan.halo, _periodic(plan, x.ndim),
                                x.dtype, src=x.local, margins=plan.margins if padded else None)
        if got is not None:   # (x's block copied into the interior)
            return got
    xh = x.with_halo(plan.halo)
    return xh, HaloExchange(xh, halo_boundary(plan), persistent=False)


def zero_halo_buffer(x_dist: Distribution, grid, plan: WindowPlan, dtype, xp=np):
    """``(g, exchange)``: a DistArray of distribution ``x_dist`` with the plan's halo, all
    zero, and its exchange (for gradients sent back with ``exchange.reverse*``; pooled as in
    :func:`halo_input` for NumPy).  Local."""
    if xp is np:
        got = halo_pool.acquire(x_dist, grid, plan.halo, _periodic(plan, x_dist.ndim), dtype)
        if got is not None:
            got[0].buffer.fill(0)
            return got
    block = x_dist.block_shape(grid.coords)
    g = DistArray(xp.zeros(tuple(lo + n + hi for (lo, hi), n in zip(plan.halo, block)),
                           dtype=dtype), x_dist, grid, plan.halo)
    with nested():
        return g, HaloExchange(g, halo_boundary(plan), persistent=False)


def halo_boundary(plan: WindowPlan):
    """The halo exchange boundary argument of a plan (periodic axes for circular padding)."""
    return tuple("periodic" if p else "zero" for p in plan.periodic) if any(plan.periodic) \
        else "zero"


def halo_gradient(local_grad, x_dist: Distribution, grid, plan: WindowPlan) -> DistArray:
    """Adjoint of :func:`halo_input` followed by reading ``plan.read``: ``local_grad`` (the
    gradient on this rank's read window) is added into a buffer with the plan's halo, whose
    halo cells are then sent back and added into their owners (collective when a halo is
    needed; same precondition as :func:`halo_input`: no agreement of its own).  Returns a
    halo-free DistArray with distribution ``x_dist``."""
    from ..core.backend import array_module
    xp = array_module(local_grad)
    if plan.has_output and plan.needs_exchange:
        # straight from the window's gradient: no zero halo'd buffer, one copy of the block
        # (its exchange cached per layout, see reverse_window)
        from ..core.halo import reverse_window
        out = reverse_window(local_grad, tuple(sl.start or 0 for sl in plan.read), x_dist,
                             grid, plan.halo, _periodic(plan, x_dist.ndim))
        if out is not None:
            return DistArray(out, x_dist, grid)
    block = x_dist.block_shape(grid.coords)
    buf_shape = tuple(lo + n + hi for (lo, hi), n in zip(plan.halo, block))
    if not plan.needs_exchange and plan.has_output and tuple(local_grad.shape) == buf_shape:
        return DistArray(local_grad, x_dist, grid)  # the read window is the whole block
    if not plan.needs_exchange:
        buf = xp.zeros(buf_shape, dtype=local_grad.dtype)
        if plan.has_output:
            buf[plan.read] = local_grad
        return DistArray(buf, x_dist, grid)
    g, ex = zero_halo_buffer(x_dist, grid, plan, local_grad.dtype, xp)
    if plan.has_output:
        g.buffer[plan.read] = local_grad
    ex.reverse()
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


@lru_cache(maxsize=1024)
def with_channels(d: Distribution, c: int) -> Distribution:
    """``d`` with ``c`` channels (axis 1, never split) and the same ownership elsewhere
    (cached: a training step asks for the same few layouts at every layer)."""
    return Distribution(d.shape[:1] + (c,) + d.shape[2:], d.grid_dims, d.split, d.split_sizes)


def check_gradient_layout(grad: DistArray, dist: Distribution, op: str,
                          name: str = "dy") -> None:
    """Raise (on every rank: the distributions are replicated metadata) unless the gradient
    ``grad`` flowing into ``op``'s backward is distributed like ``op``'s output, ``dist``."""
    if grad.distribution != dist:
        raise ValueError(f"{name} must be distributed like the {op} output ({dist}), got "
                         f"{grad.distribution}; redistribute it first")


def param_comm(x: DistArray):
    """Communicator over the ranks holding different parts of ``x`` (its split grid axes);
    collective on first use for a grid (every rank reaches it)."""
    gaxes = tuple(g for g in x.split if g is not None)
    return x.grid.sub_comm(gaxes)
