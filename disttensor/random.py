"""Random numbers that give the same global array for a seed whatever the grid.

Element ``i`` (C-order flat index) of the ``k``-th array a :class:`Generator` produces is a
pure function of ``(seed, k, i)``: the SplitMix64 output function (Steele, Lea & Flood,
OOPSLA'14) applied to a counter derived from them.  So every rank computes exactly the values
of its own block with no communication, the result does not depend on the grid, the split or
the device (CuPy evaluates the same integer formula), and streams for different ``k`` are
independent.  ``normal`` uses the Box-Muller transform on two such streams.

Every draw takes NumPy's ``size=`` (an int or a tuple) as well as ``shape=`` (one of them;
neither gives a 0-d DistArray, where NumPy would give a Python scalar).
"""
from __future__ import annotations

import contextlib

import numpy as np

from .core.array import DistArray
from .core.entry import agreed, collective_entry, device_key, dtype_key
from .core.backend import array_module, normalize_device, xp_for
from .routines.creation import _grid, empty, layout_args, local_index_grid

__all__ = ["Generator", "default_rng"]

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(z):
    xp = array_module(z)
    z = (z ^ (z >> xp.uint64(30))) * xp.uint64(_M1)
    z = (z ^ (z >> xp.uint64(27))) * xp.uint64(_M2)
    return z ^ (z >> xp.uint64(31))


def _key(seed: int, stream: int) -> np.uint64:
    with np.errstate(over="ignore"):
        s = np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64)
        k = _mix(s ^ _mix(np.array([stream], dtype=np.uint64) + _GAMMA))
    return np.uint64(k[0])


def _shape_of(shape, size, call: str):
    """``(shape, error)``: ``size=`` (NumPy's name) or ``shape=`` of a draw; both given is a
    ``TypeError`` that the draw raises inside its agreement block (on every rank)."""
    if size is not None:
        err = None if shape is None else TypeError(
            f"{call}() got both 'size' and 'shape'; pass one of them")
        return size, err
    return (() if shape is None else shape), None


class Generator:
    """A counter-based generator; every rank must create it with the same seed and make the
    same sequence of calls (each call is collective like any creation function)."""

    def __init__(self, seed: int = 0):
        self.seed = int(seed)
        self.counter = 0

    @contextlib.contextmanager
    def _agreed(self, call, shape, dtype, grid, split, sizes, device, shape_error=None,
                **params):
        """Agreement of a draw: the seed and the stream counter (a rank that drew more or
        fewer arrays before is out of step) with the layout and the distribution's
        parameters."""
        g = _grid(grid)
        gpu = device_key(device) != "cpu"
        with agreed(g.cart, f"Generator.{call}", rank_local=gpu, seed=self.seed,
                    stream=self.counter, dtype=dtype_key(dtype), **params,
                    shape_error=None if shape_error is None else str(shape_error),
                    **layout_args(shape, g, split, sizes, device)):
            if shape_error is not None:
                raise shape_error
            np.dtype(dtype)
            if gpu:
                xp_for(normalize_device(device))  # a node without a GPU fails here
            yield

    def _bits(self, shape, grid, split, sizes, device, streams=1):
        x = empty(shape, dtype=np.float64, grid=grid, split=split, sizes=sizes, device="cpu")
        idx = np.zeros(x.local_shape, dtype=np.uint64)
        stride = 1
        for t, ix in reversed(list(enumerate(local_index_grid(x)))):
            idx = idx + ix.astype(np.uint64) * np.uint64(stride)
            stride *= x.shape[t]
        xp = x.xp if device == "cpu" else __import__("cupy")
        if xp is not np:
            idx = xp.asarray(idx)
        out = []
        for s in range(streams):
            key = _key(self.seed, self.counter)
            self.counter += 1
            with np.errstate(over="ignore"):
                out.append(_mix(xp.uint64(key) + (idx + xp.uint64(1)) * xp.uint64(_GAMMA)))
        return x, out, xp

    @staticmethod
    def _unit(bits, xp):
        """Uniform doubles in [0, 1) from the top 53 bits."""
        return (bits >> xp.uint64(11)).astype(xp.float64) * (1.0 / 9007199254740992.0)

    def _wrap(self, x, vals, dtype):
        return DistArray(vals.astype(dtype), x.distribution, x.grid)

    @collective_entry
    def random(self, shape=None, dtype="float64", grid=None, split=None, sizes=None,
               device="cpu", *, size=None):
        """Uniform in [0, 1) (``shape`` or NumPy's ``size``)."""
        shape, bad = _shape_of(shape, size, "random")
        with self._agreed("random", shape, dtype, grid, split, sizes, device, bad):
            pass
        x, (b,), xp = self._bits(shape, grid, split, sizes, device)
        return self._wrap(x, self._unit(b, xp), dtype)

    @collective_entry
    def uniform(self, low=0.0, high=1.0, size=None, dtype="float64", grid=None, split=None,
                sizes=None, device="cpu", *, shape=None):
        """Uniform in [low, high) (NumPy's ``size`` or ``shape``)."""
        shape, bad = _shape_of(shape, size, "uniform")
        with self._agreed("uniform", shape, dtype, grid, split, sizes, device, bad, low=low,
                          high=high):
            pass
        x, (b,), xp = self._bits(shape, grid, split, sizes, device)
        return self._wrap(x, low + (high - low) * self._unit(b, xp), dtype)

    @collective_entry
    def normal(self, loc=0.0, scale=1.0, size=None, dtype="float64", grid=None, split=None,
               sizes=None, device="cpu", *, shape=None):
        """Normal (NumPy's ``size`` or ``shape``)."""
        shape, bad = _shape_of(shape, size, "normal")
        with self._agreed("normal", shape, dtype, grid, split, sizes, device, bad, loc=loc,
                          scale=scale):
            pass
        x, (b1, b2), xp = self._bits(shape, grid, split, sizes, device, streams=2)
        u1 = 1.0 - self._unit(b1, xp)  # (0, 1]
        u2 = self._unit(b2, xp)
        z = xp.sqrt(-2.0 * xp.log(u1)) * xp.cos(2.0 * np.pi * u2)
        return self._wrap(x, loc + scale * z, dtype)

    @collective_entry
    def integers(self, low, high=None, size=None, dtype="int64", grid=None, split=None,
                 sizes=None, device="cpu", *, shape=None):
        """Integers in ``[low, high)`` (range below 2**53; NumPy's ``size`` or ``shape``)."""
        shape, bad = _shape_of(shape, size, "integers")
        if high is None:
            low, high = 0, low
        with self._agreed("integers", shape, dtype, grid, split, sizes, device, bad, low=low,
                          high=high):
            if high <= low:
                raise ValueError(f"high <= low ({low}, {high})")
        x, (b,), xp = self._bits(shape, grid, split, sizes, device)
        v = xp.floor(self._unit(b, xp) * (high - low)).astype(xp.int64) + low
        return self._wrap(x, v, dtype)


def default_rng(seed: int = 0) -> Generator:
    return Generator(seed)
