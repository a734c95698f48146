"""CPU conv3d without an im2col matrix: register-blocked implicit GEMM on 512-bit vectors.

Same contract as :mod:`.cpu_conv` (``conv_forward``, ``conv_backward_data``,
``conv_backward_filter``): layout ``(N, C, D, H, W)``; ``stride``, ``dilation``, ``pad_lo``,
``pad_hi`` are 3-tuples of ints, zero padding, possibly asymmetric; cross-correlation with
``w`` of shape ``(Cout, Cin // groups, kD, kH, kW)``; output extent per axis
``(n + lo + hi - dilation*(k-1) - 1) // stride + 1``; float32 or float64, result in the
input's dtype.

The one kernel
--------------
All three passes are the same "gathered GEMM"::

    out[r, co] = sum_j  X[row_off[r] + red_off[j]] * A[j, co]

``X`` is a flat, zero-padded array, ``row_off`` / ``red_off`` are int64 offset tables and
``A`` is packed lane-major, ``(ceil(Cout / C), J, C)`` with ``C`` output channels per block
(zero-padded).  A micro-tile is ``R`` rows x ``C`` channels held in ``R * V`` vector registers
(``V`` vectors of 16 float32 / 8 float64 lanes, ``C = V * lanes``): per reduction step it
loads ``V`` vectors of ``A``, broadcasts ``R`` scalars of ``X`` and issues ``R * V`` fused
multiply-adds, never touching the accumulators in memory.  The vector type and its
load/store/broadcast/fma are small Numba intrinsics (LLVM ``<16 x float>`` / ``<8 x
double>``), so LLVM emits AVX-512 where the CPU has it (and splits the vectors into AVX2/SSE
halves where it has not: still correct, slower).  The reduction is cut in blocks of
``_JB`` steps so that the block of ``A`` stays in L1/L2 while a thread sweeps its tiles;
threads take contiguous ranges of tiles (``parallel=True`` over ``numba.get_num_threads()``
chunks), so no two threads write one output.

* forward: rows are output positions ``(n, od, oh, ow)`` (offset into the padded input of
  the group), the reduction is ``(ci, kd, kh, kw)``, ``A`` the packed weights.
* backward data: the forward kernel on ``dy`` zero-inserted by the stride and padded by
  ``dilation*(k-1) - pad_lo`` (cropped where negative), with the kernel flipped and its
  channel axes swapped (a stride-1 correlation over the ``(s-1)/s`` zeros when stride > 1:
  correct, but ``s^3`` more work; the im2col kernels of :mod:`.cpu_conv` are the better
  choice there).
* backward filter: rows are ``(ci, kd, kh, kw)``, the reduction is over ``(n, od, oh, ow)``
  and ``A`` is ``dy`` packed position-major.

Variants (``ALGORITHMS``; each has ``supports``, ``workspace_bytes``, ``forward``,
``backward_data``, ``backward_filter``):

* ``"direct4x4"``: R=4 rows x V=4 vectors (64 float32 / 32 float64 output channels per block,
  16 accumulators); for 64 or more output channels (of the pass: Cin for backward data).
* ``"direct8x2"``: R=8 x V=2 (32 float32 / 16 float64 channels); for 32-channel passes.
  Both direct variants take every stride, dilation, asymmetric (also negative: cropping) zero
  padding and groups count, float32 and float64, any N (empty batches too).  Passes with few
  channels (e.g. backward data of a 1- or 4-channel first layer) waste lanes: the im2col
  kernels of :mod:`.cpu_conv` are faster there.
* ``"gemm1x1"``: 1x1x1 kernels without padding (any stride, groups) as plain BLAS matrix
  products; for the narrow 1x1 segmentation head.

Workspace (:meth:`_Direct.workspace_bytes`): the padded input (or zero-inserted ``dy``), the
packed ``A``, the ``(rows, C)``-blocked output and the offset tables; the first three live in
per-thread scratch buffers that are kept and reused between calls (fresh large arrays would
pay their page faults on every call; :func:`release_scratch` drops them).  A 6-row x 4-vector
tile (24 accumulators) was tried and measured no faster than these 16-accumulator ones; a
W-vectorised direct convolution with no packing at all (lanes = consecutive outputs of a row,
loaded unaligned from the padded input, weights broadcast in place) reached only ~140 GFLOP/s
per core against ~200 here (its loads straddle cache lines), and was dropped.

On the 2-core AMD Zen 5 development machine (AVX-512) the micro-kernel runs at ~160-215
GFLOP/s per core in the large layers, about oneDNN's direct convolution; NumPy's OpenBLAS is
pinned to its AVX2 Haswell kernels there (``OPENBLAS_CORETYPE=Haswell``), which caps the
im2col + GEMM path at ~170 GFLOP/s on both cores.
"""
from __future__ import annotations

import threading

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

from ..conv_im2col import (check_shapes, conv_out_shape, data_operands, filter_operands,
                       forward_operands)

__all__ = ["ALGORITHMS", "pick", "release_scratch", "direct_forward", "direct_backward_data",
           "direct_backward_filter"]


# -- a 512-bit vector type for Numba -----------------------------------------------------------
class _Vec(types.Type):
    """A 512-bit SIMD value of ``dtype`` lanes (16 float32 or 8 float64)."""

    def __init__(self, dtype):
        self.dtype = dtype
        self.lanes = 512 // dtype.bitwidth
        super().__init__(name=f"Vec512({dtype})")


@register_model(_Vec)
class _VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, ir.VectorType(
            dmm.lookup(fe_type.dtype).get_value_type(), fe_type.lanes))


def _elem_ptr(context, builder, aty, arr, idxty, idx):
    a = context.make_array(aty)(context, builder, arr)
    return builder.gep(a.data, [context.cast(builder, idx, idxty, types.intp)])


@intrinsic
def _vload(typingctx, arr, idx):
    """``arr[idx : idx + lanes]`` as a vector (1-d contiguous ``arr``; no bounds check)."""
    vt = _Vec(arr.dtype)

    def codegen(context, builder, sig, args):
        vty = context.get_value_type(vt)
        p = _elem_ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        return builder.load(builder.bitcast(p, vty.as_pointer()),
                            align=arr.dtype.bitwidth // 8)
    return vt(arr, idx), codegen


@intrinsic
def _vstore(typingctx, arr, idx, v):
    """``arr[idx : idx + lanes] = v`` (no bounds check)."""
    def codegen(context, builder, sig, args):
        vty = context.get_value_type(sig.args[2])
        p = _elem_ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        builder.store(args[2], builder.bitcast(p, vty.as_pointer()),
                      align=arr.dtype.bitwidth // 8)
        return context.get_dummy_value()
    return types.none(arr, idx, v), codegen


@intrinsic
def _vzero(typingctx, arr):
    """A zero vector of ``arr``'s dtype."""
    vt = _Vec(arr.dtype)

    def codegen(context, builder, sig, args):
        return ir.Constant(context.get_value_type(vt), None)
    return vt(arr), codegen


@intrinsic
def _vbcast(typingctx, arr, idx):
    """``arr[idx]`` in every lane."""
    vt = _Vec(arr.dtype)

    def codegen(context, builder, sig, args):
        vty = context.get_value_type(vt)
        p = _elem_ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        v = builder.insert_element(ir.Constant(vty, ir.Undefined), builder.load(p),
                                   ir.Constant(ir.IntType(32), 0))
        return builder.shuffle_vector(
            v, ir.Constant(vty, ir.Undefined),
            ir.Constant(ir.VectorType(ir.IntType(32), vt.lanes), [0] * vt.lanes))
    return vt(arr, idx), codegen


@intrinsic
def _vfma(typingctx, a, b, c):
    """``a * b + c`` lane by lane, fused (``llvm.fma``)."""
    def codegen(context, builder, sig, args):
        vt = sig.args[0]
        vty = context.get_value_type(vt)
        name = f"llvm.fma.v{vt.lanes}{'f32' if vt.dtype.bitwidth == 32 else 'f64'}"
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vty, [vty] * 3),
                                            name)
        return builder.call(fn, args)
    return a(a, b, c), codegen


@intrinsic
def _vadd(typingctx, a, b):
    def codegen(context, builder, sig, args):
        return builder.fadd(args[0], args[1])
    return a(a, b), codegen


# -- the micro-kernels -------------------------------------------------------------------------
_JB = 128  # reduction steps per block (A block: _JB * C * itemsize bytes, 32 KiB at C=64 f32)
_TB = 128  # tiles per super-block (its accumulators, 128 tiles * 16 vectors = 128 KiB, stay in L2)


@intrinsic
def _lanes(typingctx, arr):
    """Lanes of a 512-bit vector of ``arr``'s dtype, as a compile-time constant."""
    lanes = 512 // arr.dtype.bitwidth

    def codegen(context, builder, sig, args):
        return context.get_constant(types.intp, lanes)
    return types.intp(arr), codegen


@intrinsic
def _at(typingctx, arr, idx):
    """``arr[idx]`` without the negative-index wraparound and bounds logic."""
    def codegen(context, builder, sig, args):
        return builder.load(_elem_ptr(context, builder, sig.args[0], args[0], sig.args[1],
                                      args[1]))
    return arr.dtype(arr, idx), codegen


@njit(cache=True)
def _unpack_tiles(out, dst, n_rt, rows, c, t0, t1, n_real):
    """``dst[n, m, q] = out[m // C, n*Q + q, m % C]`` for the rows of tiles ``[t0, t1)``
    (rows ``>= n_real`` and channels ``>= dst.shape[1]`` are padding and skipped)."""
    m_n, q_n = dst.shape[1], dst.shape[2]
    rp = rows * n_rt
    for t in range(t0, t1):
        cob = t // n_rt
        r0 = (t - cob * n_rt) * rows
        ob = (cob * rp + r0) * c
        c_hi = min(c, m_n - cob * c)
        for rr in range(min(rows, n_real - r0)):
            r = r0 + rr
            n = r // q_n
            q = r - n * q_n
            for cc in range(c_hi):
                dst[n, cob * c + cc, q] = out[ob + rr * c + cc]


@njit(cache=True, fastmath=True)
def _tiles_4x4(xf, a, out, row_off, red_off, n_rt, t0, t1, dst, n_real):
    """Tiles ``[t0, t1)`` (tile ``t``: channel block ``t // n_rt``, rows ``4*(t % n_rt)`` +
    0..3) of ``out[cob, r, :] = sum_j xf[row_off[r] + red_off[j]] * a[cob, j, :]`` (flat
    arrays; ``out`` is ``(n_cob, 4*n_rt, 4*lanes)``, ``a`` is ``(n_cob, J, 4*lanes)``).
    Loop order: super-blocks of ``_TB`` tiles, reduction blocks of ``_JB`` steps, tiles; the
    accumulators of a tile live in registers for a reduction block.  Where ``dst`` is not
    empty, each finished super-block is also written to ``dst[n, m, q]`` (row ``r = n*Q +
    q < n_real``, channel ``m = cob*C + c``) by :func:`_unpack_tiles`."""
    ln = _lanes(xf)
    c = 4 * ln
    jn = red_off.size
    rp = 4 * n_rt
    for s0 in range(t0, t1, _TB):
        for j0 in range(0, jn, _JB):
            j1 = min(j0 + _JB, jn)
            for t in range(s0, min(s0 + _TB, t1)):
                cob = t // n_rt
                r0 = (t - cob * n_rt) * 4
                b0 = row_off[r0]
                b1 = row_off[r0 + 1]
                b2 = row_off[r0 + 2]
                b3 = row_off[r0 + 3]
                ob = (cob * rp + r0) * c
                if j0 == 0:
                    a00 = _vzero(xf); a01 = _vzero(xf); a02 = _vzero(xf)  # noqa: E702
                    a03 = _vzero(xf)
                    a10 = _vzero(xf); a11 = _vzero(xf); a12 = _vzero(xf)  # noqa: E702
                    a13 = _vzero(xf)
                    a20 = _vzero(xf); a21 = _vzero(xf); a22 = _vzero(xf)  # noqa: E702
                    a23 = _vzero(xf)
                    a30 = _vzero(xf); a31 = _vzero(xf); a32 = _vzero(xf)  # noqa: E702
                    a33 = _vzero(xf)
                else:
                    a00 = _vload(out, ob); a01 = _vload(out, ob + ln)  # noqa: E702
                    a02 = _vload(out, ob + 2 * ln); a03 = _vload(out, ob + 3 * ln)  # noqa: E702
                    a10 = _vload(out, ob + c); a11 = _vload(out, ob + c + ln)  # noqa: E702
                    a12 = _vload(out, ob + c + 2 * ln)
                    a13 = _vload(out, ob + c + 3 * ln)
                    a20 = _vload(out, ob + 2 * c); a21 = _vload(out, ob + 2 * c + ln)  # noqa: E702
                    a22 = _vload(out, ob + 2 * c + 2 * ln)
                    a23 = _vload(out, ob + 2 * c + 3 * ln)
                    a30 = _vload(out, ob + 3 * c); a31 = _vload(out, ob + 3 * c + ln)  # noqa: E702
                    a32 = _vload(out, ob + 3 * c + 2 * ln)
                    a33 = _vload(out, ob + 3 * c + 3 * ln)
                ao = (cob * jn + j0) * c
                for j in range(j0, j1):
                    o = _at(red_off, j)
                    w0 = _vload(a, ao); w1 = _vload(a, ao + ln)  # noqa: E702
                    w2 = _vload(a, ao + 2 * ln); w3 = _vload(a, ao + 3 * ln)  # noqa: E702
                    ao += c
                    x = _vbcast(xf, b0 + o)
                    a00 = _vfma(x, w0, a00); a01 = _vfma(x, w1, a01)  # noqa: E702
                    a02 = _vfma(x, w2, a02); a03 = _vfma(x, w3, a03)  # noqa: E702
                    x = _vbcast(xf, b1 + o)
                    a10 = _vfma(x, w0, a10); a11 = _vfma(x, w1, a11)  # noqa: E702
                    a12 = _vfma(x, w2, a12); a13 = _vfma(x, w3, a13)  # noqa: E702
                    x = _vbcast(xf, b2 + o)
                    a20 = _vfma(x, w0, a20); a21 = _vfma(x, w1, a21)  # noqa: E702
                    a22 = _vfma(x, w2, a22); a23 = _vfma(x, w3, a23)  # noqa: E702
                    x = _vbcast(xf, b3 + o)
                    a30 = _vfma(x, w0, a30); a31 = _vfma(x, w1, a31)  # noqa: E702
                    a32 = _vfma(x, w2, a32); a33 = _vfma(x, w3, a33)  # noqa: E702
                _vstore(out, ob, a00); _vstore(out, ob + ln, a01)  # noqa: E702
                _vstore(out, ob + 2 * ln, a02); _vstore(out, ob + 3 * ln, a03)  # noqa: E702
                _vstore(out, ob + c, a10); _vstore(out, ob + c + ln, a11)  # noqa: E702
                _vstore(out, ob + c + 2 * ln, a12)
                _vstore(out, ob + c + 3 * ln, a13)
                _vstore(out, ob + 2 * c, a20); _vstore(out, ob + 2 * c + ln, a21)  # noqa: E702
                _vstore(out, ob + 2 * c + 2 * ln, a22)
                _vstore(out, ob + 2 * c + 3 * ln, a23)
                _vstore(out, ob + 3 * c, a30); _vstore(out, ob + 3 * c + ln, a31)  # noqa: E702
                _vstore(out, ob + 3 * c + 2 * ln, a32)
                _vstore(out, ob + 3 * c + 3 * ln, a33)
        if dst.size:   # the finished super-block, still in cache, into dst[n, m, q]
            _unpack_tiles(out, dst, n_rt, 4, c, s0, min(s0 + _TB, t1), n_real)


@njit(cache=True, fastmath=True)
def _tiles_8x2(xf, a, out, row_off, red_off, n_rt, t0, t1, dst, n_real):
    """:func:`_tiles_4x4` with tiles of 8 rows x 2 vectors (``C = 2*lanes``)."""
    ln = _lanes(xf)
    c = 2 * ln
    jn = red_off.size
    rp = 8 * n_rt
    for s0 in range(t0, t1, _TB):
        for j0 in range(0, jn, _JB):
            j1 = min(j0 + _JB, jn)
            for t in range(s0, min(s0 + _TB, t1)):
                cob = t // n_rt
                r0 = (t - cob * n_rt) * 8
                b0 = row_off[r0]; b1 = row_off[r0 + 1]; b2 = row_off[r0 + 2]  # noqa: E702
                b3 = row_off[r0 + 3]; b4 = row_off[r0 + 4]; b5 = row_off[r0 + 5]  # noqa: E702
                b6 = row_off[r0 + 6]; b7 = row_off[r0 + 7]  # noqa: E702
                ob = (cob * rp + r0) * c
                if j0 == 0:
                    a00 = _vzero(xf); a01 = _vzero(xf); a10 = _vzero(xf)  # noqa: E702
                    a11 = _vzero(xf)
                    a20 = _vzero(xf); a21 = _vzero(xf); a30 = _vzero(xf)  # noqa: E702
                    a31 = _vzero(xf)
                    a40 = _vzero(xf); a41 = _vzero(xf); a50 = _vzero(xf)  # noqa: E702
                    a51 = _vzero(xf)
                    a60 = _vzero(xf); a61 = _vzero(xf); a70 = _vzero(xf)  # noqa: E702
                    a71 = _vzero(xf)
                else:
                    a00 = _vload(out, ob); a01 = _vload(out, ob + ln)  # noqa: E702
                    a10 = _vload(out, ob + c); a11 = _vload(out, ob + c + ln)  # noqa: E702
                    a20 = _vload(out, ob + 2 * c); a21 = _vload(out, ob + 2 * c + ln)  # noqa: E702
                    a30 = _vload(out, ob + 3 * c); a31 = _vload(out, ob + 3 * c + ln)  # noqa: E702
                    a40 = _vload(out, ob + 4 * c); a41 = _vload(out, ob + 4 * c + ln)  # noqa: E702
                    a50 = _vload(out, ob + 5 * c); a51 = _vload(out, ob + 5 * c + ln)  # noqa: E702
                    a60 = _vload(out, ob + 6 * c); a61 = _vload(out, ob + 6 * c + ln)  # noqa: E702
                    a70 = _vload(out, ob + 7 * c); a71 = _vload(out, ob + 7 * c + ln)  # noqa: E702
                ao = (cob * jn + j0) * c
                for j in range(j0, j1):
                    o = _at(red_off, j)
                    w0 = _vload(a, ao); w1 = _vload(a, ao + ln)  # noqa: E702
                    ao += c
                    x = _vbcast(xf, b0 + o); a00 = _vfma(x, w0, a00)  # noqa: E702
                    a01 = _vfma(x, w1, a01)
                    x = _vbcast(xf, b1 + o); a10 = _vfma(x, w0, a10)  # noqa: E702
                    a11 = _vfma(x, w1, a11)
                    x = _vbcast(xf, b2 + o); a20 = _vfma(x, w0, a20)  # noqa: E702
                    a21 = _vfma(x, w1, a21)
                    x = _vbcast(xf, b3 + o); a30 = _vfma(x, w0, a30)  # noqa: E702
                    a31 = _vfma(x, w1, a31)
                    x = _vbcast(xf, b4 + o); a40 = _vfma(x, w0, a40)  # noqa: E702
                    a41 = _vfma(x, w1, a41)
                    x = _vbcast(xf, b5 + o); a50 = _vfma(x, w0, a50)  # noqa: E702
                    a51 = _vfma(x, w1, a51)
                    x = _vbcast(xf, b6 + o); a60 = _vfma(x, w0, a60)  # noqa: E702
                    a61 = _vfma(x, w1, a61)
                    x = _vbcast(xf, b7 + o); a70 = _vfma(x, w0, a70)  # noqa: E702
                    a71 = _vfma(x, w1, a71)
                _vstore(out, ob, a00); _vstore(out, ob + ln, a01)  # noqa: E702
                _vstore(out, ob + c, a10); _vstore(out, ob + c + ln, a11)  # noqa: E702
                _vstore(out, ob + 2 * c, a20); _vstore(out, ob + 2 * c + ln, a21)  # noqa: E702
                _vstore(out, ob + 3 * c, a30); _vstore(out, ob + 3 * c + ln, a31)  # noqa: E702
                _vstore(out, ob + 4 * c, a40); _vstore(out, ob + 4 * c + ln, a41)  # noqa: E702
                _vstore(out, ob + 5 * c, a50); _vstore(out, ob + 5 * c + ln, a51)  # noqa: E702
                _vstore(out, ob + 6 * c, a60); _vstore(out, ob + 6 * c + ln, a61)  # noqa: E702
                _vstore(out, ob + 7 * c, a70); _vstore(out, ob + 7 * c + ln, a71)  # noqa: E702
        if dst.size:   # the finished super-block, still in cache, into dst[n, m, q]
            _unpack_tiles(out, dst, n_rt, 8, c, s0, min(s0 + _TB, t1), n_real)


@njit(cache=True, parallel=True)
def _run_4x4(xf, a, out, row_off, red_off, n_rt, n_tiles, n_chunks, dst, n_real):
    for i in prange(n_chunks):
        _tiles_4x4(xf, a, out, row_off, red_off, n_rt, i * n_tiles // n_chunks,
                   (i + 1) * n_tiles // n_chunks, dst, n_real)


@njit(cache=True, parallel=True)
def _run_8x2(xf, a, out, row_off, red_off, n_rt, n_tiles, n_chunks, dst, n_real):
    for i in prange(n_chunks):
        _tiles_8x2(xf, a, out, row_off, red_off, n_rt, i * n_tiles // n_chunks,
                   (i + 1) * n_tiles // n_chunks, dst, n_real)


# -- packing -----------------------------------------------------------------------------------
_QB = 64     # positions per block of the pack/unpack transposes (a 64 x C tile in L1)
_QCHUNK = 512  # positions per parallel work item of the transposes


@njit(cache=True, parallel=True)
def _pack(src, dst, m_n):
    """``dst[cob, n*Q + q, c] = src[n, cob*C + c, q]`` (0 where ``cob*C + c >= m_n``);
    ``src`` is ``(N, >= m_n, Q)`` (any strides), ``dst`` ``(n_cob, N*Q, C)``.  A blocked
    transpose: ``_QB`` positions x C channels go through an L1-resident tile, so that both
    sides are read and written in whole cache lines whatever the strides."""
    n_n, _, q_n = src.shape
    n_cob, _, c_n = dst.shape
    n_qc = (q_n + _QCHUNK - 1) // _QCHUNK
    for t in prange(n_cob * n_n * n_qc):
        cob = t // (n_n * n_qc)
        rem = t - cob * n_n * n_qc
        n = rem // n_qc
        qc0 = (rem - n * n_qc) * _QCHUNK
        qc1 = min(qc0 + _QCHUNK, q_n)
        c_hi = max(0, min(c_n, m_n - cob * c_n))
        tile = np.zeros((_QB, c_n), dtype=dst.dtype)   # columns >= c_hi stay 0
        for q0 in range(qc0, qc1, _QB):
            q1 = min(q0 + _QB, qc1)
            for c in range(c_hi):
                m = cob * c_n + c
                for q in range(q0, q1):
                    tile[q - q0, c] = src[n, m, q]
            for q in range(q0, q1):
                dst[cob, n * q_n + q, :] = tile[q - q0]


@njit(cache=True, parallel=True)
def _unpack(src, dst):
    """``dst[n, m, q] = src[m // C, n*Q + q, m % C]`` (the inverse of :func:`_pack`;
    ``dst`` may have any strides), blocked as :func:`_pack`."""
    n_n, m_n, q_n = dst.shape
    c_n = src.shape[2]
    n_cob = (m_n + c_n - 1) // c_n
    n_qc = (q_n + _QCHUNK - 1) // _QCHUNK
    for t in prange(n_cob * n_n * n_qc):
        cob = t // (n_n * n_qc)
        rem = t - cob * n_n * n_qc
        n = rem // n_qc
        qc0 = (rem - n * n_qc) * _QCHUNK
        qc1 = min(qc0 + _QCHUNK, q_n)
        c_hi = min(c_n, m_n - cob * c_n)
        tile = np.empty((_QB, c_n), dtype=src.dtype)
        for q0 in range(qc0, qc1, _QB):
            q1 = min(q0 + _QB, qc1)
            for q in range(q0, q1):
                tile[q - q0] = src[cob, n * q_n + q, :]
            for c in range(c_hi):
                m = cob * c_n + c
                for q in range(q0, q1):
                    dst[n, m, q] = tile[q - q0, c]


@njit(cache=True, parallel=True)
def _pack_flipped(w, dst):
    """``dst[cb, ci*KK + k, c] = w[ci, cb*C + c, KK-1-k]`` (0 past ``w.shape[1]``): the
    backward-data operand, the kernel flipped (reversing the flat ``(kd, kh, kw)`` index flips
    all three axes) and the channel axes of the group swapped; ``w`` is ``(Cin_fwd_out,
    Cg, KK)`` = one group's forward weight, ``dst`` ``(ceil(Cg / C), Cin_fwd_out*KK, C)``."""
    m_n, cg, kk = w.shape
    n_cb, _, c_n = dst.shape
    for t in prange(n_cb * m_n):
        cb = t // m_n
        ci = t - cb * m_n
        c_hi = min(c_n, cg - cb * c_n)
        for k in range(kk):
            row = dst[cb, ci * kk + k]
            for c in range(c_hi):
                row[c] = w[ci, cb * c_n + c, kk - 1 - k]
            for c in range(c_hi, c_n):
                row[c] = 0


# -- geometry ----------------------------------------------------------------------------------
_local = threading.local()


def _scratch(slot: str, shape, dtype) -> np.ndarray:
    """An uninitialised array of ``shape`` backed by this thread's reusable buffer ``slot``
    (one per slot and dtype, grown as needed): fresh large arrays cost their page faults on
    every call.  Valid until the next call with the same slot in this thread."""
    bufs = getattr(_local, "bufs", None)
    if bufs is None:
        bufs = _local.bufs = {}
    key = (slot, np.dtype(dtype).str)
    n = int(np.prod(shape))
    buf = bufs.get(key)
    if buf is None or buf.size < n:
        buf = bufs[key] = np.empty(max(n, 1), dtype=dtype)
    return buf[:n].reshape(shape)


def release_scratch() -> None:
    """Drop this thread's scratch buffers (they are kept between calls and grow to the
    largest layer seen; see the module docstring)."""
    _local.__dict__.pop("bufs", None)


def _embed(x, lo, size, step=(1, 1, 1)):
    """Zeros of spatial ``size`` with ``x[..., i]`` at ``lo + i*step`` per axis (positions
    outside are dropped: negative ``lo`` crops), in the ``"padded"`` scratch buffer."""
    out = _scratch("padded", x.shape[:2] + tuple(size), x.dtype)
    out[...] = 0
    src, dst = [slice(None)] * 2, [slice(None)] * 2
    for n, l, sz, s in zip(x.shape[2:], lo, size, step):
        i0 = 0 if l >= 0 else (-l + s - 1) // s          # first i with l + i*s >= 0
        i1 = min(n, (sz - 1 - l) // s + 1) if sz - 1 - l >= 0 else 0
        if i1 <= i0:
            return out
        src.append(slice(i0, i1))
        dst.append(slice(l + i0 * s, l + (i1 - 1) * s + 1, s))
    out[tuple(dst)] = x[tuple(src)]
    return out


def _positions(n_n, sample, out_sp, stride, strides3):
    """Flat offsets ``n*sample + sum_a o_a*stride_a*strides3_a`` of every output position."""
    od, oh, ow = out_sp
    sd, sh, sw = (s * t for s, t in zip(stride, strides3))
    off = (np.arange(n_n, dtype=np.int64)[:, None, None, None] * sample
           + np.arange(od, dtype=np.int64)[:, None, None] * sd
           + np.arange(oh, dtype=np.int64)[:, None] * sh + np.arange(ow, dtype=np.int64) * sw)
    return off.reshape(-1)


def _taps(cg, chan, kernel, dilation, strides3):
    """Flat offsets ``ci*chan + sum_a k_a*dilation_a*strides3_a`` over ``(ci, kd, kh, kw)``."""
    kd, kh, kw = kernel
    dd, dh, dw = (d * t for d, t in zip(dilation, strides3))
    off = (np.arange(cg, dtype=np.int64)[:, None, None, None] * chan
           + np.arange(kd, dtype=np.int64)[:, None, None] * dd
           + np.arange(kh, dtype=np.int64)[:, None] * dh + np.arange(kw, dtype=np.int64) * dw)
    return off.reshape(-1)


def _padded_rows(off, rows_per_tile):
    """``off`` extended to a multiple of ``rows_per_tile`` by repeating its last entry."""
    n = off.size
    pad = (-n) % rows_per_tile
    if pad:
        off = np.concatenate([off, np.full(pad, off[-1], dtype=np.int64)])
    return off


# -- the variants ------------------------------------------------------------------------------
# -- the cost model the micro-batch planner's heuristic mode uses ------------------------------
# Units are those of :mod:`.microbatch`'s model (its ``_GEMM_FLOPS`` for a BLAS GEMM, its
# ``_MEM_BW`` for packing): only ratios between algorithms matter.  Measured on the 2-core Zen 5
# machine, the register-blocked kernels run at ~2x NumPy's (AVX2-pinned) BLAS GEMM when every
# lane is used; a lane or micro-tile row that holds no data costs the same as one that does.
_DIRECT_OVER_GEMM = 2.0


def _rup(v: int, m: int) -> int:
    return -(-v // m) * m


def _lanes_rows_reduction(pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi, groups,
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


def _estimate(algo, problem) -> float:
    """Modelled seconds of ``problem`` (a :class:`.microbatch.ConvProblem`) by ``algo``."""
    from ...microbatch.planner import _CALL_S, _GEMM_FLOPS, _MEM_BW
    item = np.dtype(problem.dtype).itemsize
    c = algo._c(problem.dtype)
    lanes, rows, red, zero_ins = _lanes_rows_reduction(
        problem.pass_, problem.x_shape, problem.w_shape, problem.stride, problem.dilation,
        problem.pad_lo, problem.pad_hi, problem.groups, isinstance(algo, _WeightBroadcast))
    padded_macs = _rup(max(lanes, 1), c) * _rup(max(rows, 1), algo.rows) * red * zero_ins
    compute = 2.0 * padded_macs * problem.groups / (_DIRECT_OVER_GEMM * _GEMM_FLOPS)
    moved = (int(np.prod(problem.x_shape)) + int(np.prod(problem.w_shape))) * item
    seconds = _CALL_S + compute + 2.0 * moved / _MEM_BW
    # the model cannot tell the register-blocked variants apart where all lanes are full;
    # :func:`pick`'s measured shape rules break such ties
    if pick(*problem.args()) != algo.name:
        seconds *= 1.03
    return seconds


class _Direct:
    """One register-blocking variant (see the module docstring).  ``rows`` x ``vecs`` is the
    micro-tile; every stride, dilation, zero padding (asymmetric; negative crops) and groups
    count is supported, float32 and float64."""

    def __init__(self, name, rows, vecs, runner):
        self.name, self.rows, self.vecs, self._run = name, rows, vecs, runner

    def __repr__(self):
        return f"<cpu_conv_direct {self.name}: {self.rows} rows x {self.vecs} vectors>"

    # ---- the gathered GEMM
    def _gemm(self, xf, a_pk, row_off, red_off, dtype, dst=None):
        """``(n_cob, rows_padded, C)`` result of the gathered GEMM (module docstring).  With
        ``dst`` (``(N, M, Q)``, any strides) each finished super-block of tiles is also
        written to ``dst[n, m, q] = out[m // C, n*Q + q, m % C]`` while it is in cache."""
        n_cob, c = a_pk.shape[0], a_pk.shape[2]
        row_off = _padded_rows(row_off, self.rows)
        n_rt = row_off.size // self.rows
        out = _scratch("out", (n_cob, row_off.size, c), dtype)
        n_tiles = n_cob * n_rt
        n_chunks = max(1, min(numba.get_num_threads(), n_tiles))
        n_real = row_off.size
        if dst is None:
            dst = np.empty((0, 0, 1), dtype=dtype)
        else:
            n_real = dst.shape[0] * dst.shape[2]
        self._run(xf, a_pk.reshape(-1), out.reshape(-1), row_off, red_off, n_rt, n_tiles,
                  n_chunks, dst, n_real)
        return out

    def _c(self, dtype):
        return self.vecs * 64 // np.dtype(dtype).itemsize

    def estimate_seconds(self, problem) -> float:
        """Modelled seconds of a :class:`.microbatch.ConvProblem` (the planner's heuristic
        mode): padded lanes x padded rows x reduction at the register-blocked rate, plus
        moving the operands twice (padding and packing)."""
        return _estimate(self, problem)

    # ---- the planner's interface
    def supports(self, pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi, groups,
                 dtype) -> bool:
        """Whether this variant runs the pass for these shapes (float32/float64, 5-d shapes
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

    def workspace_bytes(self, pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi,
                        groups, dtype) -> int:
        """Temporary bytes of one call (x_shape's N is the micro-batch): padded operand,
        packed ``A``, blocked output and offset tables."""
        item = np.dtype(dtype).itemsize
        c = self._c(dtype)
        n_n, cin = int(x_shape[0]), int(x_shape[1])
        cout = int(w_shape[0])
        kernel = tuple(int(k) for k in w_shape[2:])
        kk = int(np.prod(kernel))
        in_sp = tuple(int(v) for v in x_shape[2:])
        out_sp = conv_out_shape(in_sp, kernel, stride, dilation, pad_lo, pad_hi)
        p_n = int(np.prod(out_sp))
        i_n = int(np.prod(in_sp))
        cg, cog = cin // groups, cout // groups
        rup = lambda v, m: -(-v // m) * m  # noqa: E731
        if pass_ == "forward":
            padded = n_n * cin * int(np.prod([n + lo + hi for n, lo, hi in
                                               zip(in_sp, pad_lo, pad_hi)]))
            rows, red = n_n * p_n, cg * kk
            blocks = rup(cog, c)
            extra = 0
        elif pass_ == "backward_data":
            padded = n_n * cout * int(np.prod([n + d * (k - 1) for n, k, d in
                                                zip(in_sp, kernel, dilation)]))
            rows, red = n_n * i_n, cog * kk
            blocks = rup(cg, c)
            extra = cin * cog * kk
        else:
            padded = n_n * cin * int(np.prod([n + lo + hi for n, lo, hi in
                                               zip(in_sp, pad_lo, pad_hi)]))
            rows, red = cg * kk, n_n * p_n
            blocks = rup(cog, c)
            extra = 0
        out_block = blocks * rup(max(rows, 1), self.rows)
        return int((padded + blocks * red + out_block + extra) * item
                   + 8 * (rows + self.rows + red))

    def forward(self, x, w, stride, dilation, pad_lo, pad_hi, groups=1):
        """``y[n, co] = sum_{ci in group(co), k} w[co, ci, k] * xpad[n, ci, o*stride +
        k*dilation]`` (the contract of :func:`.cpu_conv.conv_forward`)."""
        x, w, dtype, (stride, dilation, pad_lo, pad_hi), out_sp = forward_operands(
            x, w, stride, dilation, pad_lo, pad_hi, groups)
        n_n = x.shape[0]
        cout = w.shape[0]
        y = np.empty((n_n, cout) + out_sp, dtype=dtype)
        if y.size == 0:
            return y
        if x.size == 0 or w.size == 0:
            y[...] = 0
            return y
        size = tuple(n + lo + hi for n, lo, hi in zip(x.shape[2:], pad_lo, pad_hi))
        xp = _embed(x, pad_lo, size)
        self._conv(xp, w, y, stride, dilation, groups)
        return y

    def _conv(self, xp, w, y, stride, dilation, groups, transposed=False):
        """``y = correlate(xp, w)`` over the already padded ``xp`` (no padding left).
        ``transposed``: use the flipped kernel with its channel axes swapped per group
        (``w`` is then the forward convolution's weight), for the backward data pass."""
        dtype = xp.dtype
        n_n, cin = xp.shape[:2]
        cout = y.shape[1]
        kernel = w.shape[2:]
        cg, cog = cin // groups, cout // groups
        sp = xp.shape[2:]
        strides3 = (sp[1] * sp[2], sp[2], 1)
        chan = sp[0] * sp[1] * sp[2]
        out_sp = y.shape[2:]
        p_n = int(np.prod(out_sp))
        c = self._c(dtype)
        n_cob = -(-cog // c)
        rows = _positions(n_n, cin * chan, out_sp, stride, strides3)
        taps = _taps(cg, chan, kernel, dilation, strides3)
        kk = taps.size
        xf = xp.reshape(-1)
        yv = y.reshape(n_n, groups, cog, p_n)
        for g in range(groups):
            a_pk = _scratch("a", (n_cob, kk, c), dtype)
            if transposed:   # w is (groups*cg, cog, *kernel) here
                _pack_flipped(w[g * cg:(g + 1) * cg].reshape(cg, cog, -1), a_pk)
            else:
                _pack(w[g * cog:(g + 1) * cog].reshape(1, cog, kk), a_pk, cog)
            # a separate blocked transpose: written from inside the kernel, the output's
            # channel rows (often a power-of-two stride apart) thrash L1's sets
            _unpack(self._gemm(xf, a_pk, rows, taps + g * cg * chan, dtype), yv[:, g])

    def backward_data(self, dy, w, in_spatial, stride, dilation, pad_lo, pad_hi, groups=1):
        """Gradient of ``sum(forward(x, w) * dy)`` with respect to ``x`` (N, Cin,
        *in_spatial); the contract of :func:`.cpu_conv.conv_backward_data`."""
        dy, w, dtype, in_spatial, (stride, dilation, pad_lo, pad_hi) = data_operands(
            dy, w, in_spatial, stride, dilation, pad_lo, pad_hi, groups)
        n_n = dy.shape[0]
        cin = w.shape[1] * groups
        kernel = w.shape[2:]
        dx = np.empty((n_n, cin) + in_spatial, dtype=dtype)
        if dx.size == 0:
            return dx
        if dy.size == 0 or w.size == 0:
            dx[...] = 0
            return dx
        # dx[i] = sum_k w[k] dy[(i + lo - k*d) / s]: a stride-1 correlation of the
        # zero-inserted, re-padded dy with the flipped kernel, channels swapped per group
        size = tuple(n + d * (k - 1) for n, k, d in zip(in_spatial, kernel, dilation))
        lo = tuple(d * (k - 1) - p for k, d, p in zip(kernel, dilation, pad_lo))
        dyp = _embed(dy, lo, size, stride)
        self._conv(dyp, w, dx, (1, 1, 1), dilation, groups, transposed=True)
        return dx

    def backward_filter(self, x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups=1):
        """Gradient of ``sum(forward(x, w) * dy)`` with respect to ``w`` (Cout, Cin //
        groups, *kernel); the contract of :func:`.cpu_conv.conv_backward_filter`."""
        x, dy, dtype, kernel, (stride, dilation, pad_lo, pad_hi), out_sp = filter_operands(
            x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups)
        n_n, cin = x.shape[:2]
        cout = dy.shape[1]
        cg, cog = cin // groups, cout // groups
        kk = int(np.prod(kernel))
        if dy.size == 0 or x.size == 0 or cout * cg * kk == 0:
            return np.zeros((cout, cg) + kernel, dtype=dtype)
        dw = np.empty((cout, cg) + kernel, dtype=dtype)  # every entry is written below
        size = tuple(n + lo + hi for n, lo, hi in zip(x.shape[2:], pad_lo, pad_hi))
        xp = _embed(x, pad_lo, size)
        strides3 = (size[1] * size[2], size[2], 1)
        chan = size[0] * size[1] * size[2]
        p_n = int(np.prod(out_sp))
        c = self._c(dtype)
        n_cob = -(-cog // c)
        red = _positions(n_n, cin * chan, out_sp, stride, strides3)
        taps = _taps(cg, chan, kernel, dilation, strides3)
        xf = xp.reshape(-1)
        dyv = dy.reshape(n_n, cout, p_n)
        dwv = dw.reshape(groups, cog, cg * kk)
        for g in range(groups):
            a_pk = _scratch("a", (n_cob, n_n * p_n, c), dtype)
            _pack(dyv[:, g * cog:(g + 1) * cog], a_pk, cog)
            self._gemm(xf, a_pk, taps + g * cg * chan, red, dtype, dst=dwv[g:g + 1])
        return dw


@njit(cache=True, parallel=True)
def _pack_cols(xf, pos_off, red_off, dst):
    """``dst[pb, j, c] = xf[pos_off[pb*C + c] + red_off[j]]``: the column matrix with the
    positions on the lanes (``pos_off`` has ``n_pb * C`` entries)."""
    n_pb, j_n, c_n = dst.shape
    n_jc = (j_n + 63) // 64
    for t in prange(n_pb * n_jc):
        pb = t // n_jc
        j0 = (t - pb * n_jc) * 64
        for j in range(j0, min(j0 + 64, j_n)):
            o = red_off[j]
            row = dst[pb, j]
            for c in range(c_n):
                row[c] = xf[pos_off[pb * c_n + c] + o]


class _WeightBroadcast(_Direct):
    """The gathered GEMM with the roles swapped: the lanes hold ``C`` output positions, the
    rows are output channels and the weights are broadcast straight from ``w`` (no weight
    packing at all; backward data reads the flipped, channel-swapped kernel through its
    offset table), while the input is packed as a position-major column matrix
    (``J x positions``).  Pays where the weights outweigh the columns: layers on few positions
    (4^3, and 8^3 with batch) and many channels.  Backward filter likewise puts the weight
    taps on the lanes and broadcasts ``dy``.  Supports what the direct variants support."""

    def __repr__(self):
        return f"<cpu_conv_direct {self.name}: {self.rows} channels x {self.vecs} vectors>"

    def _conv(self, xp, w, y, stride, dilation, groups, transposed=False):
        dtype = xp.dtype
        n_n, cin = xp.shape[:2]
        cout = y.shape[1]
        kernel = w.shape[2:]
        kk = int(np.prod(kernel))
        cg, cog = cin // groups, cout // groups
        sp = xp.shape[2:]
        strides3 = (sp[1] * sp[2], sp[2], 1)
        chan = sp[0] * sp[1] * sp[2]
        out_sp = y.shape[2:]
        p_n = int(np.prod(out_sp))
        c = self._c(dtype)
        q_n = n_n * p_n
        n_pb = -(-q_n // c)
        pos = _positions(n_n, cin * chan, out_sp, stride, strides3)
        pos = np.concatenate([pos, np.full(n_pb * c - q_n, pos[-1], dtype=np.int64)])
        taps = _taps(cg, chan, kernel, dilation, strides3)
        wf = w.reshape(-1)
        xf = xp.reshape(-1)
        yv = y.reshape(n_n, groups, cog, p_n)
        kidx = np.arange(kk, dtype=np.int64)
        for g in range(groups):
            if transposed:   # w is (groups*cg, cog, *kernel): y channel co reads w[:, co, ::-1]
                rows = g * cg * cog * kk + np.arange(cog, dtype=np.int64) * kk
                red = (np.arange(cg, dtype=np.int64)[:, None] * (cog * kk)
                       + (kk - 1 - kidx)).reshape(-1)
            else:
                rows = (g * cog + np.arange(cog, dtype=np.int64)) * (cg * kk)
                red = np.arange(cg * kk, dtype=np.int64)
            a_pk = _scratch("a", (n_pb, cg * kk, c), dtype)
            _pack_cols(xf, pos, taps + g * cg * chan, a_pk)
            out = self._gemm(wf, a_pk, rows, red, dtype)     # (n_pb, cog padded, c)
            res = out[:, :cog].transpose(1, 0, 2).reshape(cog, n_pb * c)[:, :q_n]
            yv[:, g] = res.reshape(cog, n_n, p_n).transpose(1, 0, 2)

    def backward_filter(self, x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups=1):
        """:meth:`_Direct.backward_filter` with the weight taps ``(ci, k)`` on the lanes:
        ``dw[co, j] = sum_(n,p) dy[n, co, p] * cols[j, (n,p)]``, ``dy`` broadcast unpacked and
        the columns packed tap-major, so the result comes out in ``dw``'s own layout."""
        x, dy, dtype, kernel, (stride, dilation, pad_lo, pad_hi), out_sp = filter_operands(
            x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups)
        n_n, cin = x.shape[:2]
        cout = dy.shape[1]
        cg, cog = cin // groups, cout // groups
        kk = int(np.prod(kernel))
        if dy.size == 0 or x.size == 0 or cout * cg * kk == 0:
            return np.zeros((cout, cg) + kernel, dtype=dtype)
        size = tuple(n + lo + hi for n, lo, hi in zip(x.shape[2:], pad_lo, pad_hi))
        xp = _embed(x, pad_lo, size)
        strides3 = (size[1] * size[2], size[2], 1)
        chan = size[0] * size[1] * size[2]
        p_n = int(np.prod(out_sp))
        c = self._c(dtype)
        j_n = cg * kk
        n_jb = -(-j_n // c)
        pos = _positions(n_n, cin * chan, out_sp, stride, strides3)
        taps = _taps(cg, chan, kernel, dilation, strides3)
        taps = np.concatenate([taps, np.full(n_jb * c - j_n, taps[-1], dtype=np.int64)])
        red = (np.arange(n_n, dtype=np.int64)[:, None] * (cout * p_n)
               + np.arange(p_n, dtype=np.int64)).reshape(-1)
        xf, dyf = xp.reshape(-1), dy.reshape(-1)
        dw = np.empty((groups, cog, j_n), dtype=dtype)
        for g in range(groups):
            a_pk = _scratch("a", (n_jb, n_n * p_n, c), dtype)
            _pack_cols(xf, taps + g * cg * chan, pos, a_pk)
            rows = (g * cog + np.arange(cog, dtype=np.int64)) * p_n
            out = self._gemm(dyf, a_pk, rows, red, dtype)     # (n_jb, cog padded, c)
            dw[g] = out[:, :cog].transpose(1, 0, 2).reshape(cog, n_jb * c)[:, :j_n]
        return dw.reshape((cout, cg) + kernel)

    def workspace_bytes(self, pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi,
                        groups, dtype) -> int:
        """Padded operand, the ``(J, positions)`` columns of one group, the blocked output
        and the offset tables."""
        item = np.dtype(dtype).itemsize
        c = self._c(dtype)
        n_n, cin = int(x_shape[0]), int(x_shape[1])
        cout = int(w_shape[0])
        kernel = tuple(int(k) for k in w_shape[2:])
        kk = int(np.prod(kernel))
        in_sp = tuple(int(v) for v in x_shape[2:])
        out_sp = conv_out_shape(in_sp, kernel, stride, dilation, pad_lo, pad_hi)
        cg, cog = cin // groups, cout // groups
        if pass_ == "forward":
            padded = n_n * cin * int(np.prod([n + lo + hi for n, lo, hi in
                                               zip(in_sp, pad_lo, pad_hi)]))
            q_n, red, rows = n_n * int(np.prod(out_sp)), cg * kk, cog
        elif pass_ == "backward_filter":   # lanes over the taps, reduction over positions
            padded = n_n * cin * int(np.prod([n + lo + hi for n, lo, hi in
                                               zip(in_sp, pad_lo, pad_hi)]))
            q_n, red, rows = cg * kk, n_n * int(np.prod(out_sp)), cog
        else:
            padded = n_n * cout * int(np.prod([n + d * (k - 1) for n, k, d in
                                                zip(in_sp, kernel, dilation)]))
            q_n, red, rows = n_n * int(np.prod(in_sp)), cog * kk, cg
        q_pad = -(-q_n // c) * c
        rows_pad = -(-rows // self.rows) * self.rows
        return int((padded + red * q_pad + 2 * rows_pad * q_pad) * item
                   + 8 * (q_pad + red + rows_pad))


class _Gemm1x1:
    """1x1x1 kernels without padding: the convolution is a plain matrix product per sample
    and group, ``y[n] = w (Cout/g, Cin/g) @ x[n, :, ::s, ::s, ::s] (Cin/g, P)`` (NumPy's
    BLAS); backward data is ``w^T @ dy`` scattered back to the strided positions (zeros
    elsewhere), backward filter ``sum_n dy[n] @ x[n]^T``.  Any stride, groups, float32 and
    float64; dilation is irrelevant for one tap.  Wins where there are few output channels
    (a segmentation head), which waste most lanes of the register-blocked kernels."""

    name = "gemm1x1"

    def __repr__(self):
        return "<cpu_conv_direct gemm1x1>"

    def supports(self, pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi, groups,
                 dtype) -> bool:
        """``_Direct.supports`` and a 1x1x1 kernel with zero padding."""
        return (_Direct.supports(self, pass_, x_shape, w_shape, stride, dilation, pad_lo,
                                 pad_hi, groups, dtype)
                and tuple(int(k) for k in w_shape[2:]) == (1, 1, 1)
                and all(int(v) == 0 for v in tuple(pad_lo) + tuple(pad_hi)))

    def workspace_bytes(self, pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi,
                        groups, dtype) -> int:
        """The strided input gathered contiguous (stride > 1; backward data: the dense
        gradient before the scatter) plus one group's product."""
        item = np.dtype(dtype).itemsize
        n_n, cin = int(x_shape[0]), int(x_shape[1])
        out_sp = conv_out_shape(tuple(int(v) for v in x_shape[2:]), (1, 1, 1), stride, dilation,
                            pad_lo, pad_hi)
        p_n = int(np.prod(out_sp))
        cout = int(w_shape[0])
        return int((n_n * (cin + cout // groups) * p_n + cout * cin) * item) + 1

    def estimate_seconds(self, problem) -> float:
        """Modelled seconds (the planner's heuristic mode): one BLAS GEMM per sample and
        group, as :mod:`.microbatch` models GEMMs."""
        from ...microbatch.planner import _gemm_seconds
        n_n, cin = problem.x_shape[:2]
        cout, g = problem.w_shape[0], problem.groups
        out_sp = conv_out_shape(problem.x_shape[2:], (1, 1, 1), problem.stride, problem.dilation,
                            problem.pad_lo, problem.pad_hi)
        return n_n * g * _gemm_seconds(cout // g, cin // g, int(np.prod(out_sp)))

    @staticmethod
    def _sub(stride, out_sp):
        return (slice(None), slice(None)) + tuple(slice(0, (o - 1) * s + 1, s)
                                                  for o, s in zip(out_sp, stride))

    def forward(self, x, w, stride, dilation, pad_lo, pad_hi, groups=1):
        """:meth:`_Direct.forward` for 1x1x1 kernels without padding."""
        x, w, dtype, (stride, _, pad_lo, pad_hi), out_sp = forward_operands(
            x, w, stride, dilation, pad_lo, pad_hi, groups)
        self._require(w.shape[2:], pad_lo, pad_hi)
        n_n, cin = x.shape[:2]
        cout = w.shape[0]
        p_n = int(np.prod(out_sp))
        xs = np.ascontiguousarray(x[self._sub(stride, out_sp)], dtype=dtype)
        y = np.empty((n_n, cout) + out_sp, dtype=dtype)
        cg, cog = cin // groups, cout // groups
        wm = np.ascontiguousarray(w, dtype=dtype).reshape(groups, cog, cg)
        xv = xs.reshape(n_n, groups, cg, p_n)
        yv = y.reshape(n_n, groups, cog, p_n)
        for g in range(groups):
            np.matmul(wm[g], xv[:, g], out=yv[:, g])
        return y

    def backward_data(self, dy, w, in_spatial, stride, dilation, pad_lo, pad_hi, groups=1):
        """:meth:`_Direct.backward_data` for 1x1x1 kernels without padding."""
        dy, w, dtype, in_spatial, (stride, _, pad_lo, pad_hi) = data_operands(
            dy, w, in_spatial, stride, dilation, pad_lo, pad_hi, groups)
        self._require(w.shape[2:], pad_lo, pad_hi)
        n_n, cout = dy.shape[:2]
        cg, cog = w.shape[1], cout // groups
        cin = cg * groups
        out_sp = tuple(dy.shape[2:])
        p_n = int(np.prod(out_sp))
        wm = np.ascontiguousarray(w, dtype=dtype).reshape(groups, cog, cg)
        dyv = np.ascontiguousarray(dy, dtype=dtype).reshape(n_n, groups, cog, p_n)
        dense = tuple(stride) == (1, 1, 1)
        dx = (np.empty if dense else np.zeros)((n_n, cin) + in_spatial, dtype=dtype)
        dxs = dx if dense else np.empty((n_n, cin) + out_sp, dtype=dtype)
        dxv = dxs.reshape(n_n, groups, cg, p_n)
        for g in range(groups):
            np.matmul(wm[g].T, dyv[:, g], out=dxv[:, g])
        if not dense:
            dx[self._sub(stride, out_sp)] = dxs
        return dx

    def backward_filter(self, x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups=1):
        """:meth:`_Direct.backward_filter` for 1x1x1 kernels without padding."""
        x, dy, dtype, kernel, (stride, _, pad_lo, pad_hi), out_sp = filter_operands(
            x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups)
        self._require(kernel, pad_lo, pad_hi)
        n_n, cin = x.shape[:2]
        cout = dy.shape[1]
        cg, cog = cin // groups, cout // groups
        p_n = int(np.prod(out_sp))
        xs = np.ascontiguousarray(x[self._sub(stride, out_sp)], dtype=dtype)
        xv = xs.reshape(n_n, groups, cg, p_n)
        dyv = np.ascontiguousarray(dy, dtype=dtype).reshape(n_n, groups, cog, p_n)
        dw = np.zeros((groups, cog, cg), dtype=dtype)
        for g in range(groups):
            for n in range(n_n):
                dw[g] += dyv[n, g] @ xv[n, g].T
        return dw.reshape((cout, cg) + kernel)

    @staticmethod
    def _require(kernel, pad_lo, pad_hi):
        if tuple(int(k) for k in kernel) != (1, 1, 1) or any(
                int(v) for v in tuple(pad_lo) + tuple(pad_hi)):
            raise ValueError("gemm1x1 takes 1x1x1 kernels without padding, got kernel "
                             f"{tuple(kernel)}, padding {tuple(pad_lo)}/{tuple(pad_hi)}")


ALGORITHMS: dict = {
    "direct4x4": _Direct("direct4x4", 4, 4, _run_4x4),
    "direct8x2": _Direct("direct8x2", 8, 2, _run_8x2),
    "wbcast4x4": _WeightBroadcast("wbcast4x4", 4, 4, _run_4x4),
    "wbcast8x2": _WeightBroadcast("wbcast8x2", 8, 2, _run_8x2),
    "gemm1x1": _Gemm1x1(),
}


def pick(pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi, groups, dtype) -> str:
    """A shape heuristic for the algorithm of one pass (what the measurements on the 2-core
    Zen 5 machine suggest; a planner that times the candidates knows better): ``gemm1x1``
    for unpadded 1x1x1 forward / backward data; ``wbcast*`` where the weights outnumber the
    column matrix (few positions, many channels); else ``direct8x2`` (its micro-kernel runs at
    ~226 GFLOP/s per core on in-cache data against ~210 for ``direct4x4``; in whole layers the
    two are within noise of each other)."""
    g1 = ALGORITHMS["gemm1x1"]
    if pass_ != "backward_filter" and g1.supports(pass_, x_shape, w_shape, stride, dilation,
                                                  pad_lo, pad_hi, groups, dtype):
        return "gemm1x1"
    kernel = tuple(int(k) for k in w_shape[2:])
    kk = int(np.prod(kernel))
    n_n, cin = int(x_shape[0]), int(x_shape[1])
    cout = int(w_shape[0])
    cg, cog = cin // groups, cout // groups
    out_sp = conv_out_shape(tuple(int(v) for v in x_shape[2:]), kernel, stride, dilation,
                            pad_lo,
                        pad_hi)
    p_n = n_n * int(np.prod(out_sp if pass_ != "backward_data" else x_shape[2:]))
    red = (cog if pass_ == "backward_data" else cg) * kk
    if cout * cg * kk > red * p_n:
        return "wbcast4x4" if p_n >= 64 else "wbcast8x2"
    return "direct8x2"


def direct_forward(x, w, stride, dilation, pad_lo, pad_hi, groups=1, algorithm=None):
    """``ALGORITHMS[algorithm].forward`` (None: :func:`pick`'s choice)."""
    algo = algorithm or pick("forward", x.shape, w.shape, stride, dilation, pad_lo, pad_hi,
                             groups, np.result_type(x, w))
    return ALGORITHMS[algo].forward(x, w, stride, dilation, pad_lo, pad_hi, groups)


def direct_backward_data(dy, w, in_spatial, stride, dilation, pad_lo, pad_hi, groups=1,
                         algorithm=None):
    """``ALGORITHMS[algorithm].backward_data`` (None: :func:`pick`'s choice)."""
    x_shape = (dy.shape[0], w.shape[1] * groups) + tuple(in_spatial)
    algo = algorithm or pick("backward_data", x_shape, w.shape, stride, dilation, pad_lo,
                             pad_hi, groups, np.result_type(dy, w))
    return ALGORITHMS[algo].backward_data(dy, w, in_spatial, stride, dilation, pad_lo, pad_hi,
                                          groups)


def direct_backward_filter(x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups=1,
                           algorithm=None):
    """``ALGORITHMS[algorithm].backward_filter`` (None: :func:`pick`'s choice)."""
    w_shape = (dy.shape[1], x.shape[1] // groups) + tuple(kernel)
    algo = algorithm or pick("backward_filter", x.shape, w_shape, stride, dilation, pad_lo,
                             pad_hi, groups, np.result_type(x, dy))
    return ALGORITHMS[algo].backward_filter(x, dy, kernel, stride, dilation, pad_lo, pad_hi,
                                            groups)
