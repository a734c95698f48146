"""The step profiler: where the time of a training step goes, per op, pass and rank.

``with dt.profile(grid) as prof:`` records, on the thread that entered it, every op of the
autograd tape (forward and backward) and inside each op the time spent in these categories:

==============  ==========================================================================
``kernel``      the per-rank local kernels (``ops.local.kernels_for``: convolutions,
                pooling, pointwise, normalization, losses)
``pack``        copying point-to-point pieces into and out of contiguous buffers (halo
                exchange and redistribution: :class:`~disttensor.core.comm.PieceExchange`)
``p2p wait``    waiting for point-to-point messages (halos, redistribution, pipeline)
``collective``  waiting in all-reduces and other collectives (statistics, losses, gradients)
``agreement``   argument agreement: the digest of a collective call's arguments and the
                failure all-reduce it rides on (:func:`disttensor.core.comm.collective`)
``alloc``       :func:`disttensor.core.memory.allocate`
``python``      the rest of the op's time (its own Python, NumPy calls outside the kernels)
==============  ==========================================================================

Regions nest (an agreement contains its all-reduce wait; a kernel may allocate): each
region's *exclusive* time (its duration less that of the regions inside it) is what the
summary charges to its category, so the categories of an op add up to the op's time.

How ops are found without touching every op: a forward op is the time from the end of the
previous op (or of the last explicit region, step mark or backward) to the moment the op's
result is recorded on the tape (``autograd.tensor.make_result``), so the Python of the layer
that calls it counts as the op's; a backward op is one node of the backward walk (its
gradient function plus the accumulation of what it returns).  The gradient all-reduce that
a data-parallel reducer waits for after the walk is the op ``grad sync``; :meth:`Profile.op`
marks any other block (the optimizer step, data loading) as an op of its own.  Time outside
every op (between steps, the loop's own Python) is the row ``(outside ops)``.

When no profile is active every hook is one test of a module global (``_active is None``),
measured at well under 1 % of the smallest training step (``bench/profile_bench.py``).

Results: :meth:`Profile.summary` (collective: a text table, the same on every rank) and
:meth:`Profile.write_chrome_trace` (collective: ``trace-rank{r}.json`` per rank and a merged
``trace.json``, Chrome's Trace Event format, which Perfetto and ``chrome://tracing`` open);
the pure table and trace math lives in :mod:`disttensor.core.profile_report`.
"""
from __future__ import annotations

import contextlib
import os
import threading
import time

from mpi4py import MPI

from . import profile_report as _report

__all__ = ["profile", "Profile", "region", "CATEGORIES"]

CATEGORIES = _report.CATEGORIES

#: the active profile (None: profiling off; every hook tests this global first)
_active: "Profile | None" = None
_NULL = NULL = contextlib.nullcontext()
_now = time.perf_counter_ns
_cpu = time.thread_time_ns


class _Region:
    """One timed region of category ``cat`` (a context manager, reusable only once)."""

    __slots__ = ("p", "cat", "label", "t0", "c0", "inner")

    def __init__(self, p: "Profile", cat: str, label: str, inner=None):
        self.p, self.cat, self.label, self.inner = p, cat, label, inner

    def __enter__(self):
        p = self.p
        if threading.get_ident() != p._thread or p is not _active:
            self.p = None  # another thread (a background reader) or a profile that ended
        else:
            p._stack.append([0, 0])
        if self.inner is not None:
            self.inner.__enter__()
        self.c0 = _cpu() if p.cpu_time else 0
        self.t0 = _now()
        return self

    def __exit__(self, *exc):
        t1 = _now()
        p = self.p
        c1 = _cpu() if p is not None and p.cpu_time else 0
        if self.inner is not None:
            self.inner.__exit__(*exc)
        if p is not None and p._stack:
            children, cpu_children = p._stack.pop()
            dur, cpu = t1 - self.t0, c1 - self.c0
            if p._stack:
                p._stack[-1][0] += dur
                p._stack[-1][1] += cpu
            p.regions.append((self.cat, self.label, self.t0, t1, dur - children,
                              len(p._stack), cpu - cpu_children))
        return False


def region(cat: str, label: str = ""):
    """A timed region of category ``cat`` of the active profile (a no-op context when none
    is active).  ``label``: what the trace shows (default: the category)."""
    p = _active
    if p is None:
        return _NULL
    return _Region(p, cat, label or cat)


def wait_region(what: str, inner=None):
    """The region of a blocking MPI wait described by ``what`` (the watchdog's description):
    ``p2p wait`` for point-to-point waits, ``agreement`` for the agreement all-reduce,
    ``collective`` otherwise.  ``inner``: a context entered inside it (the watchdog's mark).
    Called by :func:`disttensor.core.watchdog.waiting` while a profile is active."""
    p = _active
    if p is None:  # ended meanwhile (another thread)
        return _NULL if inner is None else inner
    if "agreement" in what:
        cat = "agreement"
    elif "point-to-point" in what or "redistribution" in what or "pipeline" in what:
        cat = "p2p wait"
    else:
        cat = "collective"
    return _Region(p, cat, what, inner)


class _Op:
    """An explicit op (see :meth:`Profile.op`)."""

    __slots__ = ("p", "name", "pass_", "own")

    def __init__(self, p, name, pass_):
        self.p, self.name, self.pass_ = p, name, pass_

    def __enter__(self):
        p = self.p
        self.own = threading.get_ident() == p._thread and p is _active and p._op_depth == 0
        if threading.get_ident() == p._thread:
            p._op_depth += 1
        if self.own:
            p._reset()
        return self

    def __exit__(self, *exc):
        p = self.p
        if threading.get_ident() == p._thread:
            p._op_depth -= 1
        if self.own:
            p._close_op(self.name, self.pass_)
        return False


class Profile:
    """What :func:`profile` records on this rank; see the module docstring.

    ``regions``: ``(category, label, t0, t1, exclusive, depth, exclusive CPU)`` in
    nanoseconds of ``time.perf_counter_ns`` (and of this thread's CPU time,
    ``time.thread_time_ns``, 0 unless ``cpu_time``); ``ops``: ``(name, pass, t0, t1,
    {category: exclusive ns}, CPU ns, {category: exclusive CPU ns})``; ``step_marks``: the
    times of :meth:`step` (wall, CPU)."""

    def __init__(self, comm, cpu_time: bool = False):
        self.comm = comm
        self.cpu_time = bool(cpu_time)
        self.regions: list = []
        self.ops: list = []
        self.step_marks: list = []
        self.t_start = self.t_stop = None
        self._thread = threading.get_ident()
        self._stack: list = []
        self._op_depth = 0
        self._seg_t0 = self._seg_c0 = 0
        self._seg_first = 0

    # -- recording ------------------------------------------------------------------------
    def __enter__(self) -> "Profile":
        global _active
        if _active is not None:
            raise RuntimeError("a profile is already active (profiles do not nest)")
        if self.t_start is not None:
            raise RuntimeError("this profile was already used; make a new one")
        self._thread = threading.get_ident()
        self.c_start = _cpu()
        self.t_start = _now()
        self._reset()
        _active = self
        return self

    def __exit__(self, *exc):
        global _active
        self.t_stop, self.c_stop = _now(), _cpu()
        if _active is self:
            _active = None
        return False

    def step_boundary(self) -> None:
        """Time up to here belongs to no op (a backward starts; outside explicit ops)."""
        if self._op_depth == 0 and threading.get_ident() == self._thread:
            self._reset()

    def _reset(self) -> None:
        """Start a new forward segment (time before it belongs to no op)."""
        self._seg_t0, self._seg_first = _now(), len(self.regions)
        self._seg_c0 = _cpu() if self.cpu_time else 0

    def _close_op(self, name: str, pass_: str) -> None:
        t1 = _now()
        c1 = _cpu() if self.cpu_time else 0
        cats: dict = {}
        cpu_cats: dict = {}
        for r in self.regions[self._seg_first:]:
            cats[r[0]] = cats.get(r[0], 0) + r[4]
            cpu_cats[r[0]] = cpu_cats.get(r[0], 0) + r[6]
        self.ops.append((name, pass_, self._seg_t0, t1, cats, c1 - self._seg_c0, cpu_cats))
        self._seg_t0, self._seg_c0, self._seg_first = t1, c1, len(self.regions)

    def forward_op(self, name: str) -> None:
        """The tape recorded the result of op ``name``: the time since the last boundary is
        its forward (ignored inside an explicit op or a backward node: a recomputation)."""
        if self._op_depth == 0 and threading.get_ident() == self._thread:
            self._close_op(name, "forward")

    def op(self, name: str, pass_: str = "other"):
        """Context manager: the block is one op ``name`` of pass ``pass_`` (its regions are
        charged to it; inside another op it adds nothing)."""
        return _Op(self, str(name), str(pass_))

    def step(self) -> None:
        """Mark the end of a step: the summary gives times per step (divided by the number
        of marks; without marks the whole profile is one step)."""
        if threading.get_ident() == self._thread:
            self.step_marks.append((_now(), _cpu()))
            self._reset()

    # -- results --------------------------------------------------------------------------
    def local_table(self, clock: str = "wall") -> dict:
        """This rank's figures (local, no communication) by ``clock`` (``"wall"`` or, for a
        profile made with ``cpu_time=True``, ``"cpu"``: this thread's CPU time, which a
        wait with an idle MPI hardly uses and other jobs on the cores do not inflate); see
        :func:`~disttensor.core.profile_report.rank_table`."""
        if clock not in ("wall", "cpu") or clock == "cpu" and not self.cpu_time:
            raise ValueError(f"clock must be 'wall'{' or cpu' if self.cpu_time else ''}, "
                             f"got {clock!r}")
        stop = (self.t_stop, self.c_stop) if self.t_stop is not None else (_now(), _cpu())
        marks = self.step_marks
        end = marks[-1][0] if marks else stop[0]
        if clock == "wall":
            ops = [(n, p, t1, t1 - t0, cats) for n, p, t0, t1, cats, _, _ in self.ops]
            span = end - self.t_start
        else:
            ops = [(n, p, t1, c, cc) for n, p, t0, t1, _, c, cc in self.ops]
            span = (marks[-1][1] if marks else stop[1]) - self.c_start
        return _report.rank_table(ops, end, len(marks) or 1, span)

    def summary(self, sort: str = "order", clock: str = "wall") -> str:
        """The table of ms per step by op and pass, per category (mean over ranks), with the
        slowest rank and the imbalance (max/mean of the op's time over the ranks) of each row
        and of the whole step.  ``sort``: ``"order"`` (as the ops ran) or ``"time"``
        (slowest first).  ``clock``: ``"wall"`` or ``"cpu"`` (see :meth:`local_table`).
        Collective over the profile's communicator; the same text on every
        rank."""
        from .comm import collective
        with collective(self.comm, "Profile.summary", sort=sort, clock=clock):
            if sort not in ("order", "time"):
                raise ValueError(f"Profile.summary: sort must be 'order' or 'time', got "
                                 f"{sort!r}")
            if clock not in ("wall", "cpu") or clock == "cpu" and not self.cpu_time:
                raise ValueError("Profile.summary: clock must be 'wall' (or 'cpu' for a "
                                 f"profile made with cpu_time=True), got {clock!r}")
            if self.t_start is None:
                raise RuntimeError("Profile.summary: the profile was never entered")
        tables = self.comm.allgather(self.local_table(clock))
        return _report.format_summary(tables, sort=sort, clock=clock)

    def write_chrome_trace(self, directory: str, merged: bool = True) -> list[str]:
        """Write ``directory/trace-rank{r}.json`` on every rank (Chrome's Trace Event format:
        one process per rank, lane 0 the steps, lane 1 the ops with their regions nested,
        times in microseconds from the earliest start of any rank) and, with ``merged``,
        ``directory/trace.json`` with every rank (written by rank 0).  Collective over the
        profile's communicator; returns the paths written (the same on every rank)."""
        from .comm import collective
        with collective(self.comm, "Profile.write_chrome_trace", directory=directory,
                        merged=merged):
            if not isinstance(directory, (str, os.PathLike)):
                raise TypeError("Profile.write_chrome_trace: directory must be a path, got "
                                f"{type(directory).__name__}")
            if self.t_start is None:
                raise RuntimeError("Profile.write_chrome_trace: the profile was never entered")
        origin = self.comm.allreduce(self.t_start, op=MPI.MIN)
        rank = self.comm.rank
        events = _report.chrome_events(rank, self.regions, [o[:5] for o in self.ops],
                                       [m[0] for m in self.step_marks], origin)
        directory = os.fspath(directory)
        paths = [os.path.join(directory, f"trace-rank{r}.json")
                 for r in range(self.comm.size)]
        with collective(self.comm):
            os.makedirs(directory, exist_ok=True)
            _report.write_trace(paths[rank], events)
        if merged:
            every = self.comm.gather(events, root=0)
            merged_path = os.path.join(directory, "trace.json")
            with collective(self.comm):
                if rank == 0:
                    _report.write_trace(merged_path, [e for evs in every for e in evs])
            paths.append(merged_path)
        return paths


def profile(grid=None, *, comm=None, cpu_time: bool = False) -> Profile:
    """A new step profile (enter it with ``with``): records this rank's ops and their time
    per category while active.  ``grid`` (a :class:`~disttensor.ProcessGrid`) or ``comm``
    (an MPI communicator; default ``MPI.COMM_WORLD``) names the ranks that
    :meth:`Profile.summary` and :meth:`Profile.write_chrome_trace` gather over;
    ``cpu_time=True`` also records this thread's CPU time of every op and region (two more
    clock reads each).  Making it
    is local; it raises on bad arguments (the same on every rank for replicated ones)."""
    if grid is not None and comm is not None:
        raise TypeError("profile: give grid or comm, not both")
    if grid is not None:
        comm = getattr(grid, "comm", None)
        if not isinstance(comm, MPI.Comm):
            raise TypeError(f"profile: grid must be a ProcessGrid, got {type(grid).__name__}")
    elif comm is None:
        comm = MPI.COMM_WORLD
    elif not isinstance(comm, MPI.Comm):
        raise TypeError(f"profile: comm must be an MPI communicator, got "
                        f"{type(comm).__name__}")
    return Profile(comm, cpu_time)
