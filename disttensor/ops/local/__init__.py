"""Per-rank (no MPI) kernels behind the distributed ops, chosen by the block's device.

CPU: :mod:`.cpu_conv`, :mod:`.cpu_pool`, :mod:`.cpu_pointwise` (NumPy + Numba).  GPU:
:mod:`.gpu` (cuDNN through NVIDIA's cuDNN frontend, CuPy RawModule kernels, im2col + cuBLAS
fallback).  Every backend implements the same functions with the same contracts; conv and
pooling kernels take exactly three spatial axes (callers lift 1-D/2-D inputs)."""
from __future__ import annotations

import importlib

from ...backend import array_module

__all__ = ["kernels_for"]

_CPU_MODULES = ("cpu_conv", "cpu_pool", "cpu_pointwise")


class _Kernels:
    """Namespace of one backend's kernel functions (looked up in its modules in order)."""

    def __init__(self, modules):
        self._modules = [importlib.import_module(f"{__name__}.{m}") for m in modules]

    def __getattr__(self, name):
        for m in self._modules:
            f = getattr(m, name, None)
            if f is not None:
                setattr(self, name, f)
                return f
        raise AttributeError(f"no local kernel {name!r}")


_BACKENDS: dict = {}


def kernels_for(arr) -> _Kernels:
    """The kernel namespace for ``arr``'s device (NumPy -> CPU, CuPy -> GPU)."""
    key = "cpu" if array_module(arr).__name__ == "numpy" else "gpu"
    if key not in _BACKENDS:
        _BACKENDS[key] = _Kernels(_CPU_MODULES if key == "cpu" else ("gpu",))
    return _BACKENDS[key]
