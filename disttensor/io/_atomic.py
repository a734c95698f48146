"""Atomic HDF5 writes: a :class:`~disttensor.io._sessions.WriteSession` on a temporary file that
rank 0 renames over the target only when every rank has finished.

:func:`atomic_update` is how every writer of :mod:`disttensor.io` changes a file (collective):
arguments agreed, the target checked and the stale temporary files of interrupted writes to it
removed (:mod:`disttensor.io._temps`), free space checked (:mod:`disttensor.io._space`), then
``body(session)`` writes, and :func:`replace_atomically` flushes the temporary file to disk
and renames it.  On any failure on any rank the temporary file is removed and the target is
untouched; the error is raised on every rank.
"""
from __future__ import annotations

import contextlib
import os
import shutil
from typing import Callable

from ..core.comm import collective
from ._args import arg_path
from ._h5file import check_file, root_call
from ._sessions import WriteSession
from ._space import check_space, trim
from ._temps import _release, remove_quietly, remove_stale_temps_for, temp_path_for

__all__ = ["fsync_path", "replace_atomically", "atomic_update"]


def fsync_path(path) -> None:
    """Flush ``path`` (a file or a directory) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_atomically(tmp, path) -> None:
    """Flush ``tmp`` to disk and rename it over ``path`` (one rank)."""
    fsync_path(tmp)
    os.replace(tmp, path)
    _release(tmp)
    try:
        fsync_path(os.path.dirname(os.path.abspath(path)))
    except OSError:
        pass  # directories cannot be fsynced on every file system


def replace_directory(tmp, path) -> None:
    """Put the finished directory ``tmp`` (a Zarr store) in place of ``path`` (one rank): an
    existing ``path`` is first renamed to a temporary name and removed only after ``tmp`` took
    its place, so a crash leaves either store whole (between the two renames the old one is
    under its temporary name, which the next write of ``path`` clears as stale)."""
    backup = None
    if os.path.exists(path):
        backup = temp_path_for(path)
        os.rename(path, backup)
    os.rename(tmp, path)
    _release(tmp)
    if backup is not None:
        shutil.rmtree(backup, ignore_errors=True)
        _release(backup)


def atomic_update(comm, path, driver: str, mode: str, atomic: bool, needed: int,
                  body: Callable[[WriteSession], None],
                  validate: Callable[[str], None] | None = None, *,
                  agreed: bool = False) -> None:
    """Write ``path`` through ``body(session)`` so that it changes all at once (collective).

    ``mode``: ``'w'`` (the file gets only what ``body`` writes), ``'a'`` (keep the rest of an
    existing file, create it if missing) or ``'r+'`` (the file must exist).  With ``atomic``
    the work happens on a temporary file in the same directory (a copy of the existing file for
    ``'a'``/``'r+'``) that rank 0 renames over ``path`` only after every rank finished without
    error; on any failure the temporary file is removed and ``path`` is untouched.  Without
    ``atomic`` ``path`` is written in place.  ``validate(path)`` runs on rank 0 before anything
    is written when the file exists (``'a'``/``'r+'``).  ``needed``: bytes of raw data, for the
    free-space check.  The arguments are agreed across the ranks first (one small all-reduce;
    ``agreed=True``: the caller agreed them, and everything ``body`` passes to the session,
    already), and rank 0 removes the stale temporary files of earlier, interrupted writes to
    ``path`` (:func:`remove_stale_temps`) before it creates its own."""
    with collective(comm, "atomic_update", path=arg_path(path), driver=driver, mode=mode,
                    atomic=atomic, needed=needed) if not agreed else contextlib.nullcontext():
        path = os.path.abspath(os.fspath(path))
        if mode not in ("w", "a", "r+"):
            raise ValueError(f"mode must be 'w', 'a' or 'r+', got {mode!r}")

    def prep():
        d = os.path.dirname(path)
        if not os.path.isdir(d):
            raise FileNotFoundError(f"directory {d!r} does not exist (writing {path!r})")
        if os.path.isdir(path):
            raise IsADirectoryError(f"{path!r} is a directory")
        exists = os.path.exists(path)
        if mode == "r+" and not exists:
            raise FileNotFoundError(f"no such file: {path!r} (mode 'r+' updates an existing file)")
        keep = exists and mode in ("a", "r+")
        if keep:
            check_file(path)
            if validate is not None:
                validate(path)
        copy = os.path.getsize(path) if keep and atomic else 0
        # the temporary files of earlier writes to this path that were killed (their writer
        # is gone): removed before this write claims space (never a live writer's)
        remove_stale_temps_for(path)
        check_space(path, needed + copy)
        if not atomic:
            return path, not keep
        tmp = temp_path_for(path)
        if keep:
            try:
                shutil.copyfile(path, tmp)
            except BaseException:
                remove_quietly(tmp)
                raise
        return tmp, not keep

    target, create = root_call(comm, prep)
    sess = None
    try:
        sess = WriteSession(target, comm, driver, create, reserve=needed, agreed=agreed)
        body(sess)
        s, sess = sess, None
        s.close()

        def finish():
            if s.extended:
                trim(target)
            if atomic:
                replace_atomically(target, path)
        root_call(comm, finish)
    except BaseException:
        if sess is not None:
            sess.abort()
        if atomic and (comm is None or comm.rank == 0):
            remove_quietly(target)
        raise
