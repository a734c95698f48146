"""One pytest session per rank of an ``mpiexec`` job: the MPI side of the disttensor pytest
plugin (:mod:`pytest_disttensor` describes the behaviour and the knobs).

:class:`MpiSession` is made on every rank when pytest starts (collective over
``MPI_COMM_WORLD``: it duplicates the communicator, so the plugin's own exchanges never match a
collective of a test still running on a rank that fell behind).  :class:`TestTimer` is the
per-test timeout.  Every exchange here is collective over all ranks; each rank reaches them in
the same order because the phases of every test are kept in step.
"""
from __future__ import annotations

import faulthandler
import getpass
import os
import sys
import tempfile
import threading
import time
import traceback
import zlib
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI
from pytest_disttensor import ABORT_EXIT_CODE, TIMEOUT_EXIT_CODE
NO_TESTS = 5  # pytest.ExitCode.NO_TESTS_COLLECTED
_PASSED, _SKIPPED, _FAILED = 0, 1, 2
_NOTIFY_TAG = 78
_GRACE = 2.0  # seconds for every rank's report to reach mpiexec before the abort


def _default_root() -> Path:
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name (containers): any stable name will do
        user = "unknown"
    return Path(tempfile.gettempdir()) / f"pytest-mpi-of-{user}"


def combine_exit_codes(codes: list[int]) -> int:
    """One exit code for the whole job: 0 only if every rank returned 0; otherwise the most
    severe code among the ranks, where 'no tests collected' (5) is the least severe."""
    bad = [int(c) for c in codes if int(c) != 0]
    if not bad:
        return 0
    specific = [c for c in bad if c != NO_TESTS]
    return max(specific) if specific else NO_TESTS


def _short_traceback(err: BaseException) -> str:
    """The traceback of ``err`` without pytest's, pluggy's and the test kit's frames (this
    package's files and the plugin module; a user's own ``testing/`` folder keeps its)."""
    import pytest_disttensor
    kit = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frames = [f for f in traceback.extract_tb(err.__traceback__)
              if not f.filename.startswith(kit) and f.filename != pytest_disttensor.__file__
              and not any(p in f.filename for p in ("/_pytest/", "/pluggy/"))]
    return "".join(traceback.format_list(frames) + traceback.format_exception_only(type(err), err))


class MpiSession:
    """The plugin's state on one rank of a job of more than one rank."""

    def __init__(self, early_config: pytest.Config):
        world = MPI.COMM_WORLD
        self.rank, self.size = world.Get_rank(), world.Get_size()
        self.comm = world.Dup()
        self.sync = os.environ.get("DISTTENSOR_SYNC_OUTCOMES", "1") not in ("0", "false", "no")
        self.sync_timeout = float(os.environ.get("DISTTENSOR_SYNC_TIMEOUT", "120"))
        self.config: pytest.Config | None = None
        self.timer: TestTimer | None = None
        self.rc = 0
        self.waiting = ""  # what this rank waits for in the plugin's exchanges (for reports)
        self.codes: list[int] = []
        # no .pytest_cache races between the ranks (what -p no:cacheprovider does)
        early_config.pluginmanager.consider_pluginarg("no:cacheprovider")
        ns = early_config.known_args_namespace
        self.log_path: Path | None = None
        self.log_fd: int | None = None
        self._saved_fds: tuple[int, int] | None = None
        if self.rank == 0:
            self.terminal_fd = os.dup(2)  # pytest's output capture never touches a duplicate
            return
        log_dir = (getattr(ns, "mpi_log_dir", None) or os.environ.get("DISTTENSOR_TEST_LOG_DIR")
                   or _default_root() / "logs")
        log_dir = Path(log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"rank{self.rank}-n{self.size}.log"
        sys.stdout.flush()
        sys.stderr.flush()
        self._saved_fds = (os.dup(1), os.dup(2))
        self.terminal_fd = self._saved_fds[1]
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        self.log_fd = fd  # kept: reports written while pytest captures fds 1 and 2
        # runs after the output capture's clean-up, which restores fds 1 and 2 to the log
        early_config.add_cleanup(self._restore_fds)

    def _restore_fds(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        if self._saved_fds is not None:
            os.dup2(self._saved_fds[0], 1)
            os.dup2(self._saved_fds[1], 2)

    # -- set-up ---------------------------------------------------------------------------
    def configure(self, config: pytest.Config, timeout: float) -> None:
        """Per-rank ``--basetemp``; the per-test timer (collective)."""
        self.config = config
        given = config.option.basetemp
        if given:
            base = Path(given) / f"rank{self.rank}"
        else:
            root = os.environ.get("DISTTENSOR_TEST_TMP_DIR")
            base = (Path(root) if root else _default_root()) / f"n{self.size}" / f"rank{self.rank}"
        base.parent.mkdir(parents=True, exist_ok=True)  # pytest creates only the leaf
        config.option.basetemp = str(base)
        if self.rank != 0 and self.log_path is not None:
            config.option.color = "no"
        if timeout > 0:
            self.timer = TestTimer(config, timeout, self)

    def emit(self, text: str) -> None:
        """Write ``text`` (each line prefixed ``[rank r]``) to the terminal and to this rank's
        log, whatever pytest's output capture is doing."""
        lines = "".join(f"[rank {self.rank}] {line}\n" for line in text.splitlines())
        for fd in (self.terminal_fd, self.log_fd):
            if fd is not None:
                try:
                    os.write(fd, lines.encode(errors="replace"))
                except OSError:
                    pass

    def abort(self, text: str, code: int = ABORT_EXIT_CODE) -> None:
        """Print ``text`` where a person will see it and end the whole MPI job."""
        self.emit(text)
        time.sleep(_GRACE)  # let mpiexec forward the message before the abort tears it down
        MPI.COMM_WORLD.Abort(code)

    # -- keeping the ranks in step --------------------------------------------------------
    def compare_collections(self, session: pytest.Session) -> None:
        """Stop the session on every rank if the ranks collected different tests."""
        if not self.sync:
            return
        ids = "\n".join(item.nodeid for item in session.items)
        mine = (len(session.items), zlib.crc32(ids.encode()), int(session.testsfailed))
        everyone = self.comm.allgather(mine)
        if any(x != everyone[0] for x in everyone[1:]):
            pytest.exit("ranks collected different tests or hit different collection errors "
                        f"(items, crc32 of node ids, errors) by rank: {everyone}", returncode=2)

    def _exchange(self, code: int, what: str, own: str) -> list[int]:
        """All-gather one small int per rank, giving up after ``DISTTENSOR_SYNC_TIMEOUT`` s.

        A rank that waits that long here has finished ``what`` while some other rank has not,
        almost always because this rank left a test early (a rank-local failure or skip) and
        the others sit in a collective of the test it will never enter.  Waiting longer cannot
        help: it prints its own outcome (the likely cause) and aborts the job."""
        send = np.array([code], dtype=np.int64)
        recv = np.zeros(self.size, dtype=np.int64)
        req = self.comm.Iallgather(send, recv)
        t0, delay = time.monotonic(), 1e-4
        self.waiting = (f"waiting for the other ranks to finish {what} (the plugin's outcome "
                        f"exchange); this rank's outcome: {own}")
        while not req.Test():
            if time.monotonic() - t0 > self.sync_timeout:
                self._suspend_capture()
                self.abort(f"waited {self.sync_timeout:.0f} s for the other ranks to finish "
                           f"{what}: probably some rank is blocked in a collective that another "
                           "rank left early (a rank-local failure, skip or exit).  This rank's "
                           f"outcome: {own}\nAborting the MPI job (DISTTENSOR_SYNC_TIMEOUT sets "
                           "the wait).")
            time.sleep(delay)
            delay = min(2 * delay, 0.02)
        self.waiting = ""
        return [int(c) for c in recv]

    def _suspend_capture(self) -> None:
        capman = self.config.pluginmanager.getplugin("capturemanager") if self.config else None
        if capman is not None:
            try:
                capman.suspend_global_capture(in_=True)
            except Exception:  # noqa: BLE001 - best effort before an abort
                pass

    def sync_phase(self, phase: str, item: pytest.Item, before=None):
        """Wrapper body for one test phase: all-gather its outcome; a failure on any rank fails
        the phase on every rank, a skip on any rank skips it on all."""
        if not self.sync:
            if before is not None:
                before()
            return (yield)
        err: BaseException | None = None
        try:
            if before is not None:
                before()
            result = yield
        except (KeyboardInterrupt, SystemExit, pytest.exit.Exception):
            raise
        except BaseException as e:  # noqa: BLE001 - includes pytest's Skipped/Failed outcomes
            err, result = e, None
        if err is None:
            code, summary, own = _PASSED, "", "passed"
        elif isinstance(err, pytest.skip.Exception):
            code, summary = _SKIPPED, str(err)
            own = f"skipped: {summary}"
        else:
            code, summary = _FAILED, f"{type(err).__name__}: {str(err).strip()[:500]}"
            own = "failed:\n" + _short_traceback(err)
        codes = self._exchange(code, f"{phase} of {item.nodeid}", own)
        if err is not None:
            if any(c != code for c in codes):
                self.comm.allgather(summary)  # the others ask for it (below)
            raise err
        if all(c == _PASSED for c in codes):
            return result
        summaries = self.comm.allgather(summary)
        failed = [r for r, c in enumerate(codes) if c == _FAILED]
        if failed:
            pytest.fail(f"{phase} failed on rank(s) {failed} (passed on this rank "
                        f"{self.rank}); rank {failed[0]}: {summaries[failed[0]]}",
                        pytrace=False)
        skipped = [r for r, c in enumerate(codes) if c == _SKIPPED]
        pytest.skip(f"skipped on rank(s) {skipped}: {summaries[skipped[0]]}")

    # -- the end --------------------------------------------------------------------------
    def finish(self, session: pytest.Session) -> None:
        """All-gather the exit codes and make the session's the collective one.  A rank whose
        session ended while another's has not (``DISTTENSOR_SYNC_TIMEOUT`` s later) aborts."""
        if self.timer is not None:
            self.timer.stop()
        self.rc = int(session.exitstatus)
        own = f"pytest ended here with exit code {self.rc}"
        if self.log_path is not None:
            tail = self.log_path.read_text(errors="replace").splitlines()[-40:]
            own += f"; last lines of {self.log_path}:\n" + "\n".join(tail)
        self.codes = self._exchange(self.rc, "their pytest sessions", own)
        session.exitstatus = combine_exit_codes(self.codes)

    def show_logs(self) -> None:
        """Ranks > 0 whose session failed print their log, one rank after another (mpiexec
        forwards each rank's stream separately; this keeps the blocks mostly together)."""
        self.comm.Barrier()  # rank 0 has printed its summary
        for r in range(1, self.size):
            if self.rank == r and self.rc != 0 and self.log_path is not None:
                sys.stdout.flush()
                sys.stderr.flush()
                text = self.log_path.read_text(errors="replace")
                out = [f"[rank {r}] ===== pytest exit code {self.rc}; log {self.log_path} =====\n"]
                out += [f"[rank {r}] {line}\n" for line in text.splitlines()]
                os.write(self._saved_fds[0], "".join(out).encode(errors="replace"))
            self.comm.Barrier()
        final = combine_exit_codes(self.codes)
        if self.rank == 0 and final != 0:
            failed = {r: c for r, c in enumerate(self.codes) if c != 0}
            os.write(self.terminal_fd, f"mpi: n={self.size}: pytest exit codes by rank {failed} "
                                       f"-> exit {final}\n".encode())


class TestTimer:
    """The per-test timeout on one rank: a daemon thread that, when the armed test has run
    longer than ``seconds``, prints where this rank waits (its disttensor collective wait, as
    the library's watchdog records it, and every thread's stack), asks the other ranks to do
    the same, and aborts the job with :data:`TIMEOUT_EXIT_CODE`.  Made on every rank
    (collective: it duplicates ``MPI_COMM_WORLD`` for the requests)."""

    __test__ = False  # not a test class, whatever its name says

    def __init__(self, config: pytest.Config, seconds: float, session: MpiSession | None):
        self.seconds = float(seconds)
        self.session = session
        self._terminal_fd = session.terminal_fd if session is not None else os.dup(2)
        self._lock = threading.Lock()
        self._nodeid: str | None = None
        self._deadline = float("inf")
        self._stop = threading.Event()
        world = MPI.COMM_WORLD
        multiple = MPI.Query_thread() >= MPI.THREAD_MULTIPLE
        self._comm = world.Dup() if world.Get_size() > 1 and multiple else None
        _enable_watchdog_marks()
        self._thread = threading.Thread(target=self._loop, name="disttensor-test-timer",
                                        daemon=True)
        self._thread.start()

    def arm(self, nodeid: str) -> None:
        with self._lock:
            self._nodeid, self._deadline = nodeid, time.monotonic() + self.seconds

    def disarm(self) -> None:
        with self._lock:
            self._nodeid, self._deadline = None, float("inf")

    def stop(self) -> None:
        """End the thread (it cancels its pending receive first)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _emit(self, text: str) -> None:
        if self.session is not None:
            self.session.emit(text)
            return
        os.write(self._terminal_fd, "".join(f"[rank 0] {line}\n"
                                            for line in text.splitlines()).encode())

    def _loop(self) -> None:
        buf = bytearray(4)
        req = (self._comm.Irecv([buf, MPI.BYTE], MPI.ANY_SOURCE, _NOTIFY_TAG)
               if self._comm is not None else None)
        period = min(0.5, max(0.05, self.seconds / 20))
        while not self._stop.wait(period):
            if req is not None and req.Test():
                other = int.from_bytes(buf, "little")
                self._emit(self._report(f"rank {other} reached the per-test timeout; where "
                                        "this rank is:"))
                time.sleep(_GRACE + 5)  # the other rank aborts; abort here should it be gone
                MPI.COMM_WORLD.Abort(TIMEOUT_EXIT_CODE)
            with self._lock:
                nodeid, late = self._nodeid, time.monotonic() > self._deadline
            if not late:
                continue
            self._emit(self._report(f"{nodeid} ran past the per-test timeout of "
                                    f"{self.seconds:g} s (--mpi-test-timeout); aborting the MPI "
                                    "job.  Where this rank is:"))
            if self._comm is not None:
                me = MPI.COMM_WORLD.Get_rank().to_bytes(4, "little")
                for r in range(self._comm.Get_size()):
                    if r != self._comm.Get_rank():
                        self._comm.Isend([me, MPI.BYTE], r, _NOTIFY_TAG)  # never waited on
            time.sleep(_GRACE)
            MPI.COMM_WORLD.Abort(TIMEOUT_EXIT_CODE)
        if req is not None:
            req.Cancel()
            req.Wait()

    def _report(self, headline: str) -> str:
        lines = [f"===== {headline}"]
        waiting = self.session.waiting if self.session is not None else None
        if waiting:
            lines.append(waiting)
        lines += _watchdog_state() + _stacks()
        return "\n".join(lines)


_NOISE = ("/_pytest/", "/pluggy/", "<frozen ", "/threading.py", "/contextlib.py",
          "/pytest/__main__.py")


def _stacks() -> list[str]:
    """Every thread's stack (faulthandler's dump, innermost call first) without the frames of
    pytest, pluggy and the standard library's plumbing, and without the plugin's and the
    watchdog's own threads."""
    with tempfile.TemporaryFile() as f:
        faulthandler.dump_traceback(file=f, all_threads=True)
        f.seek(0)
        text = f.read().decode(errors="replace")
    out = []
    for block in text.strip().split("\n\n"):
        frames = block.splitlines()
        if any("in _loop" in line and ("mpi_session.py" in line or "watchdog.py" in line)
               for line in frames):
            continue
        kept = [line for line in frames[1:] if not any(n in line for n in _NOISE)]
        out += [frames[0].replace("Current thread", "Thread")] + kept
    return out


def _enable_watchdog_marks() -> None:
    """Switch on the library's watchdog so its collective waits are recorded (collective; with
    a timeout far beyond any test's, so the per-test timeout reports first), unless
    ``DISTTENSOR_COLLECTIVE_TIMEOUT`` already turned it on."""
    try:
        from disttensor.core import watchdog
    except ImportError:  # pragma: no cover - disttensor half installed
        return
    if watchdog.timeout() is None:
        watchdog.enable(10.0 ** 9)


def _watchdog_state() -> list[str]:
    """This rank's disttensor collective waits (what, for how long, inside which call)."""
    wd = sys.modules.get("disttensor.core.watchdog")
    return [] if wd is None else wd.wait_report()