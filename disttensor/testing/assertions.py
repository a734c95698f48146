"""Collective assertions for tests of distributed code (``numpy.testing`` over MPI).

Every assertion here is **collective**: all ranks of the communicator must call it, in the same
order, with arguments of the same kinds (a DistArray on every rank, or a plain array on every
rank).  Every rank agrees on the outcome: when the check passes on every rank it costs one
small all-reduce (plus whatever moving DistArray data takes); when it fails on *any* rank,
*every* rank raises :class:`AssertionError` with the *same* message, which names the failing
ranks and carries their details (for array comparisons: the worst element, at its index in
global coordinates).  A failure on one rank therefore fails the test, and makes Hypothesis
shrink, on every rank, and the ranks never drift into different code paths.

The communicator: the grid's of the first DistArray argument, else ``comm=``, else
``MPI.COMM_WORLD``.

* :func:`assert_all_ranks` -- the primitive: ``ok`` must be true on every rank.
* :func:`assert_allclose`, :func:`assert_array_equal` -- ``numpy.testing`` semantics and
  defaults, on DistArrays (compared block by block, each rank's block against the matching
  slice of a global NumPy array, or of another DistArray moved to the first one's layout)
  and on plain NumPy/CuPy arrays or scalars (compared on each rank).
* :func:`assert_same_on_all_ranks` -- a value is identical on every rank (digest compare).
* :func:`assert_adjoint` -- the dot-product test ``<f(x), y> == <x, f_adjoint(y)>``.
* :func:`assert_raises_collectively` -- a call raises the expected exception on every rank
  (also a context manager).
"""
from __future__ import annotations

import hashlib
import math
import pickle
import re

import numpy as np

from disttensor.core.agreement import status_allreduce
from disttensor.core.array import DistArray
from disttensor.core.backend import to_host

__all__ = ["assert_all_ranks", "assert_allclose", "assert_array_equal",
           "assert_same_on_all_ranks", "assert_adjoint", "assert_raises_collectively"]

_MAX_RANK_LINES = 8  # per-rank detail lines in a failure message (the rest are counted)


# -- the primitive ---------------------------------------------------------------------------
def _world():
    from mpi4py import MPI
    return MPI.COMM_WORLD


def _pick_comm(comm, *values):
    for v in values:
        if isinstance(v, DistArray):
            return v.grid.comm
    return _world() if comm is None else comm


def _all_passed(comm, ok: bool) -> bool:
    """Collective: whether ``ok`` holds on every rank (the failure all-reduce of argument
    agreement, :func:`disttensor.core.agreement.status_allreduce`, without a digest)."""
    if comm.Get_size() == 1:
        return bool(ok)
    failed, _ = status_allreduce(comm, not ok, None)
    return not failed


def _failures(comm, ok: bool, detail):
    """Collective: ``None`` when ``ok`` on every rank, else every rank's ``detail`` (``None``
    where it passed), the same list on every rank."""
    if _all_passed(comm, ok):
        return None
    return comm.allgather(None if ok else detail)


def _ranks_text(ranks) -> str:
    """``rank 3`` or ``ranks [0, 2]``."""
    return f"ranks {list(ranks)}" if len(ranks) > 1 else f"rank {ranks[0]}"


def _grouped(details) -> str:
    """``rank(s) [..]: message`` per distinct message, the ranks of each in one group."""
    groups: dict[str, list[int]] = {}
    for r, d in enumerate(details):
        if d is not None:
            groups.setdefault(str(d), []).append(r)
    lines = [f"{_ranks_text(rs)}: {m}" if m else _ranks_text(rs) for m, rs in groups.items()]
    return "\n".join(lines)


def _raise(header: str, err_msg: str, body: str):
    __tracebackhide__ = True
    parts = [header] + ([err_msg] if err_msg else []) + ([body] if body else [])
    raise AssertionError("\n".join(parts))


def assert_all_ranks(ok, msg: str = "", *, comm=None) -> None:
    """Collective: raise ``AssertionError`` on every rank unless ``ok`` is true on every rank.

    The message (the same on every rank) names the failing ranks and carries each failing
    rank's ``msg``, ranks with the same ``msg`` grouped: ``failed on ranks [1, 3] of 4:
    ranks [1, 3]: <msg>``.  Costs one all-reduce of one int when it passes."""
    __tracebackhide__ = True
    comm = _world() if comm is None else comm
    details = _failures(comm, bool(ok), str(msg))
    if details is not None:
        failed = [r for r, d in enumerate(details) if d is not None]
        _raise(f"failed on {_ranks_text(failed)} of {comm.Get_size()}", "", _grouped(details))


# -- array comparisons -----------------------------------------------------------------------
def _host(a):
    """A NumPy array for a NumPy/CuPy array, scalar or nested sequence."""
    if isinstance(a, np.ndarray):
        return a
    if type(a).__module__.split(".")[0] == "cupy":
        return to_host(a)
    return np.asanyarray(a)


def _layout_of(*values):
    """The first DistArray of at least one dimension among ``values`` (``None`` if none)."""
    return next((v for v in values if isinstance(v, DistArray) and v.ndim > 0), None)


def _blocks(actual, desired, strict: bool):
    """``(a, d, layout)``: this rank's NumPy arrays to compare and the DistArray whose layout
    they are in (``None``: plain arrays, compared whole on every rank).  Raises
    ``AssertionError`` for a shape or dtype mismatch (the same on every rank)."""
    # a 0-d DistArray is replicated: its block is the whole value, like a plain scalar
    actual, desired = (to_host(v.local) if isinstance(v, DistArray) and v.ndim == 0 else v
                       for v in (actual, desired))
    layout = _layout_of(actual, desired)
    sa, sd = np.shape(actual), np.shape(desired)
    if strict:
        da, dd = (np.dtype(v.dtype) if isinstance(v, DistArray) else _host(v).dtype
                  for v in (actual, desired))
        if sa != sd:
            raise AssertionError(f"(shapes {sa}, {sd} mismatch)")
        if da != dd:
            raise AssertionError(f"(dtypes {da}, {dd} mismatch)")
    elif sa != sd and sa != () and sd != ():
        raise AssertionError(f"(shapes {sa}, {sd} mismatch)")
    if layout is None:
        return _host(actual), _host(desired), None

    def block(v):
        if v is layout:
            return to_host(v.local)
        if isinstance(v, DistArray):
            if v.distribution != layout.distribution or not v.grid.same_as(layout.grid):
                v = v.redistribute(grid=layout.grid, distribution=layout.distribution)
            return to_host(v.local)
        v = _host(v)
        return np.broadcast_to(v, layout.shape)[layout.local_slices]

    return block(actual), block(desired), layout


def _mismatch_mask(a, d, rtol, atol, equal_nan, exact: bool):
    a, d = np.broadcast_arrays(a, d)
    if exact:
        same = a == d
        if a.dtype.kind in "fc" or d.dtype.kind in "fc":
            same |= np.isnan(a) & np.isnan(d)
        return ~np.asarray(same, dtype=bool), a, d
    return ~np.isclose(a, d, rtol=rtol, atol=atol, equal_nan=equal_nan), a, d


def _worst(a, d, bad, offset):
    """``(abs_worst, rel_worst)`` among the mismatched elements, each ``(value, global index,
    actual, desired)`` or ``None`` when the dtypes have no difference."""
    if not bad.any() or a.dtype.kind not in "biufc" or d.dtype.kind not in "biufc":
        return None, None
    wide = np.result_type(a.dtype, d.dtype, np.float64)
    av, dv, where = a[bad], d[bad], np.argwhere(bad)
    with np.errstate(all="ignore"):
        diff = np.abs(av.astype(wide) - dv.astype(wide))
        rel = diff / np.abs(dv.astype(wide))
    out = []
    for values in (diff, rel):
        i = int(np.argmax(np.where(np.isnan(values), -np.inf, values)))  # NaN only if all are
        index = tuple(int(o + j) for o, j in zip(offset, where[i]))
        out.append((float(values[i]), index, av[i].item(), dv[i].item()))
    return tuple(out)


def _exact_count(layout, bad) -> int:
    """Collective over ``layout``'s grid: the number of global elements mismatched on at least
    one replica of this rank's block, counted on the first replica only (others give 0)."""
    grid, rep = layout.grid, layout.distribution.replicated_grid_axes
    rep = tuple(g for g in rep if grid.dims[g] > 1)
    if not rep:
        return int(bad.sum())
    from mpi4py import MPI
    sub = grid.sub_comm(rep)
    mask = np.ascontiguousarray(bad, dtype=np.uint8)
    union = np.empty_like(mask)
    sub.Allreduce(mask, union, op=MPI.MAX)
    return int(union.sum()) if sub.Get_rank() == 0 else 0


def _fmt_index(index) -> str:
    return "(" + ", ".join(map(str, index)) + ("," if len(index) == 1 else "") + ")"


def _compare(actual, desired, *, rtol, atol, equal_nan, err_msg, strict, exact, comm, header):
    __tracebackhide__ = True
    if rtol < 0 or atol < 0:
        raise ValueError(f"rtol and atol must be >= 0, got rtol={rtol}, atol={atol}")
    comm = _pick_comm(comm, actual, desired)
    layout = _layout_of(actual, desired)  # from the argument types: the same on every rank
    error = bad = stats = None
    try:
        a, d, _ = _blocks(actual, desired, strict)
        bad, a, d = _mismatch_mask(a, d, rtol, atol, equal_nan, exact)
        offset = ([s.start for s in layout.local_slices] if layout is not None
                  else [0] * bad.ndim)
        stats = (int(bad.sum()), int(bad.size), _worst(a, d, bad, offset),
                 [(s.start, s.stop) for s in layout.local_slices]
                 if layout is not None else None)
    except Exception as e:  # noqa: BLE001 - bad data is a (collective) assertion failure
        error = f"{type(e).__name__}: {str(e).strip()}" if not isinstance(e, AssertionError) \
            else str(e).strip()
    ok = error is None and stats[0] == 0
    if _all_passed(comm, ok):
        return
    # every rank is here: settle the details collectively
    count = None
    if layout is not None:
        mask = bad if bad is not None and bad.shape == layout.local.shape else \
            np.zeros(layout.local.shape, dtype=bool)
        count = _exact_count(layout, mask)
    details = comm.allgather((error, stats, count))
    _raise(header, err_msg, _describe(details, layout))


def _describe(details, layout) -> str:
    lines = []
    errors = [e for e, _, _ in details]
    if any(errors):
        lines.append(_grouped(errors))
    failed = [r for r, (e, s, _) in enumerate(details) if e is None and s[0]]
    if not failed:
        return "\n".join(lines)
    if layout is not None:
        k = sum(c or 0 for _, _, c in details)
        n = layout.size
        lines.append(f"Mismatched elements: {k} / {n} ({100 * k / max(n, 1):.3g}%) "
                     f"on {_ranks_text(failed)}")
        where = "global index"
    else:
        lines.append("Mismatched elements: " + "; ".join(
            f"{details[r][1][0]} / {details[r][1][1]} on rank {r}" for r in failed))
        where = "index"
    for name, i in (("absolute", 0), ("relative", 1)):
        cands = [(s[2][i], r) for r, (_, s, _) in enumerate(details)
                 if s is not None and s[2] is not None and s[2][0] is not None]
        if not cands:
            continue
        (value, index, av, dv), r = max(cands, key=lambda c: (not math.isnan(c[0][0]),
                                                              c[0][0], -c[1]))
        lines.append(f"Max {name} difference among violations: {value:.6g} at {where} "
                     f"{_fmt_index(index)} on rank {r} (actual {av!r}, desired {dv!r})")
    if layout is not None:
        shown = failed[:_MAX_RANK_LINES]
        lines += [f"rank {r}: {details[r][1][0]} mismatched in its block "
                  + "[" + ", ".join(f"{lo}:{hi}" for lo, hi in details[r][1][3]) + "]"
                  for r in shown]
        if len(failed) > len(shown):
            lines.append(f"... and {len(failed) - len(shown)} more ranks")
    return "\n".join(lines)


def assert_allclose(actual, desired, rtol: float = 1e-7, atol: float = 0.0, *,
                    equal_nan: bool = True, err_msg: str = "", strict: bool = False,
                    comm=None) -> None:
    """Collective ``numpy.testing.assert_allclose``: ``|actual - desired| <= atol + rtol *
    |desired|`` elementwise, on every rank.

    ``actual`` and ``desired`` are DistArrays and/or NumPy/CuPy arrays or scalars:

    * DistArray vs array: each rank compares its block with the matching slice
      (``x.local_slices``) of the global array, which every rank passes whole (a scalar is
      broadcast unless ``strict``).
    * DistArray vs DistArray: the second is moved to the first one's layout (collective)
      when they differ, then blocks are compared.
    * arrays vs arrays: each rank compares its own (numpy's rules), all agree.

    Shapes must be equal (a 0-d operand broadcasts unless ``strict``; ``strict`` also checks
    dtypes).  On failure the message reports "Mismatched elements: k / n" (each global element
    once, however many ranks hold it), the largest absolute and relative differences with
    their index in global coordinates and rank, and each failing rank's block.  Exceptions
    while comparing (say incomparable dtypes) are failures too.  ``ValueError`` (every rank)
    for a negative ``rtol`` or ``atol``."""
    __tracebackhide__ = True
    _compare(actual, desired, rtol=rtol, atol=atol, equal_nan=equal_nan, err_msg=err_msg,
             strict=strict, exact=False, comm=comm,
             header=f"Not equal to tolerance rtol={rtol:g}, atol={atol:g}")


def assert_array_equal(actual, desired, *, err_msg: str = "", strict: bool = False,
                       comm=None) -> None:
    """Collective ``numpy.testing.assert_array_equal``: equal elementwise, NaNs in the same
    places count as equal; operands, layouts and the message as in :func:`assert_allclose`."""
    __tracebackhide__ = True
    _compare(actual, desired, rtol=0.0, atol=0.0, equal_nan=True, err_msg=err_msg,
             strict=strict, exact=True, comm=comm, header="Arrays are not equal")


# -- replicated values -----------------------------------------------------------------------
def _canonical(value):
    """A picklable, rank-independent form of ``value`` (arrays as dtype, shape and bytes;
    DistArrays as their global metadata)."""
    if isinstance(value, DistArray):
        return ("DistArray", value.shape, np.dtype(value.dtype).str, repr(value.distribution),
                value.grid.dims, value.halo, value.device)
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_canonical(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((repr(k), _canonical(v)) for k, v in value.items())))
    if isinstance(value, np.ndarray) or type(value).__module__.split(".")[0] == "cupy":
        a = np.ascontiguousarray(_host(value))
        if a.dtype.hasobject:
            return ("ndarray", a.shape, _canonical(a.tolist()))
        return ("ndarray", a.dtype.str, a.shape, a.tobytes())
    if isinstance(value, np.generic):
        return (type(value).__name__, value.tobytes())
    return (type(value).__name__, repr(value))


def _short(value, limit: int = 300) -> str:
    text = repr(value)
    if isinstance(value, DistArray):  # its repr leaves out the ownership sizes
        text = (f"DistArray(dtype={value.dtype}, halo={value.halo}, device={value.device!r}, "
                f"{value.distribution!r})")
    return text if len(text) <= limit else text[:limit - 3] + "..."


def assert_same_on_all_ranks(value, *, comm=None, err_msg: str = "") -> None:
    """Collective: ``value`` is identical on every rank -- arrays (dtype, shape and bytes;
    NaNs with the same bits are equal), scalars (type and value: ``1`` and ``np.int64(1)``
    differ), nested tuples/lists/dicts, DistArrays (their global metadata: shape, dtype,
    distribution, grid shape, halo, device).  Compares a 128-bit digest with one all-reduce
(:func:`disttensor.core.agreement.status_allreduce`, as argument agreement does);
    on failure every rank raises the same message naming the groups of ranks holding each
    distinct value (a short ``repr`` of each)."""
    __tracebackhide__ = True
    comm = _pick_comm(comm, value)
    digest = hashlib.sha256(pickle.dumps(_canonical(value), protocol=4)).digest()
    if comm.Get_size() == 1:
        return
    halves = tuple(int(h) for h in np.frombuffer(digest[:16], dtype=np.int64))
    _, differ = status_allreduce(comm, False, halves)  # one all-reduce compares the digests
    if not differ:
        return
    everyone = comm.allgather((digest, _short(value)))
    groups: dict[bytes, list[int]] = {}
    for r, (d, _) in enumerate(everyone):
        groups.setdefault(d, []).append(r)
    lines = [f"{_ranks_text(rs)}: {everyone[rs[0]][1]}" for rs in groups.values()]
    _raise(f"value differs between ranks ({len(groups)} distinct values on "
           f"{comm.Get_size()} ranks)", err_msg, "\n".join(lines))


# -- adjoints --------------------------------------------------------------------------------
def _pair_terms(a, b, inner: str, size: int):
    """This rank's ``(<a, b>, |a|^2, |b|^2)`` contributions (complex ``vdot``: ``a``
    conjugated), weighted so that the sum over ranks is the inner product (see
    :func:`assert_adjoint`)."""
    weight = 1.0
    a, b = (to_host(v.local) if isinstance(v, DistArray) and v.ndim == 0 else v for v in (a, b))
    if inner == "blocks":
        a, b = (to_host(v.local) if isinstance(v, DistArray) else _host(v) for v in (a, b))
        if a.shape != b.shape:
            raise ValueError(f"blocks of shapes {a.shape} and {b.shape} on this rank")
    else:
        layout = _layout_of(a, b)
        if layout is None:  # replicated plain values: every rank holds the whole
            a, b, weight = _host(a), _host(b), 1.0 / size
            if a.shape != b.shape:
                raise ValueError(f"shapes {a.shape} and {b.shape} differ")
        else:
            a, b, _ = _blocks(a, b, strict=False)
            dist, grid = layout.distribution, layout.grid
            weight = 1.0 / math.prod(grid.dims[g] for g in dist.replicated_grid_axes)
    a = np.asarray(a, dtype=np.complex128).ravel()
    b = np.asarray(b, dtype=np.complex128).ravel()
    return [weight * np.vdot(a, b), weight * np.vdot(a, a).real, weight * np.vdot(b, b).real]


def _precision(*values) -> float:
    kinds = [np.dtype(v.dtype) for v in values if hasattr(v, "dtype")]
    return min((np.finfo(k).eps for k in kinds if k.kind in "fc"), default=2.0 ** -52)


def assert_adjoint(f, f_adjoint, x, y, *, rtol: float | None = None, atol: float = 0.0,
                   inner: str = "global", comm=None, err_msg: str = "") -> None:
    """Collective dot-product test: ``<f(x), y> == <x, f_adjoint(y)>``.

    ``f`` and ``f_adjoint`` are called once each on every rank (they may be collective).
    The inner products ``<a, b> = sum(conj(a) * b)`` are global, summed over ranks in rank
    order (the same value on every rank):

    * ``inner="global"`` (default): over global arrays.  DistArray operands count each
      element once: every rank's block is weighted by 1 / (number of its replicas), and an
      operand in another layout is moved to the first one's (a plain array with a DistArray is
      the global array; two plain arrays are replicated values, counted once).
    * ``inner="blocks"``: each rank's block (a DistArray's ``local`` or a plain per-rank array,
      e.g. a halo buffer) is its own coordinate, replicas included -- for maps on per-rank
      storage such as the reverse halo exchange and ``redistribute_adjoint``, whose replicas
      are independent inputs.

    Passes when ``|lhs - rhs| <= atol + rtol * max(|lhs|, |rhs|, |f(x)| |y|, |x| |f*(y)|)``;
    ``rtol`` defaults to ``1e4`` times the machine epsilon of the least precise floating
    dtype among the four operands (``2.2e-12`` for float64).  On failure every rank raises
    the same message with both values and their relative gap; an exception in ``f`` or
    ``f_adjoint`` on any rank is reported as a failure on every rank (if the others got
    past it)."""
    __tracebackhide__ = True
    if inner not in ("global", "blocks"):
        raise ValueError(f"inner must be 'global' or 'blocks', got {inner!r}")
    comm = _pick_comm(comm, x, y)
    error, terms, fx, aty = None, [0.0] * 6, None, None
    try:
        fx = f(x)
        aty = f_adjoint(y)
        terms = (_pair_terms(fx, y, inner, comm.Get_size())
                 + _pair_terms(x, aty, inner, comm.Get_size()))
    except Exception as e:  # noqa: BLE001 - reported collectively
        error = f"{'f' if fx is None else 'f_adjoint' if aty is None else 'inner product'} " \
                f"raised {type(e).__name__}: {str(e).strip()}"
    everyone = comm.allgather((error, [complex(t) for t in terms]))
    errors = [e for e, _ in everyone]
    if any(errors):
        _raise("adjoint test failed", err_msg, _grouped(errors))
    lhs, fx2, y2, rhs, x2, aty2 = (sum(t[i] for _, t in everyone) for i in range(6))
    if rtol is None:
        rtol = 1e4 * _precision(x, y, fx, aty)
    scale = max(abs(lhs), abs(rhs), math.sqrt(fx2.real * y2.real),
                math.sqrt(x2.real * aty2.real))
    gap = abs(lhs - rhs)
    if not gap <= atol + rtol * scale:  # NaN fails
        _raise("adjoint test failed: <f(x), y> != <x, f_adjoint(y)>", err_msg,
               f"<f(x), y> = {_num(lhs)}\n<x, f_adjoint(y)> = {_num(rhs)}\n"
               f"|difference| = {gap:.6g}, relative to the scale {scale:.6g}: "
               f"{gap / scale if scale else math.inf:.3g} (rtol={rtol:g}, atol={atol:g}, "
               f"inner={inner!r}, {comm.Get_size()} ranks)")


def _num(z: complex) -> str:
    return repr(z.real) if z.imag == 0 else repr(z)


# -- exceptions ------------------------------------------------------------------------------
class _RaisesCollectively:
    """The context manager of :func:`assert_raises_collectively`; ``value`` is the exception
    this rank caught (after the block)."""

    def __init__(self, exc, match, comm):
        self.expected, self.match, self.comm, self.value = exc, match, comm, None

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        __tracebackhide__ = True
        if kind is not None and not issubclass(kind, Exception):
            return False  # KeyboardInterrupt, SystemExit, pytest's outcomes: not ours
        if value is None:
            problem = "did not raise"
        elif not isinstance(value, self.expected):
            problem = f"raised {type(value).__name__}: {str(value).strip()}"
        elif self.match is not None and not re.search(self.match, str(value)):
            problem = f"message {str(value)!r} does not match {self.match!r}"
        else:
            problem = None
        self.value = value
        details = _failures(self.comm, problem is None, problem)
        if details is not None:
            failed = [r for r, d in enumerate(details) if d is not None]
            _raise(f"expected {_exc_name(self.expected)}"
                   + (f" matching {self.match!r}" if self.match is not None else "")
                   + f" on every rank; failed on {_ranks_text(failed)} of {len(details)}",
                   "", _grouped(details))
        return True


def _exc_name(exc) -> str:
    return " or ".join(e.__name__ for e in exc) if isinstance(exc, tuple) else exc.__name__


def assert_raises_collectively(exc, fn=None, *args, match: str | None = None, comm=None,
                               **kwargs):
    """Collective: ``fn(*args, **kwargs)`` must raise ``exc`` (a class or tuple of classes)
    with ``str(exception)`` matching the regular expression ``match`` (``re.search``, as in
    ``pytest.raises``) on every rank.  Otherwise every rank raises the same
    ``AssertionError`` giving, per failing rank, "did not raise", the other exception, or the
    message that did not match.  Without ``fn`` it is a context manager::

        with assert_raises_collectively(ValueError, match="shape"):
            dt.reshape(x, (7,))

    ``TypeError`` (every rank) if ``exc`` is not an exception class or tuple of them."""
    __tracebackhide__ = True
    classes = exc if isinstance(exc, tuple) else (exc,)
    if not classes or not all(isinstance(c, type) and issubclass(c, BaseException)
                              for c in classes):
        raise TypeError(f"exc must be an exception class or a tuple of them, got {exc!r}")
    ctx = _RaisesCollectively(exc, match, _world() if comm is None else comm)
    if fn is None:
        if args or kwargs:
            raise TypeError("arguments given without fn")
        return ctx
    with ctx:
        fn(*args, **kwargs)
    return ctx.value
