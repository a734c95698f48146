"""The distributed transforms: ``fftn ifftn rfftn irfftn`` (``s``, ``axes``, ``norm``,
``out_split``), the 1-D forms ``fft ifft rfft irfft hfft ihfft`` (``n``, ``axis``) and the 2-D
forms ``fft2 ifft2 rfft2 irfft2``.

All are collective over the array's grid; the ranks agree on every metadata argument (``s``,
``axes``, ``norm``, ``out_split``, ...) before any data moves, and bad input (an axis out of
range, ``s`` and ``axes`` of different lengths, ``n < 1``, an unknown ``norm``) raises the same
NumPy-like exception on every rank.

Semantics are NumPy 2's: ``s`` pads with zeros or crops each axis before its transform
(``-1`` keeps the input axis' length, also for ``irfftn``), ``s`` without ``axes`` means the
last ``len(s)`` axes, ``norm`` is ``"backward"`` (default), ``"ortho"`` or ``"forward"``,
repeated axes transform twice, float32/complex64 give complex64 and float64/integers
complex128; ``rfftn`` applies the real transform on the *last* axis of ``axes`` first (it
becomes ``n // 2 + 1`` long) and ``irfftn`` the inverse real transform on it last (length
``s[-1]``, default ``2 * (m - 1)``).

Each transform runs the steps of :func:`~.transpose_plan.plan_transposes` (local transforms
of whole axes, redistributions that move a split to another axis); the output layout is the
one the plan ends in (see :mod:`.transpose_plan`).  ``out_split="input"`` asks for the input's
split (and its ownership on the axes whose length did not change), any split tuple for that
split (balanced): one more redistribution.

Cost: per rank ``O((N / P) log N)`` flops and, per redistribution, ``N / P`` elements sent
(all-to-all within the rows of the grid axis moved).  Error: each 1-D transform is NumPy's
pocketfft, so the result equals the serial transform up to the usual bound
``||fft(x) - F x|| <= c log2(N) eps ||F x||`` (the redistributions are exact copies); the
distributed result is bit-identical to ``numpy.fft.fftn`` when the 1-D passes run in NumPy's
order (last axis first: slabs and pencils over the leading axes), within that bound
otherwise.
"""
from __future__ import annotations

import numbers

from ..core.array import DistArray
from ..core.distribution import Distribution
from ..core.entry import agreed, canon, collective_entry, split_key
from ..core.redistribute import redistribute_blocks
from .transpose_plan import plan_transposes, transformed_length

__all__ = ["fft", "ifft", "rfft", "irfft", "hfft", "ihfft", "fft2", "ifft2", "rfft2",
           "irfft2", "fftn", "ifftn", "rfftn", "irfftn", "check_distarray"]

_NORMS = (None, "backward", "ortho", "forward")


# -- validation --------------------------------------------------------------------------------
def check_distarray(x):
    if not isinstance(x, DistArray):
        raise TypeError(f"expected a DistArray, got {type(x).__name__}")


def _check_norm(norm):
    if norm not in _NORMS:
        raise ValueError(f'Invalid norm value {norm}; should be "backward", "ortho" or '
                         '"forward".')


def _axes_and_s(x: DistArray, s, axes, real_inverse: bool = False):
    """NumPy's ``s``/``axes`` rules: returns ``(axes, ns)`` with normalized axes and the
    transform lengths (``s`` entries of -1 or ``None`` resolved)."""
    from numpy.lib.array_utils import normalize_axis_index
    nd = x.ndim
    if s is not None:
        if isinstance(s, numbers.Integral):
            raise TypeError("s must be a sequence of integers, not an integer")
        s = [int(v) if isinstance(v, numbers.Integral) else v for v in s]
        if any(v is not None and not isinstance(v, int) for v in s):
            raise TypeError(f"s must be a sequence of integers, got {s!r}")
    if axes is None:
        axes = list(range(nd)) if s is None else list(range(nd - len(s), nd))
        if s is not None and len(s) > nd:
            raise ValueError(f"s has {len(s)} entries, the array has only {nd} axes")
    else:
        if isinstance(axes, numbers.Integral):
            axes = [axes]
        axes = [normalize_axis_index(int(a), nd) for a in axes]
    if s is None:
        ns = [x.shape[a] for a in axes]
        if real_inverse and axes:
            ns[-1] = 2 * (x.shape[axes[-1]] - 1)
    else:
        if len(s) != len(axes):
            raise ValueError("Shape and axes have different lengths.")
        ns = list(s)
        for i, a in enumerate(axes):
            if ns[i] == -1:  # NumPy: the whole input axis (also for irfftn)
                ns[i] = x.shape[a]
            elif ns[i] is None:  # NumPy (deprecated): the 1-D transform's default length
                ns[i] = 2 * (x.shape[a] - 1) if real_inverse and i == len(axes) - 1 \
                    else x.shape[a]
    for n in ns:
        if n < 1:
            raise ValueError(f"Invalid number of FFT data points ({n}) specified.")
    return axes, ns


def _out_split_key(out_split, nd):
    return out_split if isinstance(out_split, str) else split_key(out_split, nd)


def _target_split(out_split, nd):
    if out_split is None or out_split == "input":
        return out_split
    if isinstance(out_split, str):
        raise ValueError(f"out_split must be None, 'input' or a split, got {out_split!r}")
    if isinstance(out_split, numbers.Integral):
        return split_key(out_split, nd)
    out = tuple(out_split)
    if len(out) != nd:
        raise ValueError(f"out_split {out} needs one entry per axis ({nd})")
    return out


# -- execution ---------------------------------------------------------------------------------
def _resized(dist: Distribution, axes, lens) -> Distribution:
    shape, sizes = list(dist.shape), list(dist.split_sizes)
    for a, n in reversed(list(zip(axes, lens))):  # repeated axes: the first entry is last
        shape[a] = n
        sizes[a] = None
    return Distribution(shape, dist.grid_dims, dist.split, sizes)


def _local_fft(xp, block, kind, axes, ns, norm):
    if kind == "fft":
        return xp.fft.fftn(block, s=ns, axes=axes, norm=norm)
    if kind == "ifft":
        return xp.fft.ifftn(block, s=ns, axes=axes, norm=norm)
    if kind == "rfft":
        return xp.fft.rfft(block, n=ns[0], axis=axes[0], norm=norm)
    return xp.fft.irfft(block, n=ns[0], axis=axes[0], norm=norm)


def _run(x: DistArray, phases, norm, out_split) -> DistArray:
    """Run the plan of ``phases`` on ``x`` (arguments already validated and agreed)."""
    grid, comm, xp = x.grid, x.grid.cart, x.xp
    dist = x.distribution
    steps, _ = plan_transposes(dist.shape, dist.grid_dims, dist.split, phases)
    local = x.local
    if not steps:
        local = local.copy()
    for step in steps:
        if step[0] == "fft":
            _, kind, axes, ns = step
            local = _local_fft(xp, local, kind, list(axes), list(ns), norm)
            dist = _resized(dist, axes, [transformed_length(kind, n) for n in ns])
        else:
            _, a, b = step
            split, sizes = list(dist.split), list(dist.split_sizes)
            if b is not None:
                split[b], sizes[b] = split[a], None
            split[a], sizes[a] = None, None
            new = Distribution(dist.shape, dist.grid_dims, split, sizes)
            local = redistribute_blocks(comm, local, dist, new)
            dist = new
    if out_split is not None:
        if out_split == "input":
            src = x.distribution
            sizes = [src.split_sizes[t] if src.shape[t] == dist.shape[t] else None
                     for t in range(dist.ndim)]
            target = Distribution(dist.shape, dist.grid_dims, src.split, sizes)
        else:
            target = Distribution(dist.shape, dist.grid_dims, out_split)
        if target != dist:
            local = redistribute_blocks(comm, local, dist, target)
            dist = target
    return DistArray(local, dist, grid)


@collective_entry
def _transform(call, x, s, axes, norm, out_split, kind):
    check_distarray(x)
    with agreed(x.grid.cart, call, x=x, s=canon(s), axes=canon(axes), norm=norm,
                out_split=_out_split_key(out_split, x.ndim)):
        _check_norm(norm)
        axes, ns = _axes_and_s(x, s, axes, real_inverse=(kind == "irfft"))
        target = _target_split(out_split, x.ndim)
        if target not in (None, "input"):
            Distribution([1] * x.ndim, x.grid.dims, target)  # validates the split
        if kind in ("rfft", "irfft") and not axes:
            raise ValueError("at least one axis must be transformed by a real FFT")
        if kind == "rfft" and x.dtype.kind == "c":
            raise TypeError(f"{call} needs real input, got {x.dtype}")
    entries = list(zip(axes, ns))
    if kind in ("fft", "ifft"):
        phases = [(kind, entries)]
    elif kind == "rfft":
        phases = [("rfft", entries[-1:])] + ([("fft", entries[:-1])] if len(entries) > 1 else [])
    else:
        phases = ([("ifft", entries[:-1])] if len(entries) > 1 else []) + [("irfft", entries[-1:])]
    return _run(x, phases, norm, target)


# -- public transforms -------------------------------------------------------------------------
def fftn(x: DistArray, s=None, axes=None, norm=None, out_split=None) -> DistArray:
    """N-d discrete Fourier transform (``numpy.fft.fftn``): complex result of ``x``'s shape
    with ``s`` applied; output layout per the module docstring."""
    return _transform("fftn", x, s, axes, norm, out_split, "fft")


def ifftn(x: DistArray, s=None, axes=None, norm=None, out_split=None) -> DistArray:
    """Inverse of :func:`fftn` (``numpy.fft.ifftn``)."""
    return _transform("ifftn", x, s, axes, norm, out_split, "ifft")


def rfftn(x: DistArray, s=None, axes=None, norm=None, out_split=None) -> DistArray:
    """Real-input N-d FFT (``numpy.fft.rfftn``): the last axis of ``axes`` becomes
    ``s[-1] // 2 + 1`` long (balanced ownership if it is split on output)."""
    return _transform("rfftn", x, s, axes, norm, out_split, "rfft")


def irfftn(x: DistArray, s=None, axes=None, norm=None, out_split=None) -> DistArray:
    """Inverse of :func:`rfftn` (``numpy.fft.irfftn``): real output, the last axis of
    ``axes`` ``s[-1]`` long (default ``2 * (m - 1)``)."""
    return _transform("irfftn", x, s, axes, norm, out_split, "irfft")


def _one(n, axis):
    return (None if n is None else (n,)), (axis,)


def fft(x, n=None, axis=-1, norm=None, out_split=None):
    """1-D FFT along ``axis`` (``numpy.fft.fft``); ``axis`` split: one redistribution moves
    its split to another axis (output layout per the module docstring)."""
    s, axes = _one(n, axis)
    return _transform("fft", x, s, axes, norm, out_split, "fft")


def ifft(x, n=None, axis=-1, norm=None, out_split=None):
    """Inverse of :func:`fft` (``numpy.fft.ifft``)."""
    s, axes = _one(n, axis)
    return _transform("ifft", x, s, axes, norm, out_split, "ifft")


def rfft(x, n=None, axis=-1, norm=None, out_split=None):
    """Real-input 1-D FFT (``numpy.fft.rfft``): ``axis`` becomes ``n // 2 + 1`` long."""
    s, axes = _one(n, axis)
    return _transform("rfft", x, s, axes, norm, out_split, "rfft")


def irfft(x, n=None, axis=-1, norm=None, out_split=None):
    """Inverse of :func:`rfft` (``numpy.fft.irfft``): real, ``axis`` ``n`` long (default
    ``2 * (m - 1)``)."""
    s, axes = _one(n, axis)
    return _transform("irfft", x, s, axes, norm, out_split, "irfft")


def fft2(x, s=None, axes=(-2, -1), norm=None, out_split=None):
    """:func:`fftn` over the last two axes (``numpy.fft.fft2``)."""
    return _transform("fft2", x, s, axes, norm, out_split, "fft")


def ifft2(x, s=None, axes=(-2, -1), norm=None, out_split=None):
    """:func:`ifftn` over the last two axes (``numpy.fft.ifft2``)."""
    return _transform("ifft2", x, s, axes, norm, out_split, "ifft")


def rfft2(x, s=None, axes=(-2, -1), norm=None, out_split=None):
    """:func:`rfftn` over the last two axes (``numpy.fft.rfft2``)."""
    return _transform("rfft2", x, s, axes, norm, out_split, "rfft")


def irfft2(x, s=None, axes=(-2, -1), norm=None, out_split=None):
    """:func:`irfftn` over the last two axes (``numpy.fft.irfft2``)."""
    return _transform("irfft2", x, s, axes, norm, out_split, "irfft")


_SWAP = {None: "forward", "backward": "forward", "forward": "backward", "ortho": "ortho"}


def _conj(x: DistArray) -> DistArray:
    return DistArray(x.local.conj(), x.distribution, x.grid)


@collective_entry
def hfft(x, n=None, axis=-1, norm=None, out_split=None):
    """FFT of a Hermitian-symmetric signal given by its first half (``numpy.fft.hfft``):
    ``irfft(conj(x), n)`` with the norm's direction swapped."""
    check_distarray(x)
    with agreed(x.grid.cart, "hfft", x=x, n=canon(n), axis=canon(axis), norm=norm,
                out_split=_out_split_key(out_split, x.ndim)):
        _check_norm(norm)
    return irfft(_conj(x), n, axis, _SWAP[norm], out_split)


@collective_entry
def ihfft(x, n=None, axis=-1, norm=None, out_split=None):
    """Inverse of :func:`hfft` (``numpy.fft.ihfft``): ``conj(rfft(x, n))`` with the norm's
    direction swapped."""
    check_distarray(x)
    with agreed(x.grid.cart, "ihfft", x=x, n=canon(n), axis=canon(axis), norm=norm,
                out_split=_out_split_key(out_split, x.ndim)):
        _check_norm(norm)
    return _conj(rfft(x, n, axis, _SWAP[norm], out_split))

