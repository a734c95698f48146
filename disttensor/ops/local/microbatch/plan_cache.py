"""On-disk cache of the micro-batch convolution plans chosen by :mod:`.planner`.

One JSON file, ``conv_plans.json`` in ``$DISTTENSOR_CACHE_DIR`` (default
``~/.cache/disttensor``), maps a key (a SHA-256 of the canonical JSON of everything the choice
depends on) to ``{"key": <those fields>, "plan": <the plan>}``.  The key fields are the
*fingerprint* of this machine and software (:func:`fingerprint`: CPU model and thread count or
GPU name and compute capability, NumPy/Numba/BLAS or cuDNN versions, disttensor's version) and
the problem (shapes, dtype, pass, workspace limit, policy, algorithm names), so a plan timed on
another machine or library is never reused.

Writes are atomic: the file is re-read, merged with the new entry, written to a temporary file
in the same directory and moved into place with :func:`os.replace`, so concurrent writers
(several ranks) never leave a torn file (the last writer wins on a key both wrote; both
entries being valid choices, that is harmless).  A file that cannot be read or parsed is
ignored with a warning, never an error; a directory that cannot be written warns once and the
plans stay in memory.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import tempfile
import threading
from pathlib import Path

from ....core.warn import warn

__all__ = ["PlanCache", "cache_dir", "fingerprint", "key_of"]

FILE_NAME = "conv_plans.json"
FORMAT = 1


def cache_dir() -> Path:
    """``$DISTTENSOR_CACHE_DIR`` or ``~/.cache/disttensor``."""
    d = os.environ.get("DISTTENSOR_CACHE_DIR")
    return Path(d) if d else Path.home() / ".cache" / "disttensor"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _blas() -> str:
    try:
        import numpy as np
        info = np.__config__.CONFIG["Build Dependencies"]["blas"]
        return f"{info.get('name')}-{info.get('version')}"
    except Exception:  # noqa: BLE001 - older NumPy without CONFIG: the NumPy version decides
        return "unknown"


def _disttensor_version() -> str:
    mod = sys.modules.get("disttensor")
    return str(getattr(mod, "__version__", "unknown"))


_FP: dict = {}


def fingerprint(device: str = "cpu", gpu: dict | None = None) -> dict:
    """What a timing depends on besides the problem: for ``device='cpu'`` the CPU model, the
    core and Numba thread counts and the NumPy, Numba and BLAS versions; for ``'gpu'`` the
    fields of ``gpu`` (name, compute capability, cuDNN and CuPy versions, given by the
    caller); always disttensor's version."""
    if device == "gpu":
        return dict(device="gpu", **(gpu or {}), disttensor=_disttensor_version())
    if "cpu" not in _FP:
        import numba
        import numpy as np
        _FP["cpu"] = dict(device="cpu", cpu=_cpu_model(), machine=platform.machine(),
                          cores=os.cpu_count(), numpy=np.__version__, numba=numba.__version__,
                          blas=_blas())
    return dict(_FP["cpu"], threads=_numba_threads(), disttensor=_disttensor_version())


def _numba_threads() -> int:
    import numba
    try:
        return int(numba.get_num_threads())
    except Exception:  # noqa: BLE001
        return int(numba.config.NUMBA_NUM_THREADS)


def key_of(fields: dict) -> str:
    """The cache key of ``fields`` (JSON-able): SHA-256 of their canonical JSON."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=list).encode()).hexdigest()


class PlanCache:
    """The plan file of one directory (None: :func:`cache_dir` at each access), read once and
    kept in memory; :meth:`put` writes through."""

    def __init__(self, directory: str | os.PathLike | None = None):
        self._fixed = None if directory is None else Path(directory)
        self._loaded_from: Path | None = None
        self._entries: dict = {}
        self._lock = threading.Lock()
        self._write_warned = False

    @property
    def path(self) -> Path:
        return (self._fixed or cache_dir()) / FILE_NAME

    def _read(self, path: Path) -> dict:
        """The entries of ``path`` ({} if absent; {} with a warning if unreadable/corrupt)."""
        try:
            with open(path) as f:
                data = json.load(f)
        except (FileNotFoundError, NotADirectoryError):
            return {}
        except (OSError, ValueError) as err:
            warn(f"ignoring the unreadable convolution plan cache {path} "
                 f"({type(err).__name__}: {err}); it will be rewritten", RuntimeWarning)
            return {}
        if (not isinstance(data, dict) or data.get("format") != FORMAT
                or not isinstance(data.get("entries"), dict)):
            warn(f"ignoring the convolution plan cache {path}: not a format-{FORMAT} "
                 "plan file; it will be rewritten", RuntimeWarning)
            return {}
        return data["entries"]

    def _ensure(self) -> None:
        path = self.path
        if self._loaded_from != path:
            self._entries = self._read(path)
            self._loaded_from = path

    def get(self, fields: dict):
        """The stored plan (a JSON value) for ``fields``, or None."""
        with self._lock:
            self._ensure()
            entry = self._entries.get(key_of(fields))
        if isinstance(entry, dict) and entry.get("key") == json.loads(
                json.dumps(fields, sort_keys=True, default=list)):
            return entry.get("plan")
        return None

    def put(self, fields: dict, plan) -> None:
        """Store ``plan`` for ``fields``: merged into the file atomically (see the module)."""
        entry = {"key": json.loads(json.dumps(fields, sort_keys=True, default=list)),
                 "plan": plan}
        with self._lock:
            self._ensure()
            k = key_of(fields)
            self._entries[k] = entry
            path = self.path
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                merged = self._read(path)
                merged.update(self._entries)
                merged[k] = entry
                fd, tmp = tempfile.mkstemp(prefix=FILE_NAME + ".", suffix=".tmp",
                                           dir=path.parent)
                try:
                    with os.fdopen(fd, "w") as f:
                        json.dump({"format": FORMAT, "entries": merged}, f)
                    os.replace(tmp, path)
                except BaseException:
                    try:
                        os.unlink(tmp)
                    except OSError:
                        pass
                    raise
                self._entries = merged
            except OSError as err:
                if not self._write_warned:
                    self._write_warned = True
                    warn(f"cannot write the convolution plan cache {path} ({err}); "
                         "plans are kept in memory only", RuntimeWarning, rank_local=True)

    def entries(self, reread: bool = False) -> list:
        """The stored entries (``{"key": fields, "plan": plan}``); ``reread``: read the file
        again first (another process may have written since)."""
        with self._lock:
            if reread:
                self._loaded_from = None
            self._ensure()
            return list(self._entries.values())

    def clear_memory(self) -> None:
        """Forget what was read (the next access re-reads the file)."""
        with self._lock:
            self._entries, self._loaded_from = {}, None
