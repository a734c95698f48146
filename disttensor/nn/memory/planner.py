"""Training under a memory budget: keep, offload or recompute each layer's saved activations.

A training step keeps, from every layer's forward until its backward, what the layer's
backward needs (its *saved* state, measured by :mod:`disttensor.autograd.saved`).  For a
chain of layers (``disttensor.nn.sequential_layers(model)``) this module

* :func:`profile_memory` -- runs one training step and records per layer the saved bytes,
  the input and output bytes, the forward and backward times, and the host<->device bandwidth
  (measured with CuPy on a GPU; on CPU an *assumed* bandwidth, 12 GB/s PCIe by default, and
  reported as assumed);
* :func:`plan_memory` -- chooses for each layer ``keep`` / ``offload`` / ``recompute`` so that
  the modelled peak of saved bytes fits a budget at the least added time (an exact dynamic
  program over the layers with the memory discretised: pseudo-polynomial; the general problem
  of scheduling data movement is NP-complete);
* :func:`apply_plan` -- a model whose forward applies a plan: consecutive ``recompute`` layers
  run as one activation checkpoint (:func:`checkpoint`), ``offload`` layers move their saved
  arrays to pinned host memory after their forward and prefetch them back while the
  backward of the next layer runs (:class:`~disttensor.autograd.saved.OffloadGroup`; on CPU
  offload is simulated: bytes are counted, nothing moves);
* :func:`measure_step_memory` -- the peak memory a step allocates (``tracemalloc``, to which
  NumPy reports its buffers, on CPU; the CuPy memory pool's used bytes on GPU).

The cost and memory model (stated once here; :func:`evaluate_plan` computes it)
--------------------------------------------------------------------------------
Layer ``i`` has saved bytes ``s_i``, input bytes ``a_i``, forward and backward times ``f_i``,
``b_i``; ``B`` is the host<->device bandwidth; ``f_n = b_n = 0`` past the last layer.

* ``keep``: ``s_i`` stays resident from forward to backward; no added time.
* ``offload``: nothing resident; ``s_i`` is copied out while the next layer's forward runs
  and copied back (prefetched) while the next layer's backward runs, so the added time is
  ``max(0, s_i/B - f_{i+1}) + max(0, s_i/B - b_{i+1})`` (the part of each copy the
  neighbouring compute does not hide).  During the layer's backward ``s_i`` is a *transient*.
* ``recompute``: recompute layers are grouped in *segments* of consecutive layers (a plan says
  where runs of recompute layers are cut; by default each maximal run is one segment); a
  segment ``j..k`` is one checkpoint: only its input (``a_j`` bytes) stays resident; its
  backward first re-runs the forward of the segment (added time ``f_j + ... + f_k``), whose
  saved state ``s_j + ... + s_k``, plus the recomputed output ``o_k`` (alive next to the
  first forward's copy until the recomputation ends), is then a transient.  Short segments
  keep more inputs resident, long ones a larger transient: the planner chooses the cuts.

The modelled peak of saved bytes (at the start of backward, where everything kept is still
alive) is ``sum(s_i, keep) + sum(a_j, recompute runs) + max(transients)``: one transient at a
time (a prefetch is counted with its own layer's backward, not overlapping the previous
transient).  Shared buffers (an activation saved by two consecutive layers) are counted for the
first layer that saves them.  The model is the planner's; :func:`measure_step_memory` reports
what a step really allocates.

Collective use: :func:`profile_memory` is collective over the input's grid and takes the
maximum of every figure over the ranks, so every rank plans alike; :func:`plan_memory` with
``comm`` validates collectively (a budget below the minimum raises the same ``ValueError`` on
every rank).  Recompute re-runs the same layers on every rank in the same order during
backward, so collective ops inside stay matched.
"""
from __future__ import annotations

import gc
import math
import weakref
import time
import tracemalloc
from dataclasses import dataclass

import numpy as np

from ...core.array import DistArray
from ...autograd.saved import (OffloadGroup, array_bytes, backward_subgraph, record_node,
                              record_nodes, run_before_backward, saved_arrays)
from ...autograd.tensor import Node, Tensor, as_tensor, enable_grad, is_grad_enabled, no_grad
from ...core.comm import allreduce, collective
from ..module import Module, ModuleList, Sequential, sequential_layers

__all__ = ["checkpoint", "LayerProfile", "MemoryProfile", "profile_memory", "MemoryPlan",
           "plan_memory", "min_peak", "evaluate_plan", "apply_plan", "PlannedModel",
           "measure_step_memory", "measure_bandwidth", "ASSUMED_BANDWIDTH", "CHOICES"]

#: host<->device bandwidth assumed where none can be measured (PCIe 3.0 x16, bytes/s)
ASSUMED_BANDWIDTH = 12e9
CHOICES = ("keep", "offload", "recompute")


# -- buffers (running statistics, dropout counters) -------------------------------------------
def _buffer_slots(module) -> list:
    """``(buffers dict, name)`` of every buffer of ``module`` (or of a list of modules)."""
    mods = module if isinstance(module, (list, tuple)) else [module]
    out, seen = [], set()
    for top in mods:
        for m in top.modules():
            if id(m) in seen:
                continue
            seen.add(id(m))
            for name, b in m._buffers.items():
                if b is not None:
                    out.append((m._buffers, name))
    return out


def _snapshot(slots) -> list:
    return [d[name].copy() for d, name in slots]


def _restore(slots, values) -> None:
    for (d, name), v in zip(slots, values):
        cur = d[name]
        if getattr(cur, "shape", None) == v.shape:
            cur[...] = v
        else:
            d[name] = v.copy()


# -- recompute ---------------------------------------------------------------------------------
def checkpoint(module, x) -> Tensor:
    """``module(x)`` recomputed in backward instead of keeping its saved state (activation
    checkpointing).

    The forward runs under :func:`~disttensor.autograd.no_grad` and keeps only the input ``x``;
    the backward re-runs ``module(x)`` with gradients recorded and backpropagates the incoming
    gradient through it: the parameters' gradients go to them as in an ordinary backward
    (gradient-ready hooks, data-parallel reducers included), the input's gradient goes on to
    the rest of the graph.  ``module``: a :class:`~disttensor.nn.Module` (a
    :class:`~disttensor.nn.Sequential` for a run of layers).

    Buffers are handled so that the result is the plain model's: every buffer of ``module``
    (dropout counters, batch-norm running statistics and batch counts) is set back to its value
    before the first forward while the recomputation runs, then to its value after it, so
    dropout draws the same mask again and running statistics are updated once.  The module's
    ``training`` mode must not change between forward and backward.  After the recomputation
    the output tensor's ``data`` is the recomputed array (equal values; the first forward's
    copy is then freed unless referenced elsewhere).  A parameter used both inside and
    outside the checkpoint (or in two checkpoints) gets its gradient in two parts, each
    announced to its gradient-ready hooks: correct in ``.grad``, but a data-parallel reducer
    expects one announcement per pass, so do not share weights across checkpoints under
    :class:`~disttensor.nn.DistributedDataParallel`.  Collective exactly when
    ``module``'s forward is (every rank recomputes the same layers in the same order)."""
    xt = as_tensor(x)
    if not is_grad_enabled():
        return module(xt)
    slots = _buffer_slots(module)
    before = _snapshot(slots)
    with no_grad():
        y = module(xt)
    if not isinstance(y, Tensor):
        raise TypeError(f"checkpoint: the module returned {type(y).__name__}, not a Tensor")
    needs_params = any(p.requires_grad for p in module.parameters())
    if not xt.requires_grad and not needs_params:
        return y

    def backward(g):
        after = _snapshot(slots)
        _restore(slots, before)
        try:
            xd = Tensor(xt.data, requires_grad=xt.requires_grad)
            got = []
            if xd.requires_grad:
                xd.register_grad_ready_hook(lambda t, gx: got.append(gx) or gx is not None)
            with enable_grad():
                y2 = module(xd)
        finally:
            _restore(slots, after)
        res = ref()
        if res is not None:  # drop the first forward's copy: the recomputed one is equal
            res.data = y2.data
        del res
        backward_subgraph(y2, g)
        return (got[0] if got else None,)

    out = Tensor(y.data)
    ref = weakref.ref(out)
    out.requires_grad = True
    out.node = Node((xt if xt.requires_grad else None,), backward, "checkpoint")
    record_node(out.node)
    return out


# -- measurement -------------------------------------------------------------------------------
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


@dataclass
class LayerProfile:
    """What one layer costs in a training step (see the module docstring's model)."""
    name: str
    saved_bytes: int      # bytes its backward keeps alive (shared buffers: first layer)
    input_bytes: int      # bytes of its input activation (what a checkpoint keeps)
    output_bytes: int
    forward_time: float   # seconds
    backward_time: float  # seconds


@dataclass
class MemoryProfile:
    """Per-layer figures of one step (:func:`profile_memory`), identical on every rank (each
    figure the maximum over the ranks).  ``bandwidth`` in bytes/s; ``bandwidth_assumed``:
    it was not measured (CPU)."""
    layers: list
    bandwidth: float = ASSUMED_BANDWIDTH
    bandwidth_assumed: bool = True
    device: str = "cpu"
    ranks: int = 1

    @property
    def keep_all_peak(self) -> int:
        """Modelled peak of saved bytes when every layer keeps its state."""
        return int(sum(lp.saved_bytes for lp in self.layers))

    def report(self) -> str:
        bw = f"{self.bandwidth / 1e9:.1f} GB/s" + (" (assumed)" if self.bandwidth_assumed
                                                   else " (measured)")
        lines = [f"memory profile: {len(self.layers)} layers on {self.ranks} rank(s), "
                 f"{self.device}, host<->device {bw}",
                 f"{'#':>3} {'layer':<14} {'saved MB':>9} {'input MB':>9} {'fwd ms':>8} "
                 f"{'bwd ms':>8}"]
        for i, lp in enumerate(self.layers):
            lines.append(f"{i:>3} {lp.name[:14]:<14} {lp.saved_bytes / 1e6:>9.3f} "
                         f"{lp.input_bytes / 1e6:>9.3f} {lp.forward_time * 1e3:>8.2f} "
                         f"{lp.backward_time * 1e3:>8.2f}")
        lines.append(f"keep-all saved peak {self.keep_all_peak / 1e6:.3f} MB")
        return "\n".join(lines)


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


# -- the model and the planner ------------------------------------------------------------------
def _runs(choices) -> list[tuple[int, int]]:
    """Maximal runs ``[start, stop)`` of ``'recompute'`` in ``choices``."""
    out, i, n = [], 0, len(choices)
    while i < n:
        if choices[i] == "recompute":
            j = i
            while j < n and choices[j] == "recompute":
                j += 1
            out.append((i, j))
            i = j
        else:
            i += 1
    return out


def _offload_cost(prof: MemoryProfile, i: int, bandwidth: float) -> float:
    L = prof.layers
    t = L[i].saved_bytes / bandwidth
    f_next = L[i + 1].forward_time if i + 1 < len(L) else 0.0
    b_next = L[i + 1].backward_time if i + 1 < len(L) else 0.0
    return max(0.0, t - f_next) + max(0.0, t - b_next)


def _check_segments(choices, segments) -> list:
    """``segments`` (``[start, stop)`` pairs) validated against ``choices``: together they
    cover exactly the recompute layers, in order; ``None``: the maximal runs."""
    if segments is None:
        return _runs(choices)
    segments = [(int(j), int(k)) for j, k in segments]
    covered = [i for j, k in segments for i in range(j, k)]
    want = [i for i, c in enumerate(choices) if c == "recompute"]
    if covered != want or any(k <= j for j, k in segments):
        raise ValueError(f"segments {segments} must cut the recompute layers {want} into "
                         "consecutive non-empty [start, stop) ranges, in order")
    return segments


def evaluate_plan(profile: MemoryProfile, choices, bandwidth: float | None = None,
                  segments=None):
    """``(peak_bytes, added_seconds)`` of per-layer ``choices`` (recompute layers cut into
    ``segments``, default: maximal runs) under the model of the module docstring.  Local,
    pure."""
    L = profile.layers
    if len(choices) != len(L):
        raise ValueError(f"{len(choices)} choices for {len(L)} layers")
    segments = _check_segments(tuple(choices), segments)
    bw = profile.bandwidth if bandwidth is None else bandwidth
    resident, transient, added = 0, 0, 0.0
    for i, c in enumerate(choices):
        if c == "keep":
            resident += L[i].saved_bytes
        elif c == "offload":
            transient = max(transient, L[i].saved_bytes)
            added += _offload_cost(profile, i, bw)
        elif c != "recompute":
            raise ValueError(f"unknown choice {c!r} (one of {CHOICES})")
    for j, k in segments:
        resident += L[j].input_bytes
        transient = max(transient, sum(L[i].saved_bytes for i in range(j, k))
                        + L[k - 1].output_bytes)
        added += sum(L[i].forward_time for i in range(j, k))
    return int(resident + transient), float(added)


@dataclass
class MemoryPlan:
    """Per-layer choices (``'keep'``, ``'offload'``, ``'recompute'``), the checkpoint
    ``segments`` (``[start, stop)`` ranges cutting the recompute layers; default: each maximal
    run) and the model's predicted peak of saved bytes and added seconds per step (see the
    module docstring).  ``MemoryPlan(choices)`` or ``MemoryPlan(choices, segments=...)``
    makes a plan by hand."""
    choices: tuple
    names: tuple = ()
    budget: int | None = None
    peak: int | None = None
    added_time: float | None = None
    keep_all_peak: int | None = None
    bandwidth: float | None = None
    bandwidth_assumed: bool = True
    unit: int = 1
    segments: list | None = None

    def __post_init__(self):
        self.choices = tuple(self.choices)
        bad = [c for c in self.choices if c not in CHOICES]
        if bad:
            raise ValueError(f"unknown choices {bad} (each one of {CHOICES})")
        self.segments = _check_segments(self.choices, self.segments)

    def counts(self) -> dict:
        return {c: self.choices.count(c) for c in CHOICES}

    def report(self) -> str:
        names = self.names or tuple(f"layer{i}" for i in range(len(self.choices)))
        lines = []
        if self.budget is not None:
            bw = "" if self.bandwidth is None else \
                f", bandwidth {self.bandwidth / 1e9:.1f} GB/s" + \
                (" (assumed)" if self.bandwidth_assumed else " (measured)")
            lines.append(f"memory plan: budget {self.budget / 1e6:.3f} MB, predicted peak "
                         f"{self.peak / 1e6:.3f} MB (keep-all {self.keep_all_peak / 1e6:.3f} "
                         f"MB), added {self.added_time * 1e3:.2f} ms/step{bw}")
        c = self.counts()
        lines.append(f"  keep {c['keep']}, offload {c['offload']}, recompute {c['recompute']} "
                     f"in {len(self.segments)} checkpoint(s)")
        seg_of = {i: s for s, (j, k) in enumerate(self.segments) for i in range(j, k)}
        for i, (n, ch) in enumerate(zip(names, self.choices)):
            tag = f" (checkpoint {seg_of[i]})" if i in seg_of else ""
            lines.append(f"  {i:>3} {n:<14} {ch}{tag}")
        return "\n".join(lines)


def _min_peak(s, a, o, allow_off: bool, allow_rec: bool, cands) -> int:
    """The smallest modelled peak any plan reaches (exact, over the transient bounds)."""
    n = len(s)
    best = sum(s)
    for T in cands:
        # least resident bytes for layers < i with every transient <= T
        dp = [math.inf] * (n + 1)
        dp[0] = 0
        for i in range(n):
            r = dp[i]
            if r == math.inf:
                continue
            dp[i + 1] = min(dp[i + 1], r + s[i])
            if allow_off and s[i] <= T:
                dp[i + 1] = min(dp[i + 1], r)
            if allow_rec:
                tot = 0
                for k in range(i, n):
                    tot += s[k]
                    if tot > T:
                        break
                    if tot + o[k] <= T:
                        dp[k + 1] = min(dp[k + 1], r + a[i])
        best = min(best, dp[n] + T)
    return int(best)


def min_peak(profile: MemoryProfile, *, allow_offload: bool = True,
             allow_recompute: bool = True) -> int:
    """The smallest modelled peak of saved bytes any plan reaches: the least budget
    :func:`plan_memory` accepts.  With offload it is the largest layer's saved bytes (every
    layer offloaded reaches it; no plan goes below it).  Local, pure."""
    s = [int(lp.saved_bytes) for lp in profile.layers]
    a = [int(lp.input_bytes) for lp in profile.layers]
    o = [int(lp.output_bytes) for lp in profile.layers]
    return _min_peak(s, a, o, allow_offload, allow_recompute, _transient_bounds(
        s, o, allow_offload, allow_recompute))


def _transient_bounds(s, o, allow_off: bool, allow_rec: bool) -> list:
    """Every value the largest transient of a plan can take."""
    every = {0}
    if allow_off:
        every.update(s)
    if allow_rec:
        for i in range(len(s)):
            tot = 0
            for k in range(i, len(s)):
                tot += s[k]
                every.add(tot + o[k])
    return sorted(every)


def plan_memory(profile: MemoryProfile, budget_bytes, bandwidth: float | None = None, *,
                allow_offload: bool = True, allow_recompute: bool = True,
                resolution: int = 1024, unit: int | None = None, comm=None) -> MemoryPlan:
    """The choice per layer that minimises the modelled added time subject to the modelled
    peak of saved bytes ``<= budget_bytes`` (model: module docstring).

    Exact dynamic program: for every candidate bound ``T`` on the largest transient (0, each
    layer's saved bytes, each segment's transient), a knapsack over the layers in order whose state
    is the resident bytes (in units of ``unit`` bytes, each layer's bytes rounded *up*, so
    the plan always fits the budget; default ``unit = ceil(budget / resolution)``); a step
    keeps or offloads one layer or makes a segment of recompute layers.  Time
    ``O(n^4 * budget / unit)`` with ``n`` layers: pseudo-polynomial.  Optimal when every size
    is a multiple of ``unit``; otherwise optimal for the rounded sizes.  Without ``unit``, when
    no plan fits at the coarse unit (rounding), units 16, 256, ... times finer are tried, and
    last the greatest common divisor of the sizes (exact; when ``budget / gcd <= 2**20``).
    A budget at or above the keep-all peak gives every layer ``keep``.

    Raises ``ValueError`` when the budget is below the smallest peak any plan reaches (every
    rank alike when ``comm`` is given: then collective, the ranks agree on the budget).
    ``bandwidth`` overrides the profile's."""
    L = profile.layers
    n = len(L)
    s = [int(lp.saved_bytes) for lp in L]
    a = [int(lp.input_bytes) for lp in L]
    o = [int(lp.output_bytes) for lp in L]
    f = [float(lp.forward_time) for lp in L]
    bw = profile.bandwidth if bandwidth is None else float(bandwidth)
    with collective(comm, "plan_memory", budget_bytes=budget_bytes, bandwidth=bandwidth,
                    allow_offload=allow_offload, allow_recompute=allow_recompute,
                    resolution=resolution, unit=unit):
        if not n:
            raise ValueError("plan_memory: the profile has no layers")
        if not (isinstance(budget_bytes, (int, float, np.integer, np.floating))
                and budget_bytes >= 0):
            raise ValueError(f"plan_memory: budget_bytes must be a number >= 0, got "
                             f"{budget_bytes!r}")
        if not bw > 0:
            raise ValueError(f"plan_memory: bandwidth must be > 0, got {bw}")
        budget = int(budget_bytes)
        every = _transient_bounds(s, o, allow_offload, allow_recompute)
        least = _min_peak(s, a, o, allow_offload, allow_recompute, every)
        cands = sorted(c for c in every if c <= budget)
        if budget < least:
            raise ValueError(f"plan_memory: a budget of {budget} bytes is below the smallest "
                             f"peak of saved bytes any plan reaches, {least} bytes (keep-all "
                             f"needs {sum(s)}; allow_offload={allow_offload}, "
                             f"allow_recompute={allow_recompute})")
    names = tuple(lp.name for lp in L)
    common = dict(names=names, budget=budget, keep_all_peak=sum(s), bandwidth=bw,
                  bandwidth_assumed=profile.bandwidth_assumed)
    if sum(s) <= budget:
        return MemoryPlan(("keep",) * n, peak=sum(s), added_time=0.0, unit=1, **common)
    off = [_offload_cost(profile, i, bw) for i in range(n)]
    exact = math.gcd(*s, *a, *o) or 1  # a unit dividing every size: no rounding
    units = [unit] if unit is not None else []
    if unit is None:  # coarse first; finer (down to the exact unit) if rounding bites
        u = max(1, math.ceil(budget / max(1, resolution)))
        while u > exact:
            units.append(u)
            u //= 16
        if budget // exact <= 1 << 20 or not units:
            units.append(exact)
    best = None
    for unit in units:
        for T in cands:
            cap = (budget - T) // unit
            res = _knapsack(s, a, o, f, off, T, cap, unit, allow_offload, allow_recompute)
            if res is not None and (best is None or res[0] < best[0]):
                best = res
        if best is not None:
            break
    if best is None:  # only the rounding of sizes up to units can get here
        raise ValueError(f"plan_memory: no plan fits {budget} bytes at a resolution of "
                         f"{unit} bytes (the exact minimum is {least}); pass a larger "
                         "resolution or unit=1")
    _, choices, segments = best
    peak, added = evaluate_plan(profile, choices, bw, segments)
    return MemoryPlan(choices, peak=peak, added_time=added, unit=unit, segments=segments,
                      **common)


def _knapsack(s, a, o, f, off, T, cap, unit, allow_off, allow_rec):
    """Least added time with every transient ``<= T`` and resident units ``<= cap``:
    ``(cost, choices, segments)`` or ``None``.  ``dp[i][r]``: least cost for layers ``< i``
    with ``r`` resident units; a step from ``i`` to ``k + 1`` keeps or offloads layer ``i``
    (``k = i``) or makes ``i..k`` one recompute segment."""
    if cap < 0:
        return None
    n = len(s)
    inf = math.inf
    C = cap + 1
    dp = [np.full(C, inf) for _ in range(n + 1)]
    bp = [np.zeros((C, 3), dtype=np.int64) for _ in range(n + 1)]  # from i, units, choice
    dp[0][0] = 0.0
    ws = [-(-x // unit) for x in s]
    wa = [-(-x // unit) for x in a]

    def relax(i, j, w, cost, code):
        if w >= C:
            return
        cand = np.full(C, inf)
        cand[w:] = dp[i][:C - w] + cost
        better = cand < dp[j]
        if better.any():
            dp[j][better] = cand[better]
            bp[j][better] = (i, w, code)

    for i in range(n):
        if not np.isfinite(dp[i]).any():
            continue
        relax(i, i + 1, ws[i], 0.0, 0)
        if allow_off and s[i] <= T:
            relax(i, i + 1, 0, off[i], 1)
        if allow_rec:
            tot, t = 0, 0.0
            for k in range(i, n):
                tot += s[k]
                t += f[k]
                if tot > T:
                    break
                if tot + o[k] <= T:
                    relax(i, k + 1, wa[i], t, 2)
    r = int(np.argmin(dp[n]))
    if not np.isfinite(dp[n][r]):
        return None
    cost = float(dp[n][r])
    choices, segments = [None] * n, []
    j = n
    while j > 0:
        i, w, code = (int(v) for v in bp[j][r])
        for k in range(i, j):
            choices[k] = CHOICES[code]
        if code == 2:
            segments.append((i, j))
        j, r = i, r - w
    return cost, tuple(choices), segments[::-1]


# -- applying a plan ----------------------------------------------------------------------------
class PlannedModel(Module):
    """``layers`` applied in order with a :class:`MemoryPlan` (see :func:`apply_plan`).

    Parameters are those of the layers (named ``layers.<i>.<name>``).  ``offload_stats``
    holds, for the last forward, the bytes moved to the host (``offloaded_bytes``, GPU) and
    the bytes whose move was simulated (``simulated_bytes``, CPU)."""

    def __init__(self, layers, plan, copy_host: bool = False):
        super().__init__()
        self.copy_host = bool(copy_host)
        plan = plan if isinstance(plan, MemoryPlan) else MemoryPlan(tuple(plan))
        layers = list(layers)
        if len(plan.choices) != len(layers):
            raise ValueError(f"apply_plan: the plan has {len(plan.choices)} choices for "
                             f"{len(layers)} layers")
        self.layers = ModuleList(layers)
        self.plan = plan
        self.offload_stats = {"offloaded_bytes": 0, "simulated_bytes": 0}
        segs = {j: Sequential(*layers[j:k]) for j, k in plan.segments}
        object.__setattr__(self, "_segments", segs)

    def forward(self, x):
        layers, choices = list(self.layers), self.plan.choices
        exclude = _exclude_ids(layers) if "offload" in choices else ()
        stats = {"offloaded_bytes": 0, "simulated_bytes": 0}
        h = as_tensor(x)
        pending = None  # the offload group of the previous layer (prefetch in our backward)
        i, n = 0, len(layers)
        while i < n:
            if choices[i] == "recompute":
                seg = self._segments[i]
                j = i + len(seg)
                with record_nodes() as nodes:
                    h = checkpoint(seg, h)
            else:
                j = i + 1
                with record_nodes() as nodes:
                    h = layers[i](h)
            live = [nd for nd in nodes if nd.backward is not None]
            if pending is not None and live:
                run_before_backward(max(live, key=lambda nd: nd.seq), pending.prefetch)
            pending = None
            if choices[i] == "offload" and is_grad_enabled():
                grp = OffloadGroup(live, exclude, self.copy_host).offload()
                stats["offloaded_bytes"] += grp.offloaded_bytes
                stats["simulated_bytes"] += grp.simulated_bytes
                pending = grp
            i = j
        self.offload_stats = stats
        return h


def apply_plan(layers, plan, *, copy_host: bool = False) -> PlannedModel:
    """A model computing what ``layers`` (modules in forward order, or a model, expanded by
    :func:`~disttensor.nn.sequential_layers`) compute, with ``plan`` (a :class:`MemoryPlan`
    or a sequence of choices) applied in its forward: each segment of ``'recompute'`` layers
    (``plan.segments``) is one :func:`checkpoint`; each ``'offload'`` layer's saved arrays go
    to host memory after its forward and are prefetched back when the next layer's backward starts
    (simulated, counted only, for NumPy blocks); ``'keep'`` layers run as they are.  The
    layers (and their parameters) are shared with the original model, not copied; a
    model's own input checks (e.g. CosmoFlow's sample shape) are not run.  ``copy_host``:
    offload NumPy blocks by copying them out and back like device arrays (relieves nothing;
    exercises the offload path on CPU).  Collective when the layers are."""
    return PlannedModel(_layer_list(layers), plan, copy_host)
