"""disttensor.sparse: Compressed Sparse Blocks (CSB) matrices.

* :class:`CSBMatrix` (:mod:`.csb`): the local type (one process), float32/float64, CPU or
  CUDA: construction from dense, COO and ``scipy.sparse``, ``A @ X`` and ``A.T @ X`` from one
  structure, :func:`sddmm` (the weight gradient of a sparse layer).
* pure index math: :mod:`.morton` (Z-Morton order, compact index types), :mod:`.blocking`
  (block size, block pointers, load-balanced chunks of lines).
* kernels: :mod:`.local_cpu` (Numba), :mod:`.local_gpu` (CuPy RawKernels of
  ``kernels/csb.cu``).

SciPy is optional (``pip install disttensor[sparse]``): only ``from_scipy``/``to_scipy`` need
it.
"""
from __future__ import annotations

from .blocking import choose_block_size
from .csb import CSBMatrix, sddmm
# distributed matrices (S2): DistCSBMatrix, generators, solvers, HDF5 files
from .distributed import DistCSBMatrix
from .laplacian import laplacian_3d, random_graph
from . import linalg
from .io import read_hdf5, write_hdf5

__all__ = ["CSBMatrix", "sddmm", "choose_block_size"]
__all__ += ["DistCSBMatrix", "laplacian_3d", "random_graph", "linalg", "read_hdf5",
            "write_hdf5"]
