"""Distributed CNN ops on DistArrays, each with explicit forward and backward functions.

Layout ``N, C, *spatial`` (1 to 3 spatial axes).  The channel axis must not be split; the
sample axis and any subset of the spatial axes may be.  A rank computes the output block it
owns from its input block plus a halo whose width follows from the window index math in
:mod:`disttensor.ops.window`; backward passes send halo gradients back to their owners with the
reverse (adjoint) halo exchange.  Per-rank kernels live in :mod:`disttensor.ops.local`.
"""
