"""Pure planning of advanced-indexing keys (NumPy's rules, no MPI): which axes index arrays
index, where the broadcast index axes go, NumPy's ``IndexError`` for bad keys.  Used by
:mod:`disttensor.routines.fancy_indexing`."""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from ..core.array import DistArray

__all__ = ["FancyPlan", "plan_key", "is_fancy_key", "is_array_key", "as_key_entries",
           "broadcast_index_shapes", "shape_str"]

_BAD_TYPE = ("only integers, slices (`:`), ellipsis (`...`), numpy.newaxis (`None`) and "
             "integer or boolean arrays are valid indices")


def is_array_key(k) -> bool:
    return isinstance(k, (list, DistArray, np.ndarray)) or (
        hasattr(k, "shape") and hasattr(k, "dtype") and not isinstance(k, np.generic))


def is_fancy_key(key) -> bool:
    """Whether ``key`` holds an index array (a list, NumPy array or DistArray)."""
    return any(is_array_key(k) for k in (key if isinstance(key, tuple) else (key,)))


@dataclass(frozen=True)
class FancyPlan:
    """``basic``: the key of the basic step (slices and ``None``; every indexed axis as
    ``slice(None)``), whose result ``y`` has one axis per entry; ``axes``: the axes of ``y``
    the index arrays index, in key order, and ``sources[j]``: which index array (after
    booleans are expanded into ``ndim`` integer arrays, see :func:`plan_key`) indexes
    ``axes[j]``, an axis ``x_axes[j]`` of ``x``; ``position``: where the broadcast index
    axes go in the result."""

    basic: tuple
    axes: tuple
    sources: tuple
    x_axes: tuple
    position: int


def _kind(k) -> str:
    if k is None:
        return "new"
    if k is Ellipsis:
        return "ellipsis"
    if isinstance(k, slice):
        return "slice"
    if isinstance(k, (bool, np.bool_)):
        raise TypeError("a scalar boolean index is not supported with index arrays")
    if isinstance(k, numbers.Integral):
        return "int"
    if is_array_key(k):
        kind = np.dtype(k.dtype).kind
        if kind == "b":
            if len(k.shape) == 0:
                raise TypeError("a 0-d boolean index is not supported with index arrays")
            return "bool"
        if kind in "iu":
            return "array"
        raise IndexError("arrays used as indices must be of integer (or boolean) type")
    raise IndexError(_BAD_TYPE)


def plan_key(key, shape) -> FancyPlan:
    """Plan ``x[key]`` for an array of ``shape`` (pure; raises NumPy's ``IndexError`` for too
    many indices and boolean arrays of the wrong shape).  Array entries need only ``shape``
    and ``dtype``.  The index arrays, in order: each integer (array) entry, and each boolean
    entry of ``k`` axes as ``k`` arrays (its ``nonzero()``)."""
    key = as_key_entries(key)
    key = key if isinstance(key, tuple) else (key,)
    kinds = [_kind(k) for k in key]
    if kinds.count("ellipsis") > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    nd = len(shape)
    used = sum(len(k.shape) if c == "bool" else 1 for k, c in zip(key, kinds)
               if c not in ("new", "ellipsis"))
    if used > nd:
        raise IndexError(f"too many indices for array: array is {nd}-dimensional, but {used} "
                         "were indexed")
    if "ellipsis" in kinds:
        i = kinds.index("ellipsis")
        fill = nd - used
        key = key[:i] + (slice(None),) * fill + key[i + 1:]
        kinds = kinds[:i] + ["slice"] * fill + kinds[i + 1:]
    else:
        key = key + (slice(None),) * (nd - used)
        kinds = kinds + ["slice"] * (nd - used)
    basic, axes, sources, x_axes = [], [], [], []
    a = 0  # axis of x
    groups, prev_adv = 0, False
    source = 0
    for k, c in zip(key, kinds):
        if c in ("new", "slice"):
            basic.append(k)
            a += c == "slice"
            prev_adv = False
            continue
        groups += not prev_adv
        prev_adv = True
        width = len(k.shape) if c == "bool" else 1
        if c == "bool":
            for d in range(width):
                if k.shape[d] != shape[a + d]:
                    raise IndexError(
                        f"boolean index did not match indexed array along axis {a + d}; size "
                        f"of axis is {shape[a + d]} but size of corresponding boolean axis is "
                        f"{k.shape[d]}")
        for d in range(width):
            axes.append(len(basic))
            x_axes.append(a + d)
            sources.append(source)
            source += 1
            basic.append(slice(None))
        a += width
    position = axes[0] if groups == 1 and axes else 0
    return FancyPlan(tuple(basic), tuple(axes), tuple(sources), tuple(x_axes), position)


def as_key_entries(key):
    """Lists as NumPy arrays (an empty list is an empty integer index, as in NumPy)."""
    def conv(k):
        if isinstance(k, list):
            a = np.asarray(k)
            return a.astype(np.intp) if a.size == 0 else a
        return k
    return tuple(conv(k) for k in key) if isinstance(key, tuple) else conv(key)


def broadcast_index_shapes(shapes) -> tuple:
    """The broadcast shape of the index arrays (NumPy's ``IndexError`` if they do not)."""
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise IndexError("shape mismatch: indexing arrays could not be broadcast together with "
                         "shapes " + "".join(f"{shape_str(s)} " for s in shapes)) from None


def shape_str(shape) -> str:
    """A shape as NumPy's indexing messages write it: ``(2,3)``, ``(2,)``."""
    return "(" + ",".join(str(n) for n in shape) + ("," if len(shape) == 1 else "") + ")"
