"""Pure partition helpers of :mod:`disttensor.nn.pipeline` (no MPI): validation of explicit
partitions, and the balanced partition (min-max stage cost, then the fewest stages of
parameter-free layers) against brute force over every contiguous split."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from disttensor.nn.pipeline import balanced_partition, check_partition


def _cut_sets(n, s):
    return [tuple(c) for c in itertools.combinations(range(1, n), s - 1)]


def _ranges(cuts, n):
    return list(zip((0,) + cuts, cuts + (n,)))


def test_check_partition():
    assert check_partition([(0, 2), (2, 5)], 5, 2) == [(0, 2), (2, 5)]
    for bad, msg in [([(0, 2)], "1 ranges for 2 stages"), ([(0, 2), (3, 5)], "starts at 3"),
                     ([(0, 3), (2, 5)], "starts at 2"), ([(0, 0), (0, 5)], "empty"),
                     ([(0, 2), (2, 4)], "covers layers \\[0, 4\\)"), ("ab", "list of"),
                     ([(0, 2.5), (2.5, 5)], "list of"), ([(0, 5, 1), (5, 6)], "list of")]:
        with pytest.raises(ValueError, match=msg):
            check_partition(bad, 5, 2)


def test_balanced_partition_is_optimal():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 9))
        s = int(rng.integers(1, n + 1))
        costs = rng.integers(0, 10, n)
        splits = [_ranges(c, n) for c in _cut_sets(n, s)]
        best = min(max(costs[a:b].sum() for a, b in r) for r in splits)
        got = balanced_partition(costs, s)
        check_partition(got, n, s)
        assert max(costs[a:b].sum() for a, b in got) == best, (costs, s, got)
        # with idle layers: still the min-max, and the fewest all-idle stages among those
        idle = list(rng.random(n) < 0.5)

        def idle_stages(ranges):
            return sum(all(idle[a:b]) for a, b in ranges)
        got = balanced_partition(costs, s, idle)
        check_partition(got, n, s)
        assert max(costs[a:b].sum() for a, b in got) == best, (costs, s, idle, got)
        fewest = min(idle_stages(r) for r in splits
                     if max(costs[a:b].sum() for a, b in r) == best)
        assert idle_stages(got) == fewest, (costs, s, idle, got)


def test_balanced_partition_rejects_more_stages_than_layers():
    with pytest.raises(ValueError, match="cannot cut 2 layers into 3"):
        balanced_partition([1, 2], 3)
    with pytest.raises(ValueError, match="into 0"):
        balanced_partition([1, 2], 0)
