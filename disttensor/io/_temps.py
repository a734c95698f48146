"""Temporary files of atomic writes: their names, which ones are abandoned, and cleaning up.

An atomic write (:func:`disttensor.io._atomic.atomic_update`,
:func:`disttensor.routines.npyio.save`, the per-sample files of
:func:`~disttensor.io.generate_synthetic`) works on a hidden file next to its target ``name``,
from :func:`temp_path_for`::

    .{name}.{host}.{pid}.{random}.tmp     e.g.  .ckpt.h5.node017.48213.3f9c0a1b2c4d.tmp

and renames it over the target when done.  A process that is killed mid-write leaves its file
behind; the next write to the same path removes it once it is stale
(:func:`remove_stale_temps`, :func:`temp_is_stale`): the writer was on this host and its
process is gone (or is a zombie, or its pid was reused), or it was on another host and the
file has not been modified for ``DISTTENSOR_STALE_TMP_AGE`` seconds (default 3600).  The
names this process is writing now are recorded as in flight (never stale) until
:func:`~disttensor.io._atomic.replace_atomically` or :func:`remove_quietly` ends them.

Everything here is local to one process (no MPI, no h5py); the callers decide which rank
cleans up.  The full rules are in :mod:`disttensor.io`.
"""
from __future__ import annotations

import math
import os
import re
import socket
import stat
import threading
import time
import uuid
from typing import NamedTuple

__all__ = ["STALE_TMP_AGE_ENV", "DEFAULT_STALE_TMP_AGE", "host_tag", "TempName",
           "parse_temp_name", "temp_path_for", "stale_temp_age", "temp_is_stale",
           "remove_stale_temps", "remove_stale_temps_for", "remove_quietly"]

#: Environment variable: seconds after its last modification when a temporary file written from
#: another host (whose process cannot be checked) counts as abandoned.
STALE_TMP_AGE_ENV = "DISTTENSOR_STALE_TMP_AGE"
DEFAULT_STALE_TMP_AGE = 3600.0
#: A live process that started more than this many seconds after the temporary file was last
#: modified cannot have written it (its pid was reused after the writer died).
_PID_REUSE_SLACK = 10.0

_NEW_TEMP = re.compile(r"\.(?P<base>.+)\.(?P<host>[A-Za-z0-9_-]+)\.(?P<pid>[0-9]+)"
                       r"\.(?P<rand>[0-9a-f]{12})\.tmp", re.S)
_OLD_TEMP = re.compile(r"\.(?P<base>.+)\.(?P<rand>[0-9a-f]{12})\.tmp", re.S)

_inflight: set[str] = set()  # temporary files this process is writing now (absolute paths)
_inflight_lock = threading.Lock()
_host_cache: list[str] = []


def host_tag() -> str:
    """This host's name as it appears in temporary file names: the host name with every
    character but letters, digits, ``_`` and ``-`` replaced by ``_`` (no dots: the name
    splits unambiguously), at most 40 characters."""
    if not _host_cache:
        tag = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())[:40]
        _host_cache.append(tag or "unknown")
    return _host_cache[0]


class TempName(NamedTuple):
    """What a temporary file name says: the target's base name, the writer's host tag and pid
    (``None`` for the older pattern ``.{name}.{random}.tmp``, which recorded no writer) and
    the random part."""

    base: str
    host: str | None
    pid: int | None
    rand: str


def parse_temp_name(name: str) -> TempName | None:
    """The parts of a temporary file name of disttensor's own pattern, else ``None``:
    ``.{base}.{host}.{pid}.{random}.tmp`` (``random``: 12 hex digits), or the older
    ``.{base}.{random}.tmp`` (no writer recorded)."""
    m = _NEW_TEMP.fullmatch(name)
    if m:
        return TempName(m["base"], m["host"], int(m["pid"]), m["rand"])
    m = _OLD_TEMP.fullmatch(name)
    if m:
        return TempName(m["base"], None, None, m["rand"])
    return None


def temp_path_for(path) -> str:
    """A fresh hidden name next to ``path`` (same directory, so ``os.replace`` is atomic):
    ``.{name}.{host}.{pid}.{random}.tmp``.  The name is recorded as in flight in this process
    (never stale to :func:`remove_stale_temps`) until :func:`replace_atomically` or
    :func:`remove_quietly` ends it."""
    d, b = os.path.split(os.path.abspath(os.fspath(path)))
    tmp = os.path.join(d, f".{b}.{host_tag()}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp")
    with _inflight_lock:
        _inflight.add(tmp)
    return tmp


def _release(tmp) -> None:
    """End the in-flight record of the temporary file ``tmp`` (the write is over)."""
    with _inflight_lock:
        _inflight.discard(os.path.abspath(os.fspath(tmp)))


def stale_temp_age() -> float:
    """Seconds from ``DISTTENSOR_STALE_TMP_AGE`` (default 3600; ``inf``, ``never`` or a
    negative value: never by age).  ``ValueError`` for anything else."""
    raw = os.environ.get(STALE_TMP_AGE_ENV, "").strip()
    if not raw:
        return DEFAULT_STALE_TMP_AGE
    if raw.lower() in ("inf", "never", "off"):
        return math.inf
    try:
        age = float(raw)
    except ValueError:
        raise ValueError(f"{STALE_TMP_AGE_ENV}={raw!r}: expected seconds (a number), 'inf' or "
                         "'never'") from None
    return math.inf if age < 0 or math.isnan(age) else age


def _boot_time() -> float | None:
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _writer_alive(pid: int, mtime: float) -> bool:
    """Whether process ``pid`` of this host may still be writing a file last modified at
    ``mtime``: it exists, is not a zombie, and (where ``/proc`` tells) started before that
    modification (else the pid was reused).  Unknown counts as alive."""
    if pid == os.getpid():
        return True  # handled by the caller (the in-flight set)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, another user's
    except (OSError, OverflowError, ValueError):
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            line = f.read()
        fields = line[line.rindex(")") + 2:].split()
        if fields[0] in ("Z", "X", "x"):  # a zombie: dead, not yet reaped
            return False
        boot = _boot_time()
        if boot is not None:
            started = boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
            if started > mtime + _PID_REUSE_SLACK:
                return False
    except (OSError, ValueError, IndexError):
        pass
    return True


def temp_is_stale(path, parsed: TempName | None = None, now: float | None = None,
                  age: float | None = None) -> bool:
    """Whether the temporary file ``path`` (of disttensor's naming pattern) is abandoned:

    * written on this host (its host tag is this host's) by a process that no longer exists
      (``os.kill(pid, 0)`` fails with ``ProcessLookupError``), is a zombie, or started after
      the file was last modified (its pid was reused); by this very process: when no write of
      this process has it in flight;
    * written on another host, or by a version that did not record the writer: not modified
      for more than ``age`` seconds (default :func:`stale_temp_age`).

    Anything else (and anything that is not a regular file, or cannot be examined) is not
    stale."""
    p = os.path.abspath(os.fspath(path))
    parsed = parse_temp_name(os.path.basename(p)) if parsed is None else parsed
    if parsed is None:
        return False
    try:
        st = os.lstat(p)
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode):
        return False
    if parsed.host == host_tag() and parsed.pid is not None and parsed.pid > 0:
        if parsed.pid == os.getpid():
            with _inflight_lock:
                return p not in _inflight
        return not _writer_alive(parsed.pid, st.st_mtime)
    now = time.time() if now is None else now
    age = stale_temp_age() if age is None else age
    return now - st.st_mtime > age


def remove_stale_temps(directory, basenames) -> list[str]:
    """Remove the stale (:func:`temp_is_stale`) temporary files of the targets ``basenames``
    (file names in ``directory``) left by interrupted atomic writes; one scan of the
    directory.  Only names of disttensor's own pattern for those targets are considered;
    errors (a file that vanished, no permission) are ignored.  Returns the removed paths."""
    d = os.path.abspath(os.fspath(directory))
    bases = {basenames} if isinstance(basenames, str) else set(basenames)
    removed: list[str] = []
    if not bases:
        return removed
    age = stale_temp_age()
    now = time.time()
    try:
        entries = list(os.scandir(d))
    except OSError:
        return removed
    for e in entries:
        if not e.name.startswith(".") or not e.name.endswith(".tmp"):
            continue
        parsed = parse_temp_name(e.name)
        if parsed is None or parsed.base not in bases:
            continue
        try:
            if temp_is_stale(e.path, parsed, now, age):
                os.remove(e.path)
                removed.append(e.path)
        except OSError:
            pass
    return removed


def remove_stale_temps_for(path) -> list[str]:
    """:func:`remove_stale_temps` of the one target ``path``."""
    d, b = os.path.split(os.path.abspath(os.fspath(path)))
    return remove_stale_temps(d, {b})


def remove_quietly(path) -> None:
    """Remove ``path`` ignoring errors (and end its in-flight record if it is a temporary
    file of this process)."""
    try:
        os.remove(path)
    except OSError:
        pass
    _release(path)

