"""The CPU kernels behind :func:`disttensor.ops.local.kernels_for` for NumPy blocks (per rank,
no MPI; NumPy + Numba).

* :mod:`.conv_im2col`: convolution as im2col + BLAS GEMM in bounded tiles, and the batched
  variants (one GEMM per group over all samples);
* :mod:`.conv_direct`: convolution as a register-blocked implicit GEMM on 512-bit vectors;
* :mod:`.pool`: 3-D max/average pooling and their adjoints;
* :mod:`.pointwise`: batch norm, activations and the channel softmax.

The micro-batch planner (:mod:`disttensor.ops.local.microbatch`) chooses among the
convolution algorithms per layer, pass and micro-batch.
"""
