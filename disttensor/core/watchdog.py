"""An MPI watchdog for user scripts: a collective wait that never ends becomes an abort with a
per-rank report instead of a hang.

Set ``DISTTENSOR_COLLECTIVE_TIMEOUT=seconds`` (read when disttensor is imported; unset or
``0``: off, and every hook below is a no-op).  Then:

* the library's blocking waits (argument agreement and failure all-reduces, all-reduces of
  reductions and statistics, the waits of halo exchanges and redistributions, the gradient
  all-reduce, collective HDF5 file opens) are marked with :func:`waiting`;
* a daemon thread per rank checks the marks; when a wait has lasted longer than the timeout it
  prints to stderr, on its rank, what it waits in, for how long, inside which collective call
  and with which arguments, then tells every other rank (a message on a private duplicate of
  ``MPI_COMM_WORLD``, made when disttensor is imported, so the variable must be set on every
  rank alike), whose watchdogs print their own state (the wait they are in, or that they are
  not in a disttensor collective and which collective call they entered last);
* after a grace period (``DISTTENSOR_WATCHDOG_GRACE``, default 2 s) for the reports, the rank
  that timed out calls ``MPI_Abort`` (exit code 124), which ends the job.

The cross-rank report needs ``MPI_THREAD_MULTIPLE`` (mpi4py's default); with a lower thread
level each rank still reports and aborts on its own timeout.  A wait the user makes outside
the library (``comm.Barrier()`` in the script) is not marked: that rank reports that it is not
in a disttensor collective, which is the clue.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import time

from mpi4py import MPI

from . import profiler as _profiler

__all__ = ["waiting", "timeout", "enable", "wait_report", "ABORT_CODE"]

ABORT_CODE = 124
_REPORT_TAG = 77


def _parse(value: str | None) -> float | None:
    if not value:
        return None
    try:
        t = float(value)
    except ValueError:
        raise ValueError(f"DISTTENSOR_COLLECTIVE_TIMEOUT must be a number of seconds, got "
                         f"{value!r}") from None
    return t if t > 0 else None


_timeout: float | None = None
_grace = float(os.environ.get("DISTTENSOR_WATCHDOG_GRACE", "2") or 2)
_waits: dict[int, tuple[str, int, float, object]] = {}  # thread id -> (what, size, t0, call)
_lock = threading.Lock()
_thread: threading.Thread | None = None
_stop = threading.Event()
_wcomm: MPI.Comm | None = None
_null = contextlib.nullcontext()


def timeout() -> float | None:
    """The collective timeout in seconds, or ``None`` when the watchdog is off."""
    return _timeout


class _Wait:
    __slots__ = ("what", "size")

    def __init__(self, what: str, size: int):
        self.what, self.size = what, size

    def __enter__(self):
        from .agreement import current_call
        with _lock:
            _waits[threading.get_ident()] = (self.what, self.size, time.monotonic(),
                                             current_call())
        return self

    def __exit__(self, *exc):
        with _lock:
            _waits.pop(threading.get_ident(), None)
        return False


def waiting(comm, what: str):
    """Context manager marking a blocking wait of this thread on ``comm`` (a no-op unless the
    watchdog is on or a step profile is active)."""
    if _timeout is None and _profiler._active is None or comm is None or comm.size == 1:
        return _null
    if _profiler._active is not None:  # the step profiler times the wait (core/profiler.py)
        return _profiler.wait_region(what, None if _timeout is None else _Wait(what, comm.size))
    return _Wait(what, comm.size)


def _describe_call(call) -> str:
    if call is None:
        return "no disttensor collective call entered yet"
    from .agreement import describe
    name, args = call
    shown = ", ".join(f"{k}={describe(v, 120)}" for k, v in args.items())
    return f"{name}({shown})"


def wait_report() -> list[str]:
    """Where this rank waits, one line per waiting thread: the wait, for how long, on how many
    ranks, inside which disttensor collective call; or, when no thread waits, the last call
    entered.  Local (no communication); what the watchdog prints on a timeout, and what a test
    harness can print when it gives up on a hung test."""
    now = time.monotonic()
    with _lock:
        waits = list(_waits.values())
    if not waits:
        return ["not waiting in a disttensor collective; last collective call entered: "
                f"{_describe_call(current_call_any())}"]
    return [f"waiting {now - t0:.1f} s in {what} (communicator of {size} ranks) inside "
            f"{_describe_call(call)}" for what, size, t0, call in waits]


def _report(reason: str) -> None:
    rank = MPI.COMM_WORLD.rank
    lines = [f"[disttensor watchdog] rank {rank}: {line}" for line in [reason, *wait_report()]]
    sys.stderr.write("\n".join(lines) + "\n")
    sys.stderr.flush()


_last_call = None  # the last call any thread entered (current_call is per thread)


def current_call_any():
    return _last_call


def _loop() -> None:
    multiple = MPI.Query_thread() >= MPI.THREAD_MULTIPLE and _wcomm is not None
    buf = bytearray(8)
    req = _wcomm.Irecv([buf, MPI.BYTE], MPI.ANY_SOURCE, _REPORT_TAG) if multiple else None
    period = min(1.0, max(0.05, _timeout / 10))
    while not _stop.wait(period):
        if req is not None and req.Test():
            _report(f"rank {int.from_bytes(buf[:4], 'little')} reported a collective wait "
                    f"over {_timeout:g} s (DISTTENSOR_COLLECTIVE_TIMEOUT); this rank's state:")
            req = None
            # the reporting rank aborts; abort here too should it be gone already
            if _stop.wait(_grace + 5):
                return
            MPI.COMM_WORLD.Abort(ABORT_CODE)
        now = time.monotonic()
        with _lock:
            late = [w for w in _waits.values() if now - w[2] > _timeout]
        if not late:
            continue
        _report(f"a collective wait exceeded {_timeout:g} s (DISTTENSOR_COLLECTIVE_TIMEOUT); "
                "aborting the job")
        if multiple:
            me = MPI.COMM_WORLD.rank.to_bytes(4, "little") + bytes(4)
            for r in range(_wcomm.size):
                if r != _wcomm.rank:
                    _wcomm.Isend([me, MPI.BYTE], r, _REPORT_TAG)  # never waited: we abort
        time.sleep(_grace)
        MPI.COMM_WORLD.Abort(ABORT_CODE)
        return
    if req is not None:
        req.Cancel()
        req.Wait()


def _shutdown() -> None:
    global _thread
    if _thread is not None:
        _stop.set()
        _thread.join(timeout=5)
        _thread = None
    if _wcomm is not None and not MPI.Is_finalized():
        _wcomm.Free()


def enable(seconds: float) -> None:
    """Start the watchdog with a timeout of ``seconds`` (collective over ``MPI_COMM_WORLD``:
    it duplicates the communicator for the reports).  Called at import when
    ``DISTTENSOR_COLLECTIVE_TIMEOUT`` is set."""
    global _timeout, _thread, _wcomm
    if _thread is not None:
        _timeout = float(seconds)
        return
    _timeout = float(seconds)
    if MPI.COMM_WORLD.size > 1:
        _wcomm = MPI.COMM_WORLD.Dup()
    _thread = threading.Thread(target=_loop, name="disttensor-watchdog", daemon=True)
    _thread.start()
    atexit.register(_shutdown)  # runs before mpi4py finalizes MPI (registered after it)


def note_call(call) -> None:
    """Remember the last collective call entered by any thread (for the report)."""
    global _last_call
    _last_call = call


_env = _parse(os.environ.get("DISTTENSOR_COLLECTIVE_TIMEOUT"))
if _env is not None:
    enable(_env)
