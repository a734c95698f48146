"""CPU conv3d without an im2col matrix (register-blocked implicit GEMM); see :mod:`.direct`."""
from .direct import (ALGORITHMS, direct_backward_data, direct_backward_filter, direct_forward,
                     pick, release_scratch)

__all__ = ["ALGORITHMS", "pick", "release_scratch", "direct_forward", "direct_backward_data",
           "direct_backward_filter"]
