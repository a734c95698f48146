"""GPU local kernels (per rank, no MPI) on CuPy arrays (being split by op family)."""
from .cudnn_conv import *  # noqa: F401,F403
from .cudnn_conv import __all__, _chunks, _module  # noqa: F401
