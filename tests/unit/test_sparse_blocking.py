"""The pure index math of disttensor.sparse: Z-Morton codes, index types, the block size,
block pointers, nonzeros per line and the load-balanced chunks of lines (property tests)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disttensor.sparse.blocking import (block_grid, block_pointers, choose_block_size,
                                        chunk_target, line_chunks, line_nnz)
from disttensor.sparse.morton import (MAX_BLOCK_SIZE, index_dtype, morton_decode,
                                      morton_encode)

FAST = settings(max_examples=150, deadline=None)


def _z_order(beta):
    """In-block positions of a beta x beta block in Z order, by recursion on quadrants (the
    definition, written independently of the bit interleaving)."""
    if beta == 1:
        return [(0, 0)]
    h = beta // 2
    inner = _z_order(h)
    out = []
    for qr, qc in ((0, 0), (0, 1), (1, 0), (1, 1)):
        out += [(qr * h + r, qc * h + c) for r, c in inner]
    return out


@FAST
@given(st.lists(st.tuples(st.integers(0, MAX_BLOCK_SIZE - 1),
                          st.integers(0, MAX_BLOCK_SIZE - 1)), max_size=50))
def test_morton_decode_inverts_encode(pairs):
    r = np.array([p[0] for p in pairs], dtype=np.int64)
    c = np.array([p[1] for p in pairs], dtype=np.int64)
    codes = morton_encode(r, c)
    assert codes.dtype == np.uint64
    rr, cc = morton_decode(codes)
    np.testing.assert_array_equal(rr, r)
    np.testing.assert_array_equal(cc, c)


@pytest.mark.parametrize("beta", [1, 2, 4, 8, 16, 32])
def test_morton_sort_is_the_recursive_z_order(beta):
    r, c = np.divmod(np.arange(beta * beta), beta)
    order = np.argsort(morton_encode(r, c))
    got = list(zip(r[order].tolist(), c[order].tolist()))
    assert got == _z_order(beta)


@FAST
@given(st.integers(0, 8), st.integers(0, 8), st.data())
def test_aligned_subblocks_are_contiguous_in_morton_order(p, q, data):
    """Every aligned 2^q x 2^q sub-block of a 2^p block holds a contiguous run of codes."""
    q = min(p, q)
    beta, h = 1 << p, 1 << q
    br = data.draw(st.integers(0, beta // h - 1))
    bc = data.draw(st.integers(0, beta // h - 1))
    r, c = np.meshgrid(np.arange(br * h, br * h + h), np.arange(bc * h, bc * h + h))
    codes = np.sort(morton_encode(r.ravel(), c.ravel()).astype(np.int64))
    np.testing.assert_array_equal(codes, np.arange(codes[0], codes[0] + h * h))
    assert codes[0] % (h * h) == 0


def test_index_dtype():
    assert index_dtype(1) == np.uint8 and index_dtype(256) == np.uint8
    assert index_dtype(257) == np.uint16 and index_dtype(MAX_BLOCK_SIZE) == np.uint16
    for bad in (0, MAX_BLOCK_SIZE + 1):
        with pytest.raises(ValueError, match="block size"):
            index_dtype(bad)
    with pytest.raises(ValueError):
        morton_encode(np.zeros(2), np.zeros(3))


@FAST
@given(st.integers(0, 10**7), st.integers(0, 10**7), st.sampled_from([4, 8]),
       st.integers(1, 512))
def test_block_size_is_a_power_of_two_near_sqrt_n(m, n, itemsize, columns):
    side = max(m, n, 1)
    free = choose_block_size((m, n), cache_bytes=1 << 60, itemsize=itemsize, columns=columns)
    assert free & (free - 1) == 0
    assert free <= MAX_BLOCK_SIZE
    if side >= 4:
        assert math.sqrt(side) / math.sqrt(2) <= free <= math.sqrt(side) * math.sqrt(2)
    cache = 1 << 16
    b = choose_block_size((m, n), cache_bytes=cache, itemsize=itemsize, columns=columns)
    assert b & (b - 1) == 0 and b <= free
    assert b <= 8 or 2 * b * columns * itemsize <= cache
    assert b < 2 * side or b == 1


@FAST
@given(st.integers(0, 40), st.integers(0, 40), st.sampled_from([1, 2, 4, 8, 64]), st.data())
def test_block_pointers_and_line_nnz_count_the_nonzeros(m, n, beta, data):
    nbr, nbc = block_grid((m, n), beta)
    assert nbr == math.ceil(m / beta) and nbc == math.ceil(n / beta)
    nz = data.draw(st.integers(0, 60)) if m * n else 0
    rows = np.array(data.draw(st.lists(st.integers(0, max(m - 1, 0)), min_size=nz,
                                       max_size=nz)), dtype=np.int64)
    cols = np.array(data.draw(st.lists(st.integers(0, max(n - 1, 0)), min_size=nz,
                                       max_size=nz)), dtype=np.int64)
    bid = np.sort((rows // beta) * nbc + cols // beta)
    ptr = block_pointers(bid, nbr * nbc)
    assert ptr.dtype == np.int64 and ptr.size == nbr * nbc + 1 and ptr[0] == 0
    for b in range(nbr * nbc):
        assert ptr[b + 1] - ptr[b] == np.count_nonzero(bid == b)
    np.testing.assert_array_equal(line_nnz(ptr, nbr, nbc, False),
                                  [np.count_nonzero(rows // beta == i) for i in range(nbr)])
    np.testing.assert_array_equal(line_nnz(ptr, nbr, nbc, True),
                                  [np.count_nonzero(cols // beta == j) for j in range(nbc)])


@FAST
@given(st.lists(st.integers(0, 300), max_size=30), st.integers(1, 100))
def test_line_chunks_tile_every_line(nnz, target):
    nnz = np.array(nnz, dtype=np.int64)
    ch = line_chunks(nnz, target)
    slots_seen = []
    for line in range(nnz.size):
        mine = np.flatnonzero(ch.line == line)
        assert mine.size >= 1
        assert np.all(np.diff(mine) == 1)                   # ordered by line
        assert ch.lo[mine[0]] == 0 and ch.hi[mine[-1]] == nnz[line]
        np.testing.assert_array_equal(ch.lo[mine[1:]], ch.hi[mine[:-1]])
        sizes = ch.hi[mine] - ch.lo[mine]
        assert sizes.max() <= max(target, 0) or mine.size == 1
        assert sizes.max() - sizes.min() <= 1               # equal within one
        assert mine.size == max(1, math.ceil(nnz[line] / target))
        if mine.size == 1:
            assert ch.slot[mine[0]] == -1
            assert line not in ch.split_lines
        else:
            s = int(np.flatnonzero(ch.split_lines == line)[0])
            np.testing.assert_array_equal(ch.slot[mine],
                                          np.arange(ch.slot_ptr[s], ch.slot_ptr[s + 1]))
            slots_seen += ch.slot[mine].tolist()
    assert sorted(slots_seen) == list(range(ch.nslots))


def test_chunk_target():
    assert chunk_target(0, 4) >= 1
    assert chunk_target(10**6, 1, min_chunk=1) == 250000
    assert chunk_target(10**6, 2, min_chunk=10**6) == 10**6
