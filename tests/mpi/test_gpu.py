"""The foundation with CuPy blocks (device='cuda'): skipped where there is no CUDA GPU.

Each check runs the same operation on CPU and GPU blocks and compares with NumPy, so the GPU
paths (packed Alltoallv, packed halo messages staged through host memory unless MPI is
CUDA-aware, CuPy local kernels) are held to the same results as the CPU ones."""
from __future__ import annotations

import numpy as np
import pytest

import disttensor as dt
from disttensor.core.backend import gpu_available

from conftest import assert_all_ranks, assert_allclose_all

pytestmark = pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")

GRIDS = [(0,), (0, 0)]


def _grid(comm, dims):
    return dt.ProcessGrid(dims)


@pytest.mark.parametrize("dims", GRIDS)
def test_blocks_are_cupy_and_roundtrip(comm, dims):
    import cupy
    g = _grid(comm, dims)
    a = np.arange(7 * 5 * 3, dtype=np.float32).reshape(7, 5, 3)
    x = dt.from_global(a, grid=g, device="cuda")
    assert_all_ranks(comm, isinstance(x.local, cupy.ndarray) and x.device == "cuda")
    assert_allclose_all(comm, x.to_numpy(), a)
    y = x.redistribute(split=(None, 0, None) if len(dims) == 1 else (None, 0, 1))
    assert_all_ranks(comm, isinstance(y.local, cupy.ndarray))
    assert_allclose_all(comm, y.to_numpy(), a)


@pytest.mark.parametrize("boundary", ["zero", "periodic"])
@pytest.mark.parametrize("dims", GRIDS)
def test_halo_exchange_and_adjoint(comm, dims, boundary):
    g = _grid(comm, dims)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((9, 6, 4))
    halo = ((2, 1), (1, 2), (1, 1))
    xc = dt.from_global(a, grid=g, halo=halo)
    xg = dt.from_global(a, grid=g, halo=halo, device="cuda")
    xc.exchange_halo(boundary)
    xg.exchange_halo(boundary)
    assert_allclose_all(comm, xg.buffer.get(), xc.buffer)
    # adjoint on GPU equals adjoint on CPU
    yb = rng.standard_normal(xc.buffer.shape)
    xc.buffer[...] = yb
    xg.buffer[...] = xg.xp.asarray(yb)
    xc.reverse_exchange_halo(boundary)
    xg.reverse_exchange_halo(boundary)
    assert_allclose_all(comm, xg.buffer.get(), xc.buffer, rtol=1e-12)


@pytest.mark.parametrize("dims", GRIDS)
def test_ufuncs_reductions_indexing(comm, dims):
    g = _grid(comm, dims)
    a = np.linspace(-3, 3, 8 * 6).reshape(8, 6)
    x = dt.from_global(a, grid=g, device="cuda")
    y = dt.from_global(a[:, :1], grid=g, device="cuda")
    assert_allclose_all(comm, (np.exp(x) * 2 - y).to_numpy(), np.exp(a) * 2 - a[:, :1])
    assert_allclose_all(comm, x.sum(axis=0).to_numpy(), a.sum(axis=0))
    assert_allclose_all(comm, x.var().to_numpy(), a.var())
    assert_all_ranks(comm, int(x.argmax()) == int(a.argmax()))
    assert_allclose_all(comm, x[::-2, 1:5].to_numpy(), a[::-2, 1:5])
    x[2:4] = 0.5
    b = a.copy()
    b[2:4] = 0.5
    assert_allclose_all(comm, x.to_numpy(), b)


def test_random_same_on_cpu_and_gpu(comm):
    g = dt.ProcessGrid()
    c = dt.random.default_rng(5).normal(shape=(10, 4), grid=g)
    d = dt.random.default_rng(5).normal(shape=(10, 4), grid=g, device="cuda")
    assert_allclose_all(comm, d.to_numpy(), c.to_numpy(), rtol=1e-12)
