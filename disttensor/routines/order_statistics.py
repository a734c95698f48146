"""Quantiles at NumPy speed (the fast paths of :mod:`disttensor.routines.statistics`) and
order statistics of a distributed multiset without sorting it.

:func:`fast_quantile` (collective over the grid of ``x``) serves ``quantile``,
``percentile``, ``median`` and their nan forms:

* lines whole on every rank (the reduced axis unsplit or split over one rank; ``axis=None``
  of an array no rank splits): NumPy's own function on the local block, no messages;
* an N-d array reduced along a split axis: redistributed to whole lines
  (:func:`disttensor.routines.sorting.whole_lines`), NumPy on them, and the (much smaller)
  result redistributed to the layout of a reduction of ``x``;
* ``axis=None`` of a split array (or a 1-D split array): :func:`select_ranks` finds the order
  statistics NumPy's formula reads, which are combined exactly as NumPy does (its virtual
  indices, ``_lerp`` and dtype rules; ``median`` is NumPy's median of the middle values).

Results, dtypes (NumPy 2's weak-scalar rule: a Python ``float`` ``q`` keeps float32/float16,
an array or list ``q`` gives float64) and NaN handling are NumPy's; the median of an empty
line is NaN with NumPy's ``RuntimeWarning`` (``nanquantile`` of empty lines with a vector
``q``: NaNs of the documented shape, where NumPy 2.4 drops the ``q`` axis).  It returns
``None`` (the caller's distributed sort path) for GPU blocks, non-real dtypes and when the
sampled brackets fail.

:func:`select_ranks` returns the values of given ranks ``k`` (0-based positions in ascending
order) of the union of the 1-D NumPy blocks ``v`` the ranks of ``comm`` hold (each rank's
block counted once: the caller passes the communicator of the split grid axes, replicas
compute the same result).  Collective over ``comm``; about seven passes over the local block
instead of a sort:

1. every ``stride``-th element of each block (``stride = N // S``, ``S ~ 16 sqrt(N)``) is
   all-gathered and sorted (``S`` elements on every rank);
2. for each wanted rank ``k`` a bracket ``[lo, hi]`` of sample values around its estimated
   position ``k S / N`` (``3 sqrt(S)`` sample positions either side, several standard
   deviations of the estimate; ranks whose brackets overlap share one) is chosen, and one
   all-reduce of the counts of elements ``< lo``, ``<= lo``, ``< hi``, ``<= hi`` checks that
   the bracket holds ``k``;
3. the elements strictly inside the brackets (a few percent of ``N``) are all-gathered, and
   each ``k`` is read from them with ``numpy.partition`` (or is ``lo``/``hi`` itself when
   ``k`` falls on their ties).

When a bracket misses ``k`` (adversarial data) or holds more than ``N / 4`` elements inside,
it returns ``None``.  NaNs must have been removed (the caller counts them).  Exact.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.array import DistArray
from ..core.distribution import Distribution
from ._operands import held_whole
from .reductions import _result_dist
from .sorting import whole_lines

__all__ = ["fast_quantile", "numpy_dtype", "select_ranks"]

_NUMPY = {"quantile": np.quantile, "percentile": np.percentile, "median": np.median,
          "nanquantile": np.nanquantile, "nanpercentile": np.nanpercentile,
          "nanmedian": np.nanmedian}


def _numpy(what: str, a, q, axis, method, keepdims):
    """NumPy's function ``what`` on the NumPy array ``a``."""
    if what.endswith("median"):
        return _NUMPY[what](a, axis=axis, keepdims=keepdims)
    return _NUMPY[what](a, q, axis=axis, method=method, keepdims=keepdims)


def numpy_dtype(dtype, q, method: str, what: str) -> np.dtype:
    """The dtype NumPy's ``what`` gives for data of ``dtype`` and this ``q``."""
    with np.errstate(all="ignore"):
        return np.asarray(_numpy(what, np.zeros(2, dtype), q, None, method, False)).dtype


def _count(v: np.ndarray, bound, op) -> int:
    return int(np.count_nonzero(op(v, bound))) if bound is not None else None


def select_ranks(comm, v: np.ndarray, n: int, ks) -> dict | None:
    """``{k: value}`` for the ascending ranks ``ks`` (ints in ``[0, n)``) of the union of the
    blocks ``v`` over ``comm`` (``n`` elements in all, no NaNs), the same on every rank;
    ``None`` where the sampled brackets fail (see the module docstring).  Collective over
    ``comm``."""
    ks = sorted({int(k) for k in ks})
    target = int(min(n, max(4096, 16 * math.sqrt(n))))
    stride = max(1, n // max(target, 1))
    sample = np.sort(np.concatenate(comm.allgather(v[::stride])))
    s = sample.shape[0]
    d = int(3 * math.sqrt(s)) + 2 * comm.size + 2
    groups: list[list[int]] = []  # ranks whose brackets overlap share one
    for k in ks:
        r = (k * s) // max(n, 1)
        if groups and r - (groups[-1][-1] * s) // max(n, 1) <= 2 * d:
            groups[-1].append(k)
        else:
            groups.append([k])
    brackets = []  # (lo, hi) sample values; None: unbounded on that side
    for grp in groups:
        r0, r1 = (grp[0] * s) // max(n, 1), (grp[-1] * s) // max(n, 1)
        brackets.append((sample[r0 - d] if r0 - d >= 0 else None,
                         sample[r1 + d] if r1 + d < s else None))
    counts = []
    for lo, hi in brackets:
        counts += [_count(v, lo, np.less) if lo is not None else 0,
                   _count(v, lo, np.less_equal) if lo is not None else 0,
                   _count(v, hi, np.less) if hi is not None else v.shape[0],
                   _count(v, hi, np.less_equal) if hi is not None else v.shape[0]]
    tot = np.asarray(counts, dtype=np.int64)
    comm.Allreduce(tot.copy(), tot)
    tot = tot.reshape(-1, 4)
    inner_total = 0
    for grp, (lt_lo, le_lo, lt_hi, le_hi) in zip(groups, tot):
        if not (lt_lo <= grp[0] and grp[-1] < le_hi):
            return None
        inner_total += max(int(lt_hi - le_lo), 0)
    if inner_total > max(1 << 16, n // 4):
        return None
    inner_local = []
    for lo, hi in brackets:
        m = np.ones(v.shape[0], dtype=bool) if lo is None else (v > lo)
        if hi is not None:
            m &= v < hi
        inner_local.append(v[m])
    gathered = comm.allgather(inner_local)
    out = {}
    for j, (grp, (lo, hi), (lt_lo, le_lo, lt_hi, le_hi)) in enumerate(zip(groups, brackets,
                                                                          tot)):
        mid = [k - int(le_lo) for k in grp if le_lo <= k < lt_hi]
        inner = np.partition(np.concatenate([g[j] for g in gathered]), mid) if mid else None
        for k in grp:
            out[k] = lo if k < le_lo else hi if k >= lt_hi else inner[k - int(le_lo)]
    return out


# -- quantiles ------------------------------------------------------------------------------
def _with_q_axis(d: Distribution, nq) -> Distribution:
    """``d`` with a leading unsplit axis of length ``nq`` (a vector ``q``; ``None``: none)."""
    if nq is None:
        return d
    return Distribution((nq,) + tuple(d.shape), d.grid_dims, (None,) + tuple(d.split),
                        [None] + list(d.split_sizes))


def _virtual_index(method: str, n: int, q):
    """NumPy's virtual index of quantile ``q`` among ``n`` sorted values (its methods)."""
    if method == "linear":
        return (n - 1) * q
    if method == "lower":
        return np.floor((n - 1) * q).astype(np.intp)
    if method == "higher":
        return np.ceil((n - 1) * q).astype(np.intp)
    if method == "nearest":
        return np.around((n - 1) * q).astype(np.intp)
    return 0.5 * (np.floor((n - 1) * q) + np.ceil((n - 1) * q))  # midpoint


def _lerp(a, b, t):
    """NumPy's ``_lerp`` (``a + (b - a) t``, or ``b - (b - a)(1 - t)`` for ``t >= 0.5``)."""
    diff = b - a
    r = np.add(a, diff * t, out=...)
    np.subtract(b, diff * (1 - t), out=r, where=t >= 0.5, casting="unsafe",
                dtype=type(r.dtype))
    return r


def _quantile_of_ranks(comm, v, n: int, q, method: str, what: str):
    """NumPy's quantile (or median) of the ``n`` values (no NaNs) the blocks ``v`` hold over
    ``comm``, as a NumPy array of shape ``q``'s; ``None`` where the selection fails."""
    if what.endswith("median"):
        ks = [(n - 1) // 2] if n % 2 else [n // 2 - 1, n // 2]
        vals = select_ranks(comm, v, n, ks)
        return None if vals is None else \
            np.asarray(np.median(np.array([vals[k] for k in ks], dtype=v.dtype)))
    weak = type(q) in (int, float)
    qa = np.true_divide(q, 100) if what.endswith("percentile") else np.asanyarray(q)
    vi = np.asanyarray(_virtual_index(method, n, qa))
    if vi.dtype.kind in "iu":  # lower, higher, nearest (and linear of integer q)
        vals = select_ranks(comm, v, n, vi.reshape(-1))
        if vals is None:
            return None
        return np.array([vals[int(k)] for k in vi.reshape(-1)], dtype=v.dtype).reshape(vi.shape)
    prev = np.floor(vi.reshape(-1))  # 1-D: 0-d arithmetic would give NumPy scalars
    nxt = prev + 1
    above = vi.reshape(-1) >= n - 1
    prev[above], nxt[above] = -1, -1
    prev[vi.reshape(-1) < 0], nxt[vi.reshape(-1) < 0] = 0, 0
    prev, nxt = prev.astype(np.intp), nxt.astype(np.intp)
    need = np.concatenate([prev.reshape(-1), nxt.reshape(-1)]) % n
    vals = select_ranks(comm, v, n, need)
    if vals is None:
        return None
    a = np.array([vals[int(k) % n] for k in prev.reshape(-1)], dtype=v.dtype).reshape(vi.shape)
    b = np.array([vals[int(k) % n] for k in nxt.reshape(-1)], dtype=v.dtype).reshape(vi.shape)
    prev = prev.reshape(vi.shape)
    gamma = np.asanyarray(vi - prev)
    if method == "midpoint":
        gamma = np.where(vi % 1 == 0, 0.0, 0.5)
    gamma = np.asanyarray(gamma, dtype=vi.dtype)
    return np.asarray(_lerp(a, b, float(gamma) if weak else gamma))


def _on_lines(y: DistArray, q, ax, method, keepdims, what, dist) -> DistArray:
    """NumPy's ``what`` of the local block of ``y`` (whole along ``ax``) laid out as
    ``dist``; an empty block gives an empty result of NumPy's dtype (NumPy's shape for empty
    input with a vector ``q`` drops axes)."""
    shape = dist.block_shape(y.grid.coords)
    if y.local.size == 0 and math.prod(shape) == 0:
        return DistArray(np.empty(shape, numpy_dtype(y.dtype, q, method, what)), dist, y.grid)
    r = np.asarray(_numpy(what, y.local, q, ax, method, keepdims))
    if r.shape != shape:  # NumPy's nanquantile of empty lines drops the q axis: NaNs of ours
        r = np.broadcast_to(r, shape).copy()
    return DistArray(r, dist, y.grid)


def fast_quantile(x: DistArray, q, axis, ax, method: str, keepdims: bool, what: str):
    """``what`` (``quantile``, ``percentile``, ``median`` or a nan form) of ``x`` along
    ``axis`` (``ax`` its index, ``None`` for the flattened array) as NumPy computes it, laid
    out like a reduction of ``x`` over ``axis`` (a vector ``q`` adds a leading unsplit axis);
    ``None`` where the caller's sort path must serve (module docstring).  Collective."""
    if x.xp is not np:
        return None
    axes = tuple(range(x.ndim)) if ax is None else (ax,)
    nq = None if np.ndim(q) == 0 else int(np.shape(q)[0])
    want = _with_q_axis(_result_dist(x, axes, keepdims), nq)
    if held_whole(x, axes):
        return _on_lines(x, q, ax, method, keepdims, what, want)
    if ax is not None and x.ndim > 1:
        y = whole_lines(x, ax)
        got = _on_lines(y, q, ax, method, keepdims, what,
                        _with_q_axis(_result_dist(y, axes, keepdims), nq))
        return got if got.distribution == want else got.redistribute(distribution=want)
    if x.dtype.kind not in "biuf":
        return None
    comm = x.grid.sub_comm([g for g in x.split if g is not None and x.grid.dims[g] > 1])
    v = x.local.reshape(-1)
    nan = np.isnan(v) if x.dtype.kind == "f" else None
    tot = np.array([v.shape[0], 0 if nan is None else np.count_nonzero(nan)], dtype=np.int64)
    comm.Allreduce(tot.copy(), tot)
    n, nans = int(tot[0]), int(tot[1])
    skip = what.startswith("nan")
    if n == 0 or n == nans or (nans and not skip):  # NumPy's NaN (or warning) on a stand-in
        stand_in = np.full((1,) * x.ndim, np.nan, x.dtype) if n else \
            np.empty((0,) + (1,) * (x.ndim - 1), x.dtype)
        r = np.asarray(_numpy(what, stand_in, q, None, method, keepdims))
        return DistArray(np.broadcast_to(r, want.shape).copy(), want, x.grid)
    if nans:
        v = v[~nan]
    r = _quantile_of_ranks(comm, v, n - nans, q, method, what)
    if r is None:
        return None
    r = r.reshape(r.shape + (1,) * (x.ndim if keepdims else 0))
    return DistArray(r, want, x.grid)
