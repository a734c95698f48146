"""disttensor.ops.local.microbatch: the clock the CPU tuner times candidates by
(``DISTTENSOR_CONV_TUNE_CLOCK``): CPU time for one-thread kernels, so that time the core spent
on other jobs does not rank the candidates; wall time with a device queue (``sync``)."""
from __future__ import annotations

import time

import numba
import numpy as np
import pytest

from disttensor.ops.local import microbatch as mb
from disttensor.ops.local.microbatch import settings, timing


def test_tune_clock_setting(monkeypatch):
    monkeypatch.delenv("DISTTENSOR_CONV_TUNE_CLOCK", raising=False)
    assert settings.tune_clock() == "auto"
    for v in ("cpu", "wall", " CPU "):
        monkeypatch.setenv("DISTTENSOR_CONV_TUNE_CLOCK", v)
        assert settings.tune_clock() == v.strip().lower()
    monkeypatch.setenv("DISTTENSOR_CONV_TUNE_CLOCK", "sundial")
    with pytest.raises(ValueError, match="DISTTENSOR_CONV_TUNE_CLOCK"):
        settings.tune_clock()


def test_auto_clock_is_cpu_time_only_for_one_thread(monkeypatch):
    monkeypatch.setenv("DISTTENSOR_CONV_TUNE_CLOCK", "auto")
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    one = numba.get_num_threads() == 1
    assert timing.tuning_clock() is (time.process_time if one else time.perf_counter)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    assert timing.tuning_clock() is time.perf_counter
    monkeypatch.delenv("OPENBLAS_NUM_THREADS")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert timing.tuning_clock() is (time.process_time if one else time.perf_counter)
    monkeypatch.setenv("DISTTENSOR_CONV_TUNE_CLOCK", "wall")
    assert timing.tuning_clock() is time.perf_counter
    monkeypatch.setenv("DISTTENSOR_CONV_TUNE_CLOCK", "cpu")
    assert timing.tuning_clock() is time.process_time


def _sleep_vs_spin(monkeypatch, clock, sync=None):
    """Times of a candidate that waits 30 ms off the CPU against one that computes ~6 ms."""
    monkeypatch.setenv("DISTTENSOR_CONV_TUNE_CLOCK", clock)
    prob = mb.ConvProblem.make("forward", (1, 1, 3, 3, 3), (1, 1, 1, 1, 1), (1,) * 3,
                               (1,) * 3, (0,) * 3, (0,) * 3, 1, np.float64)

    def runner(alg, b):
        if alg == "waits":
            time.sleep(0.03)
        else:
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < 0.006:
                pass
    cands = {("waits", 1): 0, ("spins", 1): 0}
    return mb.measure_times(prob, cands, {"waits": "waits", "spins": "spins"}, runner,
                            sync=sync, budget_s=1e9, reps=1)


def test_measure_times_reads_the_configured_clock(monkeypatch):
    cpu = _sleep_vs_spin(monkeypatch, "cpu")
    assert cpu[("waits", 1)] < min(0.015, cpu[("spins", 1)])
    wall = _sleep_vs_spin(monkeypatch, "wall")
    assert wall[("waits", 1)] > 0.025 > wall[("spins", 1)]
    # a device queue (sync given) is timed by the wall clock whatever the setting
    synced = _sleep_vs_spin(monkeypatch, "cpu", sync=lambda: None)
    assert synced[("waits", 1)] > 0.025
