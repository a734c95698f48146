"""CuPy's RawModule / RawKernel call convention on the host builds of
tests/host_cuda/host_build.py, with NumPy arrays standing in for device arrays.

``HostModule(name, variant).get_function(expr)`` gives a :class:`HostKernel`;
``kern(grid, block, args, shared_mem=0)`` launches it as CuPy would: ``args`` holds NumPy
arrays (device pointers) and NumPy scalars of the exact C type of each parameter.  Stricter
than CuPy where a mismatch would be a silent bug on a GPU: the number of arguments, each
scalar's type and each array's dtype must match the kernel's parameters (read from the
library), arrays must be C-contiguous, grid/block are 1-3 positive ints.  Every array is
copied into a heap buffer of exactly its size (so the sanitized build catches a read one past
the end; NumPy's small-allocation cache would hide it), launched on, and the non-const ones
copied back (the const ones are checked to be unchanged).

:func:`install` monkeypatches ``rawmodules.load_module`` and the wrappers' ``cupy`` so that the
real Python wrappers of ``disttensor.ops.local.gpu`` (pooling, batchnorm, activations,
im2col_conv) run on the host with NumPy as CuPy; :data:`LAUNCHED` records every name
expression launched (the count the test step prints).
"""
from __future__ import annotations

import ctypes
import threading
from collections import Counter

import numpy as np

import host_build as build

CODES = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "i32": np.int32,
         "i64": np.int64, "u32": np.uint32, "u64": np.uint64, "u8": np.uint8,
         "u16": np.uint16}
LAUNCHED: Counter = Counter()   # (variant, name expression) -> launches with work
_libs: dict = {}
_lock = threading.Lock()


def library(module, variant):
    """The loaded (ctypes) host build of ``module``."""
    key = (module, variant)
    with _lock:
        lib = _libs.get(key)
        if lib is None:
            lib = ctypes.CDLL(str(build.build(module, variant)))
            lib.dtk_alloc.restype = ctypes.c_void_p
            lib.dtk_alloc.argtypes = [ctypes.c_ulonglong]
            lib.dtk_free.argtypes = [ctypes.c_void_p]
            lib.dtk_set_index32_limit.argtypes = [ctypes.c_longlong]
            _libs[key] = lib
    return lib


def set_index32_limit(limit):
    """Set the 32-bit index path's size limit in every loaded library (``0x7fffffff`` is the
    GPU's; 0 forces the 64-bit path)."""
    for lib in _libs.values():
        lib.dtk_set_index32_limit(int(limit))


class HostKernel:
    """One kernel of a host build (see the module docstring for the call convention)."""

    def __init__(self, module, variant, expr):
        exprs = build.name_expressions(module)
        if expr not in exprs:
            raise KeyError(f"{expr!r} is not a name expression of module {module!r}")
        self.module, self.variant, self.expr = module, variant, expr
        self.lib = library(module, variant)
        j = exprs.index(expr)
        self._launch = getattr(self.lib, f"dtk_launch_{j}")
        self._launch.restype = ctypes.c_int
        self._launch.argtypes = [ctypes.c_uint] * 6 + [ctypes.POINTER(ctypes.c_void_p)]
        sig = getattr(self.lib, f"dtk_signature_{j}")
        sig.restype = ctypes.c_char_p
        self.params = sig().decode().split(",")

    @staticmethod
    def _dims(v, what):
        v = tuple(v)
        if not 1 <= len(v) <= 3 or any(not isinstance(a, (int, np.integer)) or a < 1
                                       for a in v):
            raise ValueError(f"{what} must be 1-3 positive ints, got {v!r}")
        if any(a >= 2**31 for a in v[1:]) or (v[0] >= 2**31):
            raise ValueError(f"{what} {v!r} exceeds the CUDA limits")
        return tuple(int(a) for a in v) + (1,) * (3 - len(v))

    def __call__(self, grid, block, args, shared_mem=0):
        grid, block = self._dims(grid, "grid"), self._dims(block, "block")
        if max(grid[1:]) > 65535 or block[0] * block[1] * block[2] > 1024:
            raise ValueError(f"launch {grid} x {block} exceeds the CUDA limits")
        if shared_mem:
            raise ValueError("dynamic shared memory: no kernel here uses it")
        args = tuple(args)
        if len(args) != len(self.params):
            raise TypeError(f"{self.expr}: {len(args)} arguments for {len(self.params)} "
                            f"parameters ({','.join(self.params)})")
        holders, buffers = [], []   # holders: what args[i] points at, kept alive
        try:
            for k, (a, code) in enumerate(zip(args, self.params)):
                if ":" in code:
                    kind, elem = code.split(":")
                    if not isinstance(a, np.ndarray) or a.dtype != CODES[elem]:
                        raise TypeError(f"{self.expr} argument {k}: {elem} array expected, "
                                        f"got {type(a).__name__} {getattr(a, 'dtype', '')}")
                    if not a.flags.c_contiguous:
                        raise ValueError(f"{self.expr} argument {k}: not C-contiguous")
                    ptr = self.lib.dtk_alloc(a.nbytes)
                    if not ptr:
                        raise MemoryError(a.nbytes)
                    buffers.append((a, ptr, kind == "cp"))
                    if a.nbytes:
                        ctypes.memmove(ptr, a.ctypes.data, a.nbytes)
                    holders.append(ctypes.c_void_p(ptr))
                else:
                    want = CODES[code]
                    if not isinstance(a, np.generic) or a.dtype != want:
                        raise TypeError(f"{self.expr} argument {k}: NumPy {np.dtype(want)} "
                                        f"scalar expected, got {type(a).__name__}")
                    holders.append(np.array([a], dtype=want))
            ptrs = (ctypes.c_void_p * max(1, len(holders)))()
            for k, h in enumerate(holders):
                ptrs[k] = (ctypes.addressof(h) if isinstance(h, ctypes.c_void_p)
                           else h.ctypes.data)
            rc = self._launch(*grid, *block, ptrs)
            if rc != 0:
                raise RuntimeError(f"{self.expr}: the threads of a block met at different "
                                   "barriers (a divergent __syncthreads)")
            for a, ptr, const in buffers:
                if not a.nbytes:
                    continue
                out = np.empty_like(a)
                ctypes.memmove(out.ctypes.data, ptr, a.nbytes)
                if const:
                    if out.tobytes() != a.tobytes():
                        raise AssertionError(f"{self.expr} wrote a const argument")
                else:
                    a[...] = out
        finally:
            for _, ptr, _ in buffers:
                self.lib.dtk_free(ptr)
        LAUNCHED[(self.variant, self.expr)] += 1


class HostModule:
    """``cupy.RawModule`` stand-in: :meth:`get_function` by name expression."""

    def __init__(self, module, variant):
        self.module, self.variant = module, variant
        self._kernels = {}

    def get_function(self, expr):
        k = self._kernels.get(expr)
        if k is None:
            k = self._kernels[expr] = HostKernel(self.module, self.variant, expr)
        return k


def install(monkeypatch, variant):
    """Run the real GPU wrappers on the host build ``variant``: ``rawmodules.load_module``
    returns :class:`HostModule` (with float16), every wrapper's ``cupy`` gives NumPy."""
    from disttensor.ops.local.gpu import (activations, batchnorm, im2col_conv, pooling,
                                          rawmodules)
    modules = {}

    def load_module(name):
        if name not in modules:
            modules[name] = (HostModule(name, variant), True)
        return modules[name]

    monkeypatch.setattr(rawmodules, "load_module", load_module)
    for mod in (rawmodules, activations, batchnorm, im2col_conv, pooling):
        monkeypatch.setattr(mod, "cupy", lambda: np)
