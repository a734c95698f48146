"""``sparsify(model, min_sparsity)`` (``disttensor.nn.sparsify``): convert the pruned (or
mostly zero) Linear and Conv3d layers of a model to
:class:`~disttensor.nn.sparse_layers.SparseLinear` /
:class:`~disttensor.nn.sparse_layers.SparseConv3d` where the measured sparse kernel is faster.

For each candidate (sparsity of its weight, counted on its pruning mask when it has one, at
least ``min_sparsity``) the layer's local forward product is timed dense (NumPy BLAS: ``x @
W.T``; the library's convolution kernel) and sparse (CSB ``W @ X``; im2col + CSB) on the
layer's own shapes: the input shapes seen in a forward pass of ``example`` when given, else
``batch`` samples (and ``spatial`` extents for convolutions).  Rank 0 measures and decides;
the decision is broadcast over ``comm``, so every rank converts the same layers (collective).
"""
from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from ..autograd.tensor import no_grad
from ..core.backend import array_module, to_host
from .layers import Conv3d, Linear
from .module import Module

__all__ = ["sparsify", "time_layer"]


def _median_seconds(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def _weight_sparsity(layer) -> float:
    mask = layer._buffers.get("weight_mask")
    a = to_host(layer.weight.data if mask is None else mask)
    return 1.0 - np.count_nonzero(a) / max(a.size, 1)


def time_layer(layer, sparse, in_shape, repeats: int = 5) -> tuple[float, float]:
    """Median seconds of ``layer``'s local forward product, dense and with the sparse twin
    ``sparse``, on a random input of ``in_shape`` (rank-local, no communication)."""
    rng = np.random.default_rng(0)
    dtype = layer.weight.data.dtype
    xp = array_module(layer.weight.data)
    x = xp.asarray(rng.standard_normal(in_shape).astype(dtype))
    a = sparse.weight()
    if isinstance(layer, Linear):
        w = layer.weight.data
        xt = xp.ascontiguousarray(x.T)
        return (_median_seconds(lambda: x @ w.T, repeats),
                _median_seconds(lambda: a @ xt, repeats))
    from ..ops.local import kernels_for
    from ..ops.window import normalize_padding
    from .sparse_ops import _columns
    k = kernels_for(x)
    pads = normalize_padding(layer.padding, 3, layer.kernel_size, layer.dilation)
    lo, hi = tuple(p[0] for p in pads), tuple(p[1] for p in pads)
    w = layer.weight.data
    dense = _median_seconds(lambda: k.conv_forward(x, w, layer.stride, layer.dilation, lo, hi,
                                                   1), repeats)
    out = k.conv_forward(x, w, layer.stride, layer.dilation, lo, hi, 1).shape[2:]
    geo = (tuple(layer.stride), tuple(layer.dilation))

    def sparse_run():
        for s in range(x.shape[0]):
            a @ _columns(x[s], layer.kernel_size, out, geo, lo)
    return dense, _median_seconds(sparse_run, repeats)


def _record_shapes(model: Module, example, layers) -> dict:
    """Input shapes (global) of ``layers`` in a forward pass of ``example``."""
    shapes = {}

    def wrap(m):
        inner = type(m).forward

        def forward(x):
            shapes[id(m)] = tuple(x.shape)
            return inner(m, x)
        return forward
    for m in layers:
        object.__setattr__(m, "forward", wrap(m))
    try:
        with no_grad():
            model(example)
    finally:
        for m in layers:
            del m.__dict__["forward"]
    return shapes


def sparsify(model: Module, min_sparsity: float = 0.9, measure: bool = True, example=None,
             batch: int = 32, spatial=(8, 8, 8), repeats: int = 5, block_size=None,
             comm=None) -> list[dict]:
    """Replace, in place, the Linear / Conv3d (groups 1, zero padding) layers of ``model``
    whose weight sparsity is at least ``min_sparsity`` and whose sparse kernel measured faster
    than the dense one (``measure=False``: convert every such layer unmeasured).  Returns one
    dict per candidate: ``name``, ``kind``, ``sparsity``, ``dense_s``, ``sparse_s`` (median
    seconds, ``None`` unmeasured), ``converted``.  Collective over ``comm`` (default
    ``COMM_WORLD``): rank 0's measurements decide for every rank."""
    from .sparse_layers import SparseConv3d, SparseLinear
    comm = MPI.COMM_WORLD if comm is None else comm
    if not 0.0 <= float(min_sparsity) <= 1.0:
        raise ValueError(f"min_sparsity must be in [0, 1], got {min_sparsity}")
    found = []
    for pname, parent in model.named_modules():
        for name, child in parent._modules.items():
            ok = isinstance(child, Linear) or (isinstance(child, Conv3d) and child.groups == 1
                                               and child.padding_mode == "zeros")
            if ok and _weight_sparsity(child) >= min_sparsity:
                found.append((f"{pname}.{name}" if pname else name, parent, name, child))
    shapes = _record_shapes(model, example, [c for *_, c in found]) \
        if example is not None and measure and found else {}
    report = []
    for full, parent, name, child in found:
        make = SparseLinear if isinstance(child, Linear) else SparseConv3d
        sparse = make.from_dense(child, block_size)
        entry = {"name": full, "kind": type(child).__name__,
                 "sparsity": _weight_sparsity(child), "dense_s": None, "sparse_s": None}
        if measure:
            shape = shapes.get(id(child))
            if shape is None:
                shape = (batch, child.in_features) if make is SparseLinear else \
                    (batch, child.in_channels) + tuple(spatial)
            times = time_layer(child, sparse, shape, repeats) if comm.rank == 0 else None
            entry["dense_s"], entry["sparse_s"] = comm.bcast(times, root=0)
            entry["converted"] = entry["sparse_s"] < entry["dense_s"]
        else:
            entry["converted"] = True
        if entry["converted"]:
            parent._modules[name] = sparse
        report.append(entry)
    return report


def describe(report: list[dict]) -> str:
    """The :func:`sparsify` report as lines of text."""
    lines = []
    for e in report:
        t = "" if e["dense_s"] is None else \
            f" dense {e['dense_s'] * 1e3:.3f} ms sparse {e['sparse_s'] * 1e3:.3f} ms " \
            f"({e['dense_s'] / max(e['sparse_s'], 1e-12):.2f}x)"
        lines.append(f"{e['name']} ({e['kind']}, sparsity {e['sparsity']:.1%}):{t} "
                     f"{'converted' if e['converted'] else 'kept dense'}")
    return "\n".join(lines)


__all__ += ["describe"]
