"""roll_pieces (routines/manipulation/rearrange.py): the runs of a roll of a blocked axis,
checked against np.roll on every block layout drawn (uneven and empty blocks)."""
from __future__ import annotations

import numpy as np
from hypothesis import given, strategies as st

from disttensor.routines.manipulation.rearrange import roll_pieces


@given(st.lists(st.integers(0, 7), min_size=1, max_size=6), st.integers(-40, 40))
def test_roll_pieces_rebuild_np_roll(sizes, shift):
    n = sum(sizes)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(int)
    src = np.arange(n)
    blocks = [src[a:a + m] for a, m in zip(starts, sizes)]
    out = [np.full(m, -1) for m in sizes]
    pieces = roll_pieces(sizes, shift)
    for sb, s0, db, d0, ln in pieces:
        assert ln > 0 and 0 <= s0 and s0 + ln <= sizes[sb] and 0 <= d0 and d0 + ln <= sizes[db]
        out[db][d0:d0 + ln] = blocks[sb][s0:s0 + ln]
    got = np.concatenate(out) if out else src
    np.testing.assert_array_equal(got, np.roll(src, shift) if n else src)
    if sum(m > 0 for m in sizes) >= 2:  # one message per (source, destination) pair
        pairs = [(sb, db) for sb, _, db, _, _ in pieces if sb != db]
        assert len(pairs) == len(set(pairs))
