"""The gathered-GEMM drivers of the direct convolutions: :class:`Direct` (output channels on
the lanes) and :class:`WeightBroadcast` (output positions on the lanes), each with its
forward, backward-data and backward-filter pass (per rank, no MPI).

Contract of every pass: the one of :mod:`..conv_im2col` (``forward`` as
``conv_forward``, ``backward_data`` as ``conv_backward_data``, ``backward_filter`` as
``conv_backward_filter``): layout ``(N, C, D, H, W)``, every stride, dilation, asymmetric
(also negative: cropping) zero padding and groups count, float32 and float64, any N (empty
batches too).  A pass pads its operand into scratch (:func:`.geometry.embed`; a window of a
zero-padded store, a convolution's halo'd input, is read in place instead), packs one
operand into lane-major blocks (:mod:`.packing`), runs the register-blocked micro-kernel
(:mod:`.microkernels`) over offset tables (:mod:`.geometry`) and unpacks the blocked result.
The planner's interface (``supports``, ``workspace_bytes``, ``estimate_seconds``) sits next
to the passes.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numba
import numpy as np

from .....core import buffer_pool as _pool

from ..conv_operands import data_operands, filter_operands, forward_operands
from .cost import modelled_seconds
from .geometry import (_memo, arange_offsets, embed, gather_offsets, gemm_extents,
                       padded_elements, pass_tap_limits, round_up, scratch, shapes_supported,
                       shifted_offsets)
from .packing import pack, pack_columns, pack_flipped, unpack

__all__ = ["Direct", "WeightBroadcast"]

_NO_LIMITS = np.empty(0, dtype=np.int64)   # every micro-tile runs the whole reduction
_NO_DST = {np.dtype(t): np.empty((0, 0, 1), dtype=t) for t in (np.float32, np.float64)}


def _flipped_taps(cg, cog, kk):
    """Reduction offsets of backward data's flipped, channel-swapped kernel (one group)."""
    return (np.arange(cg, dtype=np.int64)[:, None] * (cog * kk)
            + (kk - 1 - np.arange(kk, dtype=np.int64))).reshape(-1)


def _sample_positions(n_n, stride, p_n):
    """``n * stride + p`` for every sample ``n`` and position ``p``, flat."""
    return (np.arange(n_n, dtype=np.int64)[:, None] * stride
            + np.arange(p_n, dtype=np.int64)).reshape(-1)


_FLIPPED: dict = {}
_SAMPLES: dict = {}


def unblock_lanes(out, dst):
    """``dst[n, m, p] = out[q // C, m, q % C]`` with ``q = n*P + p``: the blocked result of
    the weight-broadcast GEMM (``out`` ``(ceil(N*P / C), >= M, C)``, the positions on the
    lanes; rows ``>= M`` and lanes ``>= N*P`` are padding, not read) into ``dst`` ``(N, M,
    P)`` (any strides), each element copied once, by NumPy assignments through views that
    only split axes (never a copy): one when ``C`` divides ``P`` (a sample is whole blocks)
    or ``P`` divides ``C`` (a block is whole samples; plus one for a last, partly filled
    block), else up to three per sample (its head, whole and tail blocks)."""
    n_n, m_n, p_n = dst.shape
    n_pb, c = out.shape[0], out.shape[2]
    src = out[:, :m_n]
    if n_n == 0 or m_n == 0 or p_n == 0:
        return
    if p_n % c == 0:
        k = p_n // c
        np.copyto(dst.reshape(n_n, m_n, k, c),
                  src.reshape(n_n, k, m_n, c).transpose(0, 2, 1, 3))
        return
    if c % p_n == 0:
        k = c // p_n
        blocks = src.reshape(n_pb, m_n, k, p_n).transpose(0, 2, 1, 3)   # (n_pb, k, M, P)
        full = n_n // k
        if full:
            np.copyto(dst[:full * k].reshape(full, k, m_n, p_n), blocks[:full])
        if n_n > full * k:
            np.copyto(dst[full * k:], blocks[full, :n_n - full * k])
        return
    for n in range(n_n):
        d, q0, p = dst[n], n * p_n, 0
        l0 = q0 % c
        if l0:                                     # the rest of a block begun by sample n-1
            p = min(c - l0, p_n)
            np.copyto(d[:, :p], src[q0 // c, :, l0:l0 + p])
        nf = (p_n - p) // c
        if nf:                                     # whole blocks
            b = (q0 + p) // c
            np.copyto(d[:, p:p + nf * c].reshape(m_n, nf, c), src[b:b + nf].transpose(1, 0, 2))
            p += nf * c
        if p < p_n:                                # the start of a block that sample n+1 ends
            np.copyto(d[:, p:], src[(q0 + p) // c, :, :p_n - p])


class _FilterOperands(NamedTuple):
    """Backward filter's operands, checked and with the input padded (:func:`_filter_operands`)."""

    xf: np.ndarray      # the padded input, flat
    dy: np.ndarray      # (N, Cout, *out_spatial), C-contiguous
    dtype: np.dtype
    kernel: tuple
    n_n: int
    cg: int             # input channels per group
    cog: int            # output channels per group
    kk: int             # taps of the kernel
    p_n: int            # output positions per sample
    pos: np.ndarray     # flat offsets of the output positions' windows in xf
    taps: np.ndarray    # flat offsets of one group's taps (ci, kd, kh, kw)
    chan: int           # elements of one padded channel


def _filter_operands(x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups):
    """``(dw, None)`` with the all-zero filter gradient when there is nothing to reduce (an
    empty operand), else ``(None, f)`` with the :class:`_FilterOperands` ``f``."""
    x, dy, dtype, kernel, (stride, dilation, pad_lo, pad_hi), out_sp = filter_operands(
        x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups, strided_x=True)  # (embedded)
    n_n, cin = x.shape[:2]
    cout = dy.shape[1]
    cg, cog = cin // groups, cout // groups
    kk = math.prod(int(k) for k in kernel)
    if dy.size == 0 or x.size == 0 or cout * cg * kk == 0:
        return np.zeros((cout, cg) + kernel, dtype=dtype), None
    size = tuple(n + lo + hi for n, lo, hi in zip(x.shape[2:], pad_lo, pad_hi))
    xp = embed(x, pad_lo, size)
    pos, taps, chan = gather_offsets(xp, kernel, out_sp, stride, dilation, groups)
    return None, _FilterOperands(xp.reshape(-1), dy, dtype, kernel, n_n, cg, cog, kk,
                                 math.prod(int(n) for n in out_sp), pos, taps, chan)


class Direct:
    """One register-blocking variant (see the package docstring).  ``rows`` x ``vecs`` is
    the micro-tile, ``runner`` its micro-kernel driver (:mod:`.microkernels`); every stride,
    dilation, zero padding (asymmetric; negative crops) and groups count is supported, float32
    and float64."""

    weights_on_rows = False   # the lanes hold channels (WeightBroadcast: positions)

    def __init__(self, name, rows, vecs, runner):
        self.name, self.rows, self.vecs, self._run = name, rows, vecs, runner

    def __repr__(self):
        return f"<conv_direct {self.name}: {self.rows} rows x {self.vecs} vectors>"

    # ---- the gathered GEMM
    def _gemm(self, xf, a_pk, row_off, red_off, dtype, dst=None, limits=None, period=1):
        """``(n_cob, rows_padded, C)`` result of the gathered GEMM (package docstring).  With
        ``dst`` (``(N, M, Q)``, any strides) each finished super-block of tiles is also
        written to ``dst[n, m, q] = out[m // C, n*Q + q, m % C]`` while it is in cache.
        ``limits`` (:func:`.geometry.tile_tap_limits`): per row tile, the window ``[lo, hi)``
        of each ``period`` reduction steps that it runs (the others read only zero padding
        and are skipped); None or empty: every step."""
        n_cob, c = a_pk.shape[0], a_pk.shape[2]
        row_off = shifted_offsets(row_off, 0, self.rows)   # (row_off is a kept table)
        n_rt = row_off.size // self.rows
        out = scratch("out", (n_cob, row_off.size, c), dtype)
        n_tiles = n_cob * n_rt
        n_chunks = max(1, min(numba.get_num_threads(), n_tiles))
        n_real = row_off.size
        if dst is None:
            dst = _NO_DST.get(np.dtype(dtype))
            if dst is None:
                dst = np.empty((0, 0, 1), dtype=dtype)
        else:
            n_real = dst.shape[0] * dst.shape[2]
        if limits is None:
            limits = _NO_LIMITS
        self._run(xf, a_pk.reshape(-1), out.reshape(-1), row_off, red_off, n_rt, n_tiles,
                  n_chunks, dst, n_real, max(1, int(period)), limits)
        return out

    def block_width(self, dtype):
        """``C``: lanes of one micro-tile row, ``vecs`` vectors of 512 bits."""
        return self.vecs * 64 // np.dtype(dtype).itemsize

    # ---- the planner's interface
    def estimate_seconds(self, problem) -> float:
        """Modelled seconds of a :class:`disttensor.ops.local.microbatch.ConvProblem` (the
        planner's heuristic mode): padded lanes x padded rows x reduction at the
        register-blocked rate, plus moving the operands twice (padding and packing)."""
        return modelled_seconds(self, problem)

    def supports(self, pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi, groups,
                 dtype) -> bool:
        """Whether this variant runs the pass for these shapes (float32/float64, 5-d shapes
        whose groups divide the channels, an input no shorter than the dilated kernel)."""
        return shapes_supported(pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi,
                                groups, dtype)

    def workspace_bytes(self, pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi,
                        groups, dtype) -> int:
        """Temporary bytes of one call (x_shape's N is the micro-batch): padded operand,
        packed ``A``, blocked output and offset tables."""
        lanes, rows, red, _ = gemm_extents(pass_, x_shape, w_shape, stride, dilation, pad_lo,
                                           pad_hi, groups, False)
        padded = padded_elements(pass_, x_shape, w_shape, dilation, pad_lo, pad_hi)
        blocks = round_up(lanes, self.block_width(dtype))
        extra = int(x_shape[1]) * red if pass_ == "backward_data" else 0   # Cin * Cout/g * kk
        out_block = blocks * round_up(max(rows, 1), self.rows)
        return int((padded + blocks * red + out_block + extra) * np.dtype(dtype).itemsize
                   + 8 * (rows + self.rows + red))

    # ---- the passes
    def forward(self, x, w, stride, dilation, pad_lo, pad_hi, groups=1):
        """``y[n, co] = sum_{ci in group(co), k} w[co, ci, k] * xpad[n, ci, o*stride +
        k*dilation]`` (the contract of :func:`..conv_im2col.conv_forward`)."""
        x, w, dtype, (stride, dilation, pad_lo, pad_hi), out_sp = forward_operands(
            x, w, stride, dilation, pad_lo, pad_hi, groups, strided_x=True)  # (embedded)
        n_n = x.shape[0]
        cout = w.shape[0]
        y = _pool.empty((n_n, cout) + out_sp, np.dtype(dtype))   # (recycled when steady)
        if y.size == 0:
            return y
        if x.size == 0 or w.size == 0:
            y[...] = 0
            return y
        size = tuple(n + lo + hi for n, lo, hi in zip(x.shape[2:], pad_lo, pad_hi))
        xp = embed(x, pad_lo, size)
        self._conv(xp, w, y, stride, dilation, groups,
                   limits=None if self.weights_on_rows else pass_tap_limits(
                       "forward", x.shape, w.shape, stride, dilation, pad_lo, pad_hi,
                       self.rows))
        return y

    def _conv(self, xp, w, y, stride, dilation, groups, transposed=False, limits=None):
        """``y = correlate(xp, w)`` over the already padded ``xp`` (no padding left).
        ``transposed``: use the flipped kernel with its channel axes swapped per group
        (``w`` is then the forward convolution's weight), for the backward data pass.
        ``limits`` (:func:`.geometry.pass_tap_limits`): each micro-tile skips the depth taps
        that read only zero padding, which a halo'd block's boundary planes, and the first
        and last planes of any padded convolution, would otherwise spend a third of their
        work on."""
        dtype = xp.dtype
        n_n, cin = xp.shape[:2]
        cout = y.shape[1]
        cg, cog = cin // groups, cout // groups
        p_n = math.prod(y.shape[2:])
        c = self.block_width(dtype)
        n_cob = -(-cog // c)
        rows, taps, chan = gather_offsets(xp, w.shape[2:], y.shape[2:], stride, dilation,
                                          groups)
        kk = taps.size
        xf = xp.reshape(-1)
        yv = y.reshape(n_n, groups, cog, p_n)
        period = math.prod(w.shape[2:])
        for g in range(groups):
            a_pk = scratch("a", (n_cob, kk, c), dtype)
            if transposed:   # w is (groups*cg, cog, *kernel) here
                pack_flipped(w[g * cg:(g + 1) * cg].reshape(cg, cog, -1), a_pk)
            else:
                pack(w[g * cog:(g + 1) * cog].reshape(1, cog, kk), a_pk, cog)
            # a separate blocked transpose: written from inside the kernel, the output's
            # channel rows (often a power-of-two stride apart) thrash L1's sets
            unpack(self._gemm(xf, a_pk, rows, shifted_offsets(taps, g * cg * chan, 1), dtype,
                              limits=limits,
                              period=period), yv[:, g])

    def backward_data(self, dy, w, in_spatial, stride, dilation, pad_lo, pad_hi, groups=1):
        """Gradient of ``sum(forward(x, w) * dy)`` with respect to ``x`` (N, Cin,
        *in_spatial); the contract of :func:`..conv_im2col.conv_backward_data`."""
        dy, w, dtype, in_spatial, (stride, dilation, pad_lo, pad_hi) = data_operands(
            dy, w, in_spatial, stride, dilation, pad_lo, pad_hi, groups)
        n_n = dy.shape[0]
        cin = w.shape[1] * groups
        kernel = w.shape[2:]
        dx = _pool.empty((n_n, cin) + in_spatial, np.dtype(dtype))   # (recycled when steady)
        if dx.size == 0:
            return dx
        if dy.size == 0 or w.size == 0:
            dx[...] = 0
            return dx
        # dx[i] = sum_k w[k] dy[(i + lo - k*d) / s]: a stride-1 correlation of the
        # zero-inserted, re-padded dy with the flipped kernel, channels swapped per group
        size = tuple(n + d * (k - 1) for n, k, d in zip(in_spatial, kernel, dilation))
        lo = tuple(d * (k - 1) - p for k, d, p in zip(kernel, dilation, pad_lo))
        dyp = embed(dy, lo, size, stride)
        x_shape = (n_n, cin) + in_spatial
        self._conv(dyp, w, dx, (1, 1, 1), dilation, groups, transposed=True,
                   limits=None if self.weights_on_rows else pass_tap_limits(
                       "backward_data", x_shape, w.shape, stride, dilation, pad_lo, pad_hi,
                       self.rows))   # (the weight-broadcast variants skip no taps)
        return dx

    def backward_filter(self, x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups=1):
        """Gradient of ``sum(forward(x, w) * dy)`` with respect to ``w`` (Cout, Cin //
        groups, *kernel); the contract of :func:`..conv_im2col.conv_backward_filter`."""
        zero, f = _filter_operands(x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups)
        if f is None:
            return zero
        cog, cg = f.cog, f.cg
        dw = _pool.empty((groups * cog, cg) + f.kernel, np.dtype(f.dtype))  # all written below
        c = self.block_width(f.dtype)
        n_cob = -(-cog // c)
        dyv = f.dy.reshape(f.n_n, groups * cog, f.p_n)
        dwv = dw.reshape(groups, cog, cg * f.kk)
        for g in range(groups):
            a_pk = scratch("a", (n_cob, f.n_n * f.p_n, c), f.dtype)
            pack(dyv[:, g * cog:(g + 1) * cog], a_pk, cog)
            self._gemm(f.xf, a_pk, shifted_offsets(f.taps, g * cg * f.chan, 1), f.pos, f.dtype,
                       dst=dwv[g:g + 1])
        return dw


class WeightBroadcast(Direct):
    """The gathered GEMM with the roles swapped: the lanes hold ``C`` output positions, the
    rows are output channels and the weights are broadcast straight from ``w`` (no weight
    packing at all; backward data reads the flipped, channel-swapped kernel through its
    offset table), while the input is packed as a position-major column matrix
    (``J x positions``).  Pays where the weights outweigh the columns: layers on few positions
    (4^3, and 8^3 with batch) and many channels.  Backward filter likewise puts the weight
    taps on the lanes and broadcasts ``dy``.  Supports what the direct variants support."""

    weights_on_rows = True

    def __repr__(self):
        return f"<conv_direct {self.name}: {self.rows} channels x {self.vecs} vectors>"

    def workspace_bytes(self, pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi,
                        groups, dtype) -> int:
        """Padded operand, the ``(J, positions)`` columns of one group, the blocked output
        (unpacked straight into the result) and the offset tables."""
        lanes, rows, red, _ = gemm_extents(pass_, x_shape, w_shape, stride, dilation, pad_lo,
                                           pad_hi, groups, True)
        padded = padded_elements(pass_, x_shape, w_shape, dilation, pad_lo, pad_hi)
        q_pad = round_up(lanes, self.block_width(dtype))
        rows_pad = round_up(rows, self.rows)
        return int((padded + red * q_pad + rows_pad * q_pad) * np.dtype(dtype).itemsize
                   + 8 * (q_pad + red + rows_pad))

    def _conv(self, xp, w, y, stride, dilation, groups, transposed=False, limits=None):
        """:meth:`Direct._conv` with the positions on the lanes (``limits`` is not used: a
        lane block mixes planes, so no tap can be skipped for all of it)."""
        dtype = xp.dtype
        n_n, cin = xp.shape[:2]
        cout = y.shape[1]
        kk = math.prod(w.shape[2:])
        cg, cog = cin // groups, cout // groups
        p_n = math.prod(y.shape[2:])
        c = self.block_width(dtype)
        q_n = n_n * p_n
        n_pb = -(-q_n // c)
        pos, taps, chan = gather_offsets(xp, w.shape[2:], y.shape[2:], stride, dilation,
                                         groups)
        pos = shifted_offsets(pos, 0, c)
        wf = w.reshape(-1)
        xf = xp.reshape(-1)
        yv = y.reshape(n_n, groups, cog, p_n)
        for g in range(groups):   # (every offset table is kept: a steady call makes none)
            if transposed:   # w is (groups*cg, cog, *kernel): y channel co reads w[:, co, ::-1]
                rows = arange_offsets(cog, kk, g * cg * cog * kk)
                red = _memo(_FLIPPED, (cg, cog, kk), _flipped_taps)
            else:
                rows = arange_offsets(cog, cg * kk, g * cog * cg * kk)
                red = arange_offsets(cg * kk, 1)
            a_pk = scratch("a", (n_pb, cg * kk, c), dtype)
            pack_columns(xf, pos, shifted_offsets(taps, g * cg * chan, 1), a_pk)
            out = self._gemm(wf, a_pk, rows, red, dtype)     # (n_pb, cog padded, c)
            unblock_lanes(out, yv[:, g])    # one copy, straight into y

    def backward_filter(self, x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups=1):
        """:meth:`Direct.backward_filter` with the weight taps ``(ci, k)`` on the lanes:
        ``dw[co, j] = sum_(n,p) dy[n, co, p] * cols[j, (n,p)]``, ``dy`` broadcast unpacked and
        the columns packed tap-major, so the result comes out in ``dw``'s own layout."""
        zero, f = _filter_operands(x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups)
        if f is None:
            return zero
        cog, cg, n_n, p_n = f.cog, f.cg, f.n_n, f.p_n
        cout = groups * cog
        c = self.block_width(f.dtype)
        j_n = cg * f.kk
        n_jb = -(-j_n // c)
        red = _memo(_SAMPLES, (n_n, cout * p_n, p_n), _sample_positions)
        dyf = f.dy.reshape(-1)
        dw = _pool.empty((groups, cog, j_n), np.dtype(f.dtype))   # (recycled when steady)
        for g in range(groups):
            a_pk = scratch("a", (n_jb, n_n * p_n, c), f.dtype)
            pack_columns(f.xf, shifted_offsets(f.taps, g * cg * f.chan, c), f.pos, a_pk)
            rows = arange_offsets(cog, p_n, g * cog * p_n)
            out = self._gemm(dyf, a_pk, rows, red, f.dtype)     # (n_jb, cog padded, c)
            unblock_lanes(out, dw[g:g + 1])
        return dw.reshape((cout, cg) + f.kernel)
