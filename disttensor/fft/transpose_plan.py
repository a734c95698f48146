"""The transpose plan of a distributed FFT (pure: no MPI, no data): :func:`plan_transposes`.

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
per rank for a 1-D array; no six-step 1-D FFT).

Output layout (``out_split=None``): the distribution the algorithm ends in, with balanced
ownership on every axis it moved a split onto (axes not touched keep their ownership).  For a
3-D array split ``(0, None, None)`` (a slab) ``fftn`` returns split ``(None, 0, None)``; for
``(0, 1, None)`` on a 2-D grid (a pencil) it returns ``(None, 0, 1)``.  By the rule above the
inverse with default layout walks the same transposes backwards, so ``ifftn(fftn(x))`` (and
``irfftn(rfftn(x), x.shape)``) is split like ``x`` again for slabs and pencils over all axes
with balanced ownership, when the axes are at least as long as the grid axes (uneven input
ownership comes back balanced).
"""
from __future__ import annotations

__all__ = ["plan_transposes", "transformed_length"]


def transformed_length(kind: str, n: int) -> int:
    """The length of an axis after a transform of ``kind`` of length ``n`` (``rfft``: the
    ``n // 2 + 1`` non-negative frequencies)."""
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
                    shape[a] = transformed_length(kind, n)
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
