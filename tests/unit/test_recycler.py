"""The recycler of exact-shape arrays (disttensor.core.buffer_pool.Recycler): a dropped array is
handed out again (that a held one never is, and that threads never share an array:
tests/unit/test_buffer_pool.py); its bounds (arrays per shape, shapes, bytes; when full, idle
arrays make room); requests from the pool's threshold on go to the size-class pool; off with
the pool; ``buffer_pool.empty`` routes small requests through the shared recycler."""
from __future__ import annotations

import numpy as np

from disttensor.core import buffer_pool as bp

F4 = np.dtype(np.float32)


def addr(a) -> int:
    return a.__array_interface__["data"][0]


def test_bounds_per_shape_shapes_and_bytes():
    r = bp.Recycler(per_key=2, max_keys=2, limit_bytes=1000)
    a, b, c = (r.empty((10,), F4) for _ in range(3))
    assert a.base is not None and b.base is not None and c.base is None   # 2 per shape
    d = r.empty((11,), F4)
    e = r.empty((12,), F4)
    assert d.base is not None and e.base is None                          # 2 shapes
    assert r.held_bytes() == 3 * 40 + 4
    big = r.empty((10, 30), F4)                    # 1200 bytes: over the byte limit
    assert big.base is None
    del d, e, big
    f = r.empty((13,), F4)                         # full, but (11,) is idle now: dropped
    assert f.base is not None and r.held_bytes() == 2 * 40 + 52
    del a, b, c, f
    r.clear()
    assert r.held_bytes() == 0


def test_large_requests_go_to_the_pool_and_off_is_plain(monkeypatch):
    monkeypatch.setattr(bp, "POOL", bp.BufferPool(min_bytes=1000))
    r = bp.Recycler()
    big = r.empty((500,), F4)                      # 2000 bytes: a view of a pooled buffer
    assert big.base is not None and big.base.dtype == np.uint8 and r.held_bytes() == 0
    monkeypatch.setattr(bp, "POOL", bp.BufferPool(enabled=False))
    a = r.empty((5,), F4)
    assert a.flags.owndata and r.held_bytes() == 0


def test_module_empty_recycles_small_requests():
    a = bp.empty((3, 5), np.float64)
    first = addr(a)
    assert a.base is not None and a.dtype == np.float64
    del a
    assert addr(bp.empty((3, 5), "float64")) == first
    assert bp.empty(7, np.float32).shape == (7,)       # an int shape: the pool's path
