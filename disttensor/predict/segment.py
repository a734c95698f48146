"""Segmentation of volumes larger than the training samples, spatially parallel.

The volume (``(C, D, H, W)``, or ``(D, H, W)`` for one channel, in an HDF5 file) is read with
:func:`disttensor.io.read_hdf5` straight into blocks over the spatial axes of the grid
``(1, d, h, w)`` (each rank its hyperslab) and seen as a batch of one sample
``(1, C, D, H, W)``.  Two modes, both collective over the grid:

* **whole** (:func:`segment_whole`): the volume is padded with zeros at its far end to a
  multiple of the network's total downsampling factor (:func:`~disttensor.predict.model.
  downsampling`), redistributed to balanced blocks, and goes through ONE spatially parallel
  forward pass (the convolutions exchange halos between neighbouring blocks, the U-Net is
  fully convolutional); the argmax over the channel axis (never split) is taken block by
  block, and the label volume is cropped back to ``(D, H, W)``.  Peak memory is the
  activations of the whole volume, divided over the ranks.
* **sliding** (:func:`segment_sliding`, nnU-Net's inference): windows of the training patch
  size ``P`` at a step of ``step * P`` (:mod:`~disttensor.predict.windows`) cover the volume
  (zero-padded to at least ``P`` and a multiple of the downsampling factor).  Each window is
  cut out of the distributed volume by global slicing (``x[:, :, z:z+P, ...]``: each rank
  keeps what it owns), redistributed to balanced blocks over ALL ranks, and forwarded as one
  spatially split sample; its logits, multiplied by the Gaussian importance map, are
  accumulated into a distributed logits array ``(1, K, D, H, W)`` by global slice assignment
  (``acc[:, :, z:z+P, ...] += ...``; only the ranks owning the window's voxels receive data).
  Each rank then divides its block by the summed importance of the windows over it (computed
  locally, :func:`~disttensor.predict.windows.weight_block`) and takes the argmax.  Peak
  memory: one window's activations over all ranks plus the logits of the volume.

Labels are ``uint8`` for up to 256 classes, else ``int32``, distributed over the spatial
grid axes (the blocks the output writers write in parallel).
"""
from __future__ import annotations

import numpy as np

from ..autograd import Tensor, no_grad
from ..core.array import DistArray
from ..core.comm import collective
from ..core.distribution import Distribution
from ..io import read_hdf5
from ..routines.padding import pad
from .model import downsampling
from .windows import gaussian_importance, padded_extent, weight_block, window_boxes

__all__ = ["read_volume", "segment_whole", "segment_sliding", "segment"]

_SPLIT5 = (0, None, 1, 2, 3)


def read_volume(path, dataset: str, grid, channels: int, dtype, device="cpu") -> DistArray:
    """The volume of ``dataset`` in ``path`` as a ``(1, C, D, H, W)`` DistArray in ``dtype``,
    spatially split over the grid ``(1, d, h, w)`` (collective; ``ValueError`` on every rank
    when its channels are not the model's ``channels``)."""
    from ..io._h5file import probe, root_call
    meta = root_call(grid.cart, lambda: probe(path, [dataset])[dataset])
    shape = tuple(meta["shape"])
    with collective(grid.cart):
        if len(shape) == 3 and channels == 1:
            shape = (1,) + shape
        if len(shape) != 4 or shape[0] != channels:
            raise ValueError(f"dataset {dataset!r} of {path!r} has shape {tuple(meta['shape'])}"
                             f": the model takes a ({channels}, D, H, W) volume")
    split = (None, 1, 2, 3) if len(meta["shape"]) == 4 else (1, 2, 3)
    x = read_hdf5(path, dataset, grid=grid, split=split, device=device)
    d = x.distribution
    if x.ndim == 3:
        d = Distribution((1,) + d.shape, d.grid_dims, (None,) + d.split,
                         (None,) + d.split_sizes)
    dist = Distribution((1,) + d.shape, d.grid_dims, (0,) + d.split,
                        (None,) + d.split_sizes)
    local = x.local.reshape(dist.block_shape(grid.coords))
    if local.dtype != np.dtype(dtype):
        local = local.astype(dtype)
    return DistArray(local, dist, grid)


def _labels(logits: DistArray, weights=None) -> DistArray:
    """Argmax over the channels of the ``(1, K, D, H, W)`` logits, block by block (divided by
    the local ``weights`` block first when given): a ``(D, H, W)`` DistArray."""
    if logits.split[1] is not None:  # never in practice: the channels stay whole
        logits = logits.redistribute(split=(0, None) + logits.split[2:])
    loc = logits.local[0]
    if weights is not None:
        loc = loc / logits.xp.asarray(weights, dtype=loc.dtype)
    k = logits.shape[1]
    lab = logits.xp.argmax(loc, axis=0).astype(np.uint8 if k <= 256 else np.int32)
    return DistArray(lab, logits.distribution.drop_axes([0, 1]), logits.grid)


def _weighted(logits: DistArray, imp) -> DistArray:
    """The ``(1, K, *P)`` window logits times the importance map ``imp`` ``(*P)``, block by
    block (each rank multiplies by its part of the map; no message)."""
    box = logits.distribution.block_box(logits.grid.coords)
    part = imp[tuple(slice(a, b) for a, b in zip(box.start[2:], box.stop[2:]))]
    local = logits.local * logits.xp.asarray(part, dtype=logits.dtype)
    return DistArray(local, logits.distribution, logits.grid)


def _forward(model, x: DistArray) -> DistArray:
    with no_grad():
        y = model(Tensor(x))
    return y.data


def _padded(x: DistArray, shape) -> DistArray:
    """``x`` zero-padded at the far end of its spatial axes to ``shape``, in balanced blocks."""
    widths = [(0, 0), (0, 0)] + [(0, n - m) for n, m in zip(shape, x.shape[2:])]
    if any(b for _, b in widths):
        x = pad(x, widths)
    return x.redistribute(x.grid, split=_SPLIT5)


def segment_whole(model, x: DistArray) -> DistArray:
    """Labels of the ``(1, C, D, H, W)`` volume ``x`` by one forward pass (see the module
    docstring); collective over ``x.grid``."""
    f = downsampling(model)
    spatial = x.shape[2:]
    xp = _padded(x, tuple(padded_extent(n, f) for n in spatial))
    labels = _labels(_forward(model, xp))
    if labels.shape != spatial:
        labels = labels[tuple(slice(0, n) for n in spatial)]
    return labels


def segment_sliding(model, x: DistArray, window, step: float = 0.5,
                    sigma_scale: float = 0.125) -> DistArray:
    """Labels of the ``(1, C, D, H, W)`` volume ``x`` by nnU-Net's sliding windows of extents
    ``window`` with Gaussian blending (see the module docstring); collective over
    ``x.grid``."""
    f = downsampling(model)
    window = tuple(int(w) for w in window)
    with collective(x.grid.cart):
        if any(w % f for w in window):
            raise ValueError(f"the window {window} is not a multiple of the network's "
                             f"downsampling factor {f}")
    spatial = x.shape[2:]
    shape = tuple(max(n, w) for n, w in zip(spatial, window))
    xp = _padded(x, shape)
    boxes = window_boxes(shape, window, step)
    imp = gaussian_importance(window, sigma_scale)
    acc = None
    for box in boxes:
        key = (slice(None), slice(None)) + box
        win = xp[key].redistribute(xp.grid, split=_SPLIT5)
        logits = _forward(model, win)
        if acc is None:
            from ..routines.creation import zeros
            acc = zeros((1, logits.shape[1]) + shape, dtype=logits.dtype, grid=xp.grid,
                        split=_SPLIT5, device=logits.device)
        acc[key] += _weighted(logits, imp)
    block = acc.distribution.block_box(acc.grid.coords)
    wsum = weight_block(tuple(slice(a, b) for a, b in zip(block.start[2:], block.stop[2:])),
                        boxes, imp)
    labels = _labels(acc, wsum)
    if labels.shape != spatial:
        labels = labels[tuple(slice(0, n) for n in spatial)]
    return labels


def segment(trained, args, grid) -> DistArray:
    """``args.mode``'s labels of the volume ``args.data`` (collective over ``grid``)."""
    x = read_volume(args.data, args.x_dataset, grid, trained.sample_shape[0], trained.dtype,
                    args.device)
    if args.mode == "whole":
        return segment_whole(trained.model, x)
    return segment_sliding(trained.model, x, trained.sample_shape[1:], args.step,
                           args.sigma_scale)
