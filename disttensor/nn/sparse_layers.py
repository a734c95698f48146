"""Sparse layers with a Compressed Sparse Blocks weight, and :func:`sparsify` / :func:`densify`
between them and pruned dense layers.

:class:`SparseLinear` and :class:`SparseConv3d` hold their weight as a
:class:`disttensor.sparse.CSBMatrix` whose structure (the kept positions) is fixed and whose
values are the learnable parameter: forward ``W @ X``, backward-data ``W.T @ dY`` from the same
structure, weight gradient by SDDMM (:mod:`.sparse_ops`), differentiable through
:func:`sparse_linear` / :func:`sparse_conv3d` like the ops of :mod:`.functional`.

State dict keys (a sparse layer's state round-trips into a sparse layer of the same structure;
:func:`densify` / :func:`sparsify` convert between the two key sets):

====================  ========================================  ==============================
dense pruned layer    sparse layer                              meaning
====================  ========================================  ==============================
``weight`` (out, in)  ``weight_values`` (nnz,)                 the kept weights (storage order)
``weight_mask``       ``weight_indices`` (2, nnz) int64         their (row, column) positions
``bias``              ``bias``                                  unchanged
====================  ========================================  ==============================

A convolution's CSB weight is PyTorch's ``(Cout, Cin, *K)`` weight flattened to ``(Cout, Cin *
prod(K))``; ``weight_indices`` index that matrix.  After loading indices that differ from
the layer's structure (same nnz), call :meth:`SparseLinear.refresh_structure` (the forward
does not re-read them: comparing costs as much as the product).
"""
from __future__ import annotations

import math

import numpy as np

from ..autograd.tensor import make_result, unwrap
from ..core.backend import array_module, to_host
from ..sparse import CSBMatrix
from .functional import _as_compute, _needs, _param_grad, _reduce_now
from .layers import Conv3d, Linear
from .module import Module, Parameter
from .sparse_ops import (sparse_conv_backward, sparse_conv_forward, sparse_dense_backward,
                         sparse_dense_forward)

__all__ = ["sparse_linear", "sparse_conv3d", "SparseLinear", "SparseConv3d", "densify"]


def _with_values(weight: CSBMatrix, values):
    return weight if values is None else weight.with_values(unwrap(values))


def sparse_linear(x, weight: CSBMatrix, values=None, bias=None):
    """``x @ W.T + bias`` on ``(N, F)`` with the CSB ``weight`` ``(out, F)``; ``values``: the
    tensor holding the weight's values in storage order (``(nnz,)``; gradients go there),
    ``None`` for the weight's own (constant)."""
    xv, bv = unwrap(x), unwrap(bias)
    y, saved = sparse_dense_forward(xv, _with_values(weight, values), _as_compute(bv, xv))

    def backward(g):
        reduce = _reduce_now(values, bias)
        dx, dv, db = sparse_dense_backward(saved, g, need_dx=_needs(x),
                                           need_dw=_needs(values) or _needs(bias),
                                           reduce=reduce)
        return dx, _param_grad(values, dv, xv, reduce), _param_grad(bias, db, xv, reduce)
    return make_result(y, (x, values, bias), backward, "sparse_linear")


def sparse_conv3d(x, weight: CSBMatrix, kernel_size, values=None, bias=None, stride=1,
                  padding=0, dilation=1):
    """3-D convolution of ``x`` ``(N, Cin, D, H, W)`` with the CSB ``weight`` ``(Cout, Cin *
    prod(kernel_size))`` (see :func:`sparse_linear` for ``values``)."""
    xv, bv = unwrap(x), unwrap(bias)
    y, saved = sparse_conv_forward(xv, _with_values(weight, values), kernel_size,
                                   _as_compute(bv, xv), stride, padding, dilation)

    def backward(g):
        reduce = _reduce_now(values, bias)
        dx, dv, db = sparse_conv_backward(saved, g, need_dx=_needs(x),
                                          need_dw=_needs(values) or _needs(bias),
                                          reduce=reduce)
        return dx, _param_grad(values, dv, xv, reduce), _param_grad(bias, db, xv, reduce)
    return make_result(y, (x, values, bias), backward, "sparse_conv3d")


class _SparseWeight(Module):
    """A CSB weight: the parameter ``weight_values``, the buffer ``weight_indices`` and the
    structure (rebuilt when loaded indices differ from it)."""

    def _init_weight(self, matrix: CSBMatrix, bias):
        super().__init__()
        rows, cols, vals = matrix.to_coo()
        self.weight_values = Parameter(vals.copy())
        self.register_buffer("weight_indices", np.stack([to_host(rows), to_host(cols)]))
        self.bias = Parameter(bias.copy()) if bias is not None else None
        if bias is None:
            self.register_parameter("bias", None)
        self._structure = matrix

    @property
    def nnz(self) -> int:
        return int(self.weight_values.shape[0])

    def weight(self) -> CSBMatrix:
        """The CSB weight with the current values."""
        return self._structure.with_values(self.weight_values.data)

    def refresh_structure(self) -> None:
        """Rebuild the structure from ``weight_indices`` (after loading a state dict of
        another structure but the same nnz; not needed for the same structure, the usual
        round trip).  Values and indices are re-ordered into the new storage order."""
        idx = self.weight_indices
        m = CSBMatrix.from_coo(idx[0], idx[1], to_host(self.weight_values.data),
                               self._structure.shape)
        if self._structure.device != "cpu":
            m = m.to_device(self._structure.device)
        r, c, v = m.to_coo()
        self.weight_indices[...] = np.stack([to_host(r), to_host(c)])
        self.weight_values.data[...] = v
        self._structure = m

    def dense_weight(self):
        """The weight as a dense array of the layer's PyTorch shape."""
        return self.weight().to_dense().reshape(self.weight_shape)


def _coo_of(weight, mask):
    w = to_host(weight).reshape(weight.shape[0], -1)
    keep = w != 0 if mask is None else to_host(mask).reshape(w.shape) != 0
    rows, cols = np.nonzero(keep)
    return rows, cols, w[rows, cols], w.shape


class SparseLinear(_SparseWeight):
    """``y = x @ W.T + b`` with ``W`` a CSB ``(out_features, in_features)`` (see the module
    docstring for its state dict).  Build it from a CSB matrix or with :meth:`from_dense`."""

    def __init__(self, weight: CSBMatrix, bias=None):
        if not isinstance(weight, CSBMatrix) or weight.ndim != 2:
            raise TypeError(f"SparseLinear needs a 2-D CSBMatrix, got {type(weight).__name__}")
        self._init_weight(weight, None if bias is None else unwrap(bias))
        self.out_features, self.in_features = weight.shape
        self.weight_shape = weight.shape

    @classmethod
    def from_dense(cls, layer: Linear, block_size=None) -> "SparseLinear":
        """The sparse twin of ``layer``: its mask's kept positions if it is pruned
        (:mod:`disttensor.nn.prune`), else its nonzeros; values, dtype, device, bias kept."""
        mask = layer._buffers.get("weight_mask")
        rows, cols, vals, shape = _coo_of(layer.weight.data, mask)
        m = CSBMatrix.from_coo(rows, cols, vals, shape, block_size)
        if array_module(layer.weight.data) is not np:
            m = m.to_device("cuda")
        return cls(m, None if layer.bias is None else layer.bias.data)

    def extra_repr(self) -> str:
        density = self.nnz / max(self.in_features * self.out_features, 1)
        return f"in_features={self.in_features}, out_features={self.out_features}, " \
               f"density={density:.3f}"

    def forward(self, x):
        if len(x.shape) != 2 or x.shape[1] != self.in_features:
            raise ValueError(f"SparseLinear expects (N, {self.in_features}) input, got shape "
                             f"{x.shape}")
        return sparse_linear(x, self.weight(), self.weight_values, self.bias)


class SparseConv3d(_SparseWeight):
    """3-D convolution (``groups=1``, zero padding) with a CSB weight ``(out_channels,
    in_channels * prod(kernel_size))``; 1x1x1 kernels multiply blocks directly, others go
    through im2col (CPU).  Build it with :meth:`from_dense`."""

    def __init__(self, weight: CSBMatrix, in_channels: int, kernel_size, bias=None, stride=1,
                 padding=0, dilation=1):
        k = tuple(kernel_size) if isinstance(kernel_size, (tuple, list)) else (kernel_size,) * 3
        if not isinstance(weight, CSBMatrix) or weight.shape[1] != in_channels * math.prod(k):
            raise ValueError(f"SparseConv3d needs a CSBMatrix of shape (out, {in_channels} * "
                             f"prod({k})), got {getattr(weight, 'shape', type(weight))}")
        self._init_weight(weight, None if bias is None else unwrap(bias))
        self.in_channels, self.out_channels, self.kernel_size = in_channels, weight.shape[0], k
        self.stride, self.padding, self.dilation = stride, padding, dilation
        self.weight_shape = (weight.shape[0], in_channels) + k

    @classmethod
    def from_dense(cls, layer: Conv3d, block_size=None) -> "SparseConv3d":
        """The sparse twin of the Conv3d ``layer`` (pruned: its mask's positions; else its
        nonzeros); ``groups`` must be 1 and ``padding_mode`` ``'zeros'``."""
        if layer.groups != 1 or layer.padding_mode != "zeros" or layer._transposed:
            raise ValueError("SparseConv3d converts Conv3d layers with groups=1 and zero "
                             "padding only")
        mask = layer._buffers.get("weight_mask")
        rows, cols, vals, shape = _coo_of(layer.weight.data, mask)
        m = CSBMatrix.from_coo(rows, cols, vals, shape, block_size)
        if array_module(layer.weight.data) is not np:
            m = m.to_device("cuda")
        return cls(m, layer.in_channels, layer.kernel_size,
                   None if layer.bias is None else layer.bias.data, layer.stride,
                   layer.padding, layer.dilation)

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, " \
               f"nnz={self.nnz}"

    def forward(self, x):
        return sparse_conv3d(x, self.weight(), self.kernel_size, self.weight_values, self.bias,
                             self.stride, self.padding, self.dilation)


def _dense_twin(layer: _SparseWeight) -> Module:
    from . import prune
    w = layer.dense_weight()
    dtype, device = w.dtype, ("cpu" if array_module(w) is np else "cuda")
    if isinstance(layer, SparseLinear):
        dense = Linear(layer.in_features, layer.out_features, bias=layer.bias is not None,
                       dtype=dtype, device=device, rng=np.random.default_rng(0))
    else:
        dense = Conv3d(layer.in_channels, layer.out_channels, layer.kernel_size, layer.stride,
                       layer.padding, layer.dilation, bias=layer.bias is not None, dtype=dtype,
                       device=device, rng=np.random.default_rng(0))
    dense.weight.data[...] = w
    if layer.bias is not None:
        dense.bias.data[...] = layer.bias.data
    mask = np.zeros((w.shape[0], int(np.prod(w.shape[1:]))))
    idx = layer.weight_indices
    mask[idx[0], idx[1]] = 1
    prune._install(dense, "weight", mask.reshape(w.shape))  # local: the structure is agreed
    return dense


def densify(model: Module) -> list[str]:
    """Replace every :class:`SparseLinear` / :class:`SparseConv3d` under ``model`` by a pruned
    :class:`Linear` / :class:`Conv3d` (mask: the structure); in place, returns the names of the
    replaced layers.  Not collective."""
    done = []
    for pname, parent in list(model.named_modules()):
        for name, child in list(parent._modules.items()):
            if isinstance(child, _SparseWeight):
                parent._modules[name] = _dense_twin(child)
                done.append(f"{pname}.{name}" if pname else name)
    return done


from .sparse_convert import sparsify  # noqa: E402  (measures and converts; needs the layers above)

__all__ += ["sparsify"]
