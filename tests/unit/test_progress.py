"""The halo-overlap progress driver (disttensor.core.progress) and the sample chunks of an
overlapped window op: mode resolution, polling, the progress thread (with a fake request test:
no MPI message here; tests/mpi/test_ops_conv.py runs the modes against the reference)."""
import threading
import time

import pytest

from disttensor.core import progress
from disttensor.core.progress import Progress, overlap_mode
from disttensor.ops.convolution import sample_chunks


def test_overlap_mode_resolution(monkeypatch):
    monkeypatch.delenv("DISTTENSOR_HALO_OVERLAP", raising=False)
    assert overlap_mode("cpu") == "off" and overlap_mode("cuda") == "on"
    assert overlap_mode("cpu", True) == "on" and overlap_mode("cuda", False) == "off"
    assert overlap_mode("cpu", "poll") == "poll"
    assert overlap_mode("cuda", "thread") == "on"      # the device is the progress there
    monkeypatch.setenv("DISTTENSOR_HALO_OVERLAP", "poll")
    assert overlap_mode("cpu") == "poll" and overlap_mode("cpu", True) == "poll"
    assert overlap_mode("cpu", False) == "off" and overlap_mode("cpu", "on") == "on"
    monkeypatch.setenv("DISTTENSOR_HALO_OVERLAP", "thread")
    want = "thread" if progress.thread_progress_available() else "poll"
    assert overlap_mode("cpu") == want
    monkeypatch.setenv("DISTTENSOR_HALO_OVERLAP", "sometimes")
    with pytest.raises(ValueError, match="DISTTENSOR_HALO_OVERLAP"):
        overlap_mode("cpu")
    monkeypatch.delenv("DISTTENSOR_HALO_OVERLAP")
    with pytest.raises(ValueError, match="overlap must be"):
        overlap_mode("cpu", "always")


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 7])
@pytest.mark.parametrize("mode", ["off", "on", "poll", "thread"])
def test_sample_chunks_tile_the_samples(n, mode):
    chunks = sample_chunks(n, mode)
    assert chunks[0][0] == 0 and chunks[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))
    assert len(chunks) == (max(1, min(2, n)) if mode == "poll" else 1)
    assert len(sample_chunks(n, mode, parts=4)) == (max(1, min(4, n)) if mode == "poll" else 1)
    assert all(b > a for a, b in chunks) or n == 0


def test_poll_tests_until_complete():
    calls = []
    p = Progress(lambda: len(calls.append(0) or calls) >= 3, "poll")
    with p:
        results = [p.poll() for _ in range(5)]
    assert results == [False, False, True, True, True] and len(calls) == 3
    idle = Progress(lambda: calls.append(0), "on")   # not polling: never tests
    with idle:
        assert idle.poll() is False
    assert len(calls) == 3


def test_thread_tests_in_background_and_stops():
    seen = threading.Event()
    main = threading.get_ident()
    threads = []

    def test():
        threads.append(threading.get_ident())
        seen.set()
        return len(threads) >= 4
    with Progress(test, "thread", interval=1e-4) as p:
        assert seen.wait(5)
        deadline = time.monotonic() + 5
        while not p.done and time.monotonic() < deadline:
            time.sleep(1e-3)
    assert p.done and len(threads) == 4 and main not in threads

    stopped = []
    with Progress(lambda: stopped.append(0) and False, "thread", interval=1e-4):
        time.sleep(0.01)
    n = len(stopped)
    time.sleep(0.01)
    assert n >= 1 and len(stopped) == n     # the block's exit joined the thread


def test_failing_test_stops_progress():
    def boom():
        raise RuntimeError("MPI error")
    p = Progress(boom, "poll")
    assert p.poll() is True and p.polls == 1
    with Progress(boom, "thread") as t:
        pass
    assert not t.done


def test_overlap_split_gate():
    """A CPU block overlaps only when its interior holds MIN_INTERIOR of its outputs; a GPU
    block whenever it has an interior; never without a halo or in mode 'off'."""
    from disttensor.core.distribution import Distribution
    from disttensor.ops import convolution as C
    from disttensor.ops._spatial import spatial_windows, window_plan
    windows = spatial_windows(1, (3,), (1,), (1,), ((1, 1),))
    for n, want_cpu in ((8, True), (40, True), (4, True), (3, False), (2, False)):
        dist = Distribution((1, 1, 2 * n), (2,), (None, None, 0))
        plan = window_plan(dist, windows, (0,))
        got = C.overlap_split("on", plan, dist, windows, (0,), "cpu")
        inner = n - 1   # one shell plane next to the neighbour
        assert (got is not None) == want_cpu == (inner >= C.MIN_INTERIOR * n)
        assert C.overlap_split("on", plan, dist, windows, (0,), "cuda") is not None or n < 2
        assert C.overlap_split("off", plan, dist, windows, (0,), "cpu") is None
    dist = Distribution((1, 1, 16), (1,), (None, None, 0))   # one block: no halo
    plan = window_plan(dist, windows, (0,))
    assert C.overlap_split("poll", plan, dist, windows, (0,), "cpu") is None
