"""``einsum`` of any number of operands, with ``...`` and repeated labels.

Collective over the grid of the first DistArray operand (NumPy operands next to it are
replicated values, every rank passing the same); the ranks agree the subscripts and the
operands' metadata before any data moves, and bad subscripts or sizes raise NumPy's
``ValueError`` on every rank.

How it runs (every step is one of the distributed routines, so data moves as they say):

1. :func:`parse_subscripts` (pure) turns ``...`` into labels of their own (the broadcast
   dimensions, right-aligned across operands) and finds the implicit output (the labels that
   occur once, in alphabetical order, after the ``...`` dimensions), as NumPy does.
2. Per operand, a label repeated within it takes the diagonal
   (:func:`~.contractions.diagonal`), and a length-1 axis whose label is longer elsewhere is
   dropped (NumPy's broadcasting).
3. Pairwise contraction in greedy order: of all pairs of remaining operands the one whose
   result is smallest (fewest elements; ties: the earliest pair) is contracted first, as a
   batched matmul (:func:`~.contractions.contract`); labels needed by no other operand and
   not in the output are summed before.  The order depends only on agreed shapes, so every
   rank takes the same.
4. The last operand's labels not in the output are summed and its axes permuted into the
   output order (``transpose`` moves no data).

The result's layout is what the last contraction (a ``matmul``) or reduction leaves.  Not
supported: NumPy's interleaved call form ``einsum(op0, sublist0, op1, ...)`` and ``out=``;
``optimize`` is accepted and ignored (the greedy order is always used).
"""
from __future__ import annotations

import math
import string

from ..core.array import DistArray
from ..core.entry import agreed, collective_entry, operand_key
from .contractions import contract, diagonal
from .operands import as_operand, comm_of, first_grid

__all__ = ["einsum", "parse_subscripts", "greedy_pair"]

_LETTERS = string.ascii_letters


def _operand_labels(part: str, nd: int, i: int, ell: str) -> str:
    if "..." in part:
        k = nd - (len(part) - 3)
        if k < 0:
            raise ValueError("einstein sum subscripts string contains too many subscripts "
                             f"for operand {i}")
        return part.replace("...", ell[len(ell) - k:] if k else "")
    if len(part) > nd:
        raise ValueError("einstein sum subscripts string contains too many subscripts for "
                         f"operand {i}")
    if len(part) < nd:
        raise ValueError("operand has more dimensions than subscripts given in einstein sum, "
                         "but no '...' ellipsis provided to broadcast the extra dimensions.")
    return part


def _check_chars(part: str) -> None:
    rest = part.replace("...", "", 1)
    for c in rest:
        if c not in _LETTERS:
            raise ValueError(f"invalid subscript '{c}' in einstein sum subscripts string, "
                             "subscripts must be letters")


def parse_subscripts(subscripts, ndims) -> tuple[list[str], str]:
    """Pure: ``(labels of each operand, output labels)`` with ``...`` replaced by letters not
    used in ``subscripts`` (repeated labels inside one operand stay)."""
    if not isinstance(subscripts, str):
        raise TypeError("einsum: subscripts must be a string (the interleaved form "
                        "einsum(op0, sublist0, ...) is not supported for DistArrays)")
    s = subscripts.replace(" ", "")
    ins, arrow, out = s.partition("->")
    parts = ins.split(",")
    if len(parts) != len(ndims):  # NumPy's messages, the words as NumPy has them
        raise ValueError(f"{'fewer' if len(parts) < len(ndims) else 'more'} operands provided "
                         "to einstein sum function than specified in the subscripts string")
    for part in parts + [out]:
        _check_chars(part)
    free = [c for c in _LETTERS if c not in s]
    n_ell = max([nd - (len(p) - 3) for p, nd in zip(parts, ndims) if "..." in p] or [0])
    ell = "".join(free[:max(n_ell, 0)])
    labels = [_operand_labels(p, nd, i, ell) for i, (p, nd) in enumerate(zip(parts, ndims))]
    if arrow:
        if "..." in out:
            out = out.replace("...", ell)
        elif ell:
            raise ValueError("output has more dimensions than subscripts given in einstein "
                             "sum, but no '...' ellipsis provided to broadcast the extra "
                             "dimensions.")
    else:
        joined = "".join(labels)
        out = ell + "".join(sorted(c for c in set(joined)
                                   if joined.count(c) == 1 and c not in ell))
    if len(set(out)) != len(out):
        raise ValueError(f"einstein sum subscripts string includes output subscript "
                         f"'{next(c for c in out if out.count(c) > 1)}' multiple times")
    for c in out:
        if not any(c in lab for lab in labels):
            raise ValueError(f"einstein sum subscripts string included output subscript "
                             f"'{c}' which never appeared in an input")
    return labels, out


def _label_sizes(ops, labels) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for i, (x, lab) in enumerate(zip(ops, labels)):
        for c in dict.fromkeys(lab):  # in order: the same message on every rank
            dims = [x.shape[t] for t, d in enumerate(lab) if d == c]
            if len(set(dims)) > 1:
                raise ValueError(f"dimensions in operand {i} for collapsing index '{c}' "
                                 f"don't match ({dims[0]} != {dims[1]})")
    for x, lab in zip(ops, labels):
        for c, n in zip(lab, x.shape):
            m = sizes.get(c, 1)
            if n != 1 and m != 1 and n != m:
                raise ValueError(f"operands could not be broadcast together: label '{c}' has "
                                 f"sizes {m} and {n}")
            sizes[c] = max(m, n)
    return sizes


def greedy_pair(labels: list[str], out: str, sizes: dict[str, int]) -> tuple[int, int]:
    """Pure: the pair ``(i, j)`` (``i < j``) of operands whose contraction gives the smallest
    result (kept labels: in the output or in another operand); ties: the earliest pair."""
    best = None
    for i in range(len(labels)):
        for j in range(i + 1, len(labels)):
            others = "".join(lab for k, lab in enumerate(labels) if k not in (i, j)) + out
            kept = set(labels[i] + labels[j]) & set(others)
            cost = math.prod(sizes[c] for c in kept)
            if best is None or cost < best[0]:
                best = (cost, i, j)
    return best[1], best[2]


def _take_diagonals(x: DistArray, lab: str) -> tuple[DistArray, str]:
    """Each label repeated within ``lab`` becomes one axis (the diagonal, moved last)."""
    while len(set(lab)) < len(lab):
        c = next(c for c in lab if lab.count(c) > 1)
        i = lab.index(c)
        j = lab.index(c, i + 1)
        x = diagonal(x, 0, i, j)
        lab = "".join(d for t, d in enumerate(lab) if t not in (i, j)) + c
    return x, lab


def _drop_broadcast(x: DistArray, lab: str, sizes) -> tuple[DistArray, str]:
    """Remove length-1 axes whose label is longer in another operand (NumPy broadcasting)."""
    from ..routines.manipulation import squeeze
    axes = tuple(t for t, c in enumerate(lab) if x.shape[t] == 1 and sizes[c] > 1)
    if not axes:
        return x, lab
    return squeeze(x, axes), "".join(c for t, c in enumerate(lab) if t not in axes)


def _sum_labels(x: DistArray, lab: str, keep) -> tuple[DistArray, str]:
    from ..routines import reductions
    axes = tuple(t for t, c in enumerate(lab) if c not in keep)
    if not axes:
        return x, lab
    return reductions.sum(x, axis=axes), "".join(c for c in lab if c in keep)


def _pair(a, la, b, lb, keep) -> tuple[DistArray, str]:
    """Contract ``a`` and ``b``: labels in both and in ``keep`` are batch axes, labels in both
    only are summed by the product, labels of one operand not in ``keep`` are summed first."""
    a, la = _sum_labels(a, la, set(keep) | set(lb))
    b, lb = _sum_labels(b, lb, set(keep) | set(la))
    batch = [c for c in la if c in lb and c in keep]
    con = [c for c in la if c in lb and c not in keep]
    res = contract(a, b, [la.index(c) for c in batch], [lb.index(c) for c in batch],
                   [la.index(c) for c in con], [lb.index(c) for c in con])
    labels = batch + [c for c in la if c not in lb] + [c for c in lb if c not in la]
    return res, "".join(labels)


@collective_entry
def einsum(subscripts: str, *operands, optimize=False) -> DistArray:
    """``numpy.einsum`` of DistArrays (collective): any number of operands, ``...``,
    repeated labels (diagonals), implicit or explicit output; greedy pairwise contraction
    order (module docstring).  ``optimize`` is ignored."""
    from ..routines.manipulation import transpose
    comm = comm_of(*operands) if operands else None
    with agreed(comm, "einsum", subscripts=subscripts,
                operands=tuple(operand_key(x) for x in operands)):
        if not operands:
            raise ValueError("No input operands")
        grid = first_grid(*operands)
        ops = [as_operand(x, grid, "einsum") for x in operands]
        labels, out = parse_subscripts(subscripts, [x.ndim for x in ops])
        sizes = _label_sizes(ops, labels)
    inputs = list(ops)
    ops = list(ops)
    for k in range(len(ops)):
        ops[k], labels[k] = _take_diagonals(ops[k], labels[k])
        ops[k], labels[k] = _drop_broadcast(ops[k], labels[k], sizes)
    while len(ops) > 1:
        i, j = greedy_pair(labels, out, sizes)
        others = "".join(lab for k, lab in enumerate(labels) if k not in (i, j)) + out
        res, lab = _pair(ops[i], labels[i], ops[j], labels[j], set(others))
        ops = [x for k, x in enumerate(ops) if k not in (i, j)] + [res]
        labels = [x for k, x in enumerate(labels) if k not in (i, j)] + [lab]
    x, lab = _sum_labels(ops[0], labels[0], set(out))
    perm = [lab.index(c) for c in out]
    if perm != list(range(len(perm))):
        x = transpose(x, perm)
    return x.copy() if any(x is y for y in inputs) else x
