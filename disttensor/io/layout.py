"""Pure index math of the I/O layer (no MPI, no h5py): global sub-selections and the file
hyperslab of a block, which rank writes a replicated block, how batches of samples are drawn
and dealt, and the encoding of distributions as HDF5 attributes.

Everything here is a function of replicated metadata, so every rank computes the same answer
without communication; it is property-tested in ``tests/unit/test_io_layout.py``.
"""
from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..core.distribution import Box, Distribution

__all__ = ["AxisSelection", "normalize_selection", "selection_shape", "file_hyperslab",
           "is_writer", "epoch_order", "batch_indices",
           "encode_distribution", "decode_distribution", "check_dataset_name"]


@dataclass(frozen=True)
class AxisSelection:
    """``range(start, start + step * count, step)`` along one axis of the file dataset."""

    start: int
    step: int
    count: int


def normalize_selection(slices, shape: Sequence[int]) -> tuple[AxisSelection, ...]:
    """Normalize a global sub-selection of a dataset of ``shape``.

    ``slices`` is ``None`` (everything), a ``slice``, or a tuple of ``slice`` objects (at most
    one per axis, missing trailing axes select everything).  Steps must be positive; bounds
    follow Python's rules (negative bounds count from the end, out-of-range bounds clip).
    Raises ``TypeError`` for entries that are not slices and ``ValueError`` for a step <= 0
    or too many entries."""
    shape = tuple(int(n) for n in shape)
    if slices is None:
        slices = ()
    elif isinstance(slices, slice):
        slices = (slices,)
    elif isinstance(slices, (tuple, list)):
        slices = tuple(slices)
    else:
        raise TypeError(f"slices must be a tuple of slice objects, got {type(slices).__name__}")
    if len(slices) > len(shape):
        raise ValueError(f"slices has {len(slices)} entries but the dataset has "
                         f"{len(shape)} axes (shape {shape})")
    out = []
    for t, n in enumerate(shape):
        s = slices[t] if t < len(slices) else slice(None)
        if not isinstance(s, slice):
            raise TypeError(f"slices[{t}] must be a slice (with step > 0), got {s!r}; "
                            "integer indices are not supported, use slice(i, i + 1)")
        for v in (s.start, s.stop, s.step):
            if v is not None and not isinstance(v, numbers.Integral):
                raise TypeError(f"slices[{t}] = {s!r} must have integer bounds and step")
        if s.step is not None and s.step <= 0:
            raise ValueError(f"slices[{t}] = {s!r}: the step must be > 0")
        start, stop, step = s.indices(n)
        count = len(range(start, stop, step))
        if count == 0:
            start = 0
        out.append(AxisSelection(start, step, count))
    return tuple(out)


def selection_shape(sel: Sequence[AxisSelection]) -> tuple[int, ...]:
    return tuple(a.count for a in sel)


def file_hyperslab(sel: Sequence[AxisSelection], box: Box) \
        -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """``(start, stride, count)`` in file coordinates of the part ``box`` (in selection
    coordinates) of the selection ``sel``."""
    start = tuple(a.start + a.step * b for a, b in zip(sel, box.start))
    stride = tuple(a.step for a in sel)
    return start, stride, box.shape


def is_writer(dist: Distribution, coords: Sequence[int]) -> bool:
    """Whether the rank at grid ``coords`` writes its block: exactly one replica of every block
    writes (the one at coordinate 0 along every replication axis), and empty blocks never do."""
    if any(coords[g] != 0 for g in dist.replicated_grid_axes):
        return False
    return dist.block_box(coords).size > 0


# -- sample batches --------------------------------------------------------------------------
def epoch_order(n_samples: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The order in which the samples of epoch ``epoch`` are visited: ``arange(n)`` without
    shuffling, else ``numpy.random.default_rng([seed, epoch]).permutation(n)`` (PCG64 seeded by
    a SeedSequence: the same on every rank, platform and NumPy version that keeps PCG64)."""
    if n_samples < 0:
        raise ValueError(f"number of samples must be >= 0, got {n_samples}")
    if not shuffle:
        return np.arange(n_samples, dtype=np.int64)
    if seed < 0 or epoch < 0:
        raise ValueError(f"seed and epoch must be >= 0, got seed={seed}, epoch={epoch}")
    return np.random.default_rng([int(seed), int(epoch)]).permutation(n_samples).astype(np.int64)


def batch_indices(n_samples: int, batch_size: int, seed: int, epoch: int, shuffle: bool,
                  drop_last: bool) -> list[np.ndarray]:
    """Sample indices of every batch of an epoch, in order (consecutive pieces of
    :func:`epoch_order`; the last one shorter unless ``drop_last``)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = epoch_order(n_samples, seed, epoch, shuffle)
    nb = n_samples // batch_size if drop_last else math.ceil(n_samples / batch_size)
    return [order[b * batch_size:(b + 1) * batch_size] for b in range(nb)]


# -- metadata as attributes ------------------------------------------------------------------
def encode_distribution(dist: Distribution) -> dict:
    """HDF5 attributes describing ``dist`` (plain ints and a JSON string; no pickle)."""
    return {
        "dt_shape": np.asarray(dist.shape, dtype=np.int64),
        "dt_grid_dims": np.asarray(dist.grid_dims, dtype=np.int64),
        "dt_split": np.asarray([-1 if g is None else g for g in dist.split], dtype=np.int64),
        "dt_offsets": json.dumps([list(o) for o in dist.offsets]),
    }


def decode_distribution(attrs) -> Distribution:
    """Inverse of :func:`encode_distribution` (``attrs`` is any mapping)."""
    try:
        shape = tuple(int(v) for v in np.asarray(attrs["dt_shape"]).reshape(-1))
        dims = tuple(int(v) for v in np.asarray(attrs["dt_grid_dims"]).reshape(-1))
        split = tuple(None if int(v) < 0 else int(v)
                      for v in np.asarray(attrs["dt_split"]).reshape(-1))
        off = attrs["dt_offsets"]
        if isinstance(off, bytes):
            off = off.decode()
        offsets = json.loads(off)
    except KeyError as e:
        raise ValueError(f"missing distribution attribute {e}") from None
    sizes = [None if g is None else [b - a for a, b in zip(o[:-1], o[1:])]
             for g, o in zip(split, offsets)]
    return Distribution(shape, dims, split, sizes)


def check_dataset_name(name, what: str = "dataset") -> str:
    """A dataset/object name inside a file: a non-empty ``str``, ``/``-separated, without empty
    or ``.``/``..`` components (a leading ``/`` is allowed and dropped)."""
    if not isinstance(name, str):
        raise TypeError(f"{what} name must be a str, got {type(name).__name__}")
    body = name[1:] if name.startswith("/") else name
    parts = body.split("/")
    if not body or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"invalid {what} name {name!r}")
    return body

