"""GPU communication paths (disttensor.core.gpucomm, nn.parallel's device buckets, the pinned
halo staging of core.comm): skipped where there is no CUDA GPU.

Every path is held to the host result: a device all-reduce (NCCL where it runs, else MPI) equals
the NumPy sum; the gradient buckets of CuPy parameters equal those of the same parameters on the
host; a staged halo exchange equals the CPU one, twice in a row (the pinned buffers are reused).
The path taken is whatever this machine offers (``gpu_paths`` reports it)."""
from __future__ import annotations

import numpy as np
import pytest

import disttensor as dt
from disttensor.core.backend import gpu_available

from conftest import assert_all_ranks, assert_allclose_all

pytestmark = pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int64])
def test_device_allreduce_sum_matches_host(comm, dtype):
    import cupy
    from disttensor.core.comm import allreduce
    rng = np.random.default_rng(comm.rank)
    host = (rng.standard_normal(1000) * 10).astype(dtype)
    want = allreduce(comm, host, "sum")
    got = allreduce(comm, cupy.asarray(host), "sum")
    assert_all_ranks(comm, isinstance(got, cupy.ndarray) and got.dtype == dtype,
                     "device in, device out, same dtype")
    tol = 1e-2 if dtype == np.float16 else 1e-6
    assert_allclose_all(comm, cupy.asnumpy(got).astype(np.float64),
                        want.astype(np.float64), rtol=tol, atol=tol)


def test_gpu_paths_are_reported(comm):
    from disttensor.core.gpucomm import gpu_paths
    paths = gpu_paths(comm)
    assert_all_ranks(comm, set(paths) == {"gradient sums", "halo exchange"})
    assert_all_ranks(comm, all(isinstance(v, str) and v for v in paths.values()))


def _grads(comm, device):
    import disttensor.nn as nn
    from disttensor.nn.parallel import GradientReducer
    grid = dt.ProcessGrid((comm.size,))
    rng = np.random.default_rng(0)
    shapes = [(3, 4), (5,), (2, 2, 2)]
    params = [nn.Parameter(rng.standard_normal(s)) for s in shapes]
    if device == "cuda":
        import cupy
        for p in params:
            p.data = cupy.asarray(p.data)
    red = GradientReducer(params, grid, bucket_bytes=64)
    shares = [np.random.default_rng(comm.rank + 10 * i).standard_normal(s)
              for i, s in enumerate(shapes)]
    for p, s in zip(params, shares):
        xp = __import__("cupy") if device == "cuda" else np
        red._ready(p, xp.asarray(s))
    red.finish()
    out = [np.asarray(p.grad.get() if device == "cuda" else p.grad) for p in params]
    transport = red.transport
    red.release()
    return out, transport


def test_gradient_buckets_on_device_match_host(comm):
    host, t_host = _grads(comm, "cpu")
    dev, t_dev = _grads(comm, "cuda")
    assert_all_ranks(comm, t_host == "host" and t_dev != "host", f"{t_host}, {t_dev}")
    for h, d in zip(host, dev):
        assert_allclose_all(comm, d, h, rtol=1e-12, atol=1e-12)


def test_staged_halo_exchange_reuses_buffers(comm):
    a = np.arange(4 * 9 * 5, dtype=np.float64).reshape(4, 9, 5)
    g = dt.ProcessGrid((comm.size,))
    for _ in range(2):  # the second exchange runs on the same (pinned) scratch
        xc = dt.from_global(a, grid=g, split=(None, 0, None)).with_halo((0, 1, 0))
        xg = dt.from_global(a, grid=g, split=(None, 0, None), device="cuda").with_halo((0, 1, 0))
        xc.exchange_halo("periodic")
        xg.exchange_halo("periodic")
        assert_allclose_all(comm, xg.buffer.get(), xc.buffer)
