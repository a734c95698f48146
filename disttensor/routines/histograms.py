"""Histograms (NumPy's "Statistics: histograms"): ``histogram``, ``histogram2d``,
``histogramdd``, ``histogram_bin_edges``, ``bincount`` and ``digitize``.  Every function is
collective over the grid of its DistArray operands (the ranks agree on the arguments first).

How they work: the bin edges are computed on every rank alike (an integer ``bins`` without a
``range`` takes the global min/max, one reduction each, with NumPy's rules), each rank counts
its own block with NumPy, and one all-reduce over the grid axes that split the input sums the
counts (replicas are not counted twice).

Result layout: the counts and the edges are DistArrays (as ``unique``'s results, not NumPy
arrays), cut into balanced blocks along their axis 0 over grid axis 0 of the input's grid and
whole along the other grid axes and the other axes (``histogram2d``'s ``H`` is split by rows);
every rank holds the whole result transiently before keeping its block, so memory per rank is
``O(number of bins)``.  ``to_numpy()`` gathers them.  ``digitize`` is elementwise: its result
has ``x``'s layout.

Differences from NumPy: the string bin estimators (``bins="auto"``, ...) raise
``TypeError``; the counts of a weighted ``bincount`` are float64 even for empty input (NumPy
gives int64 there); ``weights`` must be a DistArray of the input's shape (any layout).
"""
from __future__ import annotations

import numbers
import operator

import numpy as np

from ..core.array import DistArray
from ..core.entry import agreed, canon, collective_entry, operand_key
from ..core.backend import to_device, to_host
from ..core.comm import allreduce
from ..core.distribution import Distribution
from . import reductions
from ._operands import check_array, cut_balanced
from .ufuncs import elementwise

__all__ = ["histogram", "histogram2d", "histogramdd", "histogram_bin_edges", "bincount",
           "digitize"]


def _split_comm(x: DistArray):
    gaxes = [g for g in x.split if g is not None and x.grid.dims[g] > 1]
    return x.grid.sub_comm(gaxes) if gaxes else None


def _spread(a, x: DistArray) -> DistArray:
    """The replicated NumPy array ``a`` (the same on every rank) as a DistArray on ``x``'s grid
    and device, cut into balanced blocks along axis 0 over grid axis 0 (no messages)."""
    a = np.asarray(a)
    d = Distribution(a.shape, x.grid.dims, (None,) * a.ndim)
    r = cut_balanced(a, a.shape, d, x.grid, {0: 0} if a.ndim else {})
    if x.device != "cpu":
        r = DistArray(to_device(r.local, x.device), r.distribution, r.grid)
    return r


def _bins_key(bins):
    if isinstance(bins, numbers.Integral) and not isinstance(bins, bool):
        return int(bins)
    if isinstance(bins, (list, tuple)):
        return tuple(_bins_key(b) for b in bins)
    return operand_key(bins)  # arrays: shape, dtype and a hash of the values


def _weights_local(weights, x: DistArray):
    """This rank's weights of its elements of ``x`` (flattened), or ``None``."""
    if weights is None:
        return None
    wd = weights if weights.distribution == x.distribution and weights.grid.dims == x.grid.dims \
        else weights.redistribute(grid=x.grid, distribution=x.distribution)
    return to_host(wd.local).reshape(-1)


def _check_weights(weights, shape, msg: str):
    if weights is not None:
        check_array(weights, "weights")
        if weights.shape != tuple(shape):
            raise ValueError(msg)


def _edges_1d(x: DistArray, bins, range):
    """NumPy's ``histogram_bin_edges`` of ``x`` (collective for an automatic range)."""
    if isinstance(bins, str):
        raise TypeError("histogram: string bin estimators are not supported for DistArrays")
    if isinstance(bins, numbers.Integral):
        if range is None:
            if x.size:
                lo, hi = reductions.min(x).item(), reductions.max(x).item()
                probe = np.array([lo, hi], dtype=x.dtype)
            else:
                probe = np.array([], dtype=x.dtype)
            return np.histogram_bin_edges(probe, bins=bins)
        return np.histogram_bin_edges(np.array([], dtype=x.dtype), bins=bins, range=range)
    if range is not None:
        raise ValueError("histogram: range is only used with an integer number of bins")
    return np.histogram_bin_edges(np.array([], dtype=x.dtype), bins=np.asarray(bins))


def _hist_args(call, x, bins, range, density, weights):
    check_array(x, "a")
    return agreed(x.grid.cart, call, a=x, bins=_bins_key(bins), range=canon(range),
                  density=density, weights=operand_key(weights))


@collective_entry
def histogram_bin_edges(a: DistArray, bins=10, range=None, weights=None) -> DistArray:
    """NumPy ``histogram_bin_edges``: the edges :func:`histogram` uses (a DistArray, laid out
    as the module docstring says)."""
    with _hist_args("histogram_bin_edges", a, bins, range, None, weights):
        _check_weights(weights, a.shape, "weights should have the same shape as a.")
        edges = _edges_1d(a, bins, range) if not isinstance(bins, numbers.Integral) \
            or range is not None else None
    if edges is None:
        edges = _edges_1d(a, bins, range)
    return _spread(edges, a)


@collective_entry
def histogram(a: DistArray, bins=10, range=None, density=None, weights=None):
    """NumPy ``histogram`` of all elements of ``a``: ``(hist, bin_edges)`` as DistArrays (see
    the module docstring for their layout).  ``bins``: an int or a 1-D monotonic sequence of
    edges; ``range=None`` takes the global min/max.  ``weights``: a DistArray of ``a``'s
    shape.  Collective."""
    with _hist_args("histogram", a, bins, range, density, weights):
        _check_weights(weights, a.shape, "weights should have the same shape as a.")
        if not isinstance(bins, numbers.Integral) or range is not None:
            edges = _edges_1d(a, bins, range)  # errors of explicit bins: agreed here
    if isinstance(bins, numbers.Integral) and range is None:
        edges = _edges_1d(a, bins, range)
    h, _ = np.histogram(to_host(a.local).reshape(-1), bins=edges,
                        weights=_weights_local(weights, a))
    comm = _split_comm(a)
    if comm is not None:
        h = allreduce(comm, h, "sum")
    if density:
        with np.errstate(invalid="ignore", divide="ignore"):
            h = h / np.diff(edges).astype(float) / h.sum()
    return _spread(h, a), _spread(edges, a)


def _sample_columns(sample):
    """The columns of ``histogramdd``'s ``sample``: a ``(N, D)`` DistArray, or a sequence of
    ``D`` 1-D DistArrays of one length (NumPy's two spellings)."""
    if isinstance(sample, DistArray):
        if sample.ndim > 2:
            raise ValueError("histogramdd: sample must be a (N, D) DistArray or a sequence of "
                             "D 1-D DistArrays")
        return [sample] if sample.ndim == 1 else [sample[:, k] for k in range(sample.shape[1])]
    cols = list(sample)
    for c in cols:
        check_array(c, "sample")
        if c.ndim != 1:
            raise ValueError("histogramdd: sample must be a (N, D) DistArray or a sequence of "
                             "D 1-D DistArrays")
    if len({c.shape for c in cols}) > 1:
        raise ValueError("all the input array dimensions except for the concatenation axis "
                         "must match exactly")
    return cols


def _dd_edges(cols, bins, range):
    """NumPy's ``histogramdd`` edges of the columns ``cols`` (collective for automatic
    ranges)."""
    D = len(cols)
    try:
        M = len(bins)
        if M != D:
            raise ValueError("The dimension of bins must be equal to the dimension of the "
                             "sample x.")
    except TypeError:
        bins = D * [bins]
    if range is None:
        range = (None,) * D
    elif len(range) != D:
        raise ValueError("range argument must have one entry per dimension")
    edges = []
    for c, b, r in zip(cols, bins, range):
        if isinstance(b, str):
            raise TypeError("histogramdd: string bin estimators are not supported")
        if np.ndim(b) == 0:
            if b < 1:
                raise ValueError(f"`bins[{len(edges)}]` must be positive, when an integer")
            if r is None:
                if c.size:
                    smin, smax = float(reductions.min(c).item()), float(reductions.max(c).item())
                else:
                    smin, smax = 0.0, 1.0
            else:
                smin, smax = (float(v) for v in r)
            if not np.isfinite(smin) or not np.isfinite(smax):
                raise ValueError(f"autodetected range of [{smin}, {smax}] is not finite")
            if smin > smax:
                raise ValueError("max must be larger than min in range parameter.")
            if smin == smax:
                smin, smax = smin - 0.5, smax + 0.5
            edges.append(np.linspace(smin, smax, operator.index(b) + 1))
        else:
            e = np.asarray(b)
            if e.ndim != 1 or np.any(e[:-1] > e[1:]):
                raise ValueError(f"`bins[{len(edges)}]` must be monotonically increasing, "
                                 "when an array")
            edges.append(e)
    return edges


@collective_entry
def histogramdd(sample, bins=10, range=None, density=None, weights=None):
    """NumPy ``histogramdd``: ``(H, edges)`` with ``H`` a D-dimensional DistArray (split by
    its first axis) and ``edges`` a list of D DistArrays.  ``sample``: an ``(N, D)`` DistArray
    or a sequence of D DistArrays of one shape.  Collective."""
    first = sample if isinstance(sample, DistArray) else next(iter(sample), None)
    check_array(first, "sample")
    with agreed(first.grid.cart, "histogramdd", sample=operand_key(
            sample if isinstance(sample, DistArray) else list(sample)), bins=_bins_key(bins),
            range=canon(range), density=density, weights=operand_key(weights)):
        cols = _sample_columns(sample)
        _check_weights(weights, cols[0].shape,
                       "weights should have the same shape as the sample points.")
    edges = _dd_edges(cols, bins, range)
    x0 = cols[0]
    cols = [c if c.distribution == x0.distribution and c.grid.dims == x0.grid.dims
            else c.redistribute(grid=x0.grid, distribution=x0.distribution) for c in cols]
    local = np.stack([to_host(c.local).reshape(-1) for c in cols], axis=1)
    h, _ = np.histogramdd(local, bins=edges, weights=_weights_local(weights, x0))
    comm = _split_comm(x0)
    if comm is not None:
        h = allreduce(comm, h, "sum")
    if density:
        s = h.sum()
        for k, e in enumerate(edges):
            shape = [1] * len(edges)
            shape[k] = len(e) - 1
            h = h / np.diff(e).reshape(shape)
        h = h / s
    return _spread(h, x0), [_spread(e, x0) for e in edges]


@collective_entry
def histogram2d(x: DistArray, y: DistArray, bins=10, range=None, density=None, weights=None):
    """NumPy ``histogram2d``: ``(H, xedges, yedges)`` (:func:`histogramdd` of ``(x, y)``)."""
    check_array(x, "x")
    with agreed(x.grid.cart, "histogram2d", x=x, y=operand_key(y), bins=_bins_key(bins)):
        check_array(y, "y")
        if x.shape != y.shape:
            raise ValueError("x and y must have the same length.")
    try:
        nb = len(bins)
    except TypeError:
        nb = 1
    if nb not in (1, 2):  # one array of edges for both axes, as NumPy
        bins = [np.asarray(bins), np.asarray(bins)]
    h, (ex, ey) = histogramdd([x, y], bins, range, density, weights)
    return h, ex, ey


@collective_entry
def bincount(x: DistArray, weights=None, minlength=0) -> DistArray:
    """NumPy ``bincount`` of a 1-D non-negative integer DistArray: a DistArray of length
    ``max(x.max() + 1, minlength)`` laid out as the module docstring says (float64 with
    ``weights``, a DistArray of ``x``'s shape, else int64).  Collective."""
    check_array(x)
    with agreed(x.grid.cart, "bincount", x=x, weights=operand_key(weights),
                minlength=canon(minlength)):
        if x.ndim != 1:
            raise ValueError("object too deep for desired array" if x.ndim > 1
                             else "object of too small depth for desired array")
        if x.dtype.kind not in "iub":
            raise TypeError(f"Cannot cast array data from {x.dtype!r} to dtype('int64') "
                            "according to the rule 'safe'")
        minlength = operator.index(minlength)
        if minlength < 0:
            raise ValueError("'minlength' must not be negative")
        _check_weights(weights, x.shape, "The weights and list don't have the same length.")
    if x.size:
        if int(reductions.min(x).item()) < 0:
            raise ValueError("'list' argument must have no negative elements")
        length = max(int(reductions.max(x).item()) + 1, minlength)
    else:
        length = minlength
    w = _weights_local(weights, x)
    labels = to_host(x.local).astype(np.int64, copy=False)
    h = np.bincount(labels, weights=w, minlength=length)
    if w is not None:  # NumPy gives int64 for empty input even with weights: keep ranks alike
        h = h.astype(np.float64)
    comm = _split_comm(x)
    if comm is not None:
        h = allreduce(comm, h, "sum")
    return _spread(h, x)


@collective_entry
def digitize(x: DistArray, bins, right=False) -> DistArray:
    """NumPy ``digitize``: the index of the bin of each element of ``x`` (``int64``, ``x``'s
    layout; elementwise, no messages).  ``bins``: a 1-D monotonic NumPy array or sequence
    (the same on every rank) or a 1-D DistArray (gathered to every rank first)."""
    check_array(x)
    with agreed(x.grid.cart, "digitize", x=x, bins=_bins_key(bins), right=bool(right)):
        if isinstance(bins, DistArray) and not bins.grid.compatible(x.grid):
            raise ValueError("digitize: bins live on a grid over other ranks than x's")
        if x.dtype.kind == "c":
            raise TypeError("x may not be complex")
    b = bins.to_numpy() if isinstance(bins, DistArray) else np.asarray(bins)
    with agreed(x.grid.cart, "digitize bins", rank_local=True):
        if b.ndim != 1:
            raise ValueError("object too deep for desired array" if b.ndim > 1
                             else "object of too small depth for desired array")
        np.digitize(np.zeros(0, x.dtype), b)  # NumPy's monotonic check and its message
    return elementwise(lambda u, right: np.digitize(to_host(u), b, right=right).astype(
        np.int64), "digitize", (x,), right=bool(right))
