"""Measuring a training step: :func:`profile_memory` (per layer saved / input / output bytes,
forward and backward time, and the host<->device bandwidth: the planner's
:class:`~.planner.MemoryProfile`), :func:`measure_step_memory` (the peak a step really
allocates) and :func:`measure_bandwidth`.

:func:`profile_memory` is collective over the input's grid (or ``comm``) and takes the
maximum of every figure over the ranks, so every rank plans alike; the other two are local.
"""
from __future__ import annotations

import gc
import math
import time
import tracemalloc

import numpy as np

from ...autograd.saved import array_bytes, record_nodes, saved_arrays
from ...autograd.tensor import Node, Tensor, as_tensor
from ...core.array import DistArray
from ...core.comm import allreduce
from ..module import Module, sequential_layers
from .planner import ASSUMED_BANDWIDTH, LayerProfile, MemoryProfile
from .recompute import _buffer_slots, _restore, _snapshot

__all__ = ["profile_memory", "measure_step_memory", "measure_bandwidth"]


def _value_bytes(v) -> int:
    v = v.data if isinstance(v, Tensor) else v
    if isinstance(v, DistArray):
        return array_bytes([v.buffer])
    if hasattr(v, "nbytes"):
        return int(v.nbytes)
    return 0


def _is_cuda(v) -> bool:
    v = v.data if isinstance(v, Tensor) else v
    return getattr(v, "device", "cpu") == "cuda"


def _sync(cuda: bool) -> None:
    if cuda:
        import cupy
        cupy.cuda.get_current_stream().synchronize()


def measure_step_memory(fn, device: str = "cpu") -> int:
    """Peak bytes allocated while ``fn()`` runs, above what was allocated before it.

    ``device='cpu'``: traced by :mod:`tracemalloc` (NumPy reports its array buffers to it;
    Python objects count too); ``'cuda'``: the CuPy default memory pool's used bytes, sampled
    at every allocation.  Local (each rank measures its own process)."""
    if device == "cuda":
        import cupy
        pool = cupy.get_default_memory_pool()
        cupy.cuda.Device().synchronize()
        base = pool.used_bytes()
        peak = [base]

        def malloc(size):
            mem = pool.malloc(size)
            peak[0] = max(peak[0], pool.used_bytes())
            return mem
        cupy.cuda.set_allocator(malloc)
        try:
            fn()
            cupy.cuda.Device().synchronize()
        finally:
            cupy.cuda.set_allocator(pool.malloc)
        return int(peak[0] - base)
    gc.collect()
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        if started:
            tracemalloc.stop()
    return int(peak - base)


def measure_bandwidth(nbytes: int = 64 << 20, repeat: int = 3) -> float:
    """Host<->device copy bandwidth in bytes/s (pinned host memory, the slower of the two
    directions, best of ``repeat``).  Needs CuPy and a GPU.  Local."""
    import cupy
    import cupyx
    n = max(1, nbytes // 4)
    dev = cupy.empty(n, dtype=np.float32)
    host = cupyx.empty_pinned(n, dtype=np.float32)
    host[...] = 1
    s = cupy.cuda.Stream(non_blocking=True)
    best = [math.inf, math.inf]
    for _ in range(repeat):
        s.synchronize()
        t0 = time.perf_counter()
        dev.set(host, stream=s)
        s.synchronize()
        t1 = time.perf_counter()
        dev.get(stream=s, out=host)
        s.synchronize()
        t2 = time.perf_counter()
        best = [min(best[0], t1 - t0), min(best[1], t2 - t1)]
    return float(n * 4 / max(best))


def _layer_list(layers) -> list:
    if isinstance(layers, Module):
        return sequential_layers(layers)
    return list(layers)


def _exclude_ids(layers) -> set:
    """Ids of parameter and buffer arrays (they live anyway: never counted or moved)."""
    out = set()
    for layer in layers:
        for p in layer.parameters():
            out.add(id(p.data))
        for b in layer.buffers():
            out.add(id(b))
    return out


def _timed(node: Node, acc: list, i: int, cuda: bool) -> None:
    inner = node.backward
    if inner is None:
        return

    def backward(g):
        _sync(cuda)
        t0 = time.perf_counter()
        out = inner(g)
        _sync(cuda)
        acc[i] += time.perf_counter() - t0
        return out
    node.backward = backward


def _profile_step(layers, xt, y, loss_fn, exclude, cuda):
    """One step, timed and measured per layer: ``(saved, in, out, fwd, bwd)`` lists."""
    n = len(layers)
    fwd, bwd = [0.0] * n, [0.0] * n
    in_b, out_b, groups = [], [], []
    h = xt
    for i, layer in enumerate(layers):
        in_b.append(_value_bytes(h))
        _sync(cuda)
        t0 = time.perf_counter()
        with record_nodes() as nodes:
            h = layer(h)
        _sync(cuda)
        fwd[i] = time.perf_counter() - t0
        out_b.append(_value_bytes(h))
        groups.append(nodes)
    seen: set = set()
    saved = [array_bytes(saved_arrays(nodes, exclude), seen) for nodes in groups]
    for i, nodes in enumerate(groups):
        for node in nodes:
            _timed(node, bwd, i, cuda)
    del nodes, groups
    loss = loss_fn(h, as_tensor(y))
    del h
    loss.backward()
    return saved, in_b, out_b, fwd, bwd


def profile_memory(layers, x, y, loss_fn, *, bandwidth: float | None = None,
                   comm=None, repeat: int = 1) -> MemoryProfile:
    """Run one training step ``loss_fn(layers[-1](...layers[0](x)), y).backward()`` and record
    per layer its saved bytes, input/output bytes, forward and backward time (see
    :class:`LayerProfile`).

    ``layers``: modules in forward order, or a model (:func:`~disttensor.nn.sequential_layers`).
    ``x``, ``y``: tensors (or DistArrays).  ``bandwidth`` (bytes/s): the host<->device
    bandwidth to plan with; by default measured on a GPU, else :data:`ASSUMED_BANDWIDTH`
    (reported as assumed).  ``repeat``: steps to run, keeping each layer's least time (the
    first step of a process also compiles kernels: warm up, or repeat).  The steps leave no
    trace: gradients are set back to what they were and buffers (running statistics,
    dropout counters) restored.  Collective over ``x``'s grid
    (or ``comm``): every figure is the maximum over the ranks, so all ranks get the same
    profile."""
    layers = _layer_list(layers)
    xt = as_tensor(x)
    cuda = _is_cuda(xt)
    if comm is None and isinstance(xt.data, DistArray):
        comm = xt.data.grid.cart
    exclude = _exclude_ids(layers)
    slots = _buffer_slots(layers)
    before = _snapshot(slots)
    params = [p for layer in layers for p in layer.parameters()]
    grads = [p.grad for p in params]
    n = len(layers)
    best_f, best_b = [math.inf] * n, [math.inf] * n
    try:
        for _ in range(max(1, int(repeat))):
            saved, in_b, out_b, fwd, bwd = _profile_step(layers, xt, y, loss_fn, exclude, cuda)
            best_f = [min(u, v) for u, v in zip(best_f, fwd)]
            best_b = [min(u, v) for u, v in zip(best_b, bwd)]
            _restore(slots, before)
    finally:
        _restore(slots, before)
        for p, g in zip(params, grads):
            p.grad = g
    fwd, bwd = best_f, best_b
    figures = np.array([saved, in_b, out_b, fwd, bwd], dtype=np.float64)
    if comm is not None and comm.size > 1:
        figures = allreduce(comm, figures, "max")
    assumed = bandwidth is None and not cuda
    if bandwidth is None:
        bandwidth = measure_bandwidth() if cuda else ASSUMED_BANDWIDTH
        if cuda and comm is not None and comm.size > 1:
            bandwidth = float(allreduce(comm, np.array([-bandwidth]), "max")[0]) * -1
    names = [type(layer).__name__ for layer in layers]
    profs = [LayerProfile(names[i], int(figures[0, i]), int(figures[1, i]), int(figures[2, i]),
                          float(figures[3, i]), float(figures[4, i])) for i in range(n)]
    return MemoryProfile(profs, float(bandwidth), assumed, "cuda" if cuda else "cpu",
                         1 if comm is None else comm.size)
