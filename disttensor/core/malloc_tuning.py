"""glibc ``malloc`` settings under which a steady training step reuses freed memory instead of
faulting in fresh pages.

glibc serves a request of at least ``M_MMAP_THRESHOLD`` bytes with its own ``mmap`` and gives
it back with ``munmap`` when freed; the threshold starts at 128 KiB and rises by itself to the
largest block freed so far (at most 32 MiB), and the top of the heap is given back to the
system once more than ``M_TRIM_THRESHOLD`` of it is free (twice the threshold).  A training
step frees every activation and gradient it made, in a different order than it made them, so
under those rules each step trims the heap and maps its large blocks again: every page is
zero-filled by the kernel and faulted in anew (thousands of minor faults a step at 32^3).

:func:`tune_malloc` fixes the mmap threshold at glibc's largest (32 MiB) and the trim
threshold at :data:`TRIM_BYTES` (256 MiB), with ``mallopt``: blocks below 32 MiB then come
from the heap, and freed memory stays there for the next step (a process keeps up to 256 MiB
of free heap; blocks of 32 MiB and more are still mapped and unmapped each time).
:mod:`disttensor.core.memory` calls it once at import.  It does nothing when

* ``DISTTENSOR_MALLOC_TUNING`` is ``off`` (default ``on``);
* the user tuned malloc already (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``,
  ``MALLOC_TOP_PAD_`` or ``GLIBC_TUNABLES`` naming ``glibc.malloc``), or preloads another
  allocator (``LD_PRELOAD`` naming jemalloc, tcmalloc or mimalloc);
* the C library is not glibc (macOS, musl, Windows).

Local to the process; no MPI.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

__all__ = ["tune_malloc", "MMAP_BYTES", "TRIM_BYTES", "applied"]

MMAP_BYTES = 32 << 20        # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit systems
TRIM_BYTES = 256 << 20
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_USER_VARS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
_OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")

#: what :func:`tune_malloc` did: ``None`` (not called yet), ``"applied"`` or why not
applied: str | None = None


def _reason_to_skip(env) -> str | None:
    """Why the settings must be left alone (pure: reads ``env`` and the platform)."""
    mode = env.get("DISTTENSOR_MALLOC_TUNING", "on").strip().lower()
    if mode in ("off", "0", "false", "no"):
        return "off (DISTTENSOR_MALLOC_TUNING)"
    if mode not in ("", "on", "1", "true", "yes"):
        raise ValueError(f"DISTTENSOR_MALLOC_TUNING must be 'on' or 'off', got {mode!r}")
    if any(v in env for v in _USER_VARS) or "glibc.malloc" in env.get("GLIBC_TUNABLES", ""):
        return "left to the user's glibc settings"
    if any(a in env.get("LD_PRELOAD", "") for a in _OTHER_ALLOCATORS):
        return "another allocator is preloaded"
    if not sys.platform.startswith("linux"):
        return "not glibc"
    return None


def tune_malloc(env=None) -> str:
    """Apply the settings of the module docstring (once per process; later calls return what
    the first did).  Returns ``"applied"`` or the reason it did nothing."""
    global applied
    if applied is not None:
        return applied
    reason = _reason_to_skip(os.environ if env is None else env)
    if reason is None:
        try:
            libc = ctypes.CDLL(None)
            gnu = getattr(libc, "gnu_get_libc_version", None)
            if gnu is None:
                reason = "not glibc"
            else:
                ok = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_BYTES) == 1
                ok = libc.mallopt(_M_TRIM_THRESHOLD, TRIM_BYTES) == 1 and ok
                reason = None if ok else "mallopt refused the settings"
        except (OSError, AttributeError):
            reason = "not glibc"
    applied = "applied" if reason is None else reason
    return applied
