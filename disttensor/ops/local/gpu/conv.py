"""GPU convolution entry points (``conv_forward``, ``conv_backward_data``,
``conv_backward_filter``) on CuPy arrays: the contracts of :mod:`..cpu.conv_im2col`, per rank,
no MPI.

Backend choice per call:

* ``backend='cudnn'`` or ``'im2col'`` (or ``DISTTENSOR_CONV_BACKEND``): that backend
  (:mod:`.cudnn_conv`, :mod:`.im2col_conv`); a configuration cuDNN has no engine for still runs
  on im2col.
* ``backend=None`` and no ``DISTTENSOR_CONV_BACKEND``: the micro-batch planner of
  :mod:`..microbatch` (unless ``DISTTENSOR_CONV_TUNE=off``, then :func:`conv_backend`).  The
  candidates are every cuDNN execution plan the heuristics list (``cudnn:<rank>``, each with
  its own workspace) and im2col with its column buffer bounded by the limit, per micro-batch
  size; the mini-batch is divided so that each part's workspace stays under
  ``DISTTENSOR_CONV_WORKSPACE_MB``.

:func:`last_conv_backend` says which backend ran this thread's latest call.
"""
from __future__ import annotations

import math
import os
import threading

import numpy as np

from .cudnn_conv import (MAX_CUDNN_PLANS, CudnnRank, cudnn_available, cudnn_plan, run_dgrad,
                         run_fprop, run_wgrad)
from .im2col_conv import (Im2colGpu, im2col_backward_data, im2col_backward_filter,
                          im2col_forward)
from .operands import as_5d, conv_args, in_extents, out_extents, triple
from .rawmodules import CTYPES, cupy

_CONV_BACKENDS = ("cudnn", "im2col")
_state = threading.local()   # per thread: the backend of the latest call


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


def _done(backend):
    _state.last_backend = backend


def _resolve_backend(backend):
    if backend is None:
        backend = _env_backend() or conv_backend()
    if backend not in _CONV_BACKENDS:
        raise ValueError(f"backend must be None, 'cudnn' or 'im2col', got {backend!r}")
    if backend == "cudnn" and not cudnn_available():
        raise RuntimeError("backend='cudnn' but the cuDNN frontend (import cudnn) is unavailable")
    return backend


def _check_conv(x_dtype, w, Cin, Cout, groups):
    if np.dtype(x_dtype) != np.dtype(w.dtype):
        raise TypeError(f"conv operands must share a dtype, got {np.dtype(x_dtype)} and {w.dtype}")
    if np.dtype(x_dtype).name not in CTYPES:
        raise TypeError(f"conv takes float16/32/64 arrays, got {np.dtype(x_dtype)}")
    if Cin % groups or Cout % groups:
        raise ValueError(f"groups={groups} must divide in ({Cin}) and out ({Cout}) channels")
    if w.shape[0] != Cout or w.shape[1] != Cin // groups:
        raise ValueError(f"weight shape {w.shape} does not match {Cin} in / {Cout} out channels "
                         f"with groups={groups} (expected ({Cout}, {Cin // groups}, kD, kH, kW))")


# -- micro-batch planning (mu-cuDNN): the GPU algorithms -----------------------------------------
def conv_algorithms(limit_bytes: int) -> dict:
    """The GPU micro-batch planner's algorithms under a workspace limit: ``cudnn:<rank>`` for
    the heuristics' first ``MAX_CUDNN_PLANS`` plans that build (when the frontend imports)
    and ``im2col`` with its column chunk bounded by the limit."""
    algos = {}
    if cudnn_available():
        algos.update({f"cudnn:{r}": CudnnRank(r) for r in range(MAX_CUDNN_PLANS)})
    algos["im2col"] = Im2colGpu(limit_bytes)
    return algos


_fp: dict = {}


def _gpu_fingerprint():
    """The plan cache's device key: GPU name, compute capability, CUDA, CuPy and cuDNN
    versions."""
    cp = cupy()
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
        from ..microbatch.plan_cache import fingerprint
        _fp[dev] = fingerprint("gpu", info)
    return _fp[dev]


def _planned(backend) -> bool:
    """Whether this call goes through the micro-batch planner (module docstring)."""
    if backend is not None or _env_backend() is not None:
        return False
    from .. import microbatch
    return microbatch.tune_mode() != "off"


def _run_planned(pass_, a, b, extra, s, d, lo, hi, G, x_shape, w_shape, dtype):
    """Plan (or look up) and run the micro-batches of one conv pass on CuPy arrays."""
    from .. import microbatch
    cp = cupy()
    problem = microbatch.ConvProblem.make(pass_, x_shape, w_shape, s, d, lo, hi, G, dtype)
    limit = microbatch.limit_for(problem)
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
    microbatch.set_last_plan(plan)
    out = microbatch.run_plan(plan, algos, pass_, a, b, extra, geo, xp=cp)
    _done("cudnn" if plan.micro_batches[-1][0].startswith("cudnn") else "im2col")
    return out


# -- the entry points ------------------------------------------------------------------------
def conv_forward(x, w, stride, dilation, pad_lo, pad_hi, groups, *, backend=None):
    """PyTorch-style cross-correlation: ``x`` (N, Cin, D, H, W), ``w`` (Cout, Cin//groups, kD,
    kH, kW), zero padding ``pad_lo``/``pad_hi`` (negative crops); output extent per axis
    ``(n + lo + hi - dilation*(k-1) - 1)//stride + 1``.  ``backend``: None (``conv_backend()``),
    ``'cudnn'`` or ``'im2col'``."""
    cp = cupy()
    s, d, lo, hi, G = conv_args(stride, dilation, pad_lo, pad_hi, groups)
    x = as_5d(cp, x, "x")
    w = as_5d(cp, w, "w")
    N, Cin = x.shape[:2]
    Cout = w.shape[0]
    _check_conv(x.dtype, w, Cin, Cout, G)
    y_shape = (N, Cout) + out_extents(x.shape[2:], w.shape[2:], s, d, lo, hi)
    if math.prod(y_shape) == 0 or x.size == 0 or w.size == 0:
        _done(None)
        return cp.zeros(y_shape, x.dtype)
    if _planned(backend):
        return _run_planned("forward", x, w, None, s, d, lo, hi, G, x.shape, w.shape, x.dtype)
    if _resolve_backend(backend) == "cudnn":
        plan = cudnn_plan("fprop", x.shape, w.shape, y_shape, x.dtype, s, d, lo, hi)
        if plan is not None:
            y = run_fprop(plan, x, w, y_shape)
            _done("cudnn")
            return y
    y = im2col_forward(cp, x, w, y_shape, s, d, lo, G)
    _done("im2col")
    return y


def conv_backward_data(dy, w, in_spatial, stride, dilation, pad_lo, pad_hi, groups, *,
                       backend=None):
    """Gradient of :func:`conv_forward` with respect to ``x``: ``dx`` (N, Cin, *in_spatial)."""
    cp = cupy()
    s, d, lo, hi, G = conv_args(stride, dilation, pad_lo, pad_hi, groups)
    dy = as_5d(cp, dy, "dy")
    w = as_5d(cp, w, "w")
    in_spatial = in_extents(in_spatial)
    N, Cout = dy.shape[:2]
    Cin = w.shape[1] * G
    _check_conv(dy.dtype, w, Cin, Cout, G)
    osp = out_extents(in_spatial, w.shape[2:], s, d, lo, hi)
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
        plan = cudnn_plan("dgrad", dx_shape, w.shape, dy.shape, dy.dtype, s, d, lo, hi)
        if plan is not None:
            dx = run_dgrad(plan, dy, w, in_spatial)
            _done("cudnn")
            return dx
    dx = im2col_backward_data(cp, dy, w, dx_shape, s, d, lo, G)
    _done("im2col")
    return dx


def conv_backward_filter(x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups, *,
                         backend=None):
    """Gradient of :func:`conv_forward` with respect to ``w``: ``dw`` (Cout, Cin//groups,
    *kernel)."""
    cp = cupy()
    s, d, lo, hi, G = conv_args(stride, dilation, pad_lo, pad_hi, groups)
    k = triple(kernel, "kernel", 1)
    x = as_5d(cp, x, "x")
    dy = as_5d(cp, dy, "dy")
    N, Cin = x.shape[:2]
    Cout = dy.shape[1]
    if dy.shape[0] != N:
        raise ValueError(f"x and dy disagree on the batch size: {x.shape} vs {dy.shape}")
    if np.dtype(x.dtype) != np.dtype(dy.dtype):
        raise TypeError(f"x and dy must share a dtype, got {x.dtype} and {dy.dtype}")
    if Cin % G or Cout % G:
        raise ValueError(f"groups={G} must divide in ({Cin}) and out ({Cout}) channels")
    if np.dtype(x.dtype).name not in CTYPES:
        raise TypeError(f"conv takes float16/32/64 arrays, got {x.dtype}")
    osp = out_extents(x.shape[2:], k, s, d, lo, hi)
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
        plan = cudnn_plan("wgrad", x.shape, dw_shape, dy.shape, x.dtype, s, d, lo, hi)
        if plan is not None:
            dw = run_wgrad(plan, x, dy, dw_shape)
            _done("cudnn")
            return dw
    dw = im2col_backward_filter(cp, x, dy, dw_shape, s, d, lo, G)
    _done("im2col")
    return dw
