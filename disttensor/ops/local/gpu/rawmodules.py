"""The CuPy RawModules of the GPU local kernels: NVRTC compilation of ``kernels/*.cu``, kernel
lookup by name expression, the C type of a dtype, and the launch configuration.

* :func:`module_source` reads ``kernels/<file>.cu`` and inlines its local headers (a line
  ``#include "common.cuh"`` is replaced by that header's text, recursively), so NVRTC needs no
  ``-I`` and CuPy's cache (keyed on the source text) sees every change of a header.  ``nvcc``
  resolves the same includes from the file's folder, so the files compile standalone too.
* :func:`load_module` compiles a module once per process (thread-safe); :func:`kernel` looks a
  kernel up by the name expression it was compiled with (``"max_pool3d_forward<float>"``).
* Every launch is 1-D with :data:`BLOCK` threads per block and at most :data:`MAX_BLOCKS`
  blocks; the kernels loop grid-stride over the rest.  Integer arguments go as ``int64``.

CuPy is imported lazily (:func:`cupy`): importing this module needs neither CuPy nor a GPU.

CuPy API relied on: ``RawModule(code=..., options=..., name_expressions=[...])`` and
``RawModule.get_function(name_expression)`` for template kernels (docs.cupy.dev,
``cupy.RawModule``: "name_expressions ... e.g. ['func1<int>', 'func1<double>', 'func2'] ...
Strings in this tuple must then be passed, one at a time, to get_function()").  Kernel
arguments are passed as CuPy arrays (device pointer) and NumPy scalars of the exact C type.
"""
from __future__ import annotations

import re
import threading
from pathlib import Path

import numpy as np

KERNEL_DIR = Path(__file__).resolve().parent / "kernels"
BLOCK = 256                 # threads per block of every launch (pointwise.cu REDUCE_BLOCK too)
MAX_BLOCKS = 1 << 20        # grid-stride loops cover the rest
CTYPES = {"float16": "__half", "float32": "float", "float64": "double"}

# name -> (source file, templated name expressions ({T} = C type), plain name expressions)
MODULE_SPECS = {
    "pool": ("pool.cu", ("max_pool3d_forward<{T}>", "avg_pool3d_forward<{T}>",
                         "max_pool3d_backward<{T}>", "avg_pool3d_backward<{T}>"), ()),
    "im2col": ("im2col.cu", ("im2col3d<{T}>", "col2im3d<{T}>"), ()),
    "pointwise": ("pointwise.cu", ("channel_partial<{T}, 0>", "channel_partial<{T}, 1>",
                                   "bn_forward_apply<{T}>", "bn_backward_apply<{T}>",
                                   "activation_forward<{T}>", "activation_backward<{T}>",
                                   "softmax_channels<{T}>", "softmax_channels_backward<{T}>"),
                  ("channel_finalize",)),
    "losses": ("losses.cu", ("class_ce_forward<{T}>", "class_ce_backward<{T}>",
                             "prob_ce_forward<{T}>", "prob_ce_backward<{T}>",
                             "pointwise_loss_forward<{T}>", "pointwise_loss_backward<{T}>",
                             "channel_lse<{T}>", "dice_partial<{T}>", "dice_backward<{T}>"),
               ()),
    "activations_more": ("activations_more.cu", ("pointwise_activation_forward<{T}>",
                                                 "pointwise_activation_backward<{T}>",
                                                 "prelu_forward<{T}>", "prelu_backward<{T}>"),
                         ()),
    "normalization": ("normalization.cu", ("row_moments_partial<{T}>", "ln_row_partial<{T}>",
                                           "ln_col_sums<{T}>", "rows_backward_apply<{T}>",
                                           "ln_forward_apply<{T}>", "ln_backward_apply<{T}>"),
                      ("row_moments_finalize",)),
    "resample": ("resample.cu", ("csr_apply<{T}>", "adaptive_max_forward<{T}>",
                                 "adaptive_max_backward<{T}>"), ()),
}

# disttensor.sparse's CSB kernels (sparse/ sits beside ops/: the path is relative to KERNEL_DIR;
# plain name expressions, float/double by in-block index type, no __half)
MODULE_SPECS["csb"] = ("../../../../sparse/kernels/csb.cu", (), tuple(
    f"{kern}<{t}, {i}>" for kern in ("csb_spmm_lines", "csb_sddmm")
    for t in ("float", "double") for i in ("unsigned char", "unsigned short")))

_LOCAL_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"[ \t]*(//[^\n]*)?$', re.M)


def cupy():
    """The ``cupy`` module (imported on first use)."""
    import cupy as cp
    return cp


def expand_local_includes(code: str, folder: Path, _stack=()) -> str:
    """``code`` with every ``#include "name"`` line replaced by the text of ``folder/name``
    (expanded the same way; a header including itself again raises ``ValueError``).  Angle
    includes (``#include <cuda_fp16.h>``) are left to the compiler."""
    def inline(m):
        name = m.group(1)
        if name in _stack:
            raise ValueError(f"recursive #include of {name!r} ({' -> '.join(_stack)})")
        text = expand_local_includes((Path(folder) / name).read_text(), folder,
                                     _stack + (name,))
        return f"// ---- begin {name} (inlined)\n{text.rstrip()}\n// ---- end {name}"
    return _LOCAL_INCLUDE.sub(inline, code)


def module_source(name: str) -> str:
    """The source NVRTC compiles for module ``name`` (a key of :data:`MODULE_SPECS`):
    ``kernels/<file>.cu`` with its local headers inlined."""
    path = KERNEL_DIR / MODULE_SPECS[name][0]
    return expand_local_includes(path.read_text(), path.parent)


_modules: dict = {}
_modules_lock = threading.Lock()


HALF_UNAVAILABLE: dict = {}   # module name -> why its __half instances did not compile


def load_module(name):
    """``(cupy.RawModule, has_half)`` for module ``name`` (``kernels/<name>.cu``), compiled on
    first use.

    The __half instances need ``cuda_fp16.h`` at NVRTC time.  Should the full build fail, the
    module is compiled again with ``-DDISTTENSOR_NO_HALF``: if that build succeeds, only the
    float16 instances were at fault, which is said at once (a ``RuntimeWarning`` naming the
    NVRTC error, once per module) and recorded in :data:`HALF_UNAVAILABLE` (reported by
    ``python -m disttensor.info``); float16 input then raises ``TypeError`` with the same
    reason.  If the build without them fails too, the error of the full build is raised (a
    broken kernel is never hidden behind a float16 fallback)."""
    entry = _modules.get(name)
    if entry is not None:
        return entry
    with _modules_lock:
        entry = _modules.get(name)
        if entry is None:
            cp = cupy()
            _, templated, plain = MODULE_SPECS[name]
            code = module_source(name)

            def build(half):
                types = ("float", "double") + (("__half",) if half else ())
                exprs = [t.format(T=ty) for t in templated for ty in types] + list(plain)
                opts = ("-std=c++17",) + (() if half else ("-DDISTTENSOR_NO_HALF",))
                mod = cp.RawModule(code=code, options=opts, name_expressions=exprs)
                mod.get_function(exprs[0])  # compiles the whole module now
                return mod

            try:
                entry = (build(True), True)
            except Exception as full_error:  # noqa: BLE001 - e.g. NVRTC lacks cuda_fp16.h
                try:
                    entry = (build(False), False)
                except Exception:  # noqa: BLE001 - not a float16 problem: the real error
                    raise full_error from None
                reason = f"{type(full_error).__name__}: {str(full_error).strip()[:500]}"
                HALF_UNAVAILABLE[name] = reason
                from ....core.warn import warn
                warn(f"the float16 instances of the GPU kernels {name!r} did not "
                     f"compile ({reason}); float32/float64 work, float16 input "
                     "raises TypeError", RuntimeWarning, rank_local=True)
            _modules[name] = entry
    return entry


def kernel(module, expr):
    """The kernel of module ``module`` compiled for name expression ``expr``."""
    return load_module(module)[0].get_function(expr)


def ctype(dtype, module):
    """The C type (``__half``, ``float``, ``double``) of ``dtype`` for kernels of ``module``;
    ``TypeError`` for other dtypes, or for float16 where ``module`` has no __half instances."""
    name = np.dtype(dtype).name
    ct = CTYPES.get(name)
    if ct is None:
        raise TypeError(f"GPU local kernels take float16, float32 or float64 arrays, got {name}")
    if ct == "__half" and not load_module(module)[1]:
        raise TypeError("float16 GPU kernels are unavailable here (NVRTC could not compile "
                        f"the __half instances of {module!r}: {HALF_UNAVAILABLE.get(module)})")
    return ct


def launch(kern, n, args):
    """Launch ``kern`` over ``n`` work items (nothing when ``n <= 0``)."""
    if n <= 0:
        return
    blocks = min((n + BLOCK - 1) // BLOCK, MAX_BLOCKS)
    kern((blocks,), (BLOCK,), args)


def i64(*vals):
    """``vals`` as a tuple of ``np.int64`` kernel arguments."""
    return tuple(np.int64(v) for v in vals)
