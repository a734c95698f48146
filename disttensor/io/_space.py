"""Disk space for the writers of :mod:`disttensor.io`: check it first, claim it before data.

A write that runs out of space half-way is dangerous: a collective MPI-IO write that hits
``ENOSPC`` can leave some ranks inside ROMIO for ever, and HDF5 cannot close a file whose
metadata it failed to write (both seen with MPICH 4.0 / HDF5 1.10.8 on a full tmpfs; the POSIX
driver can even crash in ``H5D_close``).  So writers check the free space first
(:func:`check_space`), and before any raw data moves claim the blocks it needs
(:func:`reserve_space`, ``fallocate``; with ``mpio`` after flushing HDF5's metadata).  The
reservation needs the *uncompressed* size even for compressed datasets; the unused part is cut
off when the file is closed (:func:`trim`).

Everything here runs on one rank (the callers make it collective); nothing communicates.
"""
from __future__ import annotations

import errno
import os
import shutil

from ._h5file import open_file

__all__ = ["SPACE_CHECK", "SPACE_MARGIN", "check_space", "reserve_space", "trim"]

#: Whether writers check, before writing, that the target directory has room for the data.
#: Tests switch it off to exercise a real "no space left" failure in the middle of a write.
SPACE_CHECK = True
SPACE_MARGIN = 64 * 1024  # bytes of HDF5 metadata allowed for on top of the raw data


def check_space(path, needed: int) -> None:
    """Raise ``OSError(ENOSPC)`` if the directory of ``path`` has less than ``needed`` bytes
    (plus a metadata margin) free.  A best-effort early check: the write itself still reports
    running out of space."""
    if not SPACE_CHECK:
        return
    d = os.path.dirname(os.path.abspath(os.fspath(path)))
    try:
        free = shutil.disk_usage(d).free
    except OSError:
        return
    if needed + SPACE_MARGIN > free:
        raise OSError(errno.ENOSPC, f"No space left on device: writing {os.fspath(path)!r} needs "
                      f"about {needed + SPACE_MARGIN} bytes but only {free} are free in {d!r}")


_libc_fallocate = None


def _fallocate(fd: int, length: int) -> None:
    """``fallocate(fd, 0, 0, length)`` without glibc's slow emulation on file systems that do
    not support it (then nothing happens)."""
    global _libc_fallocate
    if _libc_fallocate is None:
        try:
            import ctypes
            import ctypes.util
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            f = libc.fallocate
            f.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
            f.restype = ctypes.c_int
            _libc_fallocate = f
        except (OSError, AttributeError):
            _libc_fallocate = False
    if not _libc_fallocate:
        return
    import ctypes
    if _libc_fallocate(fd, 0, 0, length) != 0:
        e = ctypes.get_errno()
        if e == errno.ENOSPC or e == errno.EDQUOT:
            raise OSError(e, os.strerror(e))
        # EOPNOTSUPP, EINVAL, ...: no reservation on this file system


def reserve_space(path, nbytes: int, base: int | None = None) -> bool:
    """Allocate disk blocks so that ``path`` can hold ``nbytes`` more than ``base`` bytes (its
    current size by default) plus a metadata margin without running out of space;
    ``OSError(ENOSPC)`` now if it cannot.  (HDF5's MPI-IO driver extends the file to cover
    space it allocated but did not write yet, hence the ``max`` with the current size.)
    Returns whether the file got longer (then :func:`trim` it once written)."""
    size = os.path.getsize(path)
    base = size if base is None else base
    want = max(size, base + int(nbytes)) + SPACE_MARGIN
    fd = os.open(path, os.O_RDWR)
    try:
        try:
            _fallocate(fd, want)
        except OSError as e:
            raise OSError(e.errno, f"No space left on device: cannot reserve {want} bytes for "
                          f"{os.fspath(path)!r} ({e.strerror})") from None
    finally:
        os.close(fd)
    return os.path.getsize(path) > size


def trim(path) -> None:
    """Cut an HDF5 file back to its end of allocation (after :func:`reserve_space`)."""
    open_file(path, "r+").close()  # the POSIX driver truncates to the end of allocation
