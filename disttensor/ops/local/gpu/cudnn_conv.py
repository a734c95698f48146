"""GPU local kernels (per rank, no MPI): the same functions and contracts as the CPU kernels in
:mod:`.cpu_conv`, :mod:`.cpu_pool` and :mod:`.cpu_pointwise`, on CuPy arrays.

* Convolution (``conv_forward``, ``conv_backward_data``, ``conv_backward_filter``): cuDNN through
  NVIDIA's cuDNN frontend (``import cudnn``, package ``nvidia-cudnn-frontend`` 1.28) when it
  imports, otherwise (or with ``DISTTENSOR_CONV_BACKEND=im2col``, or ``backend='im2col'``, or
  where cuDNN reports no engine for a configuration) im2col + cuBLAS (``cupy.matmul``) with the
  RawKernels of ``kernels/im2col.cu``, the batch (and, for big samples, the output depth) cut in
  chunks so the column buffer stays under ``DISTTENSOR_IM2COL_WORKSPACE_MIB`` (default 256).
* With ``backend=None`` and no ``DISTTENSOR_CONV_BACKEND``, the three conv functions go through
  the micro-batch planner of :mod:`.microbatch` (unless ``DISTTENSOR_CONV_TUNE=off``): the
  candidates are every cuDNN execution plan the heuristics list (``cudnn:<rank>``, each with
  its own workspace) and im2col with its column buffer bounded by the limit, per micro-batch
  size; the mini-batch is divided so that each part's workspace stays under
  ``DISTTENSOR_CONV_WORKSPACE_MB``.
* Pooling (``pool_forward``, ``pool_backward``): ``kernels/pool.cu``.
* Per-channel statistics, batch-norm apply, activations, channel softmax: ``kernels/pointwise.cu``.

Layout ``(N, C, *spatial)``; conv and pooling take exactly three spatial axes ``(N, C, D, H, W)``;
``kernel``/``stride``/``dilation``/``pad_lo``/``pad_hi`` are 3-tuples (an int means the same value
on every axis), padding may be asymmetric.  Outputs have the input dtype (float16, float32,
float64); reductions are float64.  Inputs that are not C-contiguous are copied first.

CuPy is imported lazily, so ``import disttensor.ops.local.gpu`` works on a machine without it.

APIs this module relies on (looked up, not guessed):

* CuPy ``RawModule(code=..., options=..., name_expressions=[...])`` and
  ``RawModule.get_function(name_expression)`` for template kernels (docs.cupy.dev,
  ``cupy.RawModule``: "name_expressions ... e.g. ['func1<int>', 'func1<double>', 'func2'] ...
  Strings in this tuple must then be passed, one at a time, to get_function()").  Kernel
  arguments are passed as CuPy arrays (device pointer) and NumPy scalars of the exact C type.
* cuDNN frontend 1.28 Python API (NVIDIA/cudnn-frontend: ``python/cudnn/__init__.py`` of
  version 1.28.0, ``docs/operations/Convolutions.md``, ``test/python/conv/graph/test_conv_fuzzer.py``,
  ``test/python/core/graph/test_set_stream_cache.py``,
  ``test/python/core/graph/test_variant_pack_normalization.py``):

  - ``cudnn.create_handle()`` returns a ``cudnn.Handle`` object (1.28 changed it from a bare int),
    bound to the current CUDA device; cuDNN forbids sharing a handle across threads;
  - ``cudnn.set_stream(handle=h, stream=<cudaStream_t as int>)`` (cached on the Handle);
  - ``cudnn.pygraph(io_data_type=, intermediate_data_type=, compute_data_type=, handle=)``;
  - ``graph.tensor(name=, dim=, stride=, data_type=)`` with ``cudnn.data_type.{HALF,FLOAT,DOUBLE}``;
  - ``graph.conv_fprop(image=, weight=, ...)``, ``graph.conv_dgrad(loss=, filter=, ...)``,
    ``graph.conv_wgrad(image=, loss=, ...)``, each taking ``pre_padding``/``post_padding`` (or
    symmetric ``padding``), ``stride``, ``dilation``, ``compute_data_type``, ``name``; groups
    follow from the channel counts (weight ``(K, C/groups, ...)``); the dgrad and wgrad outputs
    need ``set_dim``/``set_stride`` (not inferable), and we set them on every output so cuDNN
    never picks a channels-last layout;
  - ``graph.validate()``, ``build_operation_graph()``,
    ``create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])``,
    ``check_support()``, ``build_plans()``, ``get_workspace_size()``; an unsupported graph
    raises ``cudnn.cudnnGraphNotSupportedError``;
  - ``graph.execute({graph_tensor: device_pointer_int, ...}, workspace_pointer_int_or_None,
    handle=h)``: raw device pointers are accepted as variant-pack values and as the workspace,
    so torch is never imported;
  - every candidate plan (mu-cuDNN's algorithms): ``get_execution_plan_count()``,
    ``build_plan_at_index(index)`` (raises where that engine cannot be built),
    ``get_workspace_size_plan_at_index(index)`` and
    ``execute_plan_at_index(variant_pack, workspace, index, handle=h)`` (cudnn-frontend
    ``python/pygraph/pygraph.cpp`` and ``python/cudnn/_pygraph.py``).
"""
from __future__ import annotations

import math
import os
import threading
import warnings
from pathlib import Path

import numpy as np

__all__ = [
    "cudnn_available", "conv_backend", "last_conv_backend", "conv_algorithms",
    "conv_forward", "conv_backward_data", "conv_backward_filter",
    "pool_forward", "pool_backward",
    "channel_sums", "bn_forward_apply", "channel_sums_backward", "bn_backward_apply",
    "activation_forward", "activation_backward",
    "softmax_channels", "log_softmax_channels", "softmax_channels_backward",
]

_KERNEL_DIR = Path(__file__).resolve().parent / "kernels"
_BLOCK = 256                # threads per block of every launch (pointwise.cu REDUCE_BLOCK too)
_MAX_BLOCKS = 1 << 20       # grid-stride loops cover the rest
_CTYPES = {"float16": "__half", "float32": "float", "float64": "double"}
_CONV_BACKENDS = ("cudnn", "im2col")


def _cp():
    import cupy
    return cupy


# -- RawModules --------------------------------------------------------------------------------
# name -> (source file, templated name expressions ({T} = C type), plain name expressions)
_MODULE_SPECS = {
    "pool": ("pool.cu", ("max_pool3d_forward<{T}>", "avg_pool3d_forward<{T}>",
                         "max_pool3d_backward<{T}>", "avg_pool3d_backward<{T}>"), ()),
    "im2col": ("im2col.cu", ("im2col3d<{T}>", "col2im3d<{T}>"), ()),
    "pointwise": ("pointwise.cu", ("channel_partial<{T}, 0>", "channel_partial<{T}, 1>",
                                   "bn_forward_apply<{T}>", "bn_backward_apply<{T}>",
                                   "activation_forward<{T}>", "activation_backward<{T}>",
                                   "softmax_channels<{T}>", "softmax_channels_backward<{T}>"),
                  ("channel_finalize",)),
}
_modules: dict = {}
_modules_lock = threading.Lock()


def _module(name):
    """``(cupy.RawModule, has_half)`` for ``kernels/<name>.cu``, compiled on first use.

    The __half instances need ``cuda_fp16.h`` at NVRTC time; should that fail, the module is
    compiled again with ``-DDISTTENSOR_NO_HALF`` and float16 input raises ``TypeError``."""
    entry = _modules.get(name)
    if entry is not None:
        return entry
    with _modules_lock:
        entry = _modules.get(name)
        if entry is None:
            cp = _cp()
            fname, templated, plain = _MODULE_SPECS[name]
            code = (_KERNEL_DIR / fname).read_text()

            def build(half):
                types = ("float", "double") + (("__half",) if half else ())
                exprs = [t.format(T=ty) for t in templated for ty in types] + list(plain)
                opts = ("-std=c++17",) + (() if half else ("-DDISTTENSOR_NO_HALF",))
                mod = cp.RawModule(code=code, options=opts, name_expressions=exprs)
                mod.get_function(exprs[0])  # compiles the whole module now
                return mod

            try:
                entry = (build(True), True)
            except Exception:  # noqa: BLE001 - e.g. NVRTC cannot find cuda_fp16.h
                entry = (build(False), False)
            _modules[name] = entry
    return entry


def _kernel(module, expr):
    return _module(module)[0].get_function(expr)


def _ctype(dtype, module):
    name = np.dtype(dtype).name
    ct = _CTYPES.get(name)
    if ct is None:
        raise TypeError(f"GPU local kernels take float16, float32 or float64 arrays, got {name}")
    if ct == "__half" and not _module(module)[1]:
        raise TypeError("float16 GPU kernels are unavailable here (NVRTC could not compile "
                        "the __half instances)")
    return ct


def _launch(kern, n, args):
    if n <= 0:
        return
    blocks = min((n + _BLOCK - 1) // _BLOCK, _MAX_BLOCKS)
    kern((blocks,), (_BLOCK,), args)


def _i64(*vals):
    return tuple(np.int64(v) for v in vals)


# -- argument helpers --------------------------------------------------------------------------
def _triple(v, name, minimum=None):
    if isinstance(v, (int, np.integer)):
        t = (int(v),) * 3
    else:
        t = tuple(int(a) for a in v)
        if len(t) != 3:
            raise ValueError(f"{name} must be an int or 3 ints, got {v!r}")
    if minimum is not None and min(t) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {t}")
    return t


def _out_extents(spatial, kernel, stride, dilation, lo, hi):
    return tuple(max(0, (n + a + b - d * (k - 1) - 1) // s + 1)
                 for n, k, s, d, a, b in zip(spatial, kernel, stride, dilation, lo, hi))


def _as_5d(cp, a, what):
    if not isinstance(a, cp.ndarray):
        raise TypeError(f"{what} must be a cupy.ndarray, got {type(a).__name__}")
    if a.ndim != 5:
        raise ValueError(f"{what} must have layout (N, C, D, H, W), got shape {a.shape}")
    return cp.ascontiguousarray(a)


def _as_nc(cp, a, what):
    if not isinstance(a, cp.ndarray):
        raise TypeError(f"{what} must be a cupy.ndarray, got {type(a).__name__}")
    if a.ndim < 2:
        raise ValueError(f"{what} must have layout (N, C, ...), got shape {a.shape}")
    return cp.ascontiguousarray(a)


def _ncs(shape):
    return shape[0], shape[1], math.prod(shape[2:])


def _per_channel(cp, v, C, what):
    a = cp.ascontiguousarray(cp.asarray(v, dtype=cp.float64).reshape(-1))
    if a.size == 1 and C != 1:
        a = cp.repeat(a, C)
    if a.size != C:
        raise ValueError(f"{what} must have one value per channel ({C}), got {a.size}")
    return a


# ==============================================================================================
# Convolution
# ==============================================================================================
_state = threading.local()   # per thread: cuDNN handles, built plans, last backend


def _tls(name, factory):
    v = getattr(_state, name, None)
    if v is None:
        v = factory()
        setattr(_state, name, v)
    return v


_cudnn_ok = None


def cudnn_available() -> bool:
    """Whether NVIDIA's cuDNN frontend (``import cudnn``) and the cuDNN library load."""
    global _cudnn_ok
    if _cudnn_ok is None:
        try:
            import cudnn
            cudnn.backend_version()
            _cudnn_ok = True
        except Exception:  # noqa: BLE001 - ImportError, missing libcudnn, ...
            _cudnn_ok = False
    return _cudnn_ok


def _env_backend():
    v = os.environ.get("DISTTENSOR_CONV_BACKEND", "").strip().lower()
    if v in ("", "auto"):
        return None
    if v not in _CONV_BACKENDS:
        raise ValueError(f"DISTTENSOR_CONV_BACKEND must be 'cudnn', 'im2col' or 'auto', got {v!r}")
    return v


def conv_backend() -> str:
    """The convolution backend calls with ``backend=None`` use: ``'cudnn'`` when the cuDNN
    frontend is available and ``DISTTENSOR_CONV_BACKEND`` does not say ``im2col``, else
    ``'im2col'``.  (A configuration cuDNN has no engine for still runs on im2col.)"""
    env = _env_backend()
    if env == "im2col":
        return "im2col"
    return "cudnn" if cudnn_available() else "im2col"


def last_conv_backend():
    """The backend (``'cudnn'`` or ``'im2col'``) that ran this thread's latest convolution call,
    or ``None`` (no call yet, or the latest one had an empty output)."""
    return getattr(_state, "last_backend", None)


def _resolve_backend(backend):
    if backend is None:
        backend = _env_backend() or conv_backend()
    if backend not in _CONV_BACKENDS:
        raise ValueError(f"backend must be None, 'cudnn' or 'im2col', got {backend!r}")
    if backend == "cudnn" and not cudnn_available():
        raise RuntimeError("backend='cudnn' but the cuDNN frontend (import cudnn) is unavailable")
    return backend


def _conv_args(stride, dilation, pad_lo, pad_hi, groups):
    s = _triple(stride, "stride", 1)
    d = _triple(dilation, "dilation", 1)
    lo = _triple(pad_lo, "pad_lo")
    hi = _triple(pad_hi, "pad_hi")
    g = int(groups)
    if g < 1:
        raise ValueError(f"groups must be >= 1, got {groups}")
    return s, d, lo, hi, g


def _check_conv(x_dtype, w, Cin, Cout, groups):
    if np.dtype(x_dtype) != np.dtype(w.dtype):
        raise TypeError(f"conv operands must share a dtype, got {np.dtype(x_dtype)} and {w.dtype}")
    if np.dtype(x_dtype).name not in _CTYPES:
        raise TypeError(f"conv takes float16/32/64 arrays, got {np.dtype(x_dtype)}")
    if Cin % groups or Cout % groups:
        raise ValueError(f"groups={groups} must divide in ({Cin}) and out ({Cout}) channels")
    if w.shape[0] != Cout or w.shape[1] != Cin // groups:
        raise ValueError(f"weight shape {w.shape} does not match {Cin} in / {Cout} out channels "
                         f"with groups={groups} (expected ({Cout}, {Cin // groups}, kD, kH, kW))")


# -- cuDNN ---------------------------------------------------------------------------------------
class _CudnnPlan:
    """A built cuDNN graph, its three graph tensors (op order: fprop X, W, Y; dgrad DY, W, DX;
    wgrad X, DY, DW), the workspace size, and the explicit pad/crop of the image (``elo``,
    ``ehi`` per axis, zero when cuDNN takes ``pad_lo``/``pad_hi`` itself)."""

    __slots__ = ("graph", "tensors", "workspace", "elo", "ehi", "image_shape")

    def __init__(self, graph, tensors, workspace, elo, ehi, image_shape):
        self.graph, self.tensors, self.workspace = graph, tensors, workspace
        self.elo, self.ehi, self.image_shape = elo, ehi, image_shape

    @property
    def explicit(self):
        return any(self.elo) or any(self.ehi)


def _packed_strides(shape):
    st, acc = [], 1
    for n in reversed(shape):
        st.append(acc)
        acc *= max(int(n), 1)
    return st[::-1]


def _cudnn_handle(cudnn, cp):
    """This thread's cuDNN handle for CuPy's current device, bound to CuPy's current stream."""
    dev = cp.cuda.Device().id
    handles = _tls("cudnn_handles", dict)
    h = handles.get(dev)
    if h is None:
        with cp.cuda.Device(dev):
            h = cudnn.create_handle()
        handles[dev] = h
    cudnn.set_stream(handle=h, stream=cp.cuda.get_current_stream().ptr)
    return h


_MAX_CUDNN_PLANS = 8  # candidate engines per graph the micro-batch planner times


def _cudnn_build(cudnn, handle, op, image_shape, w_shape, out_shape, dtype, stride, dilation,
                 pre, post, all_plans=False):
    """Build a conv graph: with ``all_plans`` False the heuristics' choice, returning
    ``(graph, tensors, workspace)``; with ``all_plans`` True every plan that builds (up to
    ``_MAX_CUDNN_PLANS``), returning ``(graph, tensors, [(index, workspace), ...])``."""
    dt = cudnn.data_type
    io = {"float16": dt.HALF, "float32": dt.FLOAT, "float64": dt.DOUBLE}[np.dtype(dtype).name]
    comp = dt.DOUBLE if np.dtype(dtype) == np.float64 else dt.FLOAT
    g = cudnn.pygraph(io_data_type=io, intermediate_data_type=comp, compute_data_type=comp,
                      handle=handle)

    def tensor(name, shape):
        return g.tensor(name=name, dim=list(shape), stride=_packed_strides(shape), data_type=io)

    def output(t, shape):
        t.set_output(True).set_dim(list(shape)).set_stride(_packed_strides(shape))
        t.set_data_type(io)
        return t

    conv = dict(pre_padding=list(pre), post_padding=list(post), stride=list(stride),
                dilation=list(dilation), compute_data_type=comp)
    if op == "fprop":
        X, W = tensor("X", image_shape), tensor("W", w_shape)
        Y = output(g.conv_fprop(image=X, weight=W, name="fprop", **conv), out_shape)
        tensors = (X, W, Y)
    elif op == "dgrad":
        DY, W = tensor("DY", out_shape), tensor("W", w_shape)
        DX = output(g.conv_dgrad(loss=DY, filter=W, name="dgrad", **conv), image_shape)
        tensors = (DY, W, DX)
    else:
        X, DY = tensor("X", image_shape), tensor("DY", out_shape)
        DW = output(g.conv_wgrad(image=X, loss=DY, name="wgrad", **conv), w_shape)
        tensors = (X, DY, DW)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    if not all_plans:
        g.build_plans()
        return g, tensors, int(g.get_workspace_size())
    built = []  # (plan index, workspace) of each plan that builds, in heuristic order
    for i in range(min(int(g.get_execution_plan_count()), _MAX_CUDNN_PLANS)):
        try:
            g.build_plan_at_index(i)
            built.append((i, int(g.get_workspace_size_plan_at_index(i))))
        except Exception:  # noqa: BLE001 - that engine does not build here: not a candidate
            continue
    if not built:
        raise RuntimeError("no cuDNN execution plan builds for this graph")
    return g, tensors, built


def _cudnn_plan(op, x_shape, w_shape, out_shape, dtype, stride, dilation, lo, hi,
                all_plans=False):
    """The cached plan for this convolution, or ``None`` where cuDNN has no engine for it
    (``all_plans``: its ``workspace`` is the list ``[(plan index, workspace), ...]`` of every
    plan that builds, for the micro-batch planner).

    Tried in order: cuDNN's own pre/post padding (when both are >= 0); then symmetric padding
    ``max(0, min(lo, hi))`` with the rest applied explicitly to the image (zero-padded copy, or
    a crop where padding is negative), for engines that refuse asymmetric padding."""
    import cudnn
    cp = _cp()
    key = (op, cp.cuda.Device().id, tuple(x_shape), tuple(w_shape), tuple(out_shape),
           np.dtype(dtype).str, stride, dilation, lo, hi, bool(all_plans))
    plans = _tls("cudnn_plans", dict)
    if key in plans:
        return plans[key]
    handle = _cudnn_handle(cudnn, cp)
    attempts = []
    if min(lo + hi) >= 0:
        attempts.append((lo, hi))
    if lo != hi or min(lo + hi) < 0:
        p = tuple(max(0, min(a, b)) for a, b in zip(lo, hi))
        attempts.append((p, p))
    plan = None
    for pre, post in attempts:
        elo = tuple(a - p for a, p in zip(lo, pre))
        ehi = tuple(b - p for b, p in zip(hi, post))
        sp = tuple(n + a + b for n, a, b in zip(x_shape[2:], elo, ehi))
        if min(sp) <= 0:
            continue
        image_shape = tuple(x_shape[:2]) + sp
        try:
            g, tensors, ws = _cudnn_build(cudnn, handle, op, image_shape, w_shape, out_shape,
                                          dtype, stride, dilation, pre, post, all_plans)
        except Exception as err:  # noqa: BLE001 - no engine (or a frontend error): im2col
            _warn_cudnn_failure(cudnn, op, dtype, err)
            continue
        plan = _CudnnPlan(g, tensors, ws, elo, ehi, image_shape)
        break
    plans[key] = plan
    return plan


_warned: set = set()


def _warn_cudnn_failure(cudnn, op, dtype, err):
    """Warn once per (op, dtype, error type) when building a cuDNN graph fails for another
    reason than "no engine supports it" (which is expected for some configurations)."""
    if isinstance(err, getattr(cudnn, "cudnnGraphNotSupportedError", ())):
        return
    key = (op, np.dtype(dtype).name, type(err).__name__)
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"cuDNN frontend failed to build a conv {op} graph for {np.dtype(dtype)} "
                      f"({type(err).__name__}: {err}); using im2col for it", RuntimeWarning,
                      stacklevel=4)


def _cudnn_execute(plan, arrays, index=None):
    """Run ``plan`` (the heuristics' choice; or, for an ``all_plans`` plan, its plan
    ``index`` of the graph's candidate list) on ``arrays`` (op order)."""
    import cudnn
    cp = _cp()
    handle = _cudnn_handle(cudnn, cp)
    nbytes = plan.workspace if index is None else dict(plan.workspace)[index]
    # the workspace comes from CuPy's (stream-ordered) memory pool: effectively cached, and
    # never shared between streams
    ws = cp.empty(nbytes, dtype=cp.uint8) if nbytes > 0 else None
    pack = {t: a.data.ptr for t, a in zip(plan.tensors, arrays)}
    ptr = None if ws is None else ws.data.ptr
    if index is None:
        plan.graph.execute(pack, ptr, handle=handle)
    else:
        plan.graph.execute_plan_at_index(pack, ptr, index, handle=handle)


def _pad_crop_slices(spatial, elo, ehi):
    """(src, dst) slices copying an image of ``spatial`` into its pad/crop by ``elo``/``ehi``
    (padded index = index + elo), or None if nothing overlaps."""
    src, dst = [slice(None)] * 2, [slice(None)] * 2
    for n, a, b in zip(spatial, elo, ehi):
        m = n + a + b
        s0, s1 = max(0, -a), min(n, m - a)
        if s1 <= s0:
            return None
        src.append(slice(s0, s1))
        dst.append(slice(s0 + a, s1 + a))
    return tuple(src), tuple(dst)


def _pad_crop(cp, x, elo, ehi):
    sp = x.shape[2:]
    out = cp.zeros(x.shape[:2] + tuple(n + a + b for n, a, b in zip(sp, elo, ehi)), x.dtype)
    sl = _pad_crop_slices(sp, elo, ehi)
    if sl is not None:
        out[sl[1]] = x[sl[0]]
    return out


def _unpad_crop(cp, xp, elo, ehi, spatial):
    out = cp.zeros(xp.shape[:2] + tuple(spatial), xp.dtype)
    sl = _pad_crop_slices(spatial, elo, ehi)
    if sl is not None:
        out[sl[0]] = xp[sl[1]]
    return out


# -- im2col + cuBLAS -----------------------------------------------------------------------------
def _im2col_budget_elems(itemsize, budget_bytes=None):
    if budget_bytes is None:
        budget_bytes = float(os.environ.get("DISTTENSOR_IM2COL_WORKSPACE_MIB", "256")) * 2**20
    return max(1, int(budget_bytes) // itemsize)


def _chunks(N, oD, per_plane, itemsize, budget_bytes=None):
    """(n0, nb, od0, ndp) chunks: whole samples while one fits the column budget
    (``budget_bytes``, None: ``DISTTENSOR_IM2COL_WORKSPACE_MIB``), else one sample and as many
    output-depth planes as fit (at least one)."""
    budget = _im2col_budget_elems(itemsize, budget_bytes)
    per_sample = per_plane * oD
    if per_sample <= budget:
        nb = max(1, min(N, budget // max(per_sample, 1)))
        return [(n0, min(nb, N - n0), 0, oD) for n0 in range(0, N, nb)]
    ndp = max(1, budget // max(per_plane, 1))
    return [(n, 1, od0, min(ndp, oD - od0)) for n in range(N) for od0 in range(0, oD, ndp)]


def _im2col(cp, T, x_chunk, col, G, Cg, spatial, kernel, out_hw, od0, ndp, stride, dilation, lo,
            transposed):
    nb = x_chunk.shape[0]
    args = (x_chunk, col) + _i64(nb, G, Cg, *spatial, *kernel, *out_hw, od0, ndp,
                                 *stride, *dilation, *lo) + (np.int32(transposed),)
    _launch(_kernel("im2col", f"im2col3d<{T}>"), col.size, args)


def _im2col_forward(cp, x, w, y, stride, dilation, lo, G, budget_bytes=None):
    T = _ctype(x.dtype, "im2col")
    N, Cin = x.shape[:2]
    Cout, Cg = w.shape[:2]
    kernel = w.shape[2:]
    K = Cg * math.prod(kernel)
    oD, oH, oW = y.shape[2:]
    wg = w.reshape(G, Cout // G, K)
    yv = y.reshape(N, Cout, oD, oH * oW)
    for n0, nb, od0, ndp in _chunks(N, oD, Cin * math.prod(kernel) * oH * oW, x.itemsize,
                                    budget_bytes):
        col = cp.empty((nb, G, K, ndp * oH * oW), x.dtype)
        _im2col(cp, T, x[n0:n0 + nb], col, G, Cg, x.shape[2:], kernel, (oH, oW), od0, ndp,
                stride, dilation, lo, 0)
        out = cp.matmul(wg, col)  # (G, Coutg, K) @ (nb, G, K, Q) -> (nb, G, Coutg, Q)
        yv[n0:n0 + nb, :, od0:od0 + ndp, :] = out.reshape(nb, Cout, ndp, oH * oW)


def _im2col_backward_data(cp, dy, w, dx, stride, dilation, lo, G, budget_bytes=None):
    T = _ctype(dy.dtype, "im2col")
    N, Cin, D, H, W = dx.shape
    Cout, Cg = w.shape[:2]
    kernel = w.shape[2:]
    K = Cg * math.prod(kernel)
    oD, oH, oW = dy.shape[2:]
    wt = w.reshape(G, Cout // G, K).transpose(0, 2, 1)  # (G, K, Coutg)
    dyv = dy.reshape(N, Cout, oD, oH * oW)
    kern = _kernel("im2col", f"col2im3d<{T}>")
    for n0, nb, od0, ndp in _chunks(N, oD, Cin * math.prod(kernel) * oH * oW, dy.itemsize,
                                    budget_bytes):
        # input depth rows the planes [od0, od0 + ndp) reach
        id0 = max(0, od0 * stride[0] - lo[0])
        id1 = min(D, (od0 + ndp - 1) * stride[0] - lo[0] + dilation[0] * (kernel[0] - 1) + 1)
        if id1 <= id0:
            continue
        dyc = cp.ascontiguousarray(dyv[n0:n0 + nb, :, od0:od0 + ndp, :])
        dyc = dyc.reshape(nb, G, Cout // G, ndp * oH * oW)
        dcol = cp.ascontiguousarray(cp.matmul(wt, dyc))  # (nb, G, K, Q)
        args = (dcol, dx[n0:n0 + nb]) + _i64(nb, G, Cg, D, H, W, *kernel, oH, oW, od0, ndp,
                                               id0, id1 - id0, *stride, *dilation, *lo)
        _launch(kern, nb * Cin * (id1 - id0) * H * W, args)


def _im2col_backward_filter(cp, x, dy, dw_shape, stride, dilation, lo, G, budget_bytes=None):
    T = _ctype(x.dtype, "im2col")
    N, Cin = x.shape[:2]
    Cout, Cg = dw_shape[:2]
    kernel = dw_shape[2:]
    K = Cg * math.prod(kernel)
    oD, oH, oW = dy.shape[2:]
    acc = np.float64 if x.dtype == np.float64 else np.float32
    dw = cp.zeros((G, Cout // G, K), acc)
    dyv = dy.reshape(N, Cout, oD, oH * oW)
    for n0, nb, od0, ndp in _chunks(N, oD, Cin * math.prod(kernel) * oH * oW, x.itemsize,
                                    budget_bytes):
        Q = ndp * oH * oW
        colT = cp.empty((nb, G, Q, K), x.dtype)
        _im2col(cp, T, x[n0:n0 + nb], colT, G, Cg, x.shape[2:], kernel, (oH, oW), od0, ndp,
                stride, dilation, lo, 1)
        dyc = cp.ascontiguousarray(dyv[n0:n0 + nb, :, od0:od0 + ndp, :]).reshape(nb, G, Cout // G, Q)
        part = cp.matmul(dyc, colT)  # (nb, G, Coutg, Q) @ (nb, G, Q, K) -> (nb, G, Coutg, K)
        dw += part.sum(axis=0, dtype=acc)
    return dw.astype(x.dtype, copy=False).reshape(dw_shape)


def _done(backend):
    _state.last_backend = backend


# -- micro-batch planning (mu-cuDNN): the GPU algorithms -----------------------------------------
_PASS_OP = {"forward": "fprop", "backward_data": "dgrad", "backward_filter": "wgrad"}


def _pass_shapes(pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi):
    """``(image_shape, w_shape, out_shape)`` of a conv pass (the cuDNN op's operands)."""
    out = (int(x_shape[0]), int(w_shape[0])) + _out_extents(
        tuple(x_shape[2:]), tuple(w_shape[2:]), tuple(stride), tuple(dilation), tuple(pad_lo),
        tuple(pad_hi))
    return tuple(int(v) for v in x_shape), tuple(int(v) for v in w_shape), out


class _CudnnRank:
    """The cuDNN execution plan of heuristic rank ``rank`` (among those that build) of each
    micro-batch's graph, as a micro-batch planner algorithm (:mod:`.microbatch` protocol)."""

    def __init__(self, rank):
        self.rank = rank

    def _plan(self, pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi, dtype):
        """``(cuDNN plan with all candidates, (plan index, workspace))`` or ``(None, None)``."""
        img, ws, out = _pass_shapes(pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi)
        t = lambda v: tuple(int(a) for a in v)  # noqa: E731
        plan = _cudnn_plan(_PASS_OP[pass_], img, ws, out, dtype, t(stride), t(dilation),
                           t(pad_lo), t(pad_hi), all_plans=True)
        if plan is None or self.rank >= len(plan.workspace):
            return None, None
        return plan, plan.workspace[self.rank]

    def supports(self, pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi, groups, dtype):
        if not cudnn_available():
            return False
        return self._plan(pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi,
                          dtype)[0] is not None

    def workspace_bytes(self, pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi, groups,
                        dtype):
        plan, (_, nbytes) = self._plan(pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi,
                                       dtype)
        extra = 0
        if plan.explicit:  # the padded/cropped image copy (or its gradient, for dgrad)
            extra = math.prod(plan.image_shape) * np.dtype(dtype).itemsize
        return int(nbytes) + extra

    def estimate_seconds(self, problem):
        """Cost model (heuristic mode): the heuristics' order, a fixed cost per launch."""
        return problem.flops() / 2e13 * (1.0 + 0.25 * self.rank) + 2e-5

    def forward(self, x, w, stride, dilation, pad_lo, pad_hi, groups):
        cp = _cp()
        plan, (index, _) = self._plan("forward", x.shape, w.shape, stride, dilation, pad_lo,
                                      pad_hi, x.dtype)
        img = _pad_crop(cp, x, plan.elo, plan.ehi) if plan.explicit else x
        y = cp.empty(_pass_shapes("forward", x.shape, w.shape, stride, dilation, pad_lo,
                                  pad_hi)[2], x.dtype)
        _cudnn_execute(plan, (img, w, y), index)
        return y

    def backward_data(self, dy, w, in_spatial, stride, dilation, pad_lo, pad_hi, groups):
        cp = _cp()
        x_shape = (dy.shape[0], w.shape[1] * groups) + tuple(in_spatial)
        plan, (index, _) = self._plan("backward_data", x_shape, w.shape, stride, dilation,
                                      pad_lo, pad_hi, dy.dtype)
        dimg = cp.empty(plan.image_shape, dy.dtype)
        _cudnn_execute(plan, (dy, w, dimg), index)
        return _unpad_crop(cp, dimg, plan.elo, plan.ehi, in_spatial) if plan.explicit else dimg

    def backward_filter(self, x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups):
        cp = _cp()
        w_shape = (dy.shape[1], x.shape[1] // groups) + tuple(kernel)
        plan, (index, _) = self._plan("backward_filter", x.shape, w_shape, stride, dilation,
                                      pad_lo, pad_hi, x.dtype)
        img = _pad_crop(cp, x, plan.elo, plan.ehi) if plan.explicit else x
        dw = cp.empty(w_shape, x.dtype)
        _cudnn_execute(plan, (img, dy, dw), index)
        return dw


class _Im2colGpu:
    """im2col + cuBLAS with the column chunk bounded by ``budget_bytes``."""

    def __init__(self, budget_bytes):
        self.budget_bytes = int(budget_bytes)

    def supports(self, pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi, groups, dtype):
        return np.dtype(dtype).name in _CTYPES

    def workspace_bytes(self, pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi, groups,
                        dtype):
        """The largest chunk's column buffer plus its GEMM output (and, for the filter
        gradient, the per-sample partial products)."""
        item = np.dtype(dtype).itemsize
        _, _, out = _pass_shapes(pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi)
        N, Cin = int(x_shape[0]), int(x_shape[1])
        Cout, kk = int(w_shape[0]), math.prod(w_shape[2:])
        plane = out[3] * out[4]
        worst = 0
        for _, nb, _, ndp in _chunks(N, out[2], Cin * kk * plane, item, self.budget_bytes):
            col = nb * Cin * kk * ndp * plane
            res = nb * Cout * ndp * plane
            if pass_ == "backward_filter":
                res += nb * Cout * int(w_shape[1]) * kk
            worst = max(worst, col + res)
        return worst * item

    def estimate_seconds(self, problem):
        return 2.0 * problem.flops() / 2e13 + 1e-4

    def forward(self, x, w, stride, dilation, pad_lo, pad_hi, groups):
        cp = _cp()
        s, d, lo, hi, G = _conv_args(stride, dilation, pad_lo, pad_hi, groups)
        y = cp.empty(_pass_shapes("forward", x.shape, w.shape, s, d, lo, hi)[2], x.dtype)
        _im2col_forward(cp, x, w, y, s, d, lo, G, self.budget_bytes)
        return y

    def backward_data(self, dy, w, in_spatial, stride, dilation, pad_lo, pad_hi, groups):
        cp = _cp()
        s, d, lo, hi, G = _conv_args(stride, dilation, pad_lo, pad_hi, groups)
        dx = cp.zeros((dy.shape[0], w.shape[1] * G) + tuple(in_spatial), dy.dtype)
        _im2col_backward_data(cp, dy, w, dx, s, d, lo, G, self.budget_bytes)
        return dx

    def backward_filter(self, x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups):
        cp = _cp()
        s, d, lo, hi, G = _conv_args(stride, dilation, pad_lo, pad_hi, groups)
        dw_shape = (dy.shape[1], x.shape[1] // G) + tuple(kernel)
        return _im2col_backward_filter(cp, x, dy, dw_shape, s, d, lo, G, self.budget_bytes)


def conv_algorithms(limit_bytes: int) -> dict:
    """The GPU micro-batch planner's algorithms under a workspace limit: ``cudnn:<rank>`` for
    the heuristics' first ``_MAX_CUDNN_PLANS`` plans that build (when the frontend imports)
    and ``im2col`` with its column chunk bounded by the limit."""
    algos = {}
    if cudnn_available():
        algos.update({f"cudnn:{r}": _CudnnRank(r) for r in range(_MAX_CUDNN_PLANS)})
    algos["im2col"] = _Im2colGpu(limit_bytes)
    return algos


_fp: dict = {}


def _gpu_fingerprint():
    """The plan cache's device key: GPU name, compute capability, CUDA, CuPy and cuDNN
    versions."""
    cp = _cp()
    dev = cp.cuda.Device().id
    if dev not in _fp:
        props = cp.cuda.runtime.getDeviceProperties(dev)
        name = props.get("name", b"")
        info = dict(gpu=name.decode() if isinstance(name, bytes) else str(name),
                    cc=str(cp.cuda.Device(dev).compute_capability), cupy=cp.__version__,
                    cuda=int(cp.cuda.runtime.runtimeGetVersion()))
        if cudnn_available():
            import cudnn
            info.update(cudnn=int(cudnn.backend_version()),
                        cudnn_frontend=str(getattr(cudnn, "__version__", "")))
        from .conv_plan_cache import fingerprint
        _fp[dev] = fingerprint("gpu", info)
    return _fp[dev]


def _planned(backend) -> bool:
    """Whether this call goes through the micro-batch planner (module docstring)."""
    if backend is not None or _env_backend() is not None:
        return False
    from . import microbatch
    return microbatch.tune_mode() != "off"


def _run_planned(pass_, a, b, extra, s, d, lo, hi, G, x_shape, w_shape, dtype):
    """Plan (or look up) and run the micro-batches of one conv pass on CuPy arrays."""
    from . import microbatch
    cp = _cp()
    problem = microbatch.ConvProblem.make(pass_, x_shape, w_shape, s, d, lo, hi, G, dtype)
    limit = microbatch._limit_overrides.get(problem, microbatch.workspace_limit())
    algos = conv_algorithms(limit)
    geo = (s, d, lo, hi, G)
    take = microbatch.rotating_slices(a.shape[0])
    if pass_ == "forward":
        def runner(alg, n):
            return alg.forward(a[take(n)], b, *geo)
    elif pass_ == "backward_data":
        def runner(alg, n):
            return alg.backward_data(a[take(n)], b, extra, *geo)
    else:
        def runner(alg, n):
            sl = take(n)
            return alg.backward_filter(a[sl], b[sl], extra, *geo)
    plan = microbatch.get_plan(problem, algos, _gpu_fingerprint(), runner,
                               sync=cp.cuda.get_current_stream().synchronize, limit=limit)
    microbatch._state.plan = plan
    out = microbatch.run_plan(plan, algos, pass_, a, b, extra, geo, xp=cp)
    _done("cudnn" if plan.micro_batches[-1][0].startswith("cudnn") else "im2col")
    return out


# -- public conv functions ---------------------------------------------------------------------
def conv_forward(x, w, stride, dilation, pad_lo, pad_hi, groups, *, backend=None):
    """PyTorch-style cross-correlation: ``x`` (N, Cin, D, H, W), ``w`` (Cout, Cin//groups, kD,
    kH, kW), zero padding ``pad_lo``/``pad_hi`` (negative crops); output extent per axis
    ``(n + lo + hi - dilation*(k-1) - 1)//stride + 1``.  ``backend``: None (``conv_backend()``),
    ``'cudnn'`` or ``'im2col'``."""
    cp = _cp()
    s, d, lo, hi, G = _conv_args(stride, dilation, pad_lo, pad_hi, groups)
    x = _as_5d(cp, x, "x")
    w = _as_5d(cp, w, "w")
    N, Cin = x.shape[:2]
    Cout = w.shape[0]
    _check_conv(x.dtype, w, Cin, Cout, G)
    y_shape = (N, Cout) + _out_extents(x.shape[2:], w.shape[2:], s, d, lo, hi)
    if math.prod(y_shape) == 0 or x.size == 0 or w.size == 0:
        _done(None)
        return cp.zeros(y_shape, x.dtype)
    if _planned(backend):
        return _run_planned("forward", x, w, None, s, d, lo, hi, G, x.shape, w.shape, x.dtype)
    if _resolve_backend(backend) == "cudnn":
        plan = _cudnn_plan("fprop", x.shape, w.shape, y_shape, x.dtype, s, d, lo, hi)
        if plan is not None:
            img = _pad_crop(cp, x, plan.elo, plan.ehi) if plan.explicit else x
            y = cp.empty(y_shape, x.dtype)
            _cudnn_execute(plan, (img, w, y))
            _done("cudnn")
            return y
    y = cp.empty(y_shape, x.dtype)
    _im2col_forward(cp, x, w, y, s, d, lo, G)
    _done("im2col")
    return y


def conv_backward_data(dy, w, in_spatial, stride, dilation, pad_lo, pad_hi, groups, *,
                       backend=None):
    """Gradient of :func:`conv_forward` with respect to ``x``: ``dx`` (N, Cin, *in_spatial)."""
    cp = _cp()
    s, d, lo, hi, G = _conv_args(stride, dilation, pad_lo, pad_hi, groups)
    dy = _as_5d(cp, dy, "dy")
    w = _as_5d(cp, w, "w")
    in_spatial = tuple(int(n) for n in in_spatial)
    if len(in_spatial) != 3 or min(in_spatial) < 0:
        raise ValueError(f"in_spatial must be 3 extents >= 0, got {in_spatial}")
    N, Cout = dy.shape[:2]
    Cin = w.shape[1] * G
    _check_conv(dy.dtype, w, Cin, Cout, G)
    osp = _out_extents(in_spatial, w.shape[2:], s, d, lo, hi)
    if tuple(dy.shape[2:]) != osp:
        raise ValueError(f"dy spatial extents {dy.shape[2:]} != output extents {osp} of a "
                         f"convolution of {in_spatial}")
    dx_shape = (N, Cin) + in_spatial
    if math.prod(dx_shape) == 0 or dy.size == 0 or w.size == 0:
        _done(None)
        return cp.zeros(dx_shape, dy.dtype)
    if _planned(backend):
        return _run_planned("backward_data", dy, w, in_spatial, s, d, lo, hi, G, dx_shape,
                            w.shape, dy.dtype)
    if _resolve_backend(backend) == "cudnn":
        plan = _cudnn_plan("dgrad", dx_shape, w.shape, dy.shape, dy.dtype, s, d, lo, hi)
        if plan is not None:
            dimg = cp.empty(plan.image_shape, dy.dtype)
            _cudnn_execute(plan, (dy, w, dimg))
            _done("cudnn")
            return _unpad_crop(cp, dimg, plan.elo, plan.ehi, in_spatial) if plan.explicit else dimg
    dx = cp.zeros(dx_shape, dy.dtype)
    _im2col_backward_data(cp, dy, w, dx, s, d, lo, G)
    _done("im2col")
    return dx


def conv_backward_filter(x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups, *,
                         backend=None):
    """Gradient of :func:`conv_forward` with respect to ``w``: ``dw`` (Cout, Cin//groups,
    *kernel)."""
    cp = _cp()
    s, d, lo, hi, G = _conv_args(stride, dilation, pad_lo, pad_hi, groups)
    k = _triple(kernel, "kernel", 1)
    x = _as_5d(cp, x, "x")
    dy = _as_5d(cp, dy, "dy")
    N, Cin = x.shape[:2]
    Cout = dy.shape[1]
    if dy.shape[0] != N:
        raise ValueError(f"x and dy disagree on the batch size: {x.shape} vs {dy.shape}")
    if np.dtype(x.dtype) != np.dtype(dy.dtype):
        raise TypeError(f"x and dy must share a dtype, got {x.dtype} and {dy.dtype}")
    if Cin % G or Cout % G:
        raise ValueError(f"groups={G} must divide in ({Cin}) and out ({Cout}) channels")
    if np.dtype(x.dtype).name not in _CTYPES:
        raise TypeError(f"conv takes float16/32/64 arrays, got {x.dtype}")
    osp = _out_extents(x.shape[2:], k, s, d, lo, hi)
    if tuple(dy.shape[2:]) != osp:
        raise ValueError(f"dy spatial extents {dy.shape[2:]} != output extents {osp} of a "
                         f"convolution of {x.shape[2:]}")
    dw_shape = (Cout, Cin // G) + k
    if math.prod(dw_shape) == 0 or dy.size == 0 or x.size == 0:
        _done(None)
        return cp.zeros(dw_shape, x.dtype)
    if _planned(backend):
        return _run_planned("backward_filter", x, dy, k, s, d, lo, hi, G, x.shape, dw_shape,
                            x.dtype)
    if _resolve_backend(backend) == "cudnn":
        plan = _cudnn_plan("wgrad", x.shape, dw_shape, dy.shape, x.dtype, s, d, lo, hi)
        if plan is not None:
            img = _pad_crop(cp, x, plan.elo, plan.ehi) if plan.explicit else x
            dw = cp.empty(dw_shape, x.dtype)
            _cudnn_execute(plan, (img, dy, dw))
            _done("cudnn")
            return dw
    dw = _im2col_backward_filter(cp, x, dy, dw_shape, s, d, lo, G)
    _done("im2col")
    return dw


# ==============================================================================================
# Pooling
# ==============================================================================================
def _pool_args(mode, kernel, stride, pad_lo, pad_hi):
    if mode not in ("max", "avg"):
        raise ValueError(f"mode must be 'max' or 'avg', got {mode!r}")
    return (_triple(kernel, "kernel", 1), _triple(stride, "stride", 1),
            _triple(pad_lo, "pad_lo"), _triple(pad_hi, "pad_hi"))


def pool_forward(x, mode, kernel, stride, pad_lo, pad_hi, count_include_pad=True):
    """Max or average pooling of ``x`` (N, C, D, H, W) -> ``(y, argmax)``.

    max: padding acts as -inf; ``argmax`` (int32, y's shape) is the flat window position
    ``kd*kH*kW + kh*kW + kw`` of the first maximal element (NaN counts as maximal, the first NaN
    wins).  avg: divisor ``kD*kH*kW`` if ``count_include_pad`` else the number of non-padding
    cells of the window (0 of them gives 0); ``argmax`` is None."""
    cp = _cp()
    k, s, lo, hi = _pool_args(mode, kernel, stride, pad_lo, pad_hi)
    x = _as_5d(cp, x, "x")
    T = _ctype(x.dtype, "pool")
    N, C = x.shape[:2]
    osp = _out_extents(x.shape[2:], k, s, (1, 1, 1), lo, hi)
    y = cp.empty((N, C) + osp, x.dtype)
    dims = _i64(y.size, *x.shape[2:], *osp, *k, *s, *lo)
    if mode == "max":
        am = cp.empty(y.shape, cp.int32)
        _launch(_kernel("pool", f"max_pool3d_forward<{T}>"), y.size, (x, y, am) + dims)
        return y, am
    _launch(_kernel("pool", f"avg_pool3d_forward<{T}>"), y.size,
            (x, y) + dims + (np.int32(bool(count_include_pad)),))
    return y, None


def pool_backward(dy, argmax, mode, in_spatial, kernel, stride, pad_lo, pad_hi,
                  count_include_pad=True):
    """The adjoint of :func:`pool_forward`: ``dx`` (N, C, *in_spatial).  max: each ``dy`` goes
    to its argmax cell (dropped where that is padding); avg: ``dy/divisor`` to every
    non-padding cell of the window; overlapping windows add."""
    cp = _cp()
    k, s, lo, hi = _pool_args(mode, kernel, stride, pad_lo, pad_hi)
    dy = _as_5d(cp, dy, "dy")
    T = _ctype(dy.dtype, "pool")
    in_spatial = tuple(int(n) for n in in_spatial)
    if len(in_spatial) != 3 or min(in_spatial) < 0:
        raise ValueError(f"in_spatial must be 3 extents >= 0, got {in_spatial}")
    osp = _out_extents(in_spatial, k, s, (1, 1, 1), lo, hi)
    if tuple(dy.shape[2:]) != osp:
        raise ValueError(f"dy spatial extents {dy.shape[2:]} != pooling output extents {osp} "
                         f"of {in_spatial}")
    N, C = dy.shape[:2]
    dx = cp.empty((N, C) + in_spatial, dy.dtype)
    dims = _i64(dx.size, *in_spatial, *osp, *k, *s, *lo)
    if mode == "max":
        if argmax is None:
            raise ValueError("max pooling backward needs the argmax of the forward pass")
        argmax = cp.ascontiguousarray(cp.asarray(argmax, dtype=cp.int32))
        if argmax.shape != dy.shape:
            raise ValueError(f"argmax shape {argmax.shape} != dy shape {dy.shape}")
        _launch(_kernel("pool", f"max_pool3d_backward<{T}>"), dx.size, (dy, argmax, dx) + dims)
    else:
        _launch(_kernel("pool", f"avg_pool3d_backward<{T}>"), dx.size,
                (dy, dx) + dims + (np.int32(bool(count_include_pad)),))
    return dx


# ==============================================================================================
# Pointwise: per-channel sums, batch norm, activations, channel softmax (any ndim >= 2)
# ==============================================================================================
def _float_input(cp, x, what):
    x = _as_nc(cp, x, what)
    if np.dtype(x.dtype).name not in _CTYPES:
        raise TypeError(f"{what} must be float16/32/64, got {x.dtype}")
    return x


def _channel_reduce(cp, mode, a, b, mean, invstd):
    N, C, S = _ncs(a.shape)
    M = N * S
    s1 = cp.zeros(C, cp.float64)
    s2 = cp.zeros(C, cp.float64)
    if C == 0 or M == 0:
        return s1, s2
    T = _ctype(a.dtype, "pointwise")
    B = int(min(max(1, -(-M // (_BLOCK * 8))), 1024))  # depends on the shape only: deterministic
    p1 = cp.empty(C * B, cp.float64)
    p2 = cp.empty(C * B, cp.float64)
    kern = _kernel("pointwise", f"channel_partial<{T}, {mode}>")
    kern((B, min(C, 65535)), (_BLOCK,), (a, b, mean, invstd) + _i64(C, S, M) + (p1, p2))
    _launch(_kernel("pointwise", "channel_finalize"), C, (p1, p2) + _i64(C, B) + (s1, s2))
    return s1, s2


def channel_sums(x):
    """``(s, ss)``: float64 (C,) sums of ``x`` and ``x*x`` over every axis but 1."""
    cp = _cp()
    x = _as_nc(cp, x, "x")
    if np.dtype(x.dtype).name not in _CTYPES:
        x = x.astype(cp.float64)
    dummy = cp.zeros(1, cp.float64)
    return _channel_reduce(cp, 0, x, x, dummy, dummy)


def channel_sums_backward(dy, x, mean, invstd):
    """``(sum_dy, sum_dy_xhat)``: float64 (C,) sums of ``dy`` and ``dy*xhat`` over every axis but
    1, ``xhat = (x - mean[c]) * invstd[c]``."""
    cp = _cp()
    dy = _float_input(cp, dy, "dy")
    x = _float_input(cp, x, "x")
    if dy.shape != x.shape or dy.dtype != x.dtype:
        raise ValueError(f"dy and x must match: {dy.shape} {dy.dtype} vs {x.shape} {x.dtype}")
    C = x.shape[1]
    return _channel_reduce(cp, 1, dy, x, _per_channel(cp, mean, C, "mean"),
                           _per_channel(cp, invstd, C, "invstd"))


def bn_forward_apply(x, scale, shift):
    """``y = x*scale[c] + shift[c]`` (x's dtype)."""
    cp = _cp()
    x = _float_input(cp, x, "x")
    N, C, S = _ncs(x.shape)
    y = cp.empty_like(x)
    T = _ctype(x.dtype, "pointwise")
    _launch(_kernel("pointwise", f"bn_forward_apply<{T}>"), x.size,
            (x, y, _per_channel(cp, scale, C, "scale"), _per_channel(cp, shift, C, "shift"))
            + _i64(C, S, x.size))
    return y


def bn_backward_apply(dy, x, mean, invstd, gamma, mean_dy, mean_dy_xhat):
    """``dx = gamma[c]*invstd[c]*(dy - mean_dy[c] - xhat*mean_dy_xhat[c])``,
    ``xhat = (x - mean[c])*invstd[c]`` (x's dtype)."""
    cp = _cp()
    dy = _float_input(cp, dy, "dy")
    x = _float_input(cp, x, "x")
    if dy.shape != x.shape or dy.dtype != x.dtype:
        raise ValueError(f"dy and x must match: {dy.shape} {dy.dtype} vs {x.shape} {x.dtype}")
    N, C, S = _ncs(x.shape)
    dx = cp.empty_like(x)
    T = _ctype(x.dtype, "pointwise")
    params = tuple(_per_channel(cp, v, C, n) for v, n in (
        (mean, "mean"), (invstd, "invstd"), (gamma, "gamma"), (mean_dy, "mean_dy"),
        (mean_dy_xhat, "mean_dy_xhat")))
    _launch(_kernel("pointwise", f"bn_backward_apply<{T}>"), x.size,
            (dy, x, dx) + params + _i64(C, S, x.size))
    return dx


# name -> (code in pointwise.cu, default alpha, backward reads x, backward reads y)
_ACTIVATIONS = {
    "relu": (0, 0.0, True, False),
    "leaky_relu": (1, 0.01, True, False),
    "elu": (2, 1.0, True, True),
    "sigmoid": (3, 0.0, False, True),
    "tanh": (4, 0.0, False, True),
}


def _activation(name):
    try:
        return _ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; known: {sorted(_ACTIVATIONS)}") from None


def activation_forward(name, x, alpha=None):
    """relu, leaky_relu (alpha 0.01), elu (alpha 1.0), sigmoid, tanh; x's dtype."""
    cp = _cp()
    code, default, _, _ = _activation(name)
    if not isinstance(x, cp.ndarray):
        raise TypeError(f"x must be a cupy.ndarray, got {type(x).__name__}")
    x = cp.ascontiguousarray(x)
    T = _ctype(x.dtype, "pointwise")
    y = cp.empty_like(x)
    a = default if alpha is None else float(alpha)
    _launch(_kernel("pointwise", f"activation_forward<{T}>"), x.size,
            (x, y, np.int64(x.size), np.int32(code), np.float64(a)))
    return y


def activation_backward(name, dy, x, y, alpha=None):
    """PyTorch gradient conventions: relu ``dy*(x > 0)``; leaky_relu ``dy`` if x > 0 else
    ``alpha*dy``; elu ``dy`` if x > 0 else ``dy*(y + alpha)``; sigmoid ``dy*y*(1-y)``; tanh
    ``dy*(1-y^2)``.  ``y`` may be None (recomputed from ``x``) and ``x`` may be None for sigmoid
    and tanh."""
    cp = _cp()
    code, default, needs_x, needs_y = _activation(name)
    dy = cp.ascontiguousarray(dy)
    if needs_x:
        if x is None:
            raise ValueError(f"{name} backward needs x")
        x = cp.ascontiguousarray(x)
    if needs_y and y is None:
        if x is None:
            raise ValueError(f"{name} backward needs y (or x to recompute it)")
        y = activation_forward(name, x, alpha)
    if y is not None:
        y = cp.ascontiguousarray(y)
    for a, n in ((x, "x"), (y, "y")):
        if a is not None and (a.shape != dy.shape or a.dtype != dy.dtype):
            raise ValueError(f"{n} must match dy: {a.shape} {a.dtype} vs {dy.shape} {dy.dtype}")
    T = _ctype(dy.dtype, "pointwise")
    dx = cp.empty_like(dy)
    a = default if alpha is None else float(alpha)
    _launch(_kernel("pointwise", f"activation_backward<{T}>"), dy.size,
            (dy, x if x is not None else dy, y if y is not None else dy, dx,
             np.int64(dy.size), np.int32(code), np.float64(a)))
    return dx


def _softmax(x, log):
    cp = _cp()
    x = _float_input(cp, x, "x")
    N, C, S = _ncs(x.shape)
    y = cp.empty_like(x)
    if C == 0:
        return y
    T = _ctype(x.dtype, "pointwise")
    _launch(_kernel("pointwise", f"softmax_channels<{T}>"), N * S,
            (x, y) + _i64(C, S, N * S) + (np.int32(log),))
    return y


def softmax_channels(x):
    """Softmax over axis 1."""
    return _softmax(x, 0)


def log_softmax_channels(x):
    """Log-softmax over axis 1."""
    return _softmax(x, 1)


def softmax_channels_backward(dy, y):
    """``dx = y*(dy - sum_c dy*y)`` (the adjoint of :func:`softmax_channels` at output ``y``)."""
    cp = _cp()
    dy = _float_input(cp, dy, "dy")
    y = _float_input(cp, y, "y")
    if dy.shape != y.shape or dy.dtype != y.dtype:
        raise ValueError(f"dy and y must match: {dy.shape} {dy.dtype} vs {y.shape} {y.dtype}")
    N, C, S = _ncs(y.shape)
    dx = cp.empty_like(y)
    if C == 0:
        return dx
    T = _ctype(y.dtype, "pointwise")
    _launch(_kernel("pointwise", f"softmax_channels_backward<{T}>"), N * S,
            (dy, y, dx) + _i64(C, S, N * S))
    return dx
