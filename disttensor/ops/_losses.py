"""What the loss ops share: PyTorch's reductions, the checks every loss makes (reduction,
target type and shape, class-label dtype, per-class weights) and the per-voxel results and
incoming gradients of ``reduction='none'``.

Everything here runs on replicated metadata (so every rank decides alike, inside the caller's
agreed block) or on one rank's block (no MPI).
"""
from __future__ import annotations

import numpy as np

from ..core.array import DistArray

__all__ = ["REDUCTIONS", "check_reduction", "reduced", "check_distarray", "check_same_shape",
           "is_integer_dtype", "check_class_labels", "class_weight", "aligned", "per_voxel",
           "incoming"]

REDUCTIONS = ("none", "mean", "sum")


def check_reduction(reduction, what: str) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"{what}: {reduction!r} is not a valid value for reduction; "
                         f"expected one of {REDUCTIONS}")


def reduced(total: float, count: float, reduction: str) -> float:
    """The scalar loss from the global sum (``'sum'``) or the sum over ``count`` (``'mean'``;
    NaN when ``count`` is 0, as PyTorch's mean of nothing)."""
    if reduction == "sum":
        return float(total)
    return float(total) / count if count else float("nan")


def check_distarray(a, what: str, name: str) -> None:
    if not isinstance(a, DistArray):
        raise TypeError(f"{what}: the {name} must be a DistArray (or a Tensor holding one), "
                        f"got {type(a).__name__}")


def check_same_shape(a: DistArray, shape, what: str, name: str) -> None:
    if a.shape != tuple(shape):
        raise ValueError(f"{what}: {name} shape {a.shape} must equal the input shape "
                         f"{tuple(shape)}")


def is_integer_dtype(dtype) -> bool:
    return np.dtype(dtype).kind in "iu"


def check_class_labels(labels: DistArray, what: str) -> None:
    """Class labels must be integers (PyTorch: ``expected scalar type Long``)."""
    if not is_integer_dtype(labels.dtype):
        raise TypeError(f"{what}: class labels must have an integer dtype (int64, as PyTorch's "
                        f"Long), got {labels.dtype}; float targets are class probabilities "
                        "only when they have the input's shape")


def class_weight(weight, c: int, what: str):
    """``weight`` (None or ``C`` numbers) as a float64 NumPy ``(C,)`` array (replicated)."""
    if weight is None:
        return np.ones(c)
    w = np.asarray(weight.get() if hasattr(weight, "get") else weight)
    if w.ndim != 1 or w.shape[0] != c or w.dtype.kind not in "fiu":
        raise ValueError(f"{what}: weight must be a 1-D array of {c} numbers (one per class), "
                         f"got shape {w.shape} and dtype {w.dtype}")
    return w.astype(np.float64)


def aligned(a: DistArray, like: DistArray, drop=()) -> DistArray:
    """``a`` distributed like ``like`` without the axes ``drop`` (a redistribution only when it
    is laid out otherwise; collective then)."""
    dist = like.distribution.drop_axes(drop) if drop else like.distribution
    if a.distribution == dist and a.grid is like.grid:
        return a
    return a.redistribute(grid=like.grid, distribution=dist)


def per_voxel(values, like: DistArray, drop=(), dtype=None) -> DistArray:
    """A per-voxel result (``reduction='none'``) from this rank's block ``values``: laid out as
    ``like`` without the axes ``drop``, in ``dtype`` (``like``'s by default)."""
    dist = like.distribution.drop_axes(drop) if drop else like.distribution
    xp = like.xp
    out = xp.asarray(values).astype(dtype or like.dtype, copy=False)
    return DistArray(out, dist, like.grid)


def incoming(g, like: DistArray, reduction: str, drop=()):
    """The gradient flowing into a loss as ``(gvox, gscale)`` for the backward kernels: for
    ``'none'`` the block of the per-voxel gradient ``g`` (a DistArray of the per-voxel
    result's shape, aligned to it), else ``(None, float(g))``."""
    if reduction != "none":
        return None, float(g)
    shape = tuple(s for i, s in enumerate(like.shape) if i not in drop)
    if not isinstance(g, DistArray) or g.shape != shape:
        raise ValueError(f"the gradient of a loss with reduction='none' must be a DistArray of "
                         f"shape {shape}, got {getattr(g, 'shape', type(g).__name__)}")
    return aligned(g, like, drop).local, 1.0
