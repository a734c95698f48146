"""The chunk plans of disttensor.io.zarrio (pure): every chunk inside one block."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from disttensor.core.distribution import Distribution
from disttensor.io.zarrio import aligned_chunks, aligned_distribution, chunks_aligned
from disttensor.testing.strategies import explicit_sizes


def test_examples():
    d = Distribution((10, 7), (3,), (0,))                     # blocks 4,3,3: gcd 1
    chunks, move = aligned_chunks(d, 4)
    assert chunks == (4, 7) and move
    d2 = aligned_distribution(d, chunks)
    assert d2.sizes(0) == (4, 4, 2) and chunks_aligned(d2, chunks)
    d = Distribution((12, 5), (2, 2), (0, 1))                 # blocks 6,6 and 3,2
    assert aligned_chunks(d, 8) == ((6, 3), False)
    assert aligned_chunks(Distribution((4, 4), (1,), ()), 8) == ((4, 4), False)
    assert aligned_chunks(Distribution((0, 3), (2,), (0,)), 8)[0] == (1, 3)
    big, _ = aligned_chunks(Distribution((512, 512, 512), (2,), (0,)), 4, target=8 << 20)
    assert 256 % big[0] == 0 and big[0] * big[1] * big[2] * 4 <= 8 << 20


@settings(max_examples=200, deadline=None)
@given(data=st.data(), n=st.integers(0, 40), p=st.integers(1, 5), item=st.sampled_from([1, 8]))
def test_plan_is_aligned(data, n, p, item):
    sizes = data.draw(explicit_sizes(n, p))
    d = Distribution((n, 3), (p,), (0,), [sizes, None])
    chunks, move = aligned_chunks(d, item, target=data.draw(st.sampled_from([16, 1 << 20])))
    assert all(c >= 1 for c in chunks)
    target = aligned_distribution(d, chunks) if move else d
    assert chunks_aligned(target, chunks)
    assert move == (not chunks_aligned(d, chunks))
    user = (data.draw(st.integers(1, 9)), 2)
    assert chunks_aligned(aligned_distribution(d, user), user)
