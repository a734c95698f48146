"""Distributed FFTs of DistArrays (the ``numpy.fft`` API, slab/pencil transposes).

Functions
---------
``fftn ifftn rfftn irfftn`` (``s``, ``axes``, ``norm``, ``out_split``), the 1-D forms
``fft ifft rfft irfft hfft ihfft`` (``n``, ``axis``), the 2-D forms ``fft2 ifft2 rfft2
irfft2``, ``fftfreq rfftfreq`` (distributed 1-D arrays), ``fftshift ifftshift`` and
:func:`gaussian_random_field`.  All are collective over the array's grid; the ranks agree on
every metadata argument (``s``, ``axes``, ``norm``, ``out_split``, ...) before any data moves,
and bad input (an axis out of range, ``s`` and ``axes`` of different lengths, ``n < 1``, an
unknown ``norm``) raises the same NumPy-like exception on every rank.  ``np.fft.fftn(x)`` and
the other ``numpy.fft`` functions dispatch here through ``__array_function__``
(:data:`HANDLED_FUNCTIONS`).

Semantics are NumPy 2's: ``s`` pads with zeros or crops each axis before its transform
(``-1`` keeps the input axis' length, also for ``irfftn``), ``s`` without ``axes`` means the
last ``len(s)`` axes, ``norm`` is ``"backward"`` (default), ``"ortho"`` or ``"forward"``,
repeated axes transform twice, float32/complex64 give complex64 and float64/integers
complex128; ``rfftn`` applies the real transform on the *last* axis of ``axes`` first (it
becomes ``n // 2 + 1`` long) and ``irfftn`` the inverse real transform on it last (length
``s[-1]``, default ``2 * (m - 1)``).

Algorithm (mpi4py-fft's)
------------------------
A 1-D FFT needs its axis whole on a rank.  The axes to transform that are not split (or split
over a grid axis of one rank) are transformed at once on every local block
(``numpy.fft``/``cupy.fft``).  Then, while a split axis ``a`` remains to be transformed, one
redistribution moves its split (its grid axis) onto another axis ``b`` that is not split (or
split over a grid axis of one rank), and ``a`` is transformed locally.  The pair ``(a, b)``
is chosen, in order of preference: ``b`` needs no further transform (already transformed, or
not among the axes); ``b`` is at least as long as the number of ranks along the grid axis;
``b`` is not split at all; ``|a - b|`` smallest; then the lower ``b``, then the lower ``a``.
So a transform costs one redistribution per split transformed axis, the minimum: a slab (one
split axis) needs 1, a pencil (two) 2.  Only when no axis is free (every axis split, e.g. a
1-D array, or a 2-D array on a 2-D grid) is ``a`` gathered instead (its grid axis becomes a
replication axis; each rank along it then holds, and transforms, the whole axis: O(n) memory
per rank for a 1-D array; no six-step 1-D FFT).  :func:`plan_transposes` returns the plan
without running it.

Output layout (``out_split=None``): the distribution the algorithm ends in, with balanced
ownership on every axis it moved a split onto (axes not touched keep their ownership).  For a
3-D array split ``(0, None, None)`` (a slab) ``fftn`` returns split ``(None, 0, None)``; for
``(0, 1, None)`` on a 2-D grid (a pencil) it returns ``(None, 0, 1)``.  By the rule above the
inverse with default layout walks the same transposes backwards, so ``ifftn(fftn(x))`` (and
``irfftn(rfftn(x), x.shape)``) is split like ``x`` again for slabs and pencils over all axes
with balanced ownership, when the axes are at least as long as the grid axes (uneven input
ownership comes back balanced).  ``out_split="input"`` asks for the input's split (and its
ownership on the axes whose length did not change), any split tuple for that split
(balanced): one more redistribution.

Cost: per rank ``O((N / P) log N)`` flops and, per redistribution, ``N / P`` elements sent
(all-to-all within the rows of the grid axis moved).  Error: each 1-D transform is NumPy's
pocketfft, so the result equals the serial transform up to the usual bound
``||fft(x) - F x|| <= c log2(N) eps ||F x||`` (the redistributions are exact copies); the
distributed result is bit-identical to ``numpy.fft.fftn`` when the 1-D passes run in NumPy's
order (last axis first: slabs and pencils over the leading axes), within that bound
otherwise.

Example: a Gaussian random field of spectrum ``P(k)`` on a 2x2 pencil grid::

    import numpy as np, disttensor as dt
    g = dt.ProcessGrid((2, 2))
    f = dt.fft.gaussian_random_field((64, 64, 64), lambda k: k ** -3.0, grid=g, seed=1)
    F = dt.fft.rfftn(f)   # split (None, 0, 1): pencils along axis 0

which is ``irfftn(rfftn(w) * sqrt(P(|k|)))`` for white noise ``w`` from
``disttensor.random.default_rng(seed).normal`` (the same field whatever the grid).
"""
from __future__ import annotations

import numbers

import numpy as np

from ..core.array import DistArray
from ..core.entry import agreed, canon, collective_entry, split_key
from ..routines.creation import _grid, layout_args
from ..core.distribution import Distribution
from ..core.redistribute import redistribute_blocks

__all__ = ["fft", "ifft", "rfft", "irfft", "hfft", "ihfft", "fft2", "ifft2", "rfft2",
           "irfft2", "fftn", "ifftn", "rfftn", "irfftn", "fftfreq", "rfftfreq", "fftshift",
           "ifftshift", "plan_transposes", "gaussian_random_field", "HANDLED_FUNCTIONS"]

_NORMS = (None, "backward", "ortho", "forward")


# -- planning (pure) ---------------------------------------------------------------------------
def _out_len(kind: str, n: int) -> int:
    return n // 2 + 1 if kind == "rfft" else n


def plan_transposes(shape, grid_dims, split, phases):
    """The steps of a distributed FFT (pure, no MPI).

    ``phases`` is a list of ``(kind, [(axis, n), ...])`` run in order, ``kind`` one of
    ``"fft"``, ``"ifft"``, ``"rfft"``, ``"irfft"`` (the real kinds with one entry).  Returns
    ``(steps, split)``: ``steps`` a list of ``("fft", kind, axes, ns)`` (a local transform of
    whole axes) and ``("move", a, b)`` (the split of axis ``a`` moves onto axis ``b``;
    ``b is None``: ``a`` is gathered), and the final split."""
    shape = list(shape)
    split = list(split)
    steps = []

    def whole(a):
        return split[a] is None or grid_dims[split[a]] == 1

    for i, (kind, entries) in enumerate(phases):
        later = {a for _, es in phases[i + 1:] for a, _ in es}
        pending = list(entries)
        while pending:
            local = [(a, n) for a, n in pending if whole(a)]
            if local:
                steps.append(("fft", kind, tuple(a for a, _ in local),
                              tuple(n for _, n in local)))
                for a, n in reversed(local):  # NumPy runs the last entry first
                    shape[a] = _out_len(kind, n)
                pending = [e for e in pending if not whole(e[0])]
                continue
            todo = {a for a, _ in pending}
            # a split over a grid axis of one rank counts as free (that grid axis is dropped)
            free = [b for b in range(len(shape)) if whole(b)]
            pairs = [((b in later, shape[b] < grid_dims[split[a]], split[b] is not None,
                       abs(a - b), b, a), a, b)
                     for a in sorted(todo) for b in free]
            if pairs:
                _, a, b = min(pairs)
            else:
                a, b = max(todo), None
            steps.append(("move", a, b))
            if b is not None:
                split[b] = split[a]
            split[a] = None
    return steps, tuple(split)


# -- validation --------------------------------------------------------------------------------
def _check_x(x):
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
            dist = _resized(dist, axes, [_out_len(kind, n) for n in ns])
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
    _check_x(x)
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
    _check_x(x)
    with agreed(x.grid.cart, "hfft", x=x, n=canon(n), axis=canon(axis), norm=norm,
                out_split=_out_split_key(out_split, x.ndim)):
        _check_norm(norm)
    return irfft(_conj(x), n, axis, _SWAP[norm], out_split)


@collective_entry
def ihfft(x, n=None, axis=-1, norm=None, out_split=None):
    """Inverse of :func:`hfft` (``numpy.fft.ihfft``): ``conj(rfft(x, n))`` with the norm's
    direction swapped."""
    _check_x(x)
    with agreed(x.grid.cart, "ihfft", x=x, n=canon(n), axis=canon(axis), norm=norm,
                out_split=_out_split_key(out_split, x.ndim)):
        _check_norm(norm)
    return _conj(rfft(x, n, axis, _SWAP[norm], out_split))


# -- frequencies -------------------------------------------------------------------------------
def _freq(call, n, d, real, dtype, grid, split, sizes, device):
    from ..routines.creation import empty
    g = _grid(grid)
    with agreed(g.cart, call, n=canon(n), d=d, dtype=dtype,
                **layout_args(None, g, split, sizes, device, ndim=1)):
        if not isinstance(n, numbers.Integral) or isinstance(n, bool):
            raise ValueError(f"n should be an integer, got {n!r}")
        if n < 1:
            raise ValueError(f"n must be positive, got {n}")
    m = n // 2 + 1 if real else n
    x = empty((m,), dtype=np.float64, grid=g, split=split, sizes=sizes)
    sl = x.local_slices[0]
    k = np.arange(sl.start, sl.stop)
    if not real:
        k = np.where(k < (n + 1) // 2, k, k - n)
    val = 1.0 / (n * d)
    x.local[...] = k * val
    if dtype is not None:
        x = x.astype(dtype)
    return x.to_device(device) if device != "cpu" else x


@collective_entry
def fftfreq(n, d=1.0, *, dtype=None, grid=None, split=None, sizes=None, device="cpu"):
    """Sample frequencies of an ``n``-point FFT (``numpy.fft.fftfreq``) as a distributed
    1-D array of length ``n`` laid out by ``grid``/``split``/``sizes`` (each rank computes its
    block; no messages)."""
    return _freq("fftfreq", n, d, False, dtype, grid, split, sizes, device)


@collective_entry
def rfftfreq(n, d=1.0, *, dtype=None, grid=None, split=None, sizes=None, device="cpu"):
    """Sample frequencies of an ``n``-point :func:`rfft` (``numpy.fft.rfftfreq``), length
    ``n // 2 + 1``."""
    return _freq("rfftfreq", n, d, True, dtype, grid, split, sizes, device)


# -- shifts (a roll: one or two redistributions per split axis) --------------------------------
def _roll_axis(x: DistArray, axis: int, k: int) -> DistArray:
    """``np.roll(x, k, axis)`` with ``x``'s distribution: the block ``x[:n-k]`` moves to
    ``[k, n)`` and ``x[n-k:]`` to ``[0, k)``, each by one redistribution of the part each rank
    owns (only the pieces that change owner travel)."""
    n = x.shape[axis]
    k %= max(n, 1)
    xp = x.xp
    if k == 0:
        return x.copy()
    D = x.distribution
    if x.split[axis] is None or D.grid_dims[x.split[axis]] == 1:
        return DistArray(xp.roll(x.local, k, axis=axis), D, x.grid)
    comm = x.grid.cart
    lo, hi = D.block_range(axis, D.axis_coord(axis, x.grid.coords))
    out = xp.empty_like(x.local)

    def part(a, start, stop):
        idx = [slice(None)] * a.ndim
        idx[axis] = slice(max(0, min(hi, start) - lo), max(0, min(hi, stop) - lo))
        return a[tuple(idx)]

    # x[:n-k] -> out[k:], x[n-k:] -> out[:k]
    redistribute_blocks(comm, part(x.local, 0, n - k), D.restrict(axis, 0, n - k),
                        D.restrict(axis, k, n), out=part(out, k, n))
    redistribute_blocks(comm, part(x.local, n - k, n), D.restrict(axis, n - k, n),
                        D.restrict(axis, 0, k), out=part(out, 0, k))
    return DistArray(out, D, x.grid)


@collective_entry
def _shift(call, x, axes, inverse):
    from numpy.lib.array_utils import normalize_axis_tuple
    _check_x(x)
    with agreed(x.grid.cart, call, x=x, axes=canon(axes)):
        ax = tuple(range(x.ndim)) if axes is None else \
            normalize_axis_tuple(axes, x.ndim, allow_duplicate=True)
    out = x
    for a in ax:
        n = x.shape[a]
        out = _roll_axis(out, a, -(n // 2) if inverse else n // 2)
    return out.copy() if out is x else out


def fftshift(x: DistArray, axes=None) -> DistArray:
    """Zero frequency to the centre (``numpy.fft.fftshift``); output has ``x``'s
    distribution."""
    return _shift("fftshift", x, axes, False)


def ifftshift(x: DistArray, axes=None) -> DistArray:
    """Inverse of :func:`fftshift` (``numpy.fft.ifftshift``)."""
    return _shift("ifftshift", x, axes, True)


# -- Gaussian random fields --------------------------------------------------------------------
def _kmag(F: DistArray, shape):
    """|k| (cycles per sample) on ``F``'s local block, ``F`` an :func:`rfftn` of ``shape``."""
    sl = F.local_slices
    k2 = 0.0
    nd = len(shape)
    for t in range(nd):
        f = np.fft.rfftfreq(shape[t]) if t == nd - 1 else np.fft.fftfreq(shape[t])
        v = f[sl[t]]
        k2 = k2 + (v ** 2).reshape([-1 if u == t else 1 for u in range(nd)])
    return np.sqrt(k2)


@collective_entry
def gaussian_random_field(shape, power, grid=None, seed=0, split=None) -> DistArray:
    """A real Gaussian random field of spectrum ``power`` (collective).

    ``power(k)`` maps an array of wavenumbers ``|k|`` (cycles per sample, ``k > 0``) to the
    power spectrum.  The field is ``irfftn(rfftn(w) * sqrt(P(|k|)))`` with the ``k = 0`` mode
    set to zero (a zero-mean field) and ``w`` white noise ``N(0, 1)`` from
    ``disttensor.random.default_rng(seed).normal``, so ``E |rfftn(f)_k|^2 = N P(|k|)`` with
    ``N = prod(shape)``, and the field is the same (to rounding) on any grid and split.
    Output: float64 of ``shape`` with split ``split`` (default: the grid's default)."""
    from ..random import default_rng
    g = _grid(grid)
    with agreed(g.cart, "gaussian_random_field", seed=seed,
                **layout_args(shape, g, split, None)):
        if not callable(power):
            raise TypeError("power must be callable")
        shape = tuple(int(n) for n in shape)
        if len(shape) < 1 or any(n < 1 for n in shape):
            raise ValueError(f"shape must have positive extents, got {shape}")
    w = default_rng(seed).normal(0.0, 1.0, shape, grid=g, split=split)
    W = rfftn(w)
    k = _kmag(W, shape)
    amp = np.zeros_like(k)
    pos = k > 0
    amp[pos] = np.sqrt(power(k[pos]))
    W = DistArray(W.local * amp, W.distribution, W.grid)
    f = irfftn(W, s=shape)
    if f.distribution != w.distribution:
        f = DistArray(redistribute_blocks(g.cart, f.local, f.distribution, w.distribution),
                      w.distribution, g)
    return f


# -- numpy dispatch ----------------------------------------------------------------------------
def _np(fn):
    """A ``numpy.fft`` replacement: positional arguments as NumPy's; ``out=`` unsupported."""
    def impl(a, *args, out=None, **kwargs):
        if out is not None:
            raise TypeError("out= is not supported for DistArray FFTs")
        return fn(a, *args, **kwargs)
    impl.__name__ = fn.__name__
    return impl


HANDLED_FUNCTIONS = {
    np.fft.fft: _np(fft), np.fft.ifft: _np(ifft),
    np.fft.rfft: _np(rfft), np.fft.irfft: _np(irfft),
    np.fft.hfft: _np(hfft), np.fft.ihfft: _np(ihfft),
    np.fft.fft2: _np(fft2), np.fft.ifft2: _np(ifft2),
    np.fft.rfft2: _np(rfft2), np.fft.irfft2: _np(irfft2),
    np.fft.fftn: _np(fftn), np.fft.ifftn: _np(ifftn),
    np.fft.rfftn: _np(rfftn), np.fft.irfftn: _np(irfftn),
    np.fft.fftshift: fftshift, np.fft.ifftshift: ifftshift,
}
