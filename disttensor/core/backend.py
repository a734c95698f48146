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
    """Whether CuPy imports and sees at least one CUDA device."""
    cp = _cupy()
    if cp is None:
        return False
    try:
        return cp.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


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
