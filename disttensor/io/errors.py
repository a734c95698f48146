"""Exceptions of :mod:`disttensor.io`.

Every one of them is rebuilt from its message alone (``type(e)(str(e))`` gives the same
message), so :func:`disttensor.core.comm.collective` raises the same type on every rank."""
from __future__ import annotations

__all__ = ["DatasetNotFoundError", "NotHDF5FileError", "HDF5UnavailableError"]


class DatasetNotFoundError(KeyError):
    """The file has no dataset (or object) of that name."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it plain
        return str(self.args[0]) if self.args else ""


class NotHDF5FileError(OSError):
    """The file exists but is not an HDF5 file (or is truncated/corrupt)."""


class HDF5UnavailableError(RuntimeError):
    """h5py cannot be imported, or lacks the parallel (``mpio``) driver that was asked for."""
