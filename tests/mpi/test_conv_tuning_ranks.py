"""Online convolution tuning on several ranks (:mod:`disttensor.ops.local.microbatch`): ranks
whose timings differ settle on one plan when they share the plan cache, each rank keeps its
own choice when it does not, and nothing waits on another rank's tuning state (one rank's
plan on disk, the others tuning).  Timings are injected per rank (a scripted tuning clock);
every output is checked against the serial float64 reference."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import disttensor as dt
from disttensor.ops import conv_forward
from disttensor.ops.local import microbatch as mb
from disttensor.ops.local.microbatch import cpu_entry
from checks import COMM, SIZE, grid
from conftest import assert_all_ranks, assert_allclose_all

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import reference as ref  # noqa: E402
from tuning_clock import scripted_clock  # noqa: E402

CALLS = 30   # collective conv calls per test: more than tuning this layer takes


def _settings(monkeypatch, cache: Path, fav: int) -> None:
    monkeypatch.setenv("DISTTENSOR_CACHE_DIR", str(cache))
    monkeypatch.setenv("DISTTENSOR_CONV_TUNE", "benchmark")
    monkeypatch.delenv("DISTTENSOR_CONV_TUNE_ONLINE", raising=False)
    monkeypatch.setattr(cpu_entry, "ONLINE_MIN_FLOPS", 0)     # tune these small layers online
    # this rank finds micro-batches of ``fav`` samples three times faster than the others
    monkeypatch.setattr(cpu_entry, "tuning_clock",
                        scripted_clock(lambda k: 1.0 if k[1] == fav else 3.0))
    mb.clear_plans()


def _run(dims, split):
    """``CALLS`` forwards of one layer on grid ``dims``; the plan each rank runs last."""
    rng = np.random.default_rng(5)
    xg = rng.standard_normal((2 * dims[0], 3, 7, 5, 4))
    wg = rng.standard_normal((4, 3, 3, 3, 3))
    want = ref.conv(xg, wg, padding=1)
    x = dt.from_global(xg.astype(np.float32), grid=grid(dims), split=split)
    for _ in range(CALLS):
        y, _ = conv_forward(x, wg.astype(np.float32), padding=1)
        assert_allclose_all(COMM, y.to_numpy(), want, rtol=1e-4, atol=1e-4)
    assert_all_ranks(COMM, not cpu_entry._tuners, "a rank is still tuning after the calls")
    return mb.last_plan().micro_batches


@pytest.mark.parametrize("dims, split", [((SIZE, 1, 1, 1), (0, None, 1, 2, 3)),
                                         ((1, SIZE, 1, 1), (0, None, 1, 2, 3))],
                         ids=["samples", "depth"])
def test_ranks_sharing_the_plan_cache_settle_on_one_plan(monkeypatch, shared_tmp_path, dims,
                                                         split):
    """Even ranks time the undivided plan fastest, odd ranks one sample at a time; sharing
    the plan cache, all run the plan stored first (the depth split's blocks, 3 and 2 planes
    on 3 ranks, are similar problems)."""
    _settings(monkeypatch, shared_tmp_path / f"plans-{dims}", 2 if COMM.rank % 2 == 0 else 1)
    try:
        plan = _run(dims, split)
        plans = COMM.allgather(plan)
        assert_all_ranks(COMM, all(p == plans[0] for p in plans),
                         f"the ranks' plans differ: {plans}")
    finally:
        mb.clear_plans()


def test_a_rank_with_its_plan_on_disk_does_not_wait_for_the_others(monkeypatch, tmp_path):
    """Rank-private plan caches: rank 0 finds its plan on disk (one sample at a time) and
    never tunes, the other ranks tune on the collective calls and keep their own choice (the
    undivided plan); no rank waits on another's tuning."""
    _settings(monkeypatch, tmp_path / "plans", 2)
    dims, split = (SIZE, 1, 1, 1), (0, None, 1, 2, 3)
    try:
        if COMM.rank == 0:   # rank 0 alone tunes its block's problem first, under other times
            monkeypatch.setattr(cpu_entry, "tuning_clock",
                                scripted_clock(lambda k: 1.0 if k[1] == 1 else 3.0))
            xl = np.random.default_rng(0).standard_normal((2, 3, 7, 5, 4)).astype(np.float32)
            wl = np.ones((4, 3, 3, 3, 3), np.float32)
            geo = ((1, 1, 1), (1, 1, 1), (1, 1, 1), (1, 1, 1))
            for _ in range(CALLS):
                cpu_entry.conv_forward(xl, wl, *geo)
            assert not cpu_entry._tuners
            mb.clear_plans()                    # the plan is on disk only
            _settings(monkeypatch, tmp_path / "plans", 2)
        plan = _run(dims, split)
        want = ((plan[0][0], 1),) * 2 if COMM.rank == 0 else ((plan[0][0], 2),)
        assert_all_ranks(COMM, plan == want, f"rank {COMM.rank} runs {plan}, expected {want}")
    finally:
        mb.clear_plans()
