"""A thin define-by-run autograd over DistArrays (Chainer/PyTorch style).

:class:`Tensor` wraps a DistArray (activations), a replicated NumPy/CuPy array (parameters)
or a float (losses).  Every function of :mod:`disttensor.autograd.math` (NumPy-style arithmetic,
reductions, shapes, indexing, redistribution), of :mod:`.reductions` (PyTorch's ``max``/``min``
with ``dim``, ``amax``, ``var``/``std``, ``clamp``, ``where``, ``argmax``) and of
:mod:`disttensor.nn.functional` (the distributed CNN ops of :mod:`disttensor.ops`) records what
its backward needs, and :meth:`Tensor.backward` walks the graph in reverse.  Custom functions:
:class:`Function` (:mod:`.function`); gradient hooks and ``retain_grad``: :mod:`.hooks`.  See
:mod:`.tensor` for the engine and ``docs/training.md`` for the user's view.
"""
from .tensor import (Node, Tensor, as_tensor, enable_grad, is_grad_enabled, make_result,
                     no_grad, param_share, unwrap)
from . import math
from .math import (absolute, add, concatenate, divide, exp, getitem, log, mean, multiply,
                   negative, power, redistribute, reshape, sqrt, subtract, sum, transpose)
from . import function, hooks, reductions
from .function import Function, FunctionCtx
from .hooks import RemovableHandle
from .reductions import (MaxMin, amax, amin, argmax, argmin, clamp, clip, max, min, std, var,
                         where)

__all__ = ["Tensor", "Node", "no_grad", "enable_grad", "is_grad_enabled", "make_result",
           "as_tensor", "param_share", "unwrap", "math", "add", "subtract", "multiply",
           "divide", "negative", "power", "exp", "log", "sqrt", "absolute", "sum", "mean",
           "reshape", "transpose", "getitem", "concatenate", "redistribute", "function",
           "hooks", "reductions", "Function", "FunctionCtx", "RemovableHandle", "MaxMin",
           "max", "min", "amax", "amin", "argmax", "argmin", "var", "std", "clamp", "clip",
           "where"]
