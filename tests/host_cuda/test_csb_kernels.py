"""disttensor/sparse/kernels/csb.cu on the host through the real wrapper
(disttensor/sparse/local_gpu.py) against the CPU kernels (disttensor/sparse/local_cpu.py):
A @ X and A.T @ X (lines whole, and heavy lines split so that their chunks add with atomics)
and SDDMM, float32/float64, both in-block index types (uint8: beta <= 256, uint16: beta 512),
empty rows and blocks, k = 1..33."""
from __future__ import annotations

import numpy as np
import pytest

from disttensor.sparse import CSBMatrix, local_cpu, local_gpu
from host_helpers import assert_close

CASES = [  # (shape, density, block_size, k)
    ((37, 53), 0.3, 8, 3),
    ((64, 16), 1.0, 4, 1),
    ((1, 40), 0.5, None, 5),
    ((45, 1), 0.6, 2, 33),
    ((30, 700), 0.05, 512, 2),     # uint16 in-block indices
    ((20, 20), 0.0, 4, 3),         # no nonzeros
]


def _case(i, dtype):
    shape, density, bs, k = CASES[i]
    rng = np.random.default_rng(i)
    a = rng.standard_normal(shape)
    a[rng.random(shape) >= density] = 0
    if shape[0] > 10:
        a[shape[0] // 3] = 0                                  # an empty row
    A = CSBMatrix.from_dense(a.astype(dtype), block_size=bs)
    x = rng.standard_normal((shape[1], k)).astype(dtype)
    z = rng.standard_normal((shape[0], k)).astype(dtype)
    return A, x, z, k


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("target", [None, 3])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_spmm_matches_cpu(host, case, target, dtype):
    A, x, z, k = _case(case, dtype)
    s, v = A.structure, A.values
    if target is not None and case in (0, 1, 4):                # the atomic path runs
        assert s.plan(False, 0, target).split_lines.size > 0
        assert s.plan(True, 0, target).split_lines.size > 0
    for by_columns, rhs, inner in ((False, x, A.shape[1]), (True, z, A.shape[0])):
        got = local_gpu.spmm(s, v, rhs, by_columns, target)
        want = local_cpu.spmm(s, v, rhs, by_columns)
        assert_close(got, want, dtype, scale=np.abs(rhs).max(initial=0) * max(inner, 1) * 4,
                     what=f"by_columns={by_columns}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_sddmm_matches_cpu(host, case, dtype):
    A, x, z, k = _case(case, dtype)
    got = local_gpu.sddmm(A.structure, z, x, dtype)
    want = local_cpu.sddmm(A.structure, z, x, dtype)
    assert got.shape == (A.nnz,)
    assert_close(got, want, dtype, scale=float(k) * 8, what="sddmm")


def test_gpu_chunk_target_bounds():
    assert local_gpu.chunk_target(0, 1) == local_gpu.MIN_GPU_CHUNK
    assert local_gpu.chunk_target(10**9, 256) <= 2048
    assert local_gpu.MIN_GPU_CHUNK <= local_gpu.chunk_target(10**6, 64) <= 2048
