"""The ``gemm1x1`` algorithm: 1x1x1 convolutions without padding as plain BLAS matrix
products (per rank, no MPI).

Same contracts as the other direct variants (:mod:`.direct`) restricted to a 1x1x1 kernel
with zero padding (``ValueError`` otherwise); any stride and groups count, float32 and
float64.  For the narrow 1x1 segmentation head, whose few output channels would waste most
lanes of the register-blocked kernels.
"""
from __future__ import annotations

import numpy as np

from ..conv_cost import gemm_seconds
from ..conv_operands import conv_out_shape, data_operands, filter_operands, forward_operands
from .geometry import shapes_supported, unpadded_1x1

__all__ = ["Gemm1x1"]


class Gemm1x1:
    """1x1x1 kernels without padding: the convolution is a plain matrix product per sample
    and group, ``y[n] = w (Cout/g, Cin/g) @ x[n, :, ::s, ::s, ::s] (Cin/g, P)`` (NumPy's
    BLAS); backward data is ``w^T @ dy`` scattered back to the strided positions (zeros
    elsewhere), backward filter ``sum_n dy[n] @ x[n]^T``.  Any stride, groups, float32 and
    float64; dilation is irrelevant for one tap.  Wins where there are few output channels
    (a segmentation head), which waste most lanes of the register-blocked kernels."""

    name = "gemm1x1"

    def __repr__(self):
        return "<conv_direct gemm1x1>"

    def supports(self, pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi, groups,
                 dtype) -> bool:
        """What the direct variants support, with a 1x1x1 kernel and zero padding."""
        return (shapes_supported(pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi,
                                 groups, dtype)
                and unpadded_1x1(w_shape[2:], pad_lo, pad_hi))

    def workspace_bytes(self, pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi,
                        groups, dtype) -> int:
        """The strided input gathered contiguous (stride > 1; backward data: the dense
        gradient before the scatter) plus one group's product."""
        item = np.dtype(dtype).itemsize
        n_n, cin = int(x_shape[0]), int(x_shape[1])
        out_sp = conv_out_shape(tuple(int(v) for v in x_shape[2:]), (1, 1, 1), stride,
                                dilation, pad_lo, pad_hi)
        p_n = int(np.prod(out_sp))
        cout = int(w_shape[0])
        return int((n_n * (cin + cout // groups) * p_n + cout * cin) * item) + 1

    def estimate_seconds(self, problem) -> float:
        """Modelled seconds (the planner's heuristic mode): one BLAS GEMM per sample and
        group (:func:`..conv_cost.gemm_seconds`)."""
        n_n, cin = problem.x_shape[:2]
        cout, g = problem.w_shape[0], problem.groups
        out_sp = conv_out_shape(problem.x_shape[2:], (1, 1, 1), problem.stride,
                                problem.dilation, problem.pad_lo, problem.pad_hi)
        return n_n * g * gemm_seconds(cout // g, cin // g, int(np.prod(out_sp)))

    @staticmethod
    def _sub(stride, out_sp):
        return (slice(None), slice(None)) + tuple(slice(0, (o - 1) * s + 1, s)
                                                  for o, s in zip(out_sp, stride))

    def forward(self, x, w, stride, dilation, pad_lo, pad_hi, groups=1):
        """:meth:`Direct.forward` for 1x1x1 kernels without padding."""
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
        """:meth:`Direct.backward_data` for 1x1x1 kernels without padding."""
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
        """:meth:`Direct.backward_filter` for 1x1x1 kernels without padding."""
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
        if not unpadded_1x1(kernel, pad_lo, pad_hi):
            raise ValueError("gemm1x1 takes 1x1x1 kernels without padding, got kernel "
                             f"{tuple(kernel)}, padding {tuple(pad_lo)}/{tuple(pad_hi)}")
