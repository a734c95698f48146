"""Offset tables, padding and scratch buffers of the direct convolutions (per rank, no MPI),
and which problems they support.

The gathered GEMM addresses the flat padded operand through int64 offset tables:
:func:`position_offsets` (one entry per output position ``(n, od, oh, ow)``) and
:func:`tap_offsets` (one per kernel tap ``(ci, kd, kh, kw)``).  :func:`embed` writes an
operand into zeros of the padded (or zero-inserted) extent.  The padded operand, the packed
blocks and the blocked output live in per-thread scratch buffers (:func:`scratch`) kept
between calls; :func:`release_scratch` drops this thread's.
"""
from __future__ import annotations

import numpy as np

from .....core.copies import copy_into
from .....core.padded_store import padded_view
from ..conv_operands import check_shapes, conv_out_shape
from ..scratch import ScratchBuffers

__all__ = ["scratch", "release_scratch", "embed", "data_span", "tap_window", "tile_tap_limits",
           "pass_tap_limits", "kept_fraction", "position_offsets", "tap_offsets", "gather_offsets", "padded_offsets", "round_up", "gemm_extents", "padded_elements",
           "shapes_supported", "unpadded_1x1"]

_buffers = ScratchBuffers()


def scratch(slot: str, shape, dtype) -> np.ndarray:
    """An uninitialised array of ``shape`` backed by this thread's reusable buffer ``slot``
    (one per slot and dtype, grown as needed): fresh large arrays cost their page faults on
    every call.  Valid until the next call with the same slot in this thread."""
    return _buffers.get(slot, shape, dtype)


def release_scratch() -> None:
    """Drop this thread's scratch buffers (they are kept between calls and grow to the
    largest layer seen)."""
    _buffers.release()


def embed(x, lo, size, step=(1, 1, 1)):
    """Zeros of spatial ``size`` with ``x[..., i]`` at ``lo + i*step`` per axis (positions
    outside are dropped: negative ``lo`` crops), in the ``"padded"`` scratch buffer.  With
    unit steps the copy merges the rows of the last axis into single elements
    (:func:`~disttensor.core.copies.copy_into`; 4x16x9x16x16 float32 into 10x18x18: 82 ->
    59 us).  No copy at all where ``x`` is a window of a zero-padded store that holds this
    operand (a convolution's halo'd input, :mod:`disttensor.core.padded_store`): the store's
    view is returned then.  Callers read the result only."""
    if step[0] == 1 and step[1] == 1 and step[2] == 1:
        held = padded_view(x, lo, size)
        if held is not None:
            return held
    out = scratch("padded", x.shape[:2] + tuple(size), x.dtype)
    src, dst = [slice(None)] * 2, [slice(None)] * 2
    for n, l, sz, s in zip(x.shape[2:], lo, size, step):
        i0, i1 = _kept(n, l, sz, s)
        if i1 <= i0:
            out[...] = 0
            return out
        src.append(slice(i0, i1))
        dst.append(slice(l + i0 * s, l + (i1 - 1) * s + 1, s))
    out[...] = 0
    if x.size >= 4096 and all(s == 1 for s in step):
        copy_into(out[tuple(dst)], x[tuple(src)])   # (rows of the last axis merged)
    else:
        out[tuple(dst)] = x[tuple(src)]
    return out


def _kept(n, lo, size, step):
    """``[i0, i1)``: the input indices ``i < n`` whose position ``lo + i*step`` lies in
    ``[0, size)`` (what :func:`embed` keeps along one axis)."""
    i0 = 0 if lo >= 0 else (-lo + step - 1) // step          # first i with lo + i*step >= 0
    i1 = min(n, (size - 1 - lo) // step + 1) if size - 1 - lo >= 0 else 0
    return i0, max(i0, i1)


def data_span(n, lo, size, step=1):
    """``(first, stop)``: the positions of :func:`embed`'s output along one axis that can hold
    data (``x``'s cells at ``lo + i*step``; everything outside is zero padding).  An axis with
    no data gives an empty span ``(0, 0)``."""
    i0, i1 = _kept(int(n), int(lo), int(size), int(step))
    if i1 <= i0:
        return 0, 0
    return int(lo) + i0 * int(step), int(lo) + (i1 - 1) * int(step) + 1


def tap_window(o, k, stride, dilation, span):
    """``(k0, k1)``: the kernel taps ``k0 <= t < k1`` of output ``o`` along one axis whose
    input position ``o*stride + t*dilation`` lies in ``span`` = ``(first, stop)`` (the data
    of the padded operand, :func:`data_span`); the taps outside read only zero padding.
    ``k0 == k1`` when none is inside."""
    first, stop = span
    base = o * stride
    k0 = max(0, -(-(first - base) // dilation))
    k1 = min(k, (stop - 1 - base) // dilation + 1) if stop - 1 - base >= 0 else 0
    return (k0, k1) if k1 > k0 else (0, 0)


def tile_tap_limits(n_n, out_sp, kernel, stride, dilation, span, rows):
    """Reduction limits per micro-tile of the gathered GEMM whose rows are the output
    positions ``(n, od, oh, ow)`` (``rows`` per tile; the last tile padded by repeating the
    last position, :func:`padded_offsets`) and whose reduction is ``(channel, kd, kh, kw)``:
    an int64 array ``[lo_0, hi_0, lo_1, hi_1, ...]`` with, per tile, the window ``[lo, hi)``
    of the flat tap index ``kd*kH*kW + kh*kW + kw`` within each channel's ``kD*kH*kW`` that
    covers the depth taps reading data (:func:`tap_window` along depth, the union over the
    tile's rows; ``span`` is the depth span of the padded operand's data).  Empty when every
    tile needs every tap (nothing to skip).  Pure and cached per problem: callers must not
    write to the result."""
    key = (int(n_n), tuple(int(v) for v in out_sp), tuple(int(v) for v in kernel),
           int(stride), int(dilation), tuple(int(v) for v in span), int(rows))
    return _memo(_LIMITS, key, _tile_tap_limits)


_LIMITS: dict = {}


def pass_tap_limits(pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi, rows):
    """:func:`tile_tap_limits` of the direct kernels' forward or backward data pass (rows of
    ``rows`` output positions; ``x_shape`` the forward input's, ``w_shape`` the weight's):
    forward reads the input padded by ``pad_lo`` / ``pad_hi``, backward data the output
    gradient zero-inserted by the stride and padded by ``dilation*(k-1) - pad_lo`` (as
    :func:`embed` lays them out).  Empty for backward filter (nothing skipped)."""
    n_n, in_sp = int(x_shape[0]), tuple(int(v) for v in x_shape[2:])
    kernel = tuple(int(k) for k in w_shape[2:])
    s, d, lo, hi = int(stride[0]), int(dilation[0]), int(pad_lo[0]), int(pad_hi[0])
    if pass_ == "forward":
        out_sp = conv_out_shape(in_sp, kernel, stride, dilation, pad_lo, pad_hi)
        span = data_span(in_sp[0], lo, in_sp[0] + lo + hi)
        return tile_tap_limits(n_n, out_sp, kernel, s, d, span, rows)
    if pass_ == "backward_data":
        dy_d = conv_out_shape(in_sp, kernel, stride, dilation, pad_lo, pad_hi)[0]
        reach = d * (kernel[0] - 1)
        span = data_span(dy_d, reach - lo, in_sp[0] + reach, s)
        return tile_tap_limits(n_n, in_sp, kernel, 1, d, span, rows)
    return np.empty(0, dtype=np.int64)


def kept_fraction(limits, period) -> float:
    """The share of the reduction the micro-tiles run under ``limits``
    (:func:`tile_tap_limits`; 1.0 when empty)."""
    if limits.size == 0:
        return 1.0
    lim = limits.reshape(-1, 2)
    return float((lim[:, 1] - lim[:, 0]).mean()) / max(1, int(period))


def _tile_tap_limits(n_n, out_sp, kernel, stride, dilation, span, rows):
    od_n, plane = out_sp[0], out_sp[1] * out_sp[2]
    k_d, khw = kernel[0], kernel[1] * kernel[2]
    win = np.array([tap_window(o, k_d, stride, dilation, span) for o in range(od_n)],
                   dtype=np.int64).reshape(od_n, 2) * khw
    if od_n == 0 or plane == 0 or n_n == 0 or (np.all(win[:, 0] == 0)
                                               and np.all(win[:, 1] == k_d * khw)):
        return np.empty(0, dtype=np.int64)
    r_n = n_n * od_n * plane
    r = np.minimum(np.arange(round_up(r_n, rows), dtype=np.int64), r_n - 1)
    od = (r // plane) % od_n
    lo = win[od, 0].reshape(-1, rows)
    hi = win[od, 1].reshape(-1, rows)
    # rows whose window is empty add nothing to the tile's union
    empty = lo >= hi
    lo = np.where(empty, np.iinfo(np.int64).max, lo).min(axis=1)
    hi = np.where(empty, -1, hi).max(axis=1)
    none = lo > hi
    lo[none] = 0
    hi[none] = 0
    if np.all(lo == 0) and np.all(hi == k_d * khw):
        return np.empty(0, dtype=np.int64)
    return np.stack([lo, hi], axis=1).reshape(-1)


def _grid_offsets(extents, steps):
    """``sum_a i_a * steps[a]`` over the 4-d grid ``i < extents``, flattened (C order, int64)."""
    (a, b, c, d), (sa, sb, sc, sd) = extents, steps
    off = (np.arange(a, dtype=np.int64)[:, None, None, None] * sa
           + np.arange(b, dtype=np.int64)[:, None, None] * sb
           + np.arange(c, dtype=np.int64)[:, None] * sc + np.arange(d, dtype=np.int64) * sd)
    return off.reshape(-1)


def position_offsets(n_n, sample, out_sp, stride, strides3):
    """Flat offsets ``n*sample + sum_a o_a*stride_a*strides3_a`` of every output position."""
    return _grid_offsets((n_n,) + tuple(out_sp),
                         (sample,) + tuple(s * t for s, t in zip(stride, strides3)))


def tap_offsets(cg, chan, kernel, dilation, strides3):
    """Flat offsets ``ci*chan + sum_a k_a*dilation_a*strides3_a`` over ``(ci, kd, kh, kw)``."""
    return _grid_offsets((cg,) + tuple(kernel),
                         (chan,) + tuple(d * t for d, t in zip(dilation, strides3)))


def gather_offsets(xp, kernel, out_sp, stride, dilation, groups):
    """``(positions, taps, chan)`` for the padded operand ``xp`` ``(N, C, *spatial)``
    (C-contiguous): :func:`position_offsets` of the output positions ``out_sp`` (every sample),
    :func:`tap_offsets` of one group's ``(C // groups, *kernel)`` taps and ``chan``, the
    elements of one channel (a group ``g`` adds ``g * C // groups * chan`` to the taps).
    The tables depend on the shapes only and are cached per problem (a training step asks
    for the same few at every step): callers must not write to them (they stay writeable
    arrays, so the Numba kernels see the one array type they were compiled for)."""
    key = (tuple(int(v) for v in xp.shape), tuple(int(v) for v in kernel),
           tuple(int(v) for v in out_sp), tuple(int(v) for v in stride),
           tuple(int(v) for v in dilation), int(groups))
    return _memo(_OFFSETS, key, _gather_offsets)


_OFFSETS: dict = {}
_OFFSETS_MAX = 256  # problems whose tables are kept (a network has a few per layer)


def _memo(cache: dict, key: tuple, make):
    """``make(*key)``, kept in ``cache`` (emptied when it holds :data:`_OFFSETS_MAX`
    problems)."""
    hit = cache.get(key)
    if hit is None:
        if len(cache) >= _OFFSETS_MAX:
            cache.clear()
        hit = cache[key] = make(*key)
    return hit


def _gather_offsets(shape, kernel, out_sp, stride, dilation, groups):
    n_n, cin = shape[:2]
    sp = shape[2:]
    strides3 = (sp[1] * sp[2], sp[2], 1)
    chan = sp[0] * sp[1] * sp[2]
    pos = position_offsets(n_n, cin * chan, out_sp, stride, strides3)
    taps = tap_offsets(cin // groups, chan, kernel, dilation, strides3)
    return pos, taps, chan


def shifted_offsets(off, shift: int, multiple: int):
    """``padded_offsets(off + shift, multiple)`` of a table that lives on (one of
    :func:`gather_offsets`'s or :func:`arange_offsets`'s), kept per ``(table, shift,
    multiple)`` so that a steady step makes no array here (the entry holds ``off``, so its id
    names it while kept).  Callers must not write to the result."""
    key = (id(off), int(shift), int(multiple))
    hit = _SHIFTED.get(key)
    if hit is None:
        if len(_SHIFTED) >= _OFFSETS_MAX:
            _SHIFTED.clear()
        hit = _SHIFTED[key] = (off, padded_offsets(off + shift if shift else off, multiple))
    return hit[1]


_SHIFTED: dict = {}


def arange_offsets(count: int, step: int, start: int = 0, reverse: bool = False):
    """``start + step * arange(count)`` (int64; ``reverse``: of the reversed range), kept per
    arguments like :func:`gather_offsets`' tables (callers must not write to it)."""
    return _memo(_ARANGES, (int(count), int(step), int(start), bool(reverse)), _arange)


def _arange(count, step, start, reverse):
    r = np.arange(count, dtype=np.int64)
    return start + step * (r[::-1].copy() if reverse else r)


_ARANGES: dict = {}


def padded_offsets(off, multiple):
    """``off`` extended to a multiple of ``multiple`` entries (micro-tile rows or lanes) by
    repeating its last entry (the padding rows/lanes read real data and are dropped)."""
    n = off.size
    pad = (-n) % multiple
    if pad:
        off = np.concatenate([off, np.full(pad, off[-1], dtype=np.int64)])
    return off


def shapes_supported(pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi, groups,
                     dtype) -> bool:
    """Whether the direct kernels run the pass for these shapes (float32/float64, 5-d shapes
    whose groups divide the channels, an input no shorter than the dilated kernel)."""
    if pass_ not in ("forward", "backward_data", "backward_filter"):
        return False
    if np.dtype(dtype) not in (np.float32, np.float64):
        return False
    try:
        check_shapes(x_shape, w_shape, groups)
        conv_out_shape(tuple(x_shape[2:]), tuple(w_shape[2:]), stride, dilation, pad_lo,
                       pad_hi)
    except ValueError:
        return False
    return True


def unpadded_1x1(kernel, pad_lo, pad_hi) -> bool:
    """A 1x1x1 kernel with zero padding on every side (what ``gemm1x1`` takes)."""
    return (tuple(int(k) for k in kernel) == (1, 1, 1)
            and all(int(v) == 0 for v in tuple(pad_lo) + tuple(pad_hi)))


def round_up(v: int, m: int) -> int:
    """The smallest multiple of ``m`` that is ``>= v``."""
    return -(-v // m) * m


def gemm_extents(pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi, groups,
                 weights_on_rows: bool):
    """``(lane_items, row_items, reduction, zero_inserted)`` of one group's gathered GEMM:
    what the ``C`` lanes, the micro-tile rows and the reduction run over (``weights_on_rows``:
    the weight-broadcast roles), and the work factor of a zero-inserted ``dy`` (backward data
    with stride > 1)."""
    n_n, cin = int(x_shape[0]), int(x_shape[1])
    cout = int(w_shape[0])
    kernel = tuple(int(k) for k in w_shape[2:])
    kk = int(np.prod(kernel))
    in_sp = tuple(int(v) for v in x_shape[2:])
    p_n = n_n * int(np.prod(conv_out_shape(in_sp, kernel, stride, dilation, pad_lo, pad_hi)))
    i_n = n_n * int(np.prod(in_sp))
    cg, cog = cin // groups, cout // groups
    zero_ins = 1
    if pass_ == "forward":
        chans, pos, red = cog, p_n, cg * kk
    elif pass_ == "backward_data":
        chans, pos, red = cg, i_n, cog * kk
        zero_ins = int(np.prod([max(1, int(s)) for s in stride]))
    else:
        # backward filter: the direct kernel has output channels on the lanes and taps on the
        # rows; the weight-broadcast one taps on the lanes, channels on the rows
        return ((cg * kk, cog) if weights_on_rows else (cog, cg * kk)) + (p_n, 1)
    return ((pos, chans) if weights_on_rows else (chans, pos)) + (red, zero_ins)


def padded_elements(pass_, x_shape, w_shape, dilation, pad_lo, pad_hi) -> int:
    """Elements of the pass's padded operand: the input padded by ``pad_lo``/``pad_hi``
    (forward, backward filter) or, for backward data, ``dy`` zero-inserted into the input
    extent widened by ``dilation*(k-1)``."""
    n_n, in_sp = int(x_shape[0]), tuple(int(v) for v in x_shape[2:])
    if pass_ == "backward_data":
        kernel = tuple(int(k) for k in w_shape[2:])
        return n_n * int(w_shape[0]) * int(np.prod([n + d * (k - 1) for n, k, d in
                                                     zip(in_sp, kernel, dilation)]))
    return n_n * int(x_shape[1]) * int(np.prod([n + lo + hi for n, lo, hi in
                                                zip(in_sp, pad_lo, pad_hi)]))
