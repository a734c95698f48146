"""Run pytest inside an MPI job, one pytest session per rank.

Usage (from the repository root)::

    mpiexec -n 4 .venv/bin/python -m mpi4py scripts/mpi_pytest.py tests/mpi -q [pytest args]

* Rank 0 writes to the terminal as usual.  Every other rank writes its stdout and stderr (at the
  file-descriptor level, so output of C code and faulthandler dumps too) to
  ``build/test-logs/rank<r>-n<size>.log``; that log is printed, each line prefixed with
  ``[rank r]``, only if the rank's pytest failed.
* Two jobs running at once in one checkout would share those log files and temporary
  directories: give one of them its own ``DISTTENSOR_TEST_LOG_DIR`` / ``DISTTENSOR_TEST_TMP_DIR``.
* ``-p no:cacheprovider`` is added so the ranks do not race on ``.pytest_cache``, and each rank
  gets its own ``--basetemp`` (``build/test-tmp/n<size>/rank<r>``) because pytest wipes and
  prunes its temporary directories at start-up, which ranks sharing one would race on.  Tests
  that need one directory seen by all ranks use the ``shared_tmp_path`` fixture of
  ``tests/mpi/conftest.py``.
* ``-o faulthandler_timeout=S`` (``DISTTENSOR_TEST_STACK_DUMP_S``, default 300 s) makes a test
  that runs longer than that dump every thread's stack, so a deadlock killed by the outer
  ``timeout`` leaves tracebacks behind (on the terminal for rank 0, in the logs for the others).
* A rank whose session ends while another rank's is still running (say a rank-local internal
  error, while the others wait in a collective) waits ``DISTTENSOR_SYNC_TIMEOUT`` seconds
  (default 120), then prints why and the end of its log and aborts the job with exit code 86.
* The exit code is collective: after pytest returns, the ranks all-gather their exit codes, and
  if any rank failed, every rank exits non-zero (with the same code, after a clean
  ``MPI_Finalize``).  Exit code 5 (no tests
  collected) counts as a failure only if no rank has a more specific one; callers decide
  whether 5 is acceptable.

Run it with ``python -m mpi4py`` so an exception that escapes here calls ``MPI_Abort`` instead
of leaving the other ranks waiting in a collective forever.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

ROOT = Path(__file__).resolve().parent.parent
NO_TESTS = 5  # pytest.ExitCode.NO_TESTS_COLLECTED
ABORT_EXIT_CODE = 86  # the job was aborted because its ranks got out of step (as conftest.py)


def _has_option(args: list[str], name: str) -> bool:
    return any(a == name or a.startswith(name + "=") for a in args)


def _pytest_args(argv: list[str], rank: int, size: int) -> list[str]:
    args = list(argv)
    extra = []
    if "no:cacheprovider" not in " ".join(args):
        extra += ["-p", "no:cacheprovider"]
    if not _has_option(args, "--basetemp"):
        tmp_root = Path(os.environ.get("DISTTENSOR_TEST_TMP_DIR", ROOT / "build" / "test-tmp"))
        basetemp = tmp_root / f"n{size}" / f"rank{rank}"
        basetemp.parent.mkdir(parents=True, exist_ok=True)  # pytest creates only the leaf
        extra.append(f"--basetemp={basetemp}")
    if not any("faulthandler_timeout" in a for a in args):
        extra += ["-o", f"faulthandler_timeout={os.environ.get('DISTTENSOR_TEST_STACK_DUMP_S', '300')}"]
    if rank != 0 and not _has_option(args, "--color"):
        extra.append("--color=no")
    return extra + args


def _combine(codes: list[int]) -> int:
    """One exit code for the whole job: 0 only if every rank returned 0; otherwise the most
    severe code among the ranks, where 'no tests collected' (5) is the least severe."""
    bad = [int(c) for c in codes if int(c) != 0]
    if not bad:
        return 0
    specific = [c for c in bad if c != NO_TESTS]
    return max(specific) if specific else NO_TESTS


def _exchange_codes(comm: MPI.Comm, rc: int, log_path: Path | None) -> list[int]:
    """All-gather the exit codes; give up (abort the job, after saying why) when some rank has
    not finished its session ``DISTTENSOR_SYNC_TIMEOUT`` seconds after this one did: that rank is
    stuck in a collective that this rank, which ended its session early, will never enter."""
    timeout = float(os.environ.get("DISTTENSOR_SYNC_TIMEOUT", "120"))
    send = np.array([rc], dtype=np.int64)
    recv = np.zeros(comm.Get_size(), dtype=np.int64)
    req = comm.Iallgather(send, recv)
    t0, delay = time.monotonic(), 1e-4
    while not req.Test():
        if time.monotonic() - t0 > timeout:
            r = comm.Get_rank()
            lines = [f"pytest ended here with exit code {rc}, but other ranks are still running "
                     f"{timeout:.0f} s later (blocked in a collective this rank left?); "
                     f"aborting the MPI job"]
            if log_path is not None:
                lines += [f"last lines of {log_path}:"]
                lines += log_path.read_text(errors="replace").splitlines()[-40:]
            sys.stdout.write("".join(f"[rank {r}] {line}\n" for line in lines))
            sys.stdout.flush()
            time.sleep(2)  # let mpiexec forward the message first
            MPI.COMM_WORLD.Abort(ABORT_EXIT_CODE)
        time.sleep(delay)
        delay = min(2 * delay, 0.02)
    return [int(c) for c in recv]


def main(argv: list[str]) -> int:
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    # a private communicator for the final exchange, so it can never match a collective of a
    # test still running on another rank
    comm = world.Dup()
    args = _pytest_args(argv, rank, size)

    log_path = None
    saved_fds = None
    if rank == 0:
        # where conftest.py writes a last word before it aborts a deadlocked job (pytest's
        # output capture does not touch a duplicate)
        os.environ["DISTTENSOR_TEST_TERMINAL_FD"] = str(os.dup(2))
    else:
        log_dir = Path(os.environ.get("DISTTENSOR_TEST_LOG_DIR", ROOT / "build" / "test-logs"))
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"rank{rank}-n{size}.log"
        sys.stdout.flush()
        sys.stderr.flush()
        saved_fds = (os.dup(1), os.dup(2))
        # where conftest.py writes a last word before it aborts a deadlocked job
        os.environ["DISTTENSOR_TEST_TERMINAL_FD"] = str(saved_fds[1])
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)

    import pytest  # after the redirection, so anything pytest prints at import lands in the log

    try:
        rc = int(pytest.main(args))
    except BaseException as e:  # noqa: BLE001 - an internal error must still reach the allgather
        import traceback
        traceback.print_exc()
        rc = 3 if not isinstance(e, KeyboardInterrupt) else 2
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        if saved_fds is not None:
            os.dup2(saved_fds[0], 1)
            os.dup2(saved_fds[1], 2)
            os.close(saved_fds[0])
            os.close(saved_fds[1])

    codes = _exchange_codes(comm, rc, log_path)
    final = _combine(codes)

    # Print the logs of failed ranks one rank after another (mpiexec forwards each rank's
    # stream separately, so this keeps the blocks mostly together; the prefix disambiguates).
    for r in range(1, size):
        if rank == r and rc != 0 and log_path is not None:
            text = log_path.read_text(errors="replace")
            out = [f"[rank {r}] ===== pytest exit code {rc}; log {log_path} =====\n"]
            out += [f"[rank {r}] {line}\n" for line in text.splitlines()]
            sys.stdout.write("".join(out))
            sys.stdout.flush()
        comm.Barrier()
    if rank == 0 and final != 0:
        failed = {r: c for r, c in enumerate(codes) if c != 0}
        print(f"mpi_pytest: n={size}: pytest exit codes by rank {failed} -> exit {final}",
              flush=True)
    # Every rank agreed on the outcome, so finish MPI cleanly here: otherwise `python -m mpi4py`
    # turns the non-zero SystemExit into MPI_Abort (correct, but noisy and it may cut output).
    MPI.Finalize()
    return final


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
