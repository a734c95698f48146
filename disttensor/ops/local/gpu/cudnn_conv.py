"""cuDNN convolution through NVIDIA's cuDNN frontend (``import cudnn``, package
``nvidia-cudnn-frontend`` 1.28) on CuPy arrays: graphs, execution plans and their workspace.

* :func:`cudnn_plan` builds (once per thread, device, shapes, dtype and geometry) the graph of
  one conv pass (``fprop``, ``dgrad``, ``wgrad``) and its plan(s), or returns ``None`` where
  cuDNN has no engine (the caller falls back to im2col).  Asymmetric or negative padding that
  no engine takes is applied to an explicitly padded/cropped copy of the image.
* :func:`run_fprop`, :func:`run_dgrad`, :func:`run_wgrad` execute a plan (the heuristics'
  choice, or one candidate ``index``) with a workspace from CuPy's memory pool.
* :class:`CudnnRank` is the plan of one heuristic rank as a micro-batch planner algorithm.

Operands are already checked (``(N, C, D, H, W)`` C-contiguous, one float dtype); handles and
plans are per thread (cuDNN forbids sharing a handle across threads); per rank, no MPI.  The
frontend is imported lazily: this module imports without it (and without CuPy).

APIs this module relies on (looked up, not guessed):

* cuDNN frontend 1.28 Python API (NVIDIA/cudnn-frontend: ``python/cudnn/__init__.py`` of
  version 1.28.0, ``docs/operations/Convolutions.md``,
  ``test/python/conv/graph/test_conv_fuzzer.py``,
  ``test/python/core/graph/test_set_stream_cache.py``,
  ``test/python/core/graph/test_variant_pack_normalization.py``):

  - ``cudnn.create_handle()`` returns a ``cudnn.Handle`` object (1.28 changed it from a bare
    int), bound to the current CUDA device; cuDNN forbids sharing a handle across threads;
  - ``cudnn.set_stream(handle=h, stream=<cudaStream_t as int>)`` (cached on the Handle);
  - ``cudnn.pygraph(io_data_type=, intermediate_data_type=, compute_data_type=, handle=)``;
  - ``graph.tensor(name=, dim=, stride=, data_type=)`` with
    ``cudnn.data_type.{HALF,FLOAT,DOUBLE}``;
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
  - ``graph.execute({graph_tensor: buffer, ...}, workspace_buffer_or_None, handle=h)``: the
    buffers are CuPy arrays, read through DLPack (``__dlpack__``), so torch is never imported.
    A bare device pointer (an int) is accepted too, but the frontend then knows no extent:
    1.28's ``pygraph._normalize`` describes an int workspace as 0 bytes to the engines that
    carve it (``_pybind_module.read_buffer_extent`` returns None for it), so we never pass
    one;
  - every candidate plan (mu-cuDNN's algorithms): ``get_execution_plan_count()``,
    ``build_plan_at_index(index)`` (raises where that engine cannot be built),
    ``get_workspace_size_plan_at_index(index)`` and
    ``execute_plan_at_index(variant_pack, workspace, index, handle=h)`` (cudnn-frontend
    ``python/pygraph/pygraph.cpp`` and ``python/cudnn/_pygraph.py``).
"""
from __future__ import annotations

import math
import threading

import numpy as np

from ....core.warn import warn
from .operands import pass_shapes
from .rawmodules import cupy

_state = threading.local()   # per thread: cuDNN handles and built plans


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


MAX_CUDNN_PLANS = 8  # candidate engines per graph the micro-batch planner times


def _cudnn_build(cudnn, handle, op, image_shape, w_shape, out_shape, dtype, stride, dilation,
                 pre, post, all_plans=False):
    """Build a conv graph: with ``all_plans`` False the heuristics' choice, returning
    ``(graph, tensors, workspace)``; with ``all_plans`` True every plan that builds (up to
    ``MAX_CUDNN_PLANS``), returning ``(graph, tensors, [(index, workspace), ...])``."""
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
    for i in range(min(int(g.get_execution_plan_count()), MAX_CUDNN_PLANS)):
        try:
            g.build_plan_at_index(i)
            built.append((i, int(g.get_workspace_size_plan_at_index(i))))
        except Exception:  # noqa: BLE001 - that engine does not build here: not a candidate
            continue
    if not built:
        raise RuntimeError("no cuDNN execution plan builds for this graph")
    return g, tensors, built


def cudnn_plan(op, x_shape, w_shape, out_shape, dtype, stride, dilation, lo, hi,
                all_plans=False):
    """The cached plan for this convolution, or ``None`` where cuDNN has no engine for it
    (``all_plans``: its ``workspace`` is the list ``[(plan index, workspace), ...]`` of every
    plan that builds, for the micro-batch planner).

    Tried in order: cuDNN's own pre/post padding (when both are >= 0); then symmetric padding
    ``max(0, min(lo, hi))`` with the rest applied explicitly to the image (zero-padded copy, or
    a crop where padding is negative), for engines that refuse asymmetric padding."""
    import cudnn
    cp = cupy()
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
        warn(f"cuDNN frontend failed to build a conv {op} graph for {np.dtype(dtype)} "
             f"({type(err).__name__}: {err}); using im2col for it", RuntimeWarning,
             rank_local=True)


def _cudnn_execute(plan, arrays, index=None):
    """Run ``plan`` (the heuristics' choice; or, for an ``all_plans`` plan, its plan
    ``index`` of the graph's candidate list) on ``arrays`` (op order)."""
    import cudnn
    cp = cupy()
    handle = _cudnn_handle(cudnn, cp)
    nbytes = plan.workspace if index is None else dict(plan.workspace)[index]
    # the workspace comes from CuPy's (stream-ordered) memory pool: effectively cached, and
    # never shared between streams.  The arrays themselves go to the frontend, not their
    # pointers: it reads each buffer's extent through DLPack, and a bare address is a buffer of
    # unknown (zero) size to the engines that bounds-check their workspace carves.
    ws = cp.empty(nbytes, dtype=cp.uint8) if nbytes > 0 else None
    pack = dict(zip(plan.tensors, arrays))
    if index is None:
        plan.graph.execute(pack, ws, handle=handle)
    else:
        plan.graph.execute_plan_at_index(pack, ws, index, handle=handle)


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


def run_fprop(plan, x, w, y_shape, index=None):
    """``y`` of shape ``y_shape``: the ``fprop`` ``plan`` run on ``x`` (padded/cropped first
    where the plan says so) and ``w``."""
    cp = cupy()
    img = _pad_crop(cp, x, plan.elo, plan.ehi) if plan.explicit else x
    y = cp.empty(y_shape, x.dtype)
    _cudnn_execute(plan, (img, w, y), index)
    return y


def run_dgrad(plan, dy, w, in_spatial, index=None):
    """``dx`` of spatial extents ``in_spatial``: the ``dgrad`` ``plan`` run on ``dy`` and
    ``w`` (the image gradient un-padded/cropped where the plan says so)."""
    cp = cupy()
    dimg = cp.empty(plan.image_shape, dy.dtype)
    _cudnn_execute(plan, (dy, w, dimg), index)
    return _unpad_crop(cp, dimg, plan.elo, plan.ehi, in_spatial) if plan.explicit else dimg


def run_wgrad(plan, x, dy, dw_shape, index=None):
    """``dw`` of shape ``dw_shape``: the ``wgrad`` ``plan`` run on ``x`` (padded/cropped first
    where the plan says so) and ``dy``."""
    cp = cupy()
    img = _pad_crop(cp, x, plan.elo, plan.ehi) if plan.explicit else x
    dw = cp.empty(dw_shape, x.dtype)
    _cudnn_execute(plan, (img, dy, dw), index)
    return dw


# -- micro-batch planning (mu-cuDNN): one heuristic rank as an algorithm -----------------------
_PASS_OP = {"forward": "fprop", "backward_data": "dgrad", "backward_filter": "wgrad"}


class CudnnRank:
    """The cuDNN execution plan of heuristic rank ``rank`` (among those that build) of each
    micro-batch's graph, as a micro-batch planner algorithm (:mod:`..microbatch` protocol)."""

    def __init__(self, rank):
        self.rank = rank

    def _plan(self, pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi, dtype):
        """``(cuDNN plan with all candidates, (plan index, workspace))`` or ``(None, None)``."""
        img, ws, out = pass_shapes(pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi)
        t = lambda v: tuple(int(a) for a in v)  # noqa: E731
        plan = cudnn_plan(_PASS_OP[pass_], img, ws, out, dtype, t(stride), t(dilation),
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
        plan, (index, _) = self._plan("forward", x.shape, w.shape, stride, dilation, pad_lo,
                                      pad_hi, x.dtype)
        y_shape = pass_shapes("forward", x.shape, w.shape, stride, dilation, pad_lo, pad_hi)[2]
        return run_fprop(plan, x, w, y_shape, index)

    def backward_data(self, dy, w, in_spatial, stride, dilation, pad_lo, pad_hi, groups):
        x_shape = (dy.shape[0], w.shape[1] * groups) + tuple(in_spatial)
        plan, (index, _) = self._plan("backward_data", x_shape, w.shape, stride, dilation,
                                      pad_lo, pad_hi, dy.dtype)
        return run_dgrad(plan, dy, w, in_spatial, index)

    def backward_filter(self, x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups):
        w_shape = (dy.shape[1], x.shape[1] // groups) + tuple(kernel)
        plan, (index, _) = self._plan("backward_filter", x.shape, w_shape, stride, dilation,
                                      pad_lo, pad_hi, x.dtype)
        return run_wgrad(plan, x, dy, w_shape, index)
