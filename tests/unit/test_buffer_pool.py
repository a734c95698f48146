"""The host buffer pool (disttensor.core.buffer_pool) and the glibc malloc settings
(disttensor.core.malloc_tuning): an array handed out (by the pool or by its exact-shape
``Recycler``) is never handed out again while anything references it (views, memoryviews,
frombuffer), a freed one is reused, results behave like
``np.empty``, the limit and the switch hold, size classes are within 25% of the request."""
from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disttensor.core import buffer_pool as bp
from disttensor.core import malloc_tuning as mt


def addr(a) -> int:
    return a.__array_interface__["data"][0]


def pool(**kw):
    kw.setdefault("min_bytes", 1)
    return bp.BufferPool(**kw)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 1 << 40))
def test_size_class_bounds(n):
    c = bp.size_class(n)
    assert n <= c < 1.25 * n + 4
    assert bp.size_class(c) == c            # a class serves itself
    assert bp.size_class(n + 1) >= c        # monotone


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int16, np.complex128, np.bool_])
@pytest.mark.parametrize("shape", [(3, 5, 7), (1000,), (0, 4), ()])
def test_like_np_empty(shape, dtype):
    p = pool()
    a = p.empty(shape, dtype)
    assert a.shape == shape and a.dtype == np.dtype(dtype)
    assert a.flags.c_contiguous and a.flags.writeable and a.flags.aligned
    a[...] = 1
    assert np.all(a == 1)


@pytest.mark.parametrize("kind", ["pool", "recycler"])
@pytest.mark.parametrize("hold", ["array", "slice", "transpose", "reshape", "memoryview",
                                  "frombuffer", "astype-free view"])
def test_held_array_is_never_handed_out_again(hold, kind):
    """The size-class pool and the exact-shape recycler (``Recycler``) alike."""
    p = pool() if kind == "pool" else bp.Recycler(per_key=4)
    a = p.empty((64, 64), np.dtype(np.float32))
    a[...] = 7
    first = addr(a)
    keep = {"array": lambda: a, "slice": lambda: a[10:20, 3],
            "transpose": lambda: a.T, "reshape": lambda: a.reshape(-1)[::2],
            "memoryview": lambda: memoryview(a),
            "frombuffer": lambda: np.frombuffer(a, dtype=np.uint8),
            "astype-free view": lambda: a.view(np.int32)}[hold]()
    expected = np.array(np.asarray(keep), copy=True)
    del a
    others = [p.empty((64, 64), np.dtype(np.float32)) for _ in range(3)]
    assert first not in {addr(o) for o in others}
    for o in others:
        o[...] = -1
    assert np.array_equal(np.asarray(keep), expected)    # nothing wrote over the held memory
    del keep, others
    again = p.empty((64, 64), np.dtype(np.float32))
    assert addr(again) == first                 # freed: reused
    assert p.hits >= 1 if kind == "pool" else again.base is not None
    assert again.shape == (64, 64) and again.dtype == np.float32 and again.flags.c_contiguous


def test_held_values_survive_reuse_of_other_buffers():
    p = pool()
    held = []
    for i in range(6):
        a = p.empty(1000, np.float64)
        a[...] = i
        if i % 2 == 0:
            held.append(a)                      # the others are dropped at once
    for i, a in zip(range(0, 6, 2), held):
        assert np.all(a == i)
    assert len({addr(a) for a in held}) == len(held)


def test_same_class_serves_other_shapes_and_dtypes():
    p = pool()
    a = p.empty((10, 100), np.float64)
    first = addr(a)
    del a
    b = p.empty((1000,), np.int64)               # same bytes, other shape and dtype
    assert addr(b) == first and b.shape == (1000,)
    del b
    c = p.empty((900,), np.float64)              # smaller request in the same class
    assert addr(c) == first


def test_below_min_bytes_and_disabled_are_plain():
    assert pool(min_bytes=1 << 20).empty((10,), np.float32).flags.owndata
    off = pool(enabled=False)
    a = off.empty((1000,), np.float32)
    assert a.flags.owndata and off.held_bytes() == 0


def test_limit_drops_idle_then_falls_back():
    p = pool(limit_bytes=10_000)
    a = p.empty(8000, np.uint8)
    held_a = p.held_bytes()
    assert held_a >= 8000 and not a.flags.owndata
    b = p.empty(4000, np.uint8)                 # a is held: over the limit -> plain
    assert b.flags.owndata
    del a
    c = p.empty(4000, np.uint8)                 # a is idle now: dropped to make room
    assert not c.flags.owndata and p.held_bytes() <= 10_000
    p.release()
    assert p.held_bytes() == bp.size_class(4000)  # c is still referenced
    del c
    assert p.idle_bytes() == bp.size_class(4000)
    p.release()
    assert p.held_bytes() == 0


@pytest.mark.parametrize("kind", ["pool", "recycler"])
def test_threads_never_share_a_buffer(kind):
    p = pool() if kind == "pool" else bp.Recycler(per_key=2)
    errors = []

    def work(k):
        for _ in range(200):
            a = p.empty((512,), np.dtype(np.int64))
            a[...] = k
            if not np.all(a == k):
                errors.append(k)
    ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors


def test_env_switches(monkeypatch):
    monkeypatch.setenv("DISTTENSOR_BUFFER_POOL", "maybe")
    with pytest.raises(ValueError, match="DISTTENSOR_BUFFER_POOL"):
        bp._enabled_from_env()
    monkeypatch.setenv("DISTTENSOR_BUFFER_POOL", "off")
    assert not bp._enabled_from_env()
    monkeypatch.setenv("DISTTENSOR_BUFFER_POOL_LIMIT", "3e6")
    assert bp._limit_from_env() == 3_000_000
    monkeypatch.setenv("DISTTENSOR_BUFFER_POOL_MIN", "4096")
    assert bp._min_from_env() == 4096
    monkeypatch.delenv("DISTTENSOR_BUFFER_POOL_MIN")
    # by default the pool takes what glibc would map afresh: 32 MiB up under the settings
    want = mt.MMAP_BYTES if mt.tune_malloc() == "applied" else bp.DEFAULT_MIN_BYTES
    assert bp._min_from_env() == want


@pytest.mark.parametrize("env, skipped", [
    ({}, None),
    ({"DISTTENSOR_MALLOC_TUNING": "off"}, "off"),
    ({"MALLOC_TRIM_THRESHOLD_": "1"}, "user"),
    ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"}, "user"),
    ({"GLIBC_TUNABLES": "glibc.rtld.nns=2"}, None),
    ({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}, "allocator"),
])
def test_malloc_tuning_reasons(env, skipped, monkeypatch):
    monkeypatch.setattr(mt.sys, "platform", "linux")
    reason = mt._reason_to_skip(env)
    assert (reason is None) == (skipped is None)
    if skipped:
        assert skipped in reason
    with pytest.raises(ValueError, match="DISTTENSOR_MALLOC_TUNING"):
        mt._reason_to_skip({"DISTTENSOR_MALLOC_TUNING": "sometimes"})


def test_malloc_tuning_runs_once():
    first = mt.tune_malloc()            # made at import by core.memory
    assert first == mt.applied and mt.tune_malloc() == first
    assert first == "applied" or isinstance(first, str)
