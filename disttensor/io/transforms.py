"""Read-time transforms of :class:`~disttensor.io.SampleDataset`: each rank on its own block.

Applied in this order to the samples ``x`` (every step optional):

1. **dtype conversion** to ``dtype`` (e.g. the int16 counts of the raw CosmoFlow files to
   ``float32`` or ``float16``), fused with the copy of the block read into the batch;
2. **log1p**: ``log(1 + x)`` (computed in ``dtype``, which must then be floating);
3. **division by the sample's mean** (``divide_by_mean``): ``x / mean(x)``, the mean over the
   whole sample as seen (every channel and voxel of the crop, after steps 1-2), accumulated in
   float64.  The ranks that share a sample add their partial sums in one small all-reduce per
   batch (the only communication of the transforms); a sample whose mean is 0 is left as it
   is.  (MLPerf HPC CosmoFlow's reference takes ``log1p`` *or* this division.)
4. **affine input normalization** ``(x - x_shift) / x_scale`` (scalars; e.g. centring
   ``log1p`` of counts), in ``dtype``, which must then be floating;

and to vector targets ``y``:

5. **affine normalization** ``(y - target_shift) / target_scale`` (scalars or one value per
   target; the result is floating: the target dtype if it is, else
   ``result_type(target dtype, float32)``).  The raw CosmoFlow ``unitPar`` targets are
   already scaled parameters and are usually fed as stored.

Dtypes (checked when the dataset is built, from replicated metadata, so the error is raised on
every rank): ``dtype=None`` keeps the stored dtype, which must then be floating for ``log1p``
and ``divide_by_mean``.  A conversion must keep the value's kind or widen it: integers to any
float or to a wider integer, floats to any float; never float to integer, never to or from
bool or complex (``TypeError``).  ``log1p`` and ``divide_by_mean`` take integer, unsigned and
floating input (not bool or complex) and need a floating output.  Target normalization needs
vector targets of an integer or floating dtype and finite non-zero scales.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Transforms", "resolve_transforms", "fill_block", "affine_x", "block_sums",
           "divide_by_means",
           "normalize_targets"]


@dataclass(frozen=True)
class Transforms:
    """What :func:`resolve_transforms` checked: the output dtypes and the steps to apply."""

    dtype: np.dtype                      # of x as handed out
    log1p: bool = False
    divide_by_mean: bool = False
    target_shift: tuple | None = None    # per target, or None
    target_scale: tuple | None = None
    target_dtype: np.dtype | None = None  # of y as handed out
    x_shift: float | None = None
    x_scale: float | None = None

    @property
    def any_x(self) -> bool:
        return self.log1p or self.divide_by_mean or self.x_shift is not None

    @property
    def any_y(self) -> bool:
        return self.target_shift is not None


def _per_target(v, k, what):
    if v is None:
        return None
    a = np.asarray(v, dtype=np.float64).reshape(-1)
    if a.size == 1:
        a = np.repeat(a, k)
    if a.size != k:
        raise ValueError(f"{what} needs one value or {k} (one per target), got {a.size}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{what} must be finite, got {v!r}")
    return tuple(float(t) for t in a)


def _conversion_ok(src: np.dtype, out: np.dtype) -> bool:
    if src == out:
        return True
    if src.kind in "bc" or out.kind in "bc":
        return False
    if out.kind == "f":
        return src.kind in "iuf"
    if out.kind in "iu":
        return src.kind in "iu" and np.can_cast(src, out, "safe")
    return False


def resolve_transforms(stored: np.dtype, target_kind: str, target_dtype: np.dtype,
                       num_targets: int | None, dtype=None, log1p: bool = False,
                       divide_by_mean: bool = False, target_shift=None,
                       target_scale=None, x_shift=None, x_scale=None) -> Transforms:
    """Check the transforms against the stored dtypes (see the module docstring; serial, pure)
    and return them resolved.  ``TypeError`` for a dtype a step cannot take, ``ValueError`` for
    bad values."""
    stored = np.dtype(stored)
    try:
        out = stored if dtype is None else np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype {dtype!r} is not a NumPy dtype") from None
    affine = x_shift is not None or x_scale is not None
    for flag, name in ((log1p, "log1p"), (divide_by_mean, "divide_by_mean"),
                       (affine, "x_shift/x_scale")):
        if not flag:
            continue
        if stored.kind not in "iuf":
            raise TypeError(f"{name} cannot take {stored} samples (integer, unsigned or "
                            "floating only)")
    if not _conversion_ok(stored, out):
        raise TypeError(f"cannot convert the stored {stored} samples to dtype={out} (a "
                        "conversion keeps the kind or widens: integers to floats or wider "
                        "integers, floats to floats; never float to integer, bool or complex)")
    for flag, name in ((log1p, "log1p"), (divide_by_mean, "divide_by_mean"),
                       (affine, "x_shift/x_scale")):
        if not flag:
            continue
        if out.kind != "f":
            raise TypeError(f"{name} needs a floating output dtype, got {out}: pass "
                            f"dtype='float32' (or float16/float64)")
    shift = scale = None
    ydtype = np.dtype(target_dtype)
    if target_shift is not None or target_scale is not None:
        if target_kind != "vector":
            raise ValueError("target_shift/target_scale normalize target vectors; these "
                             "targets are label volumes")
        if ydtype.kind not in "iuf":
            raise TypeError(f"target normalization cannot take {ydtype} targets")
        shift = _per_target(0.0 if target_shift is None else target_shift, num_targets,
                            "target_shift")
        scale = _per_target(1.0 if target_scale is None else target_scale, num_targets,
                            "target_scale")
        if any(s == 0 for s in scale):
            raise ValueError(f"target_scale must be non-zero, got {target_scale!r}")
        ydtype = ydtype if ydtype.kind == "f" else np.result_type(ydtype, np.float32)
    xs = xc = None
    if affine:
        xs, = _per_target(0.0 if x_shift is None else x_shift, 1, "x_shift")
        xc, = _per_target(1.0 if x_scale is None else x_scale, 1, "x_scale")
        if xc == 0:
            raise ValueError("x_scale must be non-zero")
    return Transforms(out, bool(log1p), bool(divide_by_mean), shift, scale, ydtype, xs, xc)


def fill_block(out: np.ndarray, block: np.ndarray, t: Transforms) -> None:
    """``out[...] = transformed block`` (steps 1-2: conversion and log1p, one pass; ``block``
    may be any strided view, e.g. flipped and transposed).  Step 3 needs the global mean: see
    :func:`divide_by_means`."""
    if t.log1p:
        np.log1p(block, out=out, casting="unsafe")
    else:
        np.copyto(out, block, casting="unsafe")


def affine_x(xl: np.ndarray, t: Transforms) -> None:
    """``(x - x_shift) / x_scale`` in place (step 4; nothing without them)."""
    if t.x_shift is None:
        return
    if t.x_shift:
        xl -= t.x_shift  # Python floats: computed in x's dtype
    if t.x_scale != 1:
        xl /= t.x_scale


def block_sums(xl: np.ndarray) -> np.ndarray:
    """Per-sample float64 sums of a local batch block ``(n, C, D, H, W)``."""
    return xl.reshape(xl.shape[0], -1).sum(axis=1, dtype=np.float64) if xl.size else \
        np.zeros(xl.shape[0])


def divide_by_means(xl: np.ndarray, sums: np.ndarray, counts: np.ndarray) -> None:
    """Divide each sample of the local block by its global mean ``sums / counts`` (in place;
    samples whose mean is 0, or with no elements, are left as they are)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.where(counts > 0, sums / np.maximum(counts, 1), 0.0)
    for j in range(xl.shape[0]):
        if mean[j] != 0 and xl[j].size:
            xl[j] /= float(mean[j])  # a Python float: computed in x's dtype


def normalize_targets(yl: np.ndarray, t: Transforms) -> np.ndarray:
    """``(y - shift) / scale`` of a local block of target vectors ``(n, k)`` (step 4)."""
    if not t.any_y:
        return yl
    y = yl.astype(np.float64)
    y = (y - np.asarray(t.target_shift)) / np.asarray(t.target_scale)
    return y.astype(t.target_dtype)
