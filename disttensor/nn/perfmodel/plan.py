"""A performance model of a training step per process grid, and :func:`plan_grid`.

Following Distconv (Dryden et al.) and Oyama et al., each layer's time under each candidate
decomposition ``(sample, d, h, w)`` is *predicted* from measurements, and the grid with the
smallest predicted step that fits in memory is chosen:

* **Compute** (measured): each layer's forward and backward are timed on a block of the
  slowest rank's local shape, run on a one-rank grid over ``COMM_SELF``: for a windowed
  layer the block is that rank's read window (its block with the halo it reads) and the
  padding is its local padding (at global boundaries only), so the local kernel solves
  exactly the problem the rank solves (and tunes it the same way: the first planning on a
  machine also tunes the convolution algorithms of every candidate block, cached on disk).
  Timings are cached per (layer geometry, shape, dtype).  Every rank times the same blocks at
  the same time, a barrier before each round (so ranks sharing cores measure the
  oversubscribed speed they will run at); the slowest rank's time of each round, the median
  over rounds, is used (:class:`LayerTimer`).
* **Links** (measured): a latency/bandwidth (alpha-beta) model ``t(n) = alpha + beta n`` of
  point-to-point exchange between neighbours (the library's halo exchange of faces of
  several sizes on a 1-D grid of all ranks, all at once) and of ``Allreduce`` over the
  whole communicator (what the gradient reducer uses), fitted by least squares on relative
  error (:meth:`AlphaBeta.fit`), slowest rank; and the overhead every distributed op pays
  per pass over its one-rank cost (:class:`LinkModel`, :func:`measure_links`).

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
  a small block on ``comm`` minus the same on one rank), and ``alpha_allreduce`` twice more
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

Validity (:func:`analyze_layers`): the sample axis must divide the batch; a spatial split is
*too fine* when some block of some layer's input is empty or narrower than the halo it must
send (the halo would reach past the direct neighbour).

Assumptions and limits: a model is modelled layer by layer through
:func:`~disttensor.nn.module.sequential_layers`; a layer that is not a convolution, pooling,
pointwise (activation, batch norm, dropout, identity), flatten or linear layer (e.g. the whole
U-Net, whose skip connections make it one layer) is timed whole on the local block (rounded
up to a multiple of ``2**levels`` for a model with ``levels``) and its communication
ignored, and must be the last layer.  Transfers of one rank are assumed not to
slow each other beyond the fitted model; compute is assumed independent of which spatial axis
is cut beyond the block shape (on cubic samples permutations of a split are taken as
equivalent, see :func:`enumerate_grids`).  The loss, the data and the work outside the
layers (autograd bookkeeping, reducer hooks) are not modelled (a few percent on small
models); timings taken while other processes load the machine carry their noise.
"""
from __future__ import annotations

import copy
import math
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
from mpi4py import MPI

from ...core.comm import collective
from ...ops.window import AxisWindow, normalize_padding, normalize_tuple
from ..module import Module, sequential_layers
from ..parallel import DEFAULT_BUCKET_BYTES

__all__ = ["AlphaBeta", "LinkModel", "LayerGeometry", "LayerPrediction", "GridPrediction",
           "InvalidGrid", "timing_layer",
           "GridPlan", "enumerate_grids", "analyze_layers", "allreduce_exposed",
           "estimate_memory", "measure_links", "LayerTimer", "predict_grid", "plan_grid",
           "OPTIMIZER_STATE"]

#: optimizer state in parameter sizes
OPTIMIZER_STATE = {"sgd": 1.0, "adam": 2.0, "adamw": 2.0, "none": 0.0}


# -- alpha-beta links --------------------------------------------------------------------------
@dataclass(frozen=True)
class AlphaBeta:
    """``t(n) = alpha + beta * n`` seconds for ``n`` bytes (``0`` for ``n <= 0``)."""
    alpha: float = 0.0
    beta: float = 0.0

    def __call__(self, nbytes: float, messages: int = 1) -> float:
        if nbytes <= 0 or messages <= 0:
            return 0.0
        return messages * self.alpha + nbytes * self.beta

    @property
    def bandwidth(self) -> float:
        """Bytes per second (``inf`` when ``beta`` is 0)."""
        return math.inf if self.beta <= 0 else 1.0 / self.beta

    @classmethod
    def fit(cls, sizes: Sequence[float], times: Sequence[float]) -> "AlphaBeta":
        """Least-squares fit of ``t = alpha + beta n`` minimising the *relative* error (each
        equation divided by its time, so small and large messages weigh alike); both
        coefficients clamped to ``>= 0`` (a negative one is refitted with it fixed at 0).
        Needs at least two distinct sizes; pure."""
        n = np.asarray(sizes, dtype=np.float64)
        t = np.asarray(times, dtype=np.float64)
        if n.shape != t.shape or n.size < 2 or np.unique(n).size < 2:
            raise ValueError(f"AlphaBeta.fit needs >= 2 distinct sizes with one time each, "
                             f"got sizes {list(n)} and times {list(t)}")
        w = 1.0 / np.maximum(t, 1e-12)
        a = np.stack([w, n * w], axis=1)
        (alpha, beta), *_ = np.linalg.lstsq(a, t * w, rcond=None)
        if beta < 0:
            alpha, beta = float(np.sum(w * w * t) / np.sum(w * w)), 0.0
        if alpha < 0:
            beta = max(float(np.sum(w * w * n * t) / np.sum(w * w * n * n)), 0.0)
            alpha = 0.0
        return cls(float(alpha), float(beta))


@dataclass(frozen=True)
class LinkModel:
    """Measured links of a communicator: ``p2p`` between neighbours (per message),
    ``allreduce`` over all ranks (``nranks`` of them), and the overhead a distributed op
    pays per forward / backward pass over what it costs on one rank (``op_forward_s``,
    ``op_backward_s``: agreeing its arguments in a small all-reduce, the synchronisation that
    implies, bookkeeping; measured on an activation of a small block)."""
    p2p: AlphaBeta = AlphaBeta()
    allreduce: AlphaBeta = AlphaBeta()
    nranks: int = 1
    op_forward_s: float = 0.0
    op_backward_s: float = 0.0


def _median_time(fn, repeats: int) -> float:
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def measure_links(comm: MPI.Comm, quick: bool = False, repeats: int | None = None) -> LinkModel:
    """Fit the alpha-beta models of ``comm`` (collective; identical result on every rank).

    Point to point: halo exchanges (:meth:`~disttensor.core.array.DistArray.exchange_halo`, the
    library's own, with its packing and private communicator) of one face of several sizes
    with each neighbour along a 1-D grid of all ranks, every rank at once (an inner rank
    receives two pieces); all-reduce: ``Allreduce`` of float32 arrays of several sizes over
    ``comm``.  The rounds of all sizes are interleaved, a barrier before each; the slowest
    rank's time of each round, the median over ``repeats`` rounds, is fitted
    (:meth:`AlphaBeta.fit`, per piece for the exchange).  Also measures the per-op overhead
    (:class:`LinkModel`).  On one rank everything is zero (no neighbour, nothing to
    agree)."""
    from ...routines.creation import from_global
    from ...core.grid import ProcessGrid
    if comm.size == 1:
        return LinkModel(nranks=1)
    p2p_sizes = [16, 65536, 1 << 20] if quick else [16, 4096, 65536, 1 << 20, 4 << 20]
    red_sizes = [8, 65536, 1 << 20] if quick else [8, 4096, 65536, 1 << 20, 8 << 20]
    reps = repeats or (5 if quick else 9)
    size = comm.size
    grid = ProcessGrid((size,), comm=comm)
    pieces = min(size - 1, 2)
    tasks = []
    for n in p2p_sizes:
        k = max(n // 4, 1)
        x = from_global(np.zeros((2 * size, k), np.float32), grid=grid, split=(0, None))
        h = x.with_halo(((1, 1), (0, 0))).halo_exchange()
        tasks.append(h.exchange)
    for n in red_sizes:
        sbuf = np.zeros(max(n // 4, 1), dtype=np.float32)
        rbuf = np.empty_like(sbuf)
        tasks.append(lambda sbuf=sbuf, rbuf=rbuf: comm.Allreduce(sbuf, rbuf))
    mine = np.zeros((reps, len(tasks)))
    for r in range(reps + 1):
        for j, task in enumerate(tasks):
            comm.Barrier()
            t0 = time.perf_counter()
            task()
            if r:
                mine[r - 1, j] = time.perf_counter() - t0
    agreed = np.empty_like(mine)
    comm.Allreduce(mine, agreed, op=MPI.MAX)
    med = np.median(agreed, axis=0)
    k = len(p2p_sizes)
    of, ob = _op_overhead(comm, 21 if quick else 41)
    return LinkModel(p2p=AlphaBeta.fit(p2p_sizes, med[:k] / pieces),
                     allreduce=AlphaBeta.fit(red_sizes, med[k:]), nranks=size,
                     op_forward_s=of, op_backward_s=ob)


def _op_overhead(comm: MPI.Comm, rounds: int, width: int = 1 << 18) -> tuple[float, float]:
    """Per-pass overhead of a distributed op on ``comm`` (collective): a LeakyReLU forward
    and backward on a block of 2 x ``width`` float32 per rank (about a millisecond of work,
    so the ranks synchronise after computing, as between layers: with more ranks than
    cores that costs more than a synchronisation of idle ranks), split over all ranks,
    minus the same on ``COMM_SELF``; interleaved rounds (a barrier before each), the
    slowest rank's time per round, the median over rounds of the per-round difference,
    clamped at 0."""
    from ...autograd.tensor import Tensor, filled_like
    from ...routines.creation import from_global
    from ...core.grid import ProcessGrid
    from ..layers import LeakyReLU
    layer = LeakyReLU()
    xs = []
    for c, n in ((comm, comm.size), (MPI.COMM_SELF, 1)):
        grid = ProcessGrid((n,), comm=c)
        a = np.ones((2 * n, width), np.float32)
        xs.append((c, from_global(a, grid=grid, split=(0, None))))
    times = np.zeros((rounds, 2, 2))
    for r in range(rounds + 1):
        for j, (c, x) in enumerate(xs):
            g = filled_like(x, 1)
            comm.Barrier()
            t0 = time.perf_counter()
            y = layer(Tensor(x, requires_grad=True))
            t1 = time.perf_counter()
            y.backward(g)
            t2 = time.perf_counter()
            if r:
                times[r - 1, j] = (t1 - t0, t2 - t1)
    agreed = np.empty_like(times)
    comm.Allreduce(times, agreed, op=MPI.MAX)
    diff = np.median(agreed[:, 0] - agreed[:, 1], axis=0)  # paired by round: drift cancels
    return max(float(diff[0]), 0.0), max(float(diff[1]), 0.0)


# -- candidate grids -----------------------------------------------------------------------------
def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_grids(nranks: int, batch: int, spatial: Sequence[int],
                    symmetric: bool = True) -> list[tuple[int, int, int, int]]:
    """Every grid ``(s, d, h, w)`` with ``s * d * h * w == nranks`` and ``s`` dividing
    ``batch``, ``d``/``h``/``w`` at most the extents ``spatial`` (pure).  With ``symmetric``,
    on axes of equal extent only the non-increasing splits are kept (``(2, 1)`` not ``(1, 2)``:
    the same blocks up to a permutation, and cutting outer axes gives contiguous blocks).
    Sorted by ``s`` descending, then the spatial splits descending."""
    if nranks < 1 or batch < 1:
        raise ValueError(f"enumerate_grids: nranks and batch must be >= 1, got {nranks}, "
                         f"{batch}")
    spatial = tuple(int(n) for n in spatial)
    if len(spatial) != 3:
        raise ValueError(f"enumerate_grids: 3 spatial extents expected, got {spatial}")
    out = []
    for s in _divisors(nranks):
        if batch % s:
            continue
        rest = nranks // s
        for d in _divisors(rest):
            for h in _divisors(rest // d):
                w = rest // (d * h)
                split = (d, h, w)
                if any(p > n for p, n in zip(split, spatial)):
                    continue
                if symmetric and any(spatial[i] == spatial[i + 1] and split[i] < split[i + 1]
                                     for i in range(2)):
                    continue
                if symmetric and spatial[0] == spatial[2] and split[0] < split[2]:
                    continue
                out.append((s, d, h, w))
    return sorted(out, key=lambda g: (-g[0], tuple(-v for v in g[1:])))


# -- layer geometry (pure) -----------------------------------------------------------------------
_POINTWISE = ("ReLU", "LeakyReLU", "ELU", "Sigmoid", "Tanh", "ScaledTanh", "Softmax",
              "LogSoftmax", "Dropout", "Identity", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d")


def _balanced(n: int, p: int) -> list[int]:
    """Offsets ``(0, ..., n)`` of a balanced split (remainder to the low coordinates)."""
    off = [0]
    for c in range(p):
        off.append(off[-1] + n // p + (c < n % p))
    return off


def _windows(layer, nd: int):
    """The per-axis windows of a convolution or pooling layer, or ``None``."""
    name = type(layer).__name__
    if name.startswith("Conv") and "Transpose" not in name:
        k, st, dl = layer.kernel_size, layer.stride, layer.dilation
        pads = normalize_padding(layer.padding, nd, k, dl)
        periodic = getattr(layer, "padding_mode", "zeros") == "circular"
        return tuple(AxisWindow(k[i], st[i], dl[i], pads[i][0], pads[i][1], periodic)
                     for i in range(nd))
    if name.startswith(("MaxPool", "AvgPool")):
        k = normalize_tuple(layer.kernel_size, nd, "kernel_size")
        st = normalize_tuple(layer.stride if layer.stride is not None else layer.kernel_size,
                             nd, "stride")
        pads = normalize_padding(layer.padding, nd, k)
        return tuple(AxisWindow(k[i], st[i], 1, pads[i][0], pads[i][1]) for i in range(nd))
    return None


@dataclass(frozen=True)
class LayerGeometry:
    """What one layer does to the slowest rank's block on one grid (pure result of
    :func:`analyze_layers`).

    ``kind``: ``window``, ``pointwise``, ``flatten``, ``dense`` or ``opaque``;
    ``time_shape``: the input shape to time the layer on (one rank, ``COMM_SELF``), ``()``
    when the rank owns no output; ``time_pads``: for windowed layers, the ``(lo, hi)``
    padding per spatial axis of that local problem (:func:`timing_layer`);
    ``in_bytes``/``out_bytes``: the slowest rank's input (with halo) and output block bytes;
    ``halo_bytes``/``halo_pieces``: what its halo exchange receives (forward; the reverse
    exchange sends the same back);
    ``gather_bytes``/``gather_peers``: flatten's gather; ``allreduces``: extra small
    all-reduces per pass (global batch norm); ``param_bytes``: its parameters;
    ``saved_bytes``: what it keeps for backward (approximation)."""
    name: str
    kind: str
    time_shape: tuple
    in_bytes: int
    out_bytes: int
    halo_bytes: int = 0
    halo_pieces: int = 0
    gather_bytes: int = 0
    gather_peers: int = 0
    allreduces: int = 0
    param_bytes: int = 0
    saved_bytes: int = 0
    time_pads: tuple | None = None


def timing_layer(layer, geom: LayerGeometry):
    """The layer to time on ``geom.time_shape``: ``layer`` itself, or for a windowed layer a
    shallow copy (sharing the parameters) whose padding is the slowest block's local padding
    (``geom.time_pads``: padding at global boundaries only, the halo being part of the
    block), so the local kernel solves exactly the problem that block solves; for an
    opaque layer (a whole model) a copy whose ``input_size``/``input_shape`` check, if any,
    accepts the local block."""
    if geom.kind == "opaque" and geom.time_shape:
        # a whole model checking its sample shape (U-Net's input_size, CosmoFlow's
        # input_shape): let the copy accept the local block
        clone = copy.copy(layer)
        for attr, val in (("input_size", tuple(geom.time_shape[2:])),
                          ("input_shape", tuple(geom.time_shape[1:]))):
            if getattr(clone, attr, None) is not None:
                object.__setattr__(clone, attr, val)
        return clone
    if geom.time_pads is None:
        return layer
    clone = copy.copy(layer)
    clone.padding = tuple(geom.time_pads)
    return clone


class InvalidGrid(ValueError):
    """The grid cannot run the model (raised by :func:`analyze_layers`)."""


def analyze_layers(layers: Sequence, input_shape: Sequence[int], batch: int,
                   grid: Sequence[int], itemsize: int = 4) -> list[LayerGeometry]:
    """The geometry of every layer on ``grid`` ``(s, d, h, w)`` for a global batch ``batch``
    of samples of shape ``input_shape`` ``(C, D, H, W)`` (pure, window math only).

    Raises :class:`InvalidGrid` (a ``ValueError``) when the sample axis does not divide the
    batch, an axis has more ranks than cells, or the split is too fine for a layer's halo (a
    block of a windowed layer's input empty or narrower than the halo it must send), and
    ``ValueError`` for a layer that cannot be modelled before the last position."""
    s, *sp = (int(g) for g in grid)
    C, *ext = (int(v) for v in input_shape)
    if len(sp) != 3 or len(ext) != 3:
        raise ValueError(f"analyze_layers: grid (s, d, h, w) and input_shape (C, D, H, W) "
                         f"expected, got {tuple(grid)} and {tuple(input_shape)}")
    if batch % s:
        raise InvalidGrid(f"the batch {batch} is not divisible by the {s} ranks of the sample "
                          "axis")
    for p, n, ax in zip(sp, ext, "dhw"):
        if p > n:
            raise InvalidGrid(f"{p} ranks along {ax} for an extent of {n}")
    b = batch // s
    offs = [_balanced(n, p) for n, p in zip(ext, sp)]
    chans, flat = C, None     # flat: features per sample once flattened
    out = []
    layers = list(layers)
    for i, layer in enumerate(layers):
        name = f"{i}:{type(layer).__name__}"
        tname = type(layer).__name__
        pbytes = int(sum(p.data.nbytes for p in layer.parameters()))
        blocks = [max(o[j + 1] - o[j] for j in range(len(o) - 1)) for o in offs]
        vol = b * chans * math.prod(blocks) * itemsize if flat is None else b * flat * itemsize
        win = _windows(layer, 3) if flat is None else None
        if win is not None:
            new, tshape, tpads, hbox, pieces = [], [], [], [], 1
            for ax, (w, o) in enumerate(zip(win, offs)):
                n = o[-1]
                oo = w.output_offsets(o)
                lo, hi = w.halo(o) if len(o) > 2 else (0, 0)
                sizes = [o[j + 1] - o[j] for j in range(len(o) - 1)]
                if len(o) > 2 and (min(sizes) == 0 or
                                   (lo and min(sizes[:-1]) < lo) or (hi and min(sizes[1:]) < hi)):
                    raise InvalidGrid(f"layer {name}: a split of {n} cells into "
                                      f"{len(sizes)} blocks {sizes} is too fine for its halo "
                                      f"({lo}, {hi})")
                # the slowest block: most outputs, then the widest read window; its local
                # problem is the read window with padding at global boundaries only
                best = (0, 0, (0, 0))
                for j in range(len(sizes)):
                    o0, o1 = oo[j], oo[j + 1]
                    if o1 > o0:
                        rlo, rhi = w.read_range(o0, o1, n)
                        best = max(best, (o1 - o0, rhi - rlo, w.local_pads(o0, o1, n)))
                if w.periodic:  # the halo carries the wrapped cells: time the layer's own
                    m = best[0]
                    best = (m, max((m - 1) * w.stride + w.span - w.pad_lo - w.pad_hi, 1),
                            (w.pad_lo, w.pad_hi))
                tshape.append(best[1] if best[0] else 0)
                tpads.append(tuple(best[2]))
                box, j = max((sizes[j] + (lo if j > 0 else 0)
                              + (hi if j < len(sizes) - 1 else 0), j) for j in range(len(sizes)))
                hbox.append(box)
                # neighbour pieces along this axis of the block with the largest halo'd box
                pieces *= 1 + (lo > 0 and j > 0) + (hi > 0 and j < len(sizes) - 1)
                new.append(list(oo))
            cout = layer.out_channels if hasattr(layer, "out_channels") else chans
            in_vol = b * chans * math.prod(hbox) * itemsize
            halo_b = in_vol - vol
            outb = b * cout * math.prod(max(o[j + 1] - o[j] for j in range(len(o) - 1))
                                        for o in new) * itemsize
            empty = any(v == 0 for v in tshape)
            out.append(LayerGeometry(name, "window", () if empty else (b, chans, *tshape),
                                     in_vol, outb, halo_b, pieces - 1 if halo_b else 0,
                                     param_bytes=pbytes, saved_bytes=in_vol,
                                     time_pads=tuple(tpads)))
            offs, chans = new, cout
        elif tname in _POINTWISE:
            shape = (b, chans, *blocks) if flat is None else (b, flat)
            bn = tname.startswith("BatchNorm") and getattr(layer, "stats", "global") == "global"
            out.append(LayerGeometry(name, "pointwise", shape, vol, vol,
                                     allreduces=2 if bn else 0, param_bytes=pbytes,
                                     saved_bytes=vol))
        elif tname == "Flatten":
            if flat is not None:
                out.append(LayerGeometry(name, "pointwise", (b, flat), vol, vol))
                continue
            peers = math.prod(sp)
            cur = [o[-1] for o in offs]
            full = b * chans * math.prod(cur) * itemsize
            out.append(LayerGeometry(name, "flatten", (b, chans, *cur), vol, full,
                                     gather_bytes=full - vol if peers > 1 else 0,
                                     gather_peers=peers - 1))
            flat = chans * math.prod(cur)
        elif tname == "Linear":
            if flat is None or flat != layer.in_features:
                raise ValueError(f"analyze_layers: layer {name} takes {layer.in_features} "
                                 f"features, the input has "
                                 f"{'a spatial shape' if flat is None else flat}")
            outb = b * layer.out_features * itemsize
            out.append(LayerGeometry(name, "dense", (b, flat), vol, outb, param_bytes=pbytes,
                                     saved_bytes=vol))
            flat = layer.out_features
        else:
            if i != len(layers) - 1:
                raise ValueError(f"analyze_layers: cannot model layer {name} before the last "
                                 "position (only convolution, pooling, pointwise, flatten and "
                                 "linear layers are modelled; an unknown layer must be last)")
            # a model that needs extents divisible by 2**levels (U-Net) is timed on the block
            # rounded up to that (the distributed ops themselves take any split)
            q = 2 ** int(getattr(layer, "levels", 0) or 0)
            shape = (b, chans, *(-(-n // q) * q for n in blocks)) if flat is None else (b, flat)
            leaves = max(sum(1 for m in layer.modules() if not m._modules), 1)
            out.append(LayerGeometry(name, "opaque", shape, vol, vol, param_bytes=pbytes,
                                     saved_bytes=vol * leaves))
    return out


# -- formulas (pure) ---------------------------------------------------------------------------
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

    def report(self) -> str:
        lines = [f"grid {self.grid}: step {self.step_s * 1e3:.2f} ms (forward "
                 f"{self.forward_s * 1e3:.2f}, backward {self.backward_s * 1e3:.2f}, "
                 f"exposed all-reduce {self.allreduce_s * 1e3:.2f}, optimizer "
                 f"{self.optimizer_s * 1e3:.2f}), memory {self.memory['total'] / 2 ** 20:.1f} "
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
    extra = red.alpha if many else 0.0
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


# -- measured compute --------------------------------------------------------------------------
def _layer_key(layer) -> tuple:
    return (type(layer).__name__, layer.extra_repr(),
            tuple(tuple(p.data.shape) for p in layer.parameters()))


class LayerTimer:
    """Times layers on local blocks over ``COMM_SELF``, collectively over ``comm``, with a
    cache per (layer geometry, shape, dtype).

    :meth:`time_all` takes a list of ``(layer, shape, input_grad)`` jobs that must be the
    same on every rank of ``comm``; every rank runs them in that order (a barrier before each
    block and round, so ranks measure concurrently) and one ``Allreduce(MAX)`` makes the
    result identical everywhere.
    A block that fails to run gives ``inf`` on every rank.  The rounds of a block are
    synchronised (a barrier before each) and the slowest rank's time of each round is
    taken before the median over rounds: the step waits for the slowest rank of every
    layer."""

    def __init__(self, comm: MPI.Comm, dtype, device: str = "cpu", repeats: int = 2,
                 warmup: int = 1, chunk_bytes: int = 256 * 2 ** 20):
        self.comm, self.dtype, self.device = comm, np.dtype(dtype), device
        self.repeats, self.warmup = int(repeats), int(warmup)
        self.chunk_bytes = int(chunk_bytes)
        self.cache: dict = {}

    def _prepared(self, layer, shape, input_grad: bool):
        """A function timing one round of ``layer`` on a block of ``shape``: forward,
        backward; returns ``(forward_s, backward_s)`` (local: the caller synchronises).
        Side effects on the layer are undone (as
        :func:`~disttensor.nn.partition.profile_layers` does)."""
        from ...autograd.tensor import Tensor, filled_like
        from ...core.array import DistArray
        from ...routines.creation import from_global
        from ...core.grid import ProcessGrid
        from ..partition import _Isolated, _sync
        a = np.random.default_rng(0).standard_normal(shape).astype(self.dtype)
        grid = ProcessGrid((1,) * (len(shape) - 1), comm=MPI.COMM_SELF)
        x = from_global(a, grid=grid, split=(0, None) + tuple(range(1, len(shape) - 1)),
                        device=self.device)
        state = {}  # the output's layout, for the ones gradient (known after one forward)

        def run():
            with _Isolated([layer], grid):
                xt = Tensor(x, requires_grad=input_grad)
                tmpl = state.get("out")
                g = None if tmpl is None else filled_like(tmpl, 1)
                t0 = time.perf_counter()
                y = layer(xt)
                _sync(y.data)
                t1 = time.perf_counter()
                if y.requires_grad:
                    if g is None and isinstance(y.data, DistArray):
                        state["out"] = y.data
                        g = filled_like(y.data, 1)  # first (warm-up) round only
                    y.backward(g)
                _sync(y.data)
                t2 = time.perf_counter()
            return t1 - t0, t2 - t1
        return run, x.local.nbytes

    def time_all(self, jobs: Sequence[tuple]) -> list[tuple[float, float]]:
        """``(forward_s, backward_s)`` per ``(layer, shape, input_grad)`` job (collective):
        the median over rounds of the slowest rank's time in each round.  ``input_grad``:
        whether backward computes the gradient of the layer's input (not for the first
        layer, whose input is the data).  The rounds of the distinct blocks are interleaved
        (in chunks of at most ``chunk_bytes`` of inputs), so drifting load hits them alike."""
        tune = os.environ.get("DISTTENSOR_CONV_TUNE", "")  # the kernels' algorithm choice
        keys = [(_layer_key(layer), tuple(shape), bool(ig), self.dtype.str, tune)
                for layer, shape, ig in jobs]
        todo, seen = [], set()
        for k, (layer, shape, ig) in zip(keys, jobs):
            if k not in self.cache and k not in seen and len(shape):
                seen.add(k)
                todo.append((k, layer, tuple(shape), ig))
        R = self.repeats
        mine = np.zeros((len(todo), R, 2))
        start = 0
        while start < len(todo):
            runs, nbytes, stop = [], 0, start
            while stop < len(todo) and (stop == start or nbytes < self.chunk_bytes):
                k, layer, shape, ig = todo[stop]
                try:
                    run, nb = self._prepared(layer, shape, ig)
                    nbytes += nb
                except Exception:  # noqa: BLE001 - an unrunnable block: inf on every rank
                    run = None
                runs.append(run)
                stop += 1
            for r in range(self.warmup + R):
                for j, run in enumerate(runs):
                    # one barrier per block and round on every rank, whatever failed where:
                    # the ranks run each block together and never lose step
                    self.comm.Barrier()
                    if run is None:
                        mine[start + j] = math.inf
                        continue
                    try:
                        t = run()
                    except Exception:  # noqa: BLE001
                        runs[j] = None
                        mine[start + j] = math.inf
                        continue
                    if r >= self.warmup:
                        mine[start + j, r - self.warmup] = t
            start = stop
        agreed = np.empty_like(mine)
        self.comm.Allreduce(mine, agreed, op=MPI.MAX)
        for j, (k, _, _, _) in enumerate(todo):
            self.cache[k] = (float(np.median(agreed[j, :, 0])),
                             float(np.median(agreed[j, :, 1])))
        return [self.cache.get(k, (0.0, 0.0)) if len(shape) else (0.0, 0.0)
                for k, (_, shape, _) in zip(keys, jobs)]


def _optimizer_time(params, optimizer: str, dtype, comm, repeats: int) -> float:
    """Seconds of one optimizer step over copies of ``params`` (collective: max over
    ranks)."""
    from .. import optim
    from ..module import Parameter
    if optimizer == "none":
        return 0.0
    copies = [Parameter(p.data.copy()) for p in params]
    for c in copies:
        c.grad = c.data * 0 + 1
    opt = {"sgd": lambda ps: optim.SGD(ps, lr=1e-3, momentum=0.9),
           "adamw": lambda ps: optim.AdamW(ps, lr=1e-3)}.get(
        optimizer, lambda ps: optim.Adam(ps, lr=1e-3))(copies)
    if not copies:
        return 0.0
    opt.step()
    mine = _median_time(opt.step, repeats)
    return float(comm.allreduce(mine, op=MPI.MAX))


# -- the plan ----------------------------------------------------------------------------------
@dataclass
class GridPlan:
    """:func:`plan_grid`'s result (identical on every rank): ``ranked`` predictions of the
    feasible grids, fastest first; ``excluded`` ``(grid, reason)`` of the others; ``links``
    the measured link model."""
    ranked: list
    excluded: list = field(default_factory=list)
    links: LinkModel = LinkModel()
    memory_limit: float | None = None

    @property
    def best(self) -> GridPrediction:
        return self.ranked[0]

    def report(self, top: int | None = None) -> str:
        """A short ranked table (``top`` rows; all when ``None``) and the exclusions."""
        rows = self.ranked if top is None else self.ranked[:top]
        lines = [f"grid plan (predicted step per grid (sample, d, h, w); links: p2p "
                 f"{self.links.p2p.alpha * 1e6:.1f} us + {self.links.p2p.bandwidth / 1e9:.2f} "
                 f"GB/s, all-reduce {self.links.allreduce.alpha * 1e6:.1f} us + "
                 f"{self.links.allreduce.bandwidth / 1e9:.2f} GB/s, per op "
                 f"{self.links.op_forward_s * 1e6:.0f}/{self.links.op_backward_s * 1e6:.0f} us "
                 "forward/backward):"]
        for k, p in enumerate(rows):
            lines.append(f"  {k + 1}. {'x'.join(map(str, p.grid)):10s} {p.step_s * 1e3:9.2f} ms"
                         f"  (compute+halo {(p.forward_s + p.backward_s) * 1e3:8.2f}, "
                         f"all-reduce {p.allreduce_s * 1e3:6.2f}, optimizer "
                         f"{p.optimizer_s * 1e3:6.2f})  {p.memory['total'] / 2 ** 20:8.1f} MiB")
        if top is not None and len(self.ranked) > top:
            lines.append(f"  ... {len(self.ranked) - top} more")
        for g, why in self.excluded:
            lines.append(f"  excluded {'x'.join(map(str, g))}: {why}")
        return "\n".join(lines)


def plan_grid(model: Module, input_shape: Sequence[int], batch: int, nranks: int | None = None,
              memory_limit: float | None = None, *, comm: MPI.Comm | None = None,
              optimizer: str = "adam", bucket_bytes: int = DEFAULT_BUCKET_BYTES,
              overlap: bool = True, halo_overlap: bool | None = None,
              candidates: Sequence[Sequence[int]] | None = None, quick: bool = False,
              repeats: int | None = None, links: LinkModel | None = None,
              timer: LayerTimer | None = None, dtype=None,
              tune_kernels: bool | None = None) -> GridPlan:
    """Rank the grids ``(sample, d, h, w)`` of ``nranks`` ranks for training ``model`` on a
    global batch of ``batch`` samples of shape ``input_shape`` ``(C, D, H, W)`` by predicted
    step time (collective over ``comm``, an ``MPI.Comm`` or a ``ProcessGrid``, default
    ``COMM_WORLD``; the result is identical on every rank).

    ``nranks``: ranks of the grid (default ``comm.size``; the links are measured on ``comm``
    whatever it is). ``memory_limit``: bytes per rank; grids predicted over it
    (:func:`estimate_memory`) are excluded before any timing.
    ``optimizer``: ``sgd``, ``adam``, ``adamw`` (its state and step time); ``bucket_bytes``
    and ``overlap``: the gradient reducer's; ``halo_overlap``: whether windowed ops overlap
    their halo exchange (default: on GPU only, as the convolution does); ``candidates``: the
    grids to consider (default :func:`enumerate_grids`); ``quick``: 3 timed rounds per block
    instead of 5 and fewer message sizes (a few seconds on small models); ``repeats``: timed
    rounds per block; ``links``/``timer``: reuse earlier measurements; ``dtype``: of the
    activations (default: the parameters'; ``float16`` for mixed precision);
    ``tune_kernels``: let the convolution kernels tune their algorithms on every candidate
    block as the run will (default: not in ``quick`` mode, where the algorithms come from
    their cost models, ``DISTTENSOR_CONV_TUNE=heuristic``, unless that variable is set:
    tuning every candidate's blocks costs seconds per layer on the first planning on a
    machine; the tuned choices are cached on disk).

    Every candidate is analysed (:func:`analyze_layers`), its distinct local blocks timed
    (:class:`LayerTimer`), and predicted (:func:`predict_grid`); see the module docstring
    for the model and its assumptions.  Raises ``ValueError`` on every rank for bad
    arguments, a model that cannot be modelled, or when no grid is valid and fits."""
    comm = MPI.COMM_WORLD if comm is None else comm
    if not isinstance(comm, MPI.Comm) and hasattr(comm, "comm"):  # a ProcessGrid
        comm = comm.comm
    raw_shape = input_shape
    layers = sequential_layers(model)
    params = list(model.parameters())
    device = getattr(params[0], "device", "cpu") if params else "cpu"
    with collective(comm, "plan_grid", input_shape=repr(raw_shape), batch=batch, nranks=nranks,
                    memory_limit=memory_limit, optimizer=optimizer, bucket_bytes=bucket_bytes,
                    overlap=overlap, halo_overlap=halo_overlap, quick=quick,
                    repeats=repeats, tune_kernels=tune_kernels,
                    layers=[_layer_key(l) for l in layers],
                    candidates=None if candidates is None else [tuple(c) for c in candidates],
                    dtype=None if dtype is None else str(dtype)):
        try:
            dtype = np.dtype(dtype if dtype is not None else
                             params[0].data.dtype if params else "float32")
        except TypeError:
            raise ValueError(f"plan_grid: dtype {dtype!r} is not a NumPy dtype") from None
        nranks = comm.size if nranks is None else nranks
        try:
            input_shape = tuple(int(v) for v in raw_shape)
        except (TypeError, ValueError):
            raise ValueError(f"plan_grid: input_shape must be (C, D, H, W), got "
                             f"{raw_shape!r}") from None
        if not isinstance(batch, (int, np.integer)) or batch < 1:
            raise ValueError(f"plan_grid: batch must be a positive integer, got {batch!r}")
        if not isinstance(nranks, (int, np.integer)) or nranks < 1:
            raise ValueError(f"plan_grid: nranks must be a positive integer, got {nranks!r}")
        if len(input_shape) != 4 or min(input_shape) < 1:
            raise ValueError(f"plan_grid: input_shape must be (C, D, H, W), got {input_shape}")
        if optimizer not in OPTIMIZER_STATE:
            raise ValueError(f"plan_grid: optimizer must be one of {tuple(OPTIMIZER_STATE)}, "
                             f"got {optimizer!r}")
        if memory_limit is not None and not memory_limit > 0:
            raise ValueError(f"plan_grid: memory_limit must be positive bytes, got "
                             f"{memory_limit!r}")
        if not layers:
            raise ValueError("plan_grid: the model has no layers")
        grids = enumerate_grids(nranks, batch, input_shape[1:]) if candidates is None else \
            [tuple(int(v) for v in c) for c in candidates]
        for g in grids:
            if len(g) != 4 or math.prod(g) != nranks:
                raise ValueError(f"plan_grid: candidate {g} is not a 4-axis grid of {nranks} "
                                 "ranks")
        if not grids:
            raise ValueError(f"plan_grid: no grid of {nranks} ranks has a sample axis dividing "
                             f"the batch {batch}")
        owner = {id(p): i for i, layer in enumerate(layers) for p in layer.parameters()}
        param_layers = [(owner.get(id(p), 0), int(p.data.size) * max(4, p.data.dtype.itemsize))
                        for p in params if p.requires_grad]
        pbytes = sum(n for _, n in param_layers)
        geoms, excluded = {}, []
        for g in grids:
            try:
                gl = analyze_layers(layers, input_shape, batch, g, dtype.itemsize)
            except InvalidGrid as e:
                excluded.append((g, str(e)))
                continue
            mem = estimate_memory(gl, pbytes, OPTIMIZER_STATE[optimizer])["total"]
            if memory_limit is not None and mem > memory_limit:
                excluded.append((g, f"predicted {mem / 2 ** 20:.1f} MiB per rank over the "
                                    f"limit {memory_limit / 2 ** 20:.1f} MiB"))
                continue
            geoms[g] = gl
    # everything above is pure given agreed arguments: every rank has the same geometries
    # (grids over the memory limit are excluded before any timing)
    links = measure_links(comm, quick=quick) if links is None else links
    reps = repeats or (3 if quick else 5)
    timer = LayerTimer(comm, dtype, device, repeats=reps, warmup=1) if timer is None else timer

    with collective(comm):
        jobs = [(timing_layer(layer, gm), gm.time_shape, i > 0) for g, gl in geoms.items()
                for i, (layer, gm) in enumerate(zip(layers, gl))]
    tune = (not quick) if tune_kernels is None else bool(tune_kernels)
    env = "DISTTENSOR_CONV_TUNE"
    saved_env = os.environ.get(env)
    if not tune and saved_env is None:
        os.environ[env] = "heuristic"
    try:
        measured = timer.time_all(jobs)
    finally:
        if not tune and saved_env is None:
            os.environ.pop(env, None)
    opt_s = _optimizer_time(params, optimizer, dtype, comm, reps)
    ranked, k = [], 0
    for g, gl in geoms.items():
        ts = measured[k:k + len(gl)]
        k += len(gl)
        if any(math.isinf(f) or math.isinf(b) for f, b in ts):
            bad = next(gm.name for (f, b), gm in zip(ts, gl) if math.isinf(f + b))
            excluded.append((g, f"layer {bad} failed to run on its local block"))
            continue
        pred = predict_grid(g, gl, ts, links, param_layers, opt_s, bucket_bytes, overlap,
                            device == "cuda" if halo_overlap is None else halo_overlap,
                            OPTIMIZER_STATE[optimizer])
        ranked.append(pred)
    ranked.sort(key=lambda p: (p.step_s, p.grid))
    with collective(comm):
        if not ranked:
            raise ValueError("plan_grid: no valid grid fits: " + "; ".join(
                f"{'x'.join(map(str, g))}: {why}" for g, why in excluded))
    return GridPlan(ranked, excluded, links, memory_limit)
