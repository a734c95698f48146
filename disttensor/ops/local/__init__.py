"""Per-rank (no MPI) kernels behind the distributed ops, chosen by the block's device.

CPU: the package :mod:`.cpu` (NumPy + Numba): :mod:`.cpu.conv_im2col` and
:mod:`.cpu.conv_direct` (convolution), :mod:`.cpu.pool`, :mod:`.cpu.pointwise`.  GPU: the
package :mod:`.gpu` (cuDNN through NVIDIA's cuDNN frontend, CuPy RawModule kernels, im2col +
cuBLAS fallback).  Every backend implements the same functions with the same contracts; conv
and pooling kernels take exactly three spatial axes (callers lift 1-D/2-D inputs).

The CPU convolutions (``conv_forward``, ``conv_backward_data``, ``conv_backward_filter``) come
from the micro-batch planner (:mod:`.microbatch`, its :mod:`.microbatch.cpu_entry`), which
splits the mini-batch into micro-batches and picks an algorithm per micro-batch under a
workspace limit (``DISTTENSOR_CONV_TUNE``, ``DISTTENSOR_CONV_WORKSPACE_MB``); the GPU ones do
the same inside :mod:`.gpu`."""
from __future__ import annotations

import importlib
import os

# Numba's default threading layer here is GNU OpenMP, whose idle threads spin; so do
# OpenBLAS's after each GEMM.  The CPU conv kernels alternate Numba packs with BLAS GEMMs, and
# spinning threads of one slow the other down ~1.5x on 2 cores (bench/README.md).  A passive
# wait policy (read by libgomp when Numba first loads it, i.e. after this import) fixes the
# Numba side unless the user chose a policy; OPENBLAS_THREAD_TIMEOUT=4 (set before NumPy is
# imported, as scripts/main.sh and bench/README.md do) fixes the BLAS side.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from ...core import profiler as _profiler
from ...core.backend import array_module

__all__ = ["kernels_for"]

_CPU_MODULES = ("cpu.conv_im2col", "cpu.pool", "cpu.pointwise", "cpu.losses",
                "cpu.activations_more")
# kernel names taken from another module than the first of _CPU_MODULES that defines them
_CPU_OVERRIDES = {"conv_forward": "microbatch.cpu_entry",
                  "conv_backward_data": "microbatch.cpu_entry",
                  "conv_backward_filter": "microbatch.cpu_entry"}


class _Kernels:
    """Namespace of one backend's kernel functions (looked up in ``overrides`` first, then in
    its modules in order)."""

    def __init__(self, modules, overrides=None):
        self._modules = [importlib.import_module(f"{__name__}.{m}") for m in modules]
        for name, mod in (overrides or {}).items():
            setattr(self, name, getattr(importlib.import_module(f"{__name__}.{mod}"), name))

    def __getattr__(self, name):
        for m in self._modules:
            f = getattr(m, name, None)
            if f is not None:
                setattr(self, name, f)
                return f
        raise AttributeError(f"no local kernel {name!r}")


_BACKENDS: dict = {}


class _TimedKernels:
    """A kernel namespace whose functions run inside a ``kernel`` region of the step
    profiler (:mod:`disttensor.core.profiler`), labelled with the kernel's name."""

    def __init__(self, kernels: _Kernels):
        self._kernels = kernels

    def __getattr__(self, name):
        f = getattr(self._kernels, name)
        if not callable(f):
            return f

        def timed(*args, **kwargs):
            with _profiler.region("kernel", name):
                return f(*args, **kwargs)
        return timed


def kernels_for(arr) -> _Kernels:
    """The kernel namespace for ``arr``'s device (NumPy -> CPU, CuPy -> GPU); while a step
    profile is active, its functions are timed."""
    key = "cpu" if array_module(arr).__name__ == "numpy" else "gpu"
    if key not in _BACKENDS:
        _BACKENDS[key] = (_Kernels(_CPU_MODULES, _CPU_OVERRIDES) if key == "cpu"
                          else _Kernels(("gpu",)))
    if _profiler._active is not None:
        return _TimedKernels(_BACKENDS[key])
    return _BACKENDS[key]
