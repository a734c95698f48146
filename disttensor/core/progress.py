"""MPI progress for a split-phase exchange while this process computes (halo overlap on CPU).

A message posted with ``MPI_Isend``/``MPI_Irecv`` moves only while some MPI call runs on its
rank: a large message between processes of one node goes by rendezvous (the receiver
fetches it once both sides have met), so with nothing but a compute kernel running between
``begin()`` and ``end()`` of a halo exchange, the data moves in ``end()`` and nothing is
hidden.  Two ways to drive it while the kernel runs, chosen by :func:`overlap_mode`:

* ``'poll'``: the computation is cut into chunks and :meth:`Progress.poll` calls
  ``MPI_Testall`` on the exchange's requests between them (no thread; the kernel's own
  efficiency decides the chunk size);
* ``'thread'``: a helper thread calls ``MPI_Testall`` every ``interval`` seconds until the
  requests complete or the computation ends (needs ``MPI_THREAD_MULTIPLE``, which mpi4py asks
  for; it runs only while the kernel releases the GIL, as BLAS calls do).

``'on'`` overlaps without extra progress (the GPU default: the host waits in MPI while the
device computes), ``'off'`` computes after the exchange.  The mode comes from the
environment variable ``DISTTENSOR_HALO_OVERLAP`` (read at each call, so a benchmark can
switch it), default ``'off'`` for CPU blocks (see ``docs/performance.md`` for the figures
behind that default) and ``'on'`` for GPU blocks.  Nothing here communicates by itself: the
``test`` callable given to :class:`Progress` is the exchange's own non-blocking test.
"""
from __future__ import annotations

import threading

from mpi4py import MPI

from .environ import getenv

__all__ = ["MODES", "overlap_mode", "Progress", "thread_progress_available"]

MODES = ("off", "on", "poll", "thread")
_ENV = "DISTTENSOR_HALO_OVERLAP"


def overlap_mode(device: str = "cpu", overlap=None) -> str:
    """The halo overlap mode for an op on ``device``: ``overlap`` when given (``True`` ->
    the environment's mode if that overlaps, else ``'on'``; ``False`` -> ``'off'``; a mode
    name as is), else ``$DISTTENSOR_HALO_OVERLAP``, else ``'on'`` on GPU and ``'off'`` on CPU.
    Pure (reads the environment); raises ``ValueError`` for an unknown mode."""
    env = getenv(_ENV, "").strip().lower()
    if env and env not in MODES:
        raise ValueError(f"{_ENV} must be one of {MODES}, got {env!r}")
    if isinstance(overlap, str):
        if overlap not in MODES:
            raise ValueError(f"overlap must be a bool or one of {MODES}, got {overlap!r}")
        mode = overlap
    elif overlap is None:
        mode = env or ("on" if device == "cuda" else "off")
    elif overlap:
        mode = env if env in ("poll", "thread") else "on"
    else:
        mode = "off"
    if device == "cuda" and mode in ("poll", "thread"):
        return "on"   # the device computes asynchronously: the host's wait is the progress
    if mode == "thread" and not thread_progress_available():
        return "poll"
    return mode


def thread_progress_available() -> bool:
    """Whether MPI was initialized with ``MPI_THREAD_MULTIPLE`` (a helper thread may test
    requests while the main thread makes other MPI calls)."""
    return MPI.Is_initialized() and MPI.Query_thread() >= MPI.THREAD_MULTIPLE


class Progress:
    """Drive ``test`` (a non-blocking completion test of posted requests, returning ``True``
    once they are all complete) while this process computes.

    Use as a context manager around the computation: ``mode='thread'`` runs ``test`` on a
    helper thread every ``interval`` seconds until it returns ``True`` or the block exits
    (the exit joins the thread before the caller touches the requests again); ``'poll'``
    does nothing by itself, and the computation calls :meth:`poll` between its chunks;
    any other mode does nothing.  A ``test`` that raises stops the progress; the error is
    left to the caller's wait, which sees the same failure."""

    def __init__(self, test, mode: str, interval: float = 2e-4):
        self.test = test
        self.mode = mode
        self.interval = interval
        self.done = False
        self.polls = 0
        self._stop = threading.Event()
        self._thread = None

    def poll(self) -> bool:
        """One test (``'poll'`` mode only; a no-op otherwise or once complete); ``True`` once
        the requests are complete."""
        if self.done or self.mode != "poll":
            return self.done
        self.polls += 1
        try:
            self.done = bool(self.test())
        except Exception:  # noqa: BLE001 - the wait reports it
            self.done = True
        return self.done

    def _run(self) -> None:
        stop, test, interval = self._stop, self.test, self.interval
        while not stop.is_set():
            self.polls += 1
            try:
                if test():
                    self.done = True
                    return
            except Exception:  # noqa: BLE001 - the wait reports it
                return
            stop.wait(interval)

    def __enter__(self) -> "Progress":
        if self.mode == "thread":
            self._thread = threading.Thread(target=self._run, name="disttensor-mpi-progress",
                                             daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

