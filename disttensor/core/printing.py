"""How a DistArray prints: values like NumPy, without ever hanging.

Design (why ``str`` and ``repr`` differ)
---------------------------------------
Showing the values of a distributed array needs communication, and a call that communicates
hangs (or fails) when only some ranks make it.  ``repr`` is called on one rank all the time
without the user asking: pytest's assertion rewriting and its failure reports, debuggers
(``p x`` in pdb on one rank), tracebacks and error messages built on one rank, logging in an
``if rank == 0`` branch.  ``print(x)`` and ``str(x)`` are what a user writes on every rank of
an SPMD script to look at the values.  So:

* ``str(x)`` (and ``print(x)``, ``f"{x}"``, ``format(x, "")``) of an array with at least
  one axis is **collective** over the array's grid, like every other call on a DistArray: the
  ranks agree on the call (argument agreement, so a ``str`` made on one rank while the others
  make another collective call raises
  :class:`~disttensor.core.agreement.ArgumentMismatchError` on every rank instead of
  hanging), only the elements NumPy would show are gathered to rank 0 of the grid (for an
  array larger than ``np.get_printoptions()['threshold']``, the ``edgeitems`` leading and
  trailing items of each long axis: a few hundred elements, never the whole array; the
  selection is also held to ``DISTTENSOR_GATHER_LIMIT``), and rank 0 formats them with NumPy
  (its print options: precision, linewidth, ...).  Rank 0's ``str(x)`` is exactly
  ``str(x.to_numpy())``; the other ranks' ``str(x)`` is ``""``, so ``print(x)`` on every rank
  shows the values once per job (the other ranks print an empty line).  Use
  :func:`array_str` / :func:`array_repr` for the text on every rank.
* A 0-d array (the result of a full reduction) holds its value on every rank, so ``str``,
  ``format`` (``f"{x.sum():.3f}"``), ``float``/``int`` and ``item`` of it never communicate
  and give NumPy's scalar text on every rank: ``if rank == 0: print(loss)`` is safe.
* ``repr(x)`` **never communicates**.  When this rank holds every value (a one-rank grid, or
  no axis split: a replicated array, 0-d results of reductions) it is NumPy's ``repr`` with
  ``DistArray`` for ``array`` and the layout appended:
  ``DistArray([0., 1., 2.], split=(0,), grid=(1,))``.  Otherwise it is the metadata and the
  values of this rank's own block (which this rank has without asking anyone):
  ``DistArray(shape=(10,), dtype=float64, split=(0,), grid=(2,), device='cpu'; rank 1 holds
  [5:10]: [5. 6. 7. 8. 9.])``.

Differences from NumPy: ``str(x)`` of an array with an axis is ``""`` on ranks other than 0
(and must be called on every rank); ``repr(x)`` of an array split over several ranks shows its
metadata and the local block, not the global values.
"""
from __future__ import annotations

import math

import numpy as np

from .backend import array_module, to_host
from .entry import agreed, collective_entry
from .memory import check_gather_size

__all__ = ["array_str", "array_repr", "array2string", "to_str", "local_repr",
           "summary_indices"]

_REPR_PREFIX = "DistArray("


def summary_indices(n: int, edgeitems: int, summarize: bool) -> np.ndarray:
    """The indices of an axis of length ``n`` that the printout needs (pure): all of them, or
    (summarising an axis longer than ``2 * edgeitems``) the first ``edgeitems + 1`` and the
    last ``edgeitems``.  The one extra leading item stands in for the elided middle, so NumPy,
    formatting the selection with summarisation on, elides exactly it and formats the rest as
    it would the whole axis (its column widths come from the shown items only)."""
    if not summarize or n <= 2 * edgeitems or edgeitems <= 0:  # NumPy's edgeitems=0: all
        return np.arange(n, dtype=np.int64)
    return np.concatenate([np.arange(edgeitems + 1, dtype=np.int64),
                           np.arange(n - edgeitems, n, dtype=np.int64)])


class _Selection:
    """What the printout of ``x`` needs: per-axis global indices and the shape they form."""

    def __init__(self, shape, threshold: int, edgeitems: int):
        self.summarize = math.prod(shape) > threshold
        self.indices = [summary_indices(n, edgeitems, self.summarize) for n in shape]
        self.shape = tuple(len(i) for i in self.indices)

    def piece(self, x):
        """``(offsets into the selection, values)`` of this rank's share (host NumPy), or
        ``None`` when this rank sends nothing (no selected element, or a replica of a block
        another rank sends)."""
        coords = x.grid.coords
        used = {g for g in x.split if g is not None}
        if any(c for g, c in enumerate(coords) if g not in used):
            return None
        box = x.distribution.block_box(coords)
        offsets, local_idx = [], []
        for sel, a, b in zip(self.indices, box.start, box.stop):
            inside = np.flatnonzero((sel >= a) & (sel < b))
            if inside.size == 0:
                return None
            offsets.append(int(inside[0]))
            local_idx.append(sel[inside] - a)
        if x.ndim == 0:
            return (), np.array(to_host(x.local))
        xp = array_module(x.local)
        picked = x.local[xp.ix_(*(xp.asarray(i) for i in local_idx))]
        return tuple(offsets), np.ascontiguousarray(to_host(picked))


def _gather_selection(x, root: int | None, call: str):
    """Collective: the selection's values as one NumPy array on ``root`` (every rank when
    ``root`` is None), ``None`` elsewhere; and whether the printout summarises."""
    from . import watchdog
    opts = np.get_printoptions()
    comm = x.grid.cart
    with agreed(comm, call, x=x, root=root, threshold=int(opts["threshold"]),
                edgeitems=int(opts["edgeitems"])):
        if root is not None and not 0 <= root < comm.size:
            raise ValueError(f"root {root} outside 0..{comm.size - 1}")
        sel = _Selection(x.shape, opts["threshold"], opts["edgeitems"])
        check_gather_size(call, _Sized(sel.shape, x.dtype), what="printing gathers",
                          where="on rank 0" if root is not None else "on every rank")
    mine = sel.piece(x)
    with watchdog.waiting(comm, f"MPI_Gather ({call})"):
        pieces = (comm.allgather(mine) if root is None else comm.gather(mine, root=root)) \
            if comm.size > 1 else [mine]
    if pieces is None:
        return None, sel.summarize
    out = np.empty(sel.shape, dtype=x.dtype)
    for p in pieces:
        if p is not None:
            offsets, values = p
            out[tuple(slice(o, o + n) for o, n in zip(offsets, values.shape))] = values
    return out, sel.summarize


class _Sized:
    """Stand-in with the ``nbytes`` of the selection (for :func:`check_gather_size`)."""

    def __init__(self, shape, dtype):
        self.nbytes = math.prod(shape) * np.dtype(dtype).itemsize


def _numpy_text(values: np.ndarray, summarize: bool, fmt) -> str:
    if summarize:
        with np.printoptions(threshold=0):
            return fmt(values)
    return fmt(values)


def _as_distarray_repr(text: str, suffix: str) -> str:
    """NumPy's ``array(...)`` repr as ``DistArray(..., <suffix>)``."""
    body = text[len("array("):-1].replace("\n" + " " * len("array("),
                                          "\n" + " " * len(_REPR_PREFIX))
    return f"{_REPR_PREFIX}{body}, {suffix})"


def _layout_suffix(x) -> str:
    dev = "" if x.device == "cpu" else f", device={x.device!r}"
    return f"split={x.split}, grid={x.grid.dims}{dev}"


@collective_entry
def array_str(x, root: int | None = None) -> str | None:
    """Collective over ``x``'s grid: ``str(x.to_numpy())`` (NumPy's text, summarised with
    NumPy's print options: only the shown elements are gathered) on ``root``, ``None`` on
    the other ranks; ``root=None`` (default): on every rank."""
    values, summarize = _gather_selection(x, root, "array_str")
    if values is None:
        return None
    return _numpy_text(values, summarize, str if x.ndim == 0 else np.array_str)


@collective_entry
def array_repr(x, root: int | None = None) -> str | None:
    """Collective over ``x``'s grid: NumPy's ``repr`` of the global values with ``DistArray``
    for ``array`` and the layout appended (``DistArray([0, 1, 2], split=(0,), grid=(2,))``)
    on ``root``, ``None`` on the other ranks; ``root=None`` (default): on every rank."""
    values, summarize = _gather_selection(x, root, "array_repr")
    if values is None:
        return None
    text = _numpy_text(values, summarize, np.array_repr)
    if summarize:  # NumPy >= 2.2 names the shape of a summarised array: the global one
        text = text.replace(f"shape={values.shape}", f"shape={x.shape}")
    return _as_distarray_repr(text, _layout_suffix(x))


def _options(**opts):
    """``np.printoptions`` with the options given (``None``: the current one)."""
    return np.printoptions(**{k: v for k, v in opts.items() if v is not None})


@collective_entry
def array2string(a, max_line_width=None, precision=None, suppress_small=None, separator=" ",
                 prefix="", *, threshold=None, edgeitems=None, sign=None, floatmode=None,
                 suffix="", formatter=None, legacy=None) -> str:
    """``numpy.array2string`` of a DistArray (``np.array2string(x)`` dispatches here):
    collective over its grid, the text on every rank; only the shown elements are gathered
    (see the module docstring)."""
    with _options(threshold=threshold, edgeitems=edgeitems):
        values, summarize = _gather_selection(a, None, "array2string")
    return np.array2string(values, max_line_width, precision, suppress_small, separator,
                           prefix, threshold=0 if summarize else values.size + 1,
                           edgeitems=edgeitems, sign=sign, floatmode=floatmode,
                           suffix=suffix, formatter=formatter, legacy=legacy)


def numpy_array_str(a, max_line_width=None, precision=None, suppress_small=None) -> str:
    """``numpy.array_str`` of a DistArray: :func:`array_str` on every rank."""
    with _options(linewidth=max_line_width, precision=precision, suppress=suppress_small):
        return array_str(a)


def numpy_array_repr(arr, max_line_width=None, precision=None, suppress_small=None) -> str:
    """``numpy.array_repr`` of a DistArray: :func:`array_repr` on every rank."""
    with _options(linewidth=max_line_width, precision=precision, suppress=suppress_small):
        return array_repr(arr)


def to_str(x) -> str:
    """``str(x)``: a 0-d array's value on every rank (local: it is replicated); otherwise
    collective, NumPy's text on rank 0 of the grid and ``""`` on the other ranks."""
    if x.ndim == 0:
        return str(np.asarray(to_host(x.local)))
    return array_str(x, root=0) or ""


def holds_all_values(x) -> bool:
    """Whether this rank's block is the whole array (one rank, or no axis split)."""
    return x.grid.cart.size == 1 or all(s is None for s in x.split)


def local_repr(x) -> str:
    """``repr(x)``: never communicates (see the module docstring)."""
    if holds_all_values(x):
        return _as_distarray_repr(np.array_repr(to_host(x.local)), _layout_suffix(x))
    box = x.distribution.block_box(x.grid.coords)
    where = ", ".join(f"{a}:{b}" for a, b in zip(box.start, box.stop))
    block = np.array2string(to_host(x.local), separator=" ")
    return (f"DistArray(shape={x.shape}, dtype={x.dtype}, split={x.split}, "
            f"grid={x.grid.dims}, device={x.device!r}; rank {x.grid.rank} holds [{where}]: "
            f"{block})")
