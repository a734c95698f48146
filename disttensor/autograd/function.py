"""Custom differentiable functions: :class:`Function` (PyTorch's ``torch.autograd.Function``).

Subclass :class:`Function` with two static methods and call it through ``apply``::

    import numpy as np
    from disttensor.autograd import Function, Tensor

    class Cube(Function):
        @staticmethod
        def forward(ctx, x, scale):           # x: a Tensor, scale: a number
            ctx.save_for_backward(x)
            ctx.scale = scale
            return x.data ** 3 * scale        # a DistArray (or a Tensor, array, float)

        @staticmethod
        def backward(ctx, grad):              # grad: the output's gradient (a DistArray)
            (x,) = ctx.saved_tensors
            gx = grad * 3 * x.data ** 2 * ctx.scale if ctx.needs_input_grad[0] else None
            return gx, None                   # one gradient per forward argument

    y = Cube.apply(x, 2.0)                    # recorded on the tape like any op

Contract, as PyTorch's:

* ``forward(ctx, *args, **kwargs)`` runs with gradient recording off; tensor arguments
  arrive as the :class:`~disttensor.autograd.Tensor` objects given (their values in
  ``.data``: DistArrays for activations, replicated arrays for parameters).  It returns one
  output or a tuple of outputs: Tensors or plain values (DistArray, NumPy/CuPy array, float).
* ``ctx.save_for_backward(*tensors)`` keeps tensors for backward (``ctx.saved_tensors``);
  other values may be stored as attributes of ``ctx``.  ``ctx.needs_input_grad`` is a tuple
  of booleans, one per positional argument.  ``ctx.mark_non_differentiable(*outputs)``
  marks outputs (e.g. indices) that get no gradient; ``ctx.set_materialize_grads(False)``
  passes ``None`` instead of zeros for outputs that got no gradient.
* ``backward(ctx, *grad_outputs)`` gets one gradient per output (shaped and distributed like
  it) and returns one gradient per positional argument of ``forward`` (``None`` for
  non-tensors and tensors that need none; a single value when there is one argument).  A
  gradient for a DistArray input must be shaped like it (it is redistributed to the input's
  distribution if needed); one for a replicated input (a parameter) must be the full
  gradient, the same on every rank (use the collective reductions of disttensor for sums
  over a DistArray).  Under :class:`~disttensor.nn.DistributedDataParallel` that full
  gradient is handed to the reducer as this rank's share (replicas contribute zeros).
* ``backward`` is collective when it communicates (distributed reductions, halo exchanges):
  every rank runs it, in the same order.  A wrong number of gradients or a gradient of the
  wrong shape raises ``RuntimeError`` (global shapes only: the same on every rank).
* Not supported (PyTorch features): ``setup_context``, ``vmap``, ``once_differentiable``,
  double backward (``backward`` runs with recording off), in-place marks (``mark_dirty``).
"""
from __future__ import annotations

from ..core.array import DistArray
from ..core.backend import array_module
from .hooks import GradBundle, grad_shape
from .math import _share
from .tensor import Tensor, filled_like, is_grad_enabled, make_result, no_grad

__all__ = ["Function", "FunctionCtx"]


class FunctionCtx:
    """The ``ctx`` of a :class:`Function` (module docstring)."""

    def __init__(self, needs_input_grad):
        self.needs_input_grad = tuple(needs_input_grad)
        self._saved = ()
        self._non_differentiable: set[int] = set()
        self.materialize_grads = True

    def save_for_backward(self, *tensors) -> None:
        for t in tensors:
            if t is not None and not isinstance(t, Tensor):
                raise TypeError(f"save_for_backward can only save variables, but argument "
                                f"{tensors.index(t)} is of type {type(t).__name__}")
        self._saved = tensors

    @property
    def saved_tensors(self) -> tuple:
        if self._saved is None:
            raise RuntimeError("Trying to backward through the graph a second time (or "
                               "directly access saved tensors after they have already been "
                               "freed)")
        return tuple(self._saved)

    def mark_non_differentiable(self, *outputs) -> None:
        self._non_differentiable.update(id(o) for o in outputs)

    def set_materialize_grads(self, value: bool) -> None:
        self.materialize_grads = bool(value)


def _zeros_like(v):
    if isinstance(v, DistArray):
        return filled_like(v, 0)
    if isinstance(v, (int, float)):
        return 0.0
    return array_module(v).zeros_like(v)


def _value(o):
    return o.data if isinstance(o, Tensor) else o


class Function:
    """Base class of custom differentiable functions (module docstring)."""

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError("a Function subclass must define forward(ctx, ...)")

    @staticmethod
    def backward(ctx, *grad_outputs):
        raise NotImplementedError("a Function subclass must define backward(ctx, ...)")

    @classmethod
    def apply(cls, *args, **kwargs):
        """Run ``forward`` and record ``backward`` on the tape (when gradients are recorded
        and an argument requires them); returns the output(s) as Tensors."""
        recording = is_grad_enabled()
        needs = [recording and isinstance(a, Tensor) and a.requires_grad for a in args]
        ctx = FunctionCtx(needs)
        with no_grad():
            raw = cls.forward(ctx, *args, **kwargs)
        single = not isinstance(raw, tuple)
        outs = (raw,) if single else raw
        values = [_value(o) for o in outs]
        differentiable = [id(o) not in ctx._non_differentiable for o in outs]
        name = cls.__name__

        def backward(grads):
            grads = list(grads)
            for i, g in enumerate(grads):
                if g is None and ctx.materialize_grads:
                    grads[i] = _zeros_like(values[i])
            with no_grad():
                res = cls.backward(ctx, *grads)
            ctx._saved = None
            res = res if isinstance(res, tuple) else (res,)
            if len(res) != len(args):
                raise RuntimeError(f"function {name}Backward returned an incorrect number of "
                                   f"gradients (expected {len(args)}, got {len(res)})")
            out = []
            for i, (a, g) in enumerate(zip(args, res)):
                g = _value(g)
                if g is None or not (isinstance(a, Tensor) and a.requires_grad):
                    out.append(None)
                    continue
                if grad_shape(g) != tuple(a.shape):
                    raise RuntimeError(f"function {name}Backward returned an invalid gradient "
                                       f"at index {i} - got {list(grad_shape(g))} but "
                                       f"expected shape compatible with {list(a.shape)}")
                if isinstance(a.data, DistArray) and isinstance(g, DistArray) and (
                        g.distribution != a.data.distribution or g.grid is not a.data.grid):
                    g = g.redistribute(grid=a.data.grid, distribution=a.data.distribution)
                out.append(_share(a, g))
            return tuple(out)

        if single:
            if not differentiable[0]:
                return Tensor(values[0])
            return make_result(values[0], args, lambda g: backward([g]), name)
        hub = make_result(tuple(values), args, lambda gb: backward(gb.grads), name)
        result = []
        for k, v in enumerate(values):
            if not hub.requires_grad or not differentiable[k]:
                result.append(Tensor(v))
                continue

            def pick(g, k=k):
                grads = [None] * len(values)
                grads[k] = g
                return (GradBundle(grads),)
            result.append(make_result(v, (hub,), pick, f"{name}[{k}]"))
        return tuple(result)
