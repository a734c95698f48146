"""CPU conv3d without an im2col matrix: register-blocked implicit GEMM on 512-bit vectors.

Same contract as :mod:`..conv_im2col` (``conv_forward``, ``conv_backward_data``,
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
  correct, but ``s^3`` more work; the im2col kernels of :mod:`..conv_im2col` are the better
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
  kernels of :mod:`..conv_im2col` are faster there.
* ``"wbcast4x4"``, ``"wbcast8x2"``: the same micro-tiles with the roles swapped (output
  positions on the lanes, the weights broadcast unpacked); for layers on few positions with
  many channels, where the weights outweigh the column matrix.
* ``"gemm1x1"``: 1x1x1 kernels without padding (any stride, groups) as plain BLAS matrix
  products; for the narrow 1x1 segmentation head.

Workspace (:meth:`.direct.Direct.workspace_bytes`): the padded input (or zero-inserted ``dy``), the
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

Modules: :mod:`.simd` (the vector type and intrinsics), :mod:`.microkernels` (the
register-blocked tiles), :mod:`.packing` (the Numba transposes), :mod:`.geometry` (offset
tables, padding, scratch, supported shapes), :mod:`.direct` (the ``direct*`` and ``wbcast*``
drivers: forward, backward data, backward filter), :mod:`.gemm1x1`, :mod:`.cost` (the cost
model and :func:`pick`).  Per rank, no MPI.
"""
from __future__ import annotations

import numpy as np

from .cost import pick
from .direct import Direct, WeightBroadcast
from .gemm1x1 import Gemm1x1
from .geometry import release_scratch
from .microkernels import run_4x4, run_8x2

__all__ = ["ALGORITHMS", "pick", "release_scratch", "direct_forward", "direct_backward_data",
           "direct_backward_filter"]

ALGORITHMS: dict = {
    "direct4x4": Direct("direct4x4", 4, 4, run_4x4),
    "direct8x2": Direct("direct8x2", 8, 2, run_8x2),
    "wbcast4x4": WeightBroadcast("wbcast4x4", 4, 4, run_4x4),
    "wbcast8x2": WeightBroadcast("wbcast8x2", 8, 2, run_8x2),
    "gemm1x1": Gemm1x1(),
}


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
