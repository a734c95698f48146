"""Library warnings: once per job, at the user's line.

``warnings.warn`` inside the library has two faults in an MPI job: every rank prints the same
warning (a job of 64 ranks shows it 64 times), and a fixed ``stacklevel`` points at a line of
the library when the warning is raised a few calls deeper than expected.  :func:`warn` is the
one way the library warns:

* it points at the first frame outside the ``disttensor`` package (the user's line that
  called into the library, however deep the warning is raised), so Python's default filter
  also shows it once per user line;
* a warning about a condition that is the same on every rank (the default) is issued by rank
  0 of ``MPI_COMM_WORLD`` only: the job shows it once.  A condition of one rank or node (an
  unreadable file on a node-local disk, a GPU library failing on one node, data that only
  some ranks hold) passes ``rank_local=True``: each rank that meets it warns, its message
  prefixed with ``rank r:`` (counting the ranks that met it would need a collective, which a
  warning must never add).

Local: no communication.
"""
from __future__ import annotations

import os
import sys
import warnings

__all__ = ["warn", "user_stacklevel"]

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _world_rank() -> int:
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return 0
    return mpi.COMM_WORLD.Get_rank()


def user_stacklevel() -> int:
    """The ``stacklevel`` that a ``warnings.warn`` call made by the caller of this function
    needs to point at the first frame outside the disttensor package (at the outermost frame
    when every frame is inside it)."""
    frame = sys._getframe(2)  # the frame above the caller: stacklevel 2
    level = 2
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
        level += 1
    return level


def warn(message: str, category: type[Warning] = UserWarning, *,
         rank_local: bool = False) -> None:
    """Issue ``message`` as ``category`` at the user's line: on rank 0 only (``rank_local``
    false: the condition is the same on every rank), or on this rank with a ``rank r:``
    prefix (``rank_local=True``: a condition of this rank or node).  See the module
    docstring."""
    rank = _world_rank()
    if not rank_local and rank != 0:
        return
    if rank_local and _world_size() > 1:
        message = f"rank {rank}: {message}"
    warnings.warn(message, category, stacklevel=user_stacklevel())


def _world_size() -> int:
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return 1
    return mpi.COMM_WORLD.Get_size()
