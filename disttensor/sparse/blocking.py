"""Pure index math of Compressed Sparse Blocks (no MPI, no GPU): the block size, block
pointers, the nonzeros per block-row and block-column, and the split of heavy block-rows or
block-columns into chunks of balanced work (merge-path style).

Terms.  A matrix of shape ``(m, n)`` is cut into ``beta x beta`` blocks, ``nbr = ceil(m /
beta)`` block-rows by ``nbc = ceil(n / beta)`` block-columns (the last ones may be partial).
Blocks are numbered block-row-major, ``b = i * nbc + j``, and their nonzeros are stored one
block after the other, so ``blk_ptr`` (``int64``, ``nbr * nbc + 1`` entries) is the CSR-style
pointer: block ``b`` holds storage positions ``blk_ptr[b]:blk_ptr[b + 1]``.

A *line* is a block-row (the work unit of ``A @ X``) or a block-column (``A.T @ X``).  The
nonzeros of a line, taken block after block along it, form its *virtual sequence*
(positions ``0 .. line_nnz - 1``); a *chunk* is a range ``[lo, hi)`` of one line's virtual
sequence.  :func:`line_chunks` cuts every line whose nonzeros exceed the target into equal
ranges (cuts may fall inside a block: that is the merge-path split of a heavy line), and
gives each chunk of such a split line its own slot of partial results, combined afterwards.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .morton import MAX_BLOCK_SIZE

__all__ = ["DEFAULT_CACHE_BYTES", "choose_block_size", "block_grid", "block_pointers",
           "line_nnz", "LineChunks", "line_chunks", "chunk_target"]

DEFAULT_CACHE_BYTES = 1 << 18     # the per-core L2 share a block's slices of X and Y should fit
MIN_CHUNK_NNZ = 2048              # lines lighter than this are never split


def choose_block_size(shape, cache_bytes: int = DEFAULT_CACHE_BYTES, itemsize: int = 8,
                      columns: int = 16) -> int:
    """The block size ``beta`` for a matrix of ``shape (m, n)``: the power of two nearest to
    ``sqrt(max(m, n))`` (Buluç et al.: about sqrt(n) keeps ``blk_ptr`` as short as the matrix
    side while the in-block indices need only lg beta bits), halved while the slices of the
    right-hand side and of the result one block touches (``2 * beta * columns * itemsize``
    bytes) exceed ``cache_bytes``; at least 1, at most 65536, and no larger than needed to
    cover the longer side."""
    m, n = (int(s) for s in shape)
    side = max(m, n, 1)
    beta = 1 << max(0, round(math.log2(math.sqrt(side))))
    while beta > 8 and 2 * beta * max(1, int(columns)) * int(itemsize) > int(cache_bytes):
        beta //= 2
    beta = min(beta, MAX_BLOCK_SIZE, 1 << max(0, (side - 1).bit_length()))
    return max(1, beta)


def block_grid(shape, beta: int) -> tuple[int, int]:
    """``(nbr, nbc)``: the number of block-rows and block-columns of ``shape`` in
    ``beta x beta`` blocks (``ceil`` of each side over ``beta``)."""
    m, n = (int(s) for s in shape)
    return -(-m // beta), -(-n // beta)


def block_pointers(block_ids, nblocks: int) -> np.ndarray:
    """``blk_ptr`` (``int64``, ``nblocks + 1``) of nonzeros whose block numbers, in storage
    order, are ``block_ids`` (non-decreasing, each in ``[0, nblocks)``)."""
    counts = np.bincount(np.asarray(block_ids, dtype=np.int64), minlength=nblocks)
    ptr = np.zeros(nblocks + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    return ptr


def line_nnz(blk_ptr, nbr: int, nbc: int, by_columns: bool) -> np.ndarray:
    """Nonzeros per block-row (``by_columns`` False, ``nbr`` entries) or per block-column
    (``nbc`` entries), ``int64``."""
    per_block = np.diff(np.asarray(blk_ptr, dtype=np.int64)).reshape(nbr, nbc)
    return per_block.sum(axis=0 if by_columns else 1, dtype=np.int64)


def chunk_target(total_nnz: int, workers: int, min_chunk: int = MIN_CHUNK_NNZ) -> int:
    """The nonzeros per chunk: an even share of four chunks per worker (so that unequal lines
    still even out over the workers), never below ``min_chunk``."""
    return max(int(min_chunk), -(-int(total_nnz) // max(1, 4 * int(workers))), 1)


@dataclass(frozen=True)
class LineChunks:
    """The work items of one product orientation.

    ``line[c]``, ``lo[c]``, ``hi[c]``: chunk ``c`` covers virtual positions ``[lo, hi)`` of
    line ``line[c]``.  ``slot[c]`` is -1 where the chunk is its line's only one (it writes
    the line's result rows directly), else the index of its own partial-result slot.  The
    ``split_lines`` were cut; the slots of ``split_lines[s]`` are
    ``slot_ptr[s]:slot_ptr[s + 1]``.  All arrays ``int64``; chunks are ordered by line and
    by position, every line (empty ones too) has at least one chunk, and the chunks of a line
    tile its virtual sequence exactly."""
    line: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    slot: np.ndarray
    split_lines: np.ndarray
    slot_ptr: np.ndarray

    @property
    def nslots(self) -> int:
        return int(self.slot_ptr[-1])


def line_chunks(nnz_per_line, target: int) -> LineChunks:
    """Cut each line of ``nnz_per_line`` (``int64``) with more than ``target`` nonzeros into
    ``ceil(nnz / target)`` ranges of equal size (within one), the others whole."""
    nnz = np.asarray(nnz_per_line, dtype=np.int64)
    target = max(1, int(target))
    pieces = np.maximum(1, -(-nnz // target))
    nchunks = int(pieces.sum())
    line = np.repeat(np.arange(nnz.size, dtype=np.int64), pieces)
    first = np.zeros(nnz.size + 1, dtype=np.int64)
    np.cumsum(pieces, out=first[1:])
    k = np.arange(nchunks, dtype=np.int64) - first[line]       # chunk number within its line
    p = pieces[line]
    lo = nnz[line] * k // p
    hi = nnz[line] * (k + 1) // p
    split = pieces > 1
    split_lines = np.flatnonzero(split).astype(np.int64)
    slot_ptr = np.zeros(split_lines.size + 1, dtype=np.int64)
    np.cumsum(pieces[split_lines], out=slot_ptr[1:])
    slot = np.full(nchunks, -1, dtype=np.int64)
    in_split = split[line]
    # slots are numbered in chunk order over the split lines
    slot[in_split] = np.arange(int(in_split.sum()), dtype=np.int64)
    return LineChunks(line, lo, hi, slot, split_lines, slot_ptr)
