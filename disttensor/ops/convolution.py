"""Distributed convolution and transposed convolution (1-D, 2-D, 3-D), forward and backward.

Layout ``N, C, *spatial``; the sample axis and any subset of the spatial axes may be split, the
channel axis not.  Weights and biases are ordinary (replicated) NumPy/CuPy arrays of the
input's device: ``w`` of shape ``(Cout, Cin // groups, *kernel)`` for :func:`conv_forward`
and ``(Cin, Cout // groups, *kernel)`` for :func:`conv_transpose_forward` (PyTorch's layouts).

Forward (collective): each rank exchanges the halo its owned outputs need (widths from the
window index math of :mod:`.window`), runs the local kernel on its read window with padding
only at global boundaries, and owns the output block whose window centres it owns (strided
outputs get explicit, possibly uneven sizes).  Every forward returns ``(y, saved)``;
:func:`conv_backward` takes ``saved`` and ``dy`` (distributed like ``y``) and returns
``(dx, dw, db)``: ``dx`` through the local backward-data kernel and the reverse halo exchange
(the adjoint), ``dw``/``db`` summed over the ranks that hold different parts of ``x`` (one
all-reduce each; replicas are not counted twice; ``reduce=False`` leaves the per-rank partial
sums, e.g. for a bucketed all-reduce).

A transposed convolution is the adjoint of a convolution: its output ``x`` gets the
distribution whose convolution outputs are ``y``'s blocks (:meth:`AxisWindow.input_offsets`);
when no such split exists, ``y`` is redistributed first.

Every entry point validates its arguments inside an ``agreed`` block before any message (see
:mod:`disttensor.core.agreement`): the ranks agree on the arrays' metadata, the weight's shape and
dtype and the window geometry (normalized, so two spellings of one padding agree) in the same
all-reduce that agrees on a validation failure.  :func:`conv_backward` also runs its local
kernels (data and filter gradient) inside that block, so agreeing costs it no extra message.
The forward's kernel runs after the halo exchange: its failure is agreed with the next
agreement over the grid (:func:`~disttensor.core.entry.failure_deferred`: the failing rank
agrees at once, every rank raises its error), so a forward makes one all-reduce; with no halo
at all (no spatial axis split, zero padding) no data moves and the forward's agreement is
deferred too (:func:`~disttensor.core.entry.deferrable`): none.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..core.array import DistArray
from ..core.entry import agreed, canon, collective_entry, deferrable, failure_deferred
from ..core.comm import allreduce_owned, collective
from ..core.distribution import Distribution
from ..core.progress import Progress, overlap_mode
from .local import kernels_for
from .window import normalize_padding, normalize_tuple
from ._spatial import (WindowPlan, array_key, begin_halo_input, check_extents,
                       check_gradient_layout, check_layout, halo_gradient, halo_input, lift,
                       lift3, meaning, overlap_regions, param_comm, spatial_windows, unlift,
                       window_plan, with_channels, zero_halo_buffer)

__all__ = ["conv", "conv_forward", "conv_backward", "conv_transpose", "conv_transpose_forward",
           "conv_transpose_backward", "ConvSaved"]


@dataclass
class ConvSaved:
    """What a convolution's backward needs (the halo'd input, the plan, the geometry)."""

    xin: DistArray | None   # the input with its halo exchanged (None: transposed conv)
    x_dist: Distribution    # distribution of the convolution's input
    plan: WindowPlan
    w: object
    nd: int
    kernel: tuple
    stride3: tuple
    dilation3: tuple
    groups: int
    has_bias: bool
    transposed: bool = False
    y: DistArray | None = None  # transposed conv: its input (the convolution's output side)
    y_layout: tuple | None = None  # transposed conv: (distribution, grid) the caller's y had
    windows: tuple = ()
    overlap: str = "off"    # halo overlap mode (disttensor.core.progress.overlap_mode)


def _window_keys(x: DistArray, w, stride, padding, dilation, groups) -> dict:
    """The window geometry as the ranks agree on it: normalized per-axis values where the
    arguments normalize (two spellings of one value agree), else their spellings."""
    nd = x.ndim - 2
    try:  # what 'same' padding depends on
        kernel = tuple(int(k) for k in w.shape[2:])
        dil = normalize_tuple(dilation, nd, "dilation")
    except Exception:  # noqa: BLE001 - invalid: the padding is agreed as spelled
        kernel = dil = None
    return dict(stride=meaning(normalize_tuple, stride, nd, "stride"),
                padding=meaning(normalize_padding, padding, nd, kernel, dil),
                dilation=meaning(normalize_tuple, dilation, nd, "dilation"),
                groups=canon(groups))


def _mode_key(device: str, overlap):
    """The overlap mode as the ranks agree on it (its spelling where it does not resolve: the
    agreed block then raises on every rank)."""
    try:
        return overlap_mode(device, overlap)
    except ValueError:
        return canon(overlap)


def sample_chunks(n: int, mode: str, parts: int = 2) -> list:
    """``[(n0, n1), ...]``: the sample ranges the interior of an overlapped window op is
    computed in: up to ``parts`` near-equal ones in ``'poll'`` mode (a progress test between
    them), one otherwise (a kernel call per chunk costs kernel efficiency).  Pure."""
    k = max(1, min(parts, n)) if mode == "poll" else 1
    return [(i * n // k, (i + 1) * n // k) for i in range(k)]


MIN_INTERIOR = 0.7
"""Least fraction of a CPU rank's outputs in the interior for a window op to overlap its halo
exchange: below it (blocks a few planes thick) the extra kernel calls on the shells cost more
than the wait they could hide."""


def overlap_split(mode: str, plan: WindowPlan, dist: Distribution, windows, coords,
                  device: str):
    """``(interior, shells)`` (:func:`overlap_regions`) where the ranks overlap their halo
    exchange in mode ``mode``, else ``None`` (exchange first, then one kernel call): not for
    ``'off'`` or without a halo, and on CPU only where every rank with outputs has at least
    :data:`MIN_INTERIOR` of them in its interior.  Pure and the same decision on every rank
    (the overlapped backward ends in a collective that the other path does not have)."""
    if mode == "off" or not plan.needs_exchange:
        return None
    if device != "cuda" and not _interiors_large(dist, windows, MIN_INTERIOR):
        return None
    return overlap_regions(dist, windows, coords)


@lru_cache(maxsize=256)
def _interiors_large(dist: Distribution, windows, least: float) -> bool:
    """Whether every rank's interior holds at least ``least`` of its outputs (ranks without
    outputs aside).  Pure."""
    def size(r):
        n = 1
        for sl in r.out[2:]:
            n *= sl.stop - sl.start
        return n
    for coords in itertools.product(*(range(n) for n in dist.grid_dims)):
        if not window_plan(dist, windows, coords).has_output:
            continue
        interior, shells = overlap_regions(dist, windows, coords)
        inner = 0 if interior is None else size(interior)
        if inner == 0 or inner < least * (inner + sum(size(r) for r in shells)):
            return False
    return True


def _check_bias(b, cout: int, what: str) -> None:
    if b is not None and tuple(b.shape) != (cout,):
        raise ValueError(f"{what}: bias must have shape ({cout},), got {tuple(b.shape)}")


def _geometry(x: DistArray, w, stride, padding, dilation, groups, what: str):
    nd = check_layout(x, what)
    if w.ndim != nd + 2:
        raise ValueError(f"{what}: weight of shape {tuple(w.shape)} does not fit {nd} spatial "
                         f"axes (expected {nd + 2} dimensions)")
    kernel = tuple(int(k) for k in w.shape[2:])
    stride = normalize_tuple(stride, nd, "stride")
    dilation = normalize_tuple(dilation, nd, "dilation")
    padding = normalize_padding(padding, nd, kernel, dilation)
    if isinstance(groups, bool) or int(groups) < 1:
        raise ValueError(f"groups must be a positive integer, got {groups}")
    check_extents(x, what)
    return nd, kernel, stride, dilation, padding, int(groups)


def _read_window(xin: DistArray, plan: WindowPlan):
    return xin.buffer[plan.read]


def _add_bias(y_local, b, nd: int) -> None:
    """``y_local += b`` over the channel axis, in ``y_local``'s dtype (one compiled pass on
    CPU, the bits of NumPy's broadcast add)."""
    if b is not None and y_local.size:
        kernels_for(y_local).add_channel_bias(y_local, b)


def _reduce(arr, comm, reduce: bool):
    """The sum of a parameter gradient the backward pass just made (the kernels return arrays
    of their own, so it is reduced in place, and not copied on one rank)."""
    return allreduce_owned(comm, arr, "sum") if reduce else arr


def _windowed_forward(x: DistArray, plan: WindowPlan, windows, w, nd: int, stride3, dilation3,
                      groups: int, out_shape, overlap: str):
    """Halo exchange of ``x`` and the local forward convolution of this rank's outputs
    (collective).  With an ``overlap`` mode other than ``'off'``, the interior outputs
    (reading only owned cells, see :func:`overlap_regions`) are computed between ``begin()``
    and ``end()`` of the exchange (with the MPI progress of the mode: sample chunks with a
    test between them, or a progress thread), the shells after it.  Returns ``(x with halo,
    local output)``; a failure on any rank raises on all."""
    from ..core.backend import array_module
    xp = array_module(x.local)
    dtype = np.result_type(x.dtype, w.dtype)
    k = kernels_for(x.local)

    def run(buf, read, plo, phi):
        return unlift(k.conv_forward(lift(buf[read], nd), lift(w, nd), stride3, dilation3,
                                     lift3(plo, nd, 0), lift3(phi, nd, 0), groups), nd)
    regions = overlap_split(overlap, plan, x.distribution, windows, x.grid.coords, x.device)
    if regions is None:
        xin = halo_input(x, plan, padded=True)   # (the read window padded: the store)
        with failure_deferred(x.grid.cart, "conv kernel"):  # a failure raises on every rank
            y = run(xin.buffer, plan.read, plan.pad_lo, plan.pad_hi) if plan.has_output \
                else xp.zeros(out_shape, dtype=dtype)
        return xin, y
    xin, ex = begin_halo_input(x, plan, padded=True)
    interior, shells = regions
    # the interior and the shells tile the output (tests/unit/test_overlap_regions.py)
    y = xp.empty(out_shape, dtype=dtype) if plan.has_output else xp.zeros(out_shape, dtype)
    err = None
    try:
        if interior is not None:
            with Progress(ex.test, overlap) as prog:
                for n0, n1 in sample_chunks(out_shape[0], overlap):
                    out = (slice(n0, n1),) + interior.out[1:]
                    y[out] = run(xin.buffer, (slice(n0, n1),) + interior.read[1:],
                                 interior.pad_lo, interior.pad_hi)
                    prog.poll()
    except Exception as e:  # noqa: BLE001 - agreed on below, after the exchange completes
        err = e
    ex.end()
    with failure_deferred(x.grid.cart, "conv kernel"):
        if err is not None:
            raise err
        for r in shells:
            y[r.out] = run(xin.buffer, r.read, r.pad_lo, r.pad_hi)
    return xin, y


def _backward_data_run(saved: "ConvSaved", dy_part, read, plo, phi):
    """The local adjoint (backward-data) kernel for the outputs ``dy_part`` whose windows read
    ``read`` of the halo'd input buffer."""
    nd = saved.nd
    shape = tuple(sl.stop - sl.start for sl in read[2:])
    return unlift(kernels_for(dy_part).conv_backward_data(
        lift(dy_part, nd), lift(saved.w, nd), lift3(shape, nd, 1), saved.stride3,
        saved.dilation3, lift3(plo, nd, 0), lift3(phi, nd, 0), saved.groups), nd)


def _backward_data_local(saved: "ConvSaved", dy_local):
    """This rank's gradient of its whole read window (no message; the no-overlap path)."""
    plan = saved.plan
    if not plan.has_output:
        return dy_local[:0]
    return _backward_data_run(saved, dy_local, plan.read, plan.pad_lo, plan.pad_hi)


def _windowed_backward_data(saved: "ConvSaved", dy_local, grid, local=None) -> DistArray:
    """Backward data of the convolution in ``saved``: the local adjoint kernel per region,
    halo cells sent back and added to their owners by the reverse exchange (collective).
    With overlap, the shells (the only outputs whose gradient reaches halo cells) go first,
    then the reverse exchange is started and the interior computed while it flies.
    ``local``: the read window's gradient (:func:`_backward_data_local`) when the caller
    computed it already (no overlap only)."""
    from ..core.backend import array_module
    plan = saved.plan
    xp = array_module(dy_local)

    def run(dy_part, read, plo, phi):
        return _backward_data_run(saved, dy_part, read, plo, phi)
    regions = overlap_split(saved.overlap, plan, saved.x_dist, saved.windows, grid.coords,
                            "cuda" if xp is not np else "cpu")
    if regions is None:
        if local is None:
            with collective(grid.cart):
                local = _backward_data_local(saved, dy_local)
        return halo_gradient(local, saved.x_dist, grid, plan)
    dtype = np.result_type(dy_local.dtype, saved.w.dtype)
    # a zero halo'd buffer and its exchange (pooled per layout on CPU)
    g, ex = zero_halo_buffer(saved.x_dist, grid, plan, dtype, xp)
    buf = g.buffer
    interior, shells = regions
    err = None
    try:
        for r in shells:
            buf[r.read] += run(dy_local[r.out], r.read, r.pad_lo, r.pad_hi)
    except Exception as e:  # noqa: BLE001 - agreed on below, after the exchange completes
        err = e
    ex.reverse_begin()
    try:
        if err is None and interior is not None:
            with Progress(ex.test, saved.overlap) as prog:
                for n0, n1 in sample_chunks(dy_local.shape[0], saved.overlap):
                    n = (slice(n0, n1),)
                    buf[n + interior.read[1:]] += run(dy_local[n + interior.out[1:]],
                                                      n + interior.read[1:], interior.pad_lo,
                                                      interior.pad_hi)
                    prog.poll()
    except Exception as e:  # noqa: BLE001
        err = e
    ex.reverse_end()
    with collective(grid.cart):
        if err is not None:
            raise err
    return DistArray(xp.ascontiguousarray(g.local), saved.x_dist, grid)


def _conv_setup(x: DistArray, w, b, stride, padding, dilation, groups, padding_mode: str,
                overlap):
    """Validate a convolution's arguments (raises on bad input; replicated metadata only) and
    return ``(nd, kernel, stride, dilation, groups, windows, plan, overlap mode)``."""
    nd, kernel, stride, dilation, padding, groups = _geometry(x, w, stride, padding,
                                                              dilation, groups, "conv")
    if w.shape[1] * groups != x.shape[1] or w.shape[0] % groups:
        raise ValueError(f"conv: weight {tuple(w.shape)} with groups={groups} does not fit "
                         f"{x.shape[1]} input channels")
    _check_bias(b, w.shape[0], "conv")
    if padding_mode not in ("zeros", "circular"):
        raise ValueError(f"padding_mode must be 'zeros' or 'circular', got {padding_mode!r}")
    circular = padding_mode == "circular"
    if circular and any(max(p) > n for p, n in zip(padding, x.shape[2:])):
        raise ValueError(f"circular padding {padding} must not exceed the spatial extents "
                         f"{x.shape[2:]}")
    overlap = overlap_mode(x.device, overlap)
    windows = spatial_windows(nd, kernel, stride, dilation, padding, circular)
    plan = window_plan(x.distribution, windows, x.grid.coords)
    return nd, kernel, stride, dilation, groups, windows, plan, overlap


# -- convolution ---------------------------------------------------------------------------------
@collective_entry
def conv_forward(x: DistArray, w, b=None, stride=1, padding=0, dilation=1, groups=1,
                 padding_mode: str = "zeros", overlap: bool | None = None):
    """Convolution (cross-correlation, as ``torch.nn.functional.conv{1,2,3}d``) of ``x``
    ``(N, Cin, *S)`` with ``w`` ``(Cout, Cin // groups, *K)`` plus optional bias ``(Cout,)``.
    ``padding``: int, ``'same'``, ``'valid'``, per-axis ints or per-axis (lo, hi) pairs;
    ``padding_mode``: ``'zeros'`` or ``'circular'`` (periodic domains: the padding cells are
    the wrapped-around input, read through a periodic halo; each pad at most the extent).
    ``overlap``: compute the interior outputs while the halo exchange is in flight (and, in
    the backward, the interior's data gradient while the reverse exchange is): ``False``,
    ``True``, or a mode of :func:`disttensor.core.progress.overlap_mode` (``'off'``,
    ``'on'``, ``'poll'``, ``'thread'``: how MPI progresses while a CPU kernel runs).
    Default (``None``): ``$DISTTENSOR_HALO_OVERLAP``, else on for GPU blocks, whose kernels
    run asynchronously while the host waits on MPI, and off for CPU blocks, where it did not
    pay in a training step (``bench/step_scaling_bench.py``, ``docs/performance.md``).
    Collective.  Returns ``(y, saved)``."""
    # validated before the agreeing block decides how to agree, raised inside it (so a
    # mismatch wins, on every rank)
    try:
        setup, err = _conv_setup(x, w, b, stride, padding, dilation, groups, padding_mode,
                                 overlap), None
    except Exception as e:  # noqa: BLE001 - raised inside the agreeing block
        setup, err = None, e
    # no spatial axis split over several ranks and zero padding: no halo, no data moves, the
    # agreement is deferred to the next one over the grid (decided from the layout alone, as
    # for the elementwise calls; a failure is agreed at once)
    d = x.distribution
    direct = padding_mode == "zeros" and all(g is None or d.grid_dims[g] == 1
                                             for g in d.split[2:])
    # (one rank agrees nothing: no keys to make)
    keys = {} if x.grid.cart.size <= 1 else dict(
        x=x, w=array_key(w), b=array_key(b), **_window_keys(x, w, stride, padding, dilation,
                                                             groups),
        padding_mode=padding_mode, overlap=_mode_key(x.device, overlap))
    with (deferrable if direct else agreed)(x.grid.cart, "conv_forward", **keys):
        if err is not None:
            raise err
        nd, kernel, stride, dilation, groups, windows, plan, overlap = setup
        if direct and plan.needs_exchange:  # (one block per spatial axis reads no halo)
            raise RuntimeError(f"conv: a halo on an unsplit layout ({plan.halo})")
        out_dist = with_channels(plan.out_dist, w.shape[0])
    xin, y_local = _windowed_forward(x, plan, windows, w, nd, lift3(stride, nd, 1),
                                     lift3(dilation, nd, 1), groups,
                                     out_dist.block_shape(x.grid.coords), overlap)
    _add_bias(y_local, b, nd)
    y = DistArray(y_local, out_dist, x.grid)
    saved = ConvSaved(xin, x.distribution, plan, w, nd, kernel, lift3(stride, nd, 1),
                      lift3(dilation, nd, 1), groups, b is not None, windows=windows,
                      overlap=overlap if overlap_split(overlap, plan, x.distribution, windows,
                                                       x.grid.coords, x.device) else "off")
    return y, saved


def conv(x: DistArray, w, b=None, stride=1, padding=0, dilation=1, groups=1,
         padding_mode: str = "zeros", overlap: bool | None = None) -> DistArray:
    """:func:`conv_forward` without the saved state."""
    return conv_forward(x, w, b, stride, padding, dilation, groups, padding_mode, overlap)[0]


def _conv_dw_local(saved: ConvSaved, xwin_local, dy_local, dtype):
    """This rank's part of the filter gradient (no message)."""
    from ..core.backend import array_module
    plan, nd = saved.plan, saved.nd
    if plan.has_output:
        k = kernels_for(dy_local)
        dw = k.conv_backward_filter(lift(xwin_local, nd), lift(dy_local, nd),
                                    lift3(saved.kernel, nd, 1), saved.stride3,
                                    saved.dilation3, lift3(plan.pad_lo, nd, 0),
                                    lift3(plan.pad_hi, nd, 0), saved.groups)
        return dw.reshape(saved.w.shape)
    return array_module(dy_local).zeros(saved.w.shape, dtype=dtype)


def _conv_dw(saved: ConvSaved, xwin_local, dy_local, dtype, grid):
    """:func:`_conv_dw_local`, collective only to agree on failure."""
    with collective(grid.cart):
        return _conv_dw_local(saved, xwin_local, dy_local, dtype)


@collective_entry
def conv_backward(saved: ConvSaved, dy: DistArray, need_dx: bool = True, need_dw: bool = True,
                  reduce: bool = True):
    """Gradients ``(dx, dw, db)`` of a convolution from :func:`conv_forward` for the output
    gradient ``dy`` (distributed like the output).  Collective.  ``dx`` is a DistArray like
    ``x``; ``dw``/``db`` are replicated arrays (summed over the ranks holding different parts
    of ``x`` unless ``reduce=False``); entries not asked for are ``None``.

    The local kernels that precede any message (the read window's data gradient unless it
    overlaps the reverse exchange, and the filter gradient) run inside the block that agrees
    on the arguments, so one all-reduce agrees on the arguments and on kernel failures."""
    plan = saved.plan
    local_dx = need_dx and (saved.overlap == "off" or not plan.needs_exchange)
    g = dw = db = None
    keys = dict(dy=dy, transposed=saved.transposed, need_dx=bool(need_dx),
                need_dw=bool(need_dw), reduce=bool(reduce))
    # no reverse halo and no sums (a first layer's backward under a gradient reducer, or a
    # grid that splits only the samples): no data moves, the agreement is deferred
    moves = (need_dx and plan.needs_exchange) or (need_dw and reduce)
    with (agreed(dy.grid.cart, "conv_backward", rank_local=True, **keys) if moves
          else deferrable(dy.grid.cart, "conv_backward", **keys)):
        if saved.transposed:
            raise ValueError("conv_backward got the state of a transposed convolution; use "
                             "conv_transpose_backward")
        check_gradient_layout(dy, with_channels(plan.out_dist, saved.w.shape[0]),
                              "convolution")
        if local_dx:
            g = _backward_data_local(saved, dy.local)
        if need_dw:
            dw = _conv_dw_local(saved, _read_window(saved.xin, plan), dy.local, dy.dtype)
    dx = _windowed_backward_data(saved, dy.local, dy.grid, local=g) if need_dx else None
    if need_dw:
        comm = param_comm(saved.xin)
        dw = _reduce(dw, comm, reduce)
        if saved.has_bias:
            axes = (0,) + tuple(range(2, dy.ndim))
            db = _reduce(dy.local.sum(axis=axes), comm, reduce)
    return dx, dw, db


# -- transposed convolution ----------------------------------------------------------------------
def _transposed_layout(y: DistArray, windows, extents
                       ) -> tuple[DistArray, Distribution, WindowPlan]:
    """The distribution of the transposed convolution's output (the convolution's input), its
    window plan, and ``y``, redistributed if no input split produces ``y``'s blocks."""
    d = y.distribution
    shape = list(d.shape)
    sizes = list(d.split_sizes)
    for i, (w, n) in enumerate(zip(windows, extents)):
        t = 2 + i
        shape[t] = n
        if d.split[t] is not None:
            offs = w.input_offsets(d.offsets[t], n)
            if w.output_offsets(offs) != d.offsets[t]:
                offs = None
            sizes[t] = None if offs is None else [q - p for p, q in zip(offs[:-1], offs[1:])]
    x_dist = Distribution(shape, d.grid_dims, d.split, sizes)
    plan = window_plan(x_dist, windows, y.grid.coords)
    if plan.out_dist != d:  # also when a non-split axis is involved: extents are checked
        y = y.redistribute(distribution=plan.out_dist)
    return y, x_dist, plan


@collective_entry
def conv_transpose_forward(y: DistArray, w, b=None, stride=1, padding=0, output_padding=0,
                           dilation=1, groups=1):
    """Transposed convolution (``torch.nn.functional.conv_transpose{1,2,3}d``) of ``y``
    ``(N, Cin, *S)`` with ``w`` ``(Cin, Cout // groups, *K)``; output extent per axis
    ``(m-1)*stride - lo - hi + dilation*(k-1) + 1 + output_padding`` with
    ``output_padding < stride``.  Collective.  Returns ``(x, saved)``."""
    with agreed(y.grid.cart, "conv_transpose_forward", y=y, w=array_key(w), b=array_key(b),
                **_window_keys(y, w, stride, padding, dilation, groups),
                output_padding=meaning(normalize_tuple, output_padding, y.ndim - 2,
                                       "output_padding")):
        nd, kernel, stride, dilation, padding, groups = _geometry(y, w, stride, padding,
                                                                  dilation, groups,
                                                                  "conv_transpose")
        if w.shape[0] != y.shape[1] or y.shape[1] % groups:
            raise ValueError(f"conv_transpose: weight {tuple(w.shape)} with groups={groups} "
                             f"does not fit {y.shape[1]} input channels")
        _check_bias(b, w.shape[1] * groups, "conv_transpose")
        output_padding = normalize_tuple(output_padding, nd, "output_padding")
        mode = overlap_mode(y.device)
        windows = spatial_windows(nd, kernel, stride, dilation, padding)
        extents = []
        for win, m, op in zip(windows, y.shape[2:], output_padding):
            if not 0 <= op < win.stride:
                raise ValueError(f"output_padding {output_padding} must be >= 0 and smaller "
                                 f"than the stride {stride}")
            n = (m - 1) * win.stride - win.pad_lo - win.pad_hi + win.span + op
            if n < 1 or win.out_extent(n) != m:
                raise ValueError(f"conv_transpose: input extent {m} gives no valid output "
                                 f"extent with kernel {kernel}, stride {stride}, padding "
                                 f"{padding}")
            extents.append(n)
    y_layout = (y.distribution, y.grid)
    y, x_dist, plan = _transposed_layout(y, windows, extents)
    cout = w.shape[1] * groups
    out_dist = with_channels(x_dist, cout)
    saved = ConvSaved(None, out_dist, plan, w, nd, kernel, lift3(stride, nd, 1),
                      lift3(dilation, nd, 1), groups, b is not None, transposed=True, y=y,
                      windows=windows, overlap=mode, y_layout=y_layout)
    x = _windowed_backward_data(saved, y.local, y.grid)
    _add_bias(x.local, b, nd)
    return x, saved


def conv_transpose(y: DistArray, w, b=None, stride=1, padding=0, output_padding=0, dilation=1,
                   groups=1) -> DistArray:
    """:func:`conv_transpose_forward` without the saved state."""
    return conv_transpose_forward(y, w, b, stride, padding, output_padding, dilation, groups)[0]


@collective_entry
def conv_transpose_backward(saved: ConvSaved, dx: DistArray, need_dy: bool = True,
                            need_dw: bool = True, reduce: bool = True):
    """Gradients ``(dy, dw, db)`` of a transposed convolution for its output gradient ``dx``
    (distributed like its output).  ``dy`` is the convolution of ``dx`` (halo exchange + local
    forward kernel), returned with the distribution the caller's input had (redistributed back
    when the forward had to redistribute it).  Collective."""
    with agreed(dx.grid.cart, "conv_transpose_backward", dx=dx,
                transposed=saved.transposed, need_dy=bool(need_dy), need_dw=bool(need_dw),
                reduce=bool(reduce)):
        if not saved.transposed:
            raise ValueError("conv_transpose_backward got the state of a convolution; use "
                             "conv_backward")
        check_gradient_layout(dx, saved.x_dist, "transposed convolution", name="dx")
    plan, nd = saved.plan, saved.nd
    dy = db = dw = None
    dxin = None
    if need_dy:
        dxin, dy_local = _windowed_forward(dx, plan, saved.windows, saved.w, nd, saved.stride3,
                                           saved.dilation3, saved.groups,
                                           saved.y.distribution.block_shape(dx.grid.coords),
                                           saved.overlap)
        dy = DistArray(dy_local, saved.y.distribution, dx.grid)
        if saved.y_layout is not None and saved.y_layout[0] != dy.distribution:
            dy = dy.redistribute(grid=saved.y_layout[1], distribution=saved.y_layout[0])
    if need_dw:
        if dxin is None:  # dy not asked for: exchange dx's halo for the filter gradient alone
            dxin = halo_input(dx, plan, padded=True)
        comm = param_comm(dx)
        dw = _reduce(_conv_dw(saved, _read_window(dxin, plan), saved.y.local, dx.dtype,
                              dx.grid), comm, reduce)
        if saved.has_bias:
            axes = (0,) + tuple(range(2, dx.ndim))
            db = _reduce(dx.local.sum(axis=axes), comm, reduce)
    return dy, dw, db
