"""Array-module dispatch: NumPy (+Numba) blocks on CPU, CuPy blocks on GPU.

CuPy is imported lazily, only when a GPU array is asked for or met, so CPU-only machines
never need it."""
from __future__ import annotations

from functools import lru_cache

import numpy as np

__all__ = ["array_module", "to_host", "to_device", "device_of", "gpu_available", "xp_for"]


@lru_cache(maxsize=1)
def _cupy():
    try:
        import cupy  # noqa: F401
        return cupy
    except Exception:  # ImportError, or CUDA libraries missing
        return None


@lru_cache(maxsize=1)
def gpu_available() -> bool:
    """Whether CuPy imports and sees at least one CUDA device.  The first call also binds this
    process to its GPU (:func:`bind_local_device`)."""
    cp = _cupy()
    if cp is None:
        return False
    try:
        count = cp.cuda.runtime.getDeviceCount()
    except Exception:
        return False
    if count > 0:
        bind_local_device(cp, count)
    return count > 0


# the node-local rank as the common launchers export it (Open MPI, MPICH/Hydra, MVAPICH,
# Slurm's srun, Cray PALS), first found wins
LOCAL_RANK_VARIABLES = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                        "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "PALS_LOCAL_RANKID",
                        "PMI_LOCAL_RANK")


def local_device_index(count: int, environ) -> int | None:
    """The GPU ordinal this process should use among ``count`` visible ones: ``DISTTENSOR_GPU``
    if set, else the node-local rank (from the launcher's environment) modulo ``count``; None
    where neither is known or only one device is visible (then CuPy's current device stays).
    Pure: the environment is passed in."""
    explicit = environ.get("DISTTENSOR_GPU", "").strip()
    if explicit:
        idx = int(explicit)
        if not 0 <= idx < count:
            raise ValueError(f"DISTTENSOR_GPU={idx}, but {count} GPU(s) are visible")
        return idx
    if count <= 1:
        return None
    for name in LOCAL_RANK_VARIABLES:
        v = environ.get(name, "").strip()
        if v.isdigit():
            return int(v) % count
    return None


def bind_local_device(cp, count: int) -> None:
    """Make GPU :func:`local_device_index` CuPy's current device for this process (one rank
    per GPU under ``mpirun -n <GPUs>``, each on its own device instead of all on device 0)."""
    import os
    idx = local_device_index(count, os.environ)
    if idx is not None:
        cp.cuda.Device(idx).use()


def array_module(arr):
    """``numpy`` or ``cupy``, whichever ``arr`` belongs to."""
    if type(arr).__module__.startswith("cupy"):
        return _cupy()
    return np


def device_of(arr) -> str:
    return "cuda" if array_module(arr) is not np else "cpu"


def xp_for(device: str):
    """The array module for ``device`` (``"cpu"`` or ``"cuda"``/``"gpu"``)."""
    if device == "cpu":
        return np
    if device in ("cuda", "gpu"):
        if not gpu_available():
            raise RuntimeError("device='cuda' needs CuPy and a CUDA GPU, and none was found")
        return _cupy()
    raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")


def normalize_device(device: str) -> str:
    if device in ("cuda", "gpu"):
        return "cuda"
    if device == "cpu":
        return "cpu"
    raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")


def to_host(arr) -> np.ndarray:
    """A NumPy array with the contents of ``arr`` (no copy for NumPy input)."""
    if isinstance(arr, np.ndarray):
        return arr
    if array_module(arr) is not np:
        return arr.get()
    return np.asarray(arr)


def to_device(arr, device: str):
    """``arr`` as an array of ``device`` (no copy when it is already there)."""
    xp = xp_for(normalize_device(device))
    if xp is np:
        return to_host(arr)
    return xp.asarray(arr)
