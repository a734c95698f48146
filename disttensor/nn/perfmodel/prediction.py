"""The predicted step time and memory of one grid from the measurements (all pure).

The prediction for one grid (:func:`predict_grid`, pure given the measurements):

* halo exchange of a windowed layer (convolution, pooling) on the slowest rank: one message
  per neighbour piece (faces, edges, corners: ``prod(1 + [lo] + [hi]) - 1``) and the bytes of
  its halo'd box minus its block (widths from the window math of :mod:`disttensor.ops.window`,
  one width per side for all blocks, none past the global boundary):
  ``halo = pieces * alpha_p2p + bytes * beta_p2p``, the same again backward (the reverse
  exchange).  With ``halo_overlap`` (the default on GPU, as the convolution overlaps the
  interior with the exchange) a layer costs ``max(compute, halo)`` instead of the sum.
* flatten on a spatially split grid gathers each sample on every rank of its spatial group:
  ``(P_sp - 1) * alpha_p2p + (P_sp - 1) / P_sp * bytes * beta_p2p``; backward slices locally.
* every distributed op agrees its arguments in one small all-reduce per pass, which also
  synchronises the ranks: a measured per-op overhead forward and backward (an activation of
  a small block on ``comm`` minus the same on one rank), and a tiny all-reduce twice more
  for global batch norm.
* gradient all-reduce: the parameters packed into buckets of ``bucket_bytes`` in reverse
  registration order (as :class:`~disttensor.nn.parallel.GradientReducer`); a bucket is ready
  when backward reaches the layer of its last parameter; buckets all-reduce one after the
  other, each starting at ``max(ready, previous end)`` (``overlap``) or all at the end of
  backward; only what runs past the end of backward is added (:func:`allreduce_exposed`).
* ``step = forward + backward + exposed all-reduce + optimizer step`` (the optimizer step is
  measured on arrays of the parameters' shapes); layers follow one another (each op
  synchronises the ranks through its agreement all-reduce), so the step is the sum over
  layers of the slowest rank's time, and uneven splits cost their largest block.

Memory per rank (:func:`estimate_memory`): parameters, their gradients and the reducer's
bucket buffers (one parameter size each), optimizer state (``2`` parameter sizes for Adam /
AdamW, ``1`` for SGD with momentum), the saved activations of the local block (a windowed
layer keeps its halo'd input, other layers their input block; an approximation) and a
workspace of the largest layer's input + output block (its output, or the gradients of
both, in flight).  The allocator and library workspaces are ignored (on a CPU CosmoFlow
step the total came within ~20% above the measured peak).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from ..parallel import DEFAULT_BUCKET_BYTES
from .geometry import LayerGeometry
from .links import AlphaBeta, LinkModel

__all__ = ["OPTIMIZER_STATE", "LayerPrediction", "GridPrediction", "allreduce_exposed",
           "buckets_of", "estimate_memory", "predict_grid"]

#: optimizer state in parameter sizes
OPTIMIZER_STATE = {"sgd": 1.0, "adam": 2.0, "adamw": 2.0, "none": 0.0}


def allreduce_exposed(ready_s: Sequence[float], bucket_sizes: Sequence[int],
                      backward_end_s: float, allreduce: Callable[[float], float],
                      overlap: bool = True) -> float:
    """Seconds of gradient all-reduce left after backward ends (pure).

    Bucket ``k`` (``bucket_sizes[k]`` bytes) is ready at ``ready_s[k]`` seconds into
    backward; buckets run one after another in index order, each starting at
    ``max(ready, previous end)`` (``overlap``) or all from ``backward_end_s`` (no overlap);
    the result is ``max(0, last end - backward_end_s)``."""
    if len(ready_s) != len(bucket_sizes):
        raise ValueError("allreduce_exposed: one ready time per bucket")
    end = 0.0 if overlap else backward_end_s
    for r, n in zip(ready_s, bucket_sizes):
        start = max(r, end) if overlap else end
        end = start + allreduce(n)
    return max(0.0, end - backward_end_s) if bucket_sizes else 0.0


def buckets_of(param_layers: Sequence[tuple[int, int]], bucket_bytes: int):
    """Buckets as the reducer packs them: ``param_layers`` lists ``(layer index, bytes)`` per
    parameter in registration order; walked in reverse, a bucket closes when the next
    parameter would take it past ``bucket_bytes``.  Returns ``(bytes, last layer)`` per bucket
    (the layer whose backward completes it: the smallest index in it)."""
    out, cur, layer = [], 0, None
    for li, nb in reversed(list(param_layers)):
        if cur and cur + nb > bucket_bytes:
            out.append((cur, layer))
            cur, layer = 0, None
        cur += nb
        layer = li if layer is None else min(layer, li)
    if cur:
        out.append((cur, layer))
    return out


def estimate_memory(geoms: Sequence[LayerGeometry], param_bytes: int,
                    optimizer_state: float = 2.0) -> dict:
    """Bytes per rank (pure): ``params`` (weights + gradients + reducer buckets: 3 x
    ``param_bytes``), ``optimizer`` (``optimizer_state`` x ``param_bytes``), ``activations``
    (sum of the layers' saved bytes), ``workspace`` (the largest input + output block: a
    layer's output, or in backward its output gradient and input gradient, in flight),
    ``total``."""
    acts = sum(g.saved_bytes for g in geoms)
    work = max((g.in_bytes + g.out_bytes for g in geoms), default=0)
    res = {"params": 3 * param_bytes, "optimizer": int(optimizer_state * param_bytes),
           "activations": int(acts), "workspace": int(work)}
    res["total"] = sum(res.values())
    return res


@dataclass(frozen=True)
class LayerPrediction:
    """Predicted seconds of one layer on one grid (slowest rank): ``forward_s`` /
    ``backward_s`` in total, of which ``compute_*`` measured and ``comm_*`` modelled."""
    name: str
    compute_forward_s: float
    compute_backward_s: float
    comm_forward_s: float
    comm_backward_s: float
    forward_s: float
    backward_s: float
    saved_bytes: int


@dataclass(frozen=True)
class GridPrediction:
    """The prediction for one grid: ``step_s = forward_s + backward_s + allreduce_s +
    optimizer_s``; ``memory`` as :func:`estimate_memory`; ``layers`` the breakdown."""
    grid: tuple
    step_s: float
    forward_s: float
    backward_s: float
    allreduce_s: float
    optimizer_s: float
    memory: dict
    layers: tuple = ()
    io_s: float = 0.0

    def report(self) -> str:
        lines = [f"grid {self.grid}: step {self.step_s * 1e3:.2f} ms (forward "
                 f"{self.forward_s * 1e3:.2f}, backward {self.backward_s * 1e3:.2f}, "
                 f"exposed all-reduce {self.allreduce_s * 1e3:.2f}, optimizer "
                 f"{self.optimizer_s * 1e3:.2f}, exposed sample I/O {self.io_s * 1e3:.2f}), "
                 "memory {self.memory['total'] / 2 ** 20:.1f} "
                 "MiB/rank"]
        for lp in self.layers:
            lines.append(f"  {lp.name:18s} fwd {lp.forward_s * 1e3:8.3f} ms (comm "
                         f"{lp.comm_forward_s * 1e3:7.3f})  bwd {lp.backward_s * 1e3:8.3f} ms "
                         f"(comm {lp.comm_backward_s * 1e3:7.3f})")
        return "\n".join(lines)


def predict_grid(grid, geoms: Sequence[LayerGeometry], times: Sequence[tuple[float, float]],
                 links: LinkModel, param_layers: Sequence[tuple[int, int]],
                 optimizer_s: float = 0.0, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 overlap: bool = True, halo_overlap: bool = False,
                 optimizer_state: float = 2.0) -> GridPrediction:
    """Combine measured compute ``times`` (``(forward_s, backward_s)`` per layer, slowest
    rank) with the link model into a step time (pure; see the module docstring for the
    formulas).  ``param_layers``: ``(layer index, bytes)`` per parameter in registration
    order."""
    if len(times) != len(geoms):
        raise ValueError("predict_grid: one (forward, backward) time per layer")
    p2p, red = links.p2p, links.allreduce
    many = links.nranks > 1
    of, ob = (links.op_forward_s, links.op_backward_s) if many else (0.0, 0.0)
    extra = red(8) if many else 0.0   # a tiny all-reduce (latency; NCCL: tree)
    preds, fwd_total, ends, t_bwd = [], 0.0, {}, 0.0
    comm_f, comm_b = [], []
    for g in geoms:
        halo = p2p(g.halo_bytes, g.halo_pieces)
        cf = halo + of + extra * g.allreduces
        cb = halo + ob + extra * g.allreduces
        if g.kind == "flatten" and g.gather_peers:
            cf += p2p(g.gather_bytes, g.gather_peers)
        comm_f.append((cf, halo))
        comm_b.append((cb, halo))
    for i, (g, (tf, tb)) in enumerate(zip(geoms, times)):
        (cf, hf), (cb, hb) = comm_f[i], comm_b[i]
        if halo_overlap and g.kind == "window":
            f, b = max(tf, hf) + cf - hf, max(tb, hb) + cb - hb
        else:
            f, b = tf + cf, tb + cb
        preds.append(LayerPrediction(g.name, tf, tb, cf, cb, f, b, g.saved_bytes))
        fwd_total += f
    for i in range(len(geoms) - 1, -1, -1):
        t_bwd += preds[i].backward_s
        ends[i] = t_bwd
    buckets = buckets_of(param_layers, bucket_bytes)
    exposed = allreduce_exposed([ends[li] for _, li in buckets], [n for n, _ in buckets],
                                t_bwd, red if links.nranks > 1 else AlphaBeta(), overlap)
    total_params = sum(n for _, n in param_layers)
    mem = estimate_memory(geoms, total_params, optimizer_state)
    return GridPrediction(tuple(grid), fwd_total + t_bwd + exposed + optimizer_s, fwd_total,
                          t_bwd, exposed, optimizer_s, mem, tuple(preds))
