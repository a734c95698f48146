"""GELU, SiLU, Softplus, Mish, Hardswish, Hardsigmoid and PReLU: differentiable functions (as
``torch.nn.functional``'s, re-exported from :mod:`disttensor.nn.functional`) and modules (as
``torch.nn``'s, re-exported from :mod:`disttensor.nn`), over the distributed ops of
:mod:`disttensor.ops.activations_more` (fused per-rank kernels, forward and backward).

Inputs are :class:`~disttensor.autograd.Tensor` s of DistArrays (any layout; PReLU with
``num_parameters > 1`` needs ``(N, C, *spatial)`` with ``C == num_parameters``).  PReLU's
weight gradient is summed over the ranks holding different data (or left to a data-parallel
reducer's bucketed all-reduce, as every layer's parameter gradients are).  Differences from
PyTorch: ``inplace=True`` is accepted and ignored (results are always new arrays);
Hardsigmoid's derivative is exactly 1/6 where PyTorch's float64 kernel multiplies by the
float32 constant ``1.0f / 6`` (3e-8 relative).
"""
from __future__ import annotations

from ..ops import activations_more as ops
from ..autograd.tensor import make_result, unwrap
from ..core.array import DistArray
from ..core.backend import xp_for
from .functional import _needs, _param_grad, _reduce_now
from .module import Module, Parameter

__all__ = ["gelu", "silu", "softplus", "mish", "hardswish", "hardsigmoid", "prelu", "GELU",
           "SiLU", "Softplus", "Mish", "Hardswish", "Hardsigmoid", "PReLU"]


def _value(x, what: str) -> DistArray:
    v = unwrap(x)
    if not isinstance(v, DistArray):
        raise TypeError(f"{what}: input must be a Tensor holding a DistArray, got "
                        f"{type(v).__name__}")
    return v


def _pointwise(name, x, beta=1.0, threshold=20.0):
    y, saved = ops.pointwise_activation_forward(name, _value(x, name), beta, threshold)
    return make_result(y, (x,), lambda g: (ops.pointwise_activation_backward(saved, g),), name)


def gelu(input, approximate: str = "none"):
    """``x * Phi(x)`` (``approximate='tanh'``: ``x/2 * (1 + tanh(sqrt(2/pi) (x + 0.044715
    x^3)))``)."""
    if approximate not in ("none", "tanh"):
        raise ValueError("approximate argument must be either none or tanh.")
    return _pointwise("gelu" if approximate == "none" else "gelu_tanh", input)


def silu(input, inplace: bool = False):
    """``x * sigmoid(x)``."""
    return _pointwise("silu", input)


def softplus(input, beta: float = 1.0, threshold: float = 20.0):
    """``log(1 + exp(beta x)) / beta``, and ``x`` where ``beta x > threshold``."""
    return _pointwise("softplus", input, beta, threshold)


def mish(input, inplace: bool = False):
    """``x * tanh(softplus(x))``."""
    return _pointwise("mish", input)


def hardswish(input, inplace: bool = False):
    """``x * relu6(x + 3) / 6``."""
    return _pointwise("hardswish", input)


def hardsigmoid(input, inplace: bool = False):
    """``relu6(x + 3) / 6``."""
    return _pointwise("hardsigmoid", input)


def prelu(input, weight):
    """``x if x > 0 else weight[c] * x`` (``weight``: a parameter of 1 or C values)."""
    xv = _value(input, "prelu")
    y, saved = ops.prelu_forward(xv, unwrap(weight))

    def backward(g):
        reduce = _reduce_now(weight)
        dx, dw = ops.prelu_backward(saved, g, need_dx=_needs(input), need_dw=_needs(weight),
                                    reduce=reduce)
        return dx, _param_grad(weight, dw, xv, reduce)
    return make_result(y, (input, weight), backward, "prelu")


class _Pointwise(Module):
    _fn = None

    def __init__(self, **kw):
        super().__init__()
        self._kw = kw

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}"
                         for k, v in self._kw.items())

    def forward(self, x):
        return type(self)._fn(x, **self._kw)


class GELU(_Pointwise):
    _fn = staticmethod(gelu)

    def __init__(self, approximate: str = "none"):
        if approximate not in ("none", "tanh"):
            raise ValueError("approximate argument must be either none or tanh.")
        super().__init__(approximate=approximate)


class SiLU(_Pointwise):
    _fn = staticmethod(silu)

    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = inplace


class Softplus(_Pointwise):
    _fn = staticmethod(softplus)

    def __init__(self, beta: float = 1.0, threshold: float = 20.0):
        super().__init__(beta=beta, threshold=threshold)


class Mish(SiLU):
    _fn = staticmethod(mish)


class Hardswish(SiLU):
    _fn = staticmethod(hardswish)


class Hardsigmoid(SiLU):
    _fn = staticmethod(hardsigmoid)


class PReLU(Module):
    """``x if x > 0 else a * x`` with a learnable ``weight`` ``a`` of ``num_parameters``
    values (1, or the number of channels), initialised to ``init``."""

    def __init__(self, num_parameters: int = 1, init: float = 0.25, *, dtype="float32",
                 device: str = "cpu"):
        super().__init__()
        if isinstance(num_parameters, bool) or not isinstance(num_parameters, int) \
                or num_parameters < 1:
            raise ValueError(f"num_parameters must be a positive integer, got "
                             f"{num_parameters!r}")
        self.num_parameters, self.init = num_parameters, float(init)
        self.weight = Parameter(xp_for(device).full(num_parameters, self.init, dtype=dtype))

    def extra_repr(self) -> str:
        return f"num_parameters={self.num_parameters}"

    def forward(self, x):
        return prelu(x, self.weight)
