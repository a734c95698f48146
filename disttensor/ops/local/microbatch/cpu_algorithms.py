"""The CPU convolution algorithms as the planner sees them (per rank, no MPI).

Every algorithm object has ``supports``, ``workspace_bytes`` (the arguments of
:meth:`.problem.ConvProblem.args`), ``estimate_seconds(problem)`` (the heuristic mode's cost
model) and ``forward``, ``backward_data``, ``backward_filter`` with the contracts of
:mod:`..cpu.conv_im2col` (``groups`` given).  :func:`cpu_algorithms` is the registry for a
workspace limit: ``im2col-tiled`` (column tiles of up to the limit), ``im2col-plane`` (tiles
of one output depth plane: the smallest workspace), ``im2col-batched`` (one GEMM per group
over the whole micro-batch) and the register-blocked ones of :mod:`..cpu.conv_direct`.
"""
from __future__ import annotations


import numpy as np

from ..cpu import conv_im2col
from ....core.warn import warn

__all__ = ["Im2colTiled", "Im2colBatched", "cpu_algorithms"]


class _Im2col:
    """What the im2col algorithms share: float32 and float64, every shape."""

    def supports(self, pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi, groups, dtype):
        return np.dtype(dtype) in (np.float32, np.float64)


class Im2colTiled(_Im2col):
    """:mod:`..cpu.conv_im2col`'s kernels with column tiles bounded by ``tile_bytes`` (0: one
    output depth plane; None: ``DISTTENSOR_CONV_WORKSPACE_MB``).  Workspace independent of N."""

    def __init__(self, tile_bytes=None):
        self.tile_bytes = tile_bytes

    def workspace_bytes(self, pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi, groups,
                        dtype):
        return conv_im2col.tiled_workspace_bytes(pass_, x_shape, w_shape, stride, dilation,
                                                 pad_lo, pad_hi, groups, dtype, self.tile_bytes)

    def estimate_seconds(self, problem) -> float:
        return conv_im2col.tiled_seconds(*problem.args(), self.tile_bytes)

    def forward(self, x, w, stride, dilation, pad_lo, pad_hi, groups):
        return conv_im2col.conv_forward(x, w, stride, dilation, pad_lo, pad_hi, groups,
                                        workspace_bytes=self.tile_bytes)

    def backward_data(self, dy, w, in_spatial, stride, dilation, pad_lo, pad_hi, groups):
        return conv_im2col.conv_backward_data(dy, w, in_spatial, stride, dilation, pad_lo,
                                              pad_hi, groups, workspace_bytes=self.tile_bytes)

    def backward_filter(self, x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups):
        return conv_im2col.conv_backward_filter(x, dy, kernel, stride, dilation, pad_lo,
                                                pad_hi, groups, workspace_bytes=self.tile_bytes)


class Im2colBatched(_Im2col):
    """:mod:`..cpu.conv_im2col`'s ``*_batched`` kernels: the columns of the whole micro-batch
    in one GEMM per group; workspace ``b * (K + Cout/groups) * P * itemsize``."""

    def workspace_bytes(self, pass_, x_shape, w_shape, stride, dilation, pad_lo, pad_hi, groups,
                        dtype):
        return conv_im2col.batched_workspace_bytes(pass_, x_shape, w_shape, stride, dilation,
                                                   pad_lo, pad_hi, groups, dtype)

    def estimate_seconds(self, problem) -> float:
        return conv_im2col.batched_seconds(*problem.args())

    def forward(self, x, w, stride, dilation, pad_lo, pad_hi, groups):
        return conv_im2col.conv_forward_batched(x, w, stride, dilation, pad_lo, pad_hi, groups)

    def backward_data(self, dy, w, in_spatial, stride, dilation, pad_lo, pad_hi, groups):
        return conv_im2col.conv_backward_data_batched(dy, w, in_spatial, stride, dilation,
                                                      pad_lo, pad_hi, groups)

    def backward_filter(self, x, dy, kernel, stride, dilation, pad_lo, pad_hi, groups):
        return conv_im2col.conv_backward_filter_batched(x, dy, kernel, stride, dilation,
                                                        pad_lo, pad_hi, groups)


_direct_cache: dict = {}


def _direct_algorithms() -> dict:
    """``conv_direct.ALGORITHMS`` where that module imports ({} before it exists; a module
    that fails otherwise is left out with a warning)."""
    if "algos" not in _direct_cache:
        algos = {}
        try:
            from ..cpu import conv_direct
            algos = dict(getattr(conv_direct, "ALGORITHMS", {}))
        except ImportError:
            pass
        except Exception as err:  # noqa: BLE001 - a broken optional module must not break conv
            warn(f"conv_direct failed to import ({type(err).__name__}: {err}); its "
                 "algorithms are not used", RuntimeWarning)
        _direct_cache["algos"] = algos
    return _direct_cache["algos"]


_cpu_algos: dict = {}


def cpu_algorithms(limit: int) -> dict:
    """The CPU algorithms for a workspace limit: ``im2col-tiled`` (tiles of up to ``limit``),
    ``im2col-plane`` (tiles of one output depth plane: the smallest workspace),
    ``im2col-batched``, and those of ``conv_direct`` (which may not reuse these names).
    The same (stateless) objects for the same limit; do not modify the returned dict."""
    limit = int(limit)
    algos = _cpu_algos.get(limit)
    if algos is None:
        algos = {"im2col-tiled": Im2colTiled(limit), "im2col-plane": Im2colTiled(0),
                 "im2col-batched": Im2colBatched()}
        for name, a in _direct_algorithms().items():
            if name not in algos:
                algos[name] = a
        if len(_cpu_algos) > 64:
            _cpu_algos.clear()
        _cpu_algos[limit] = algos
    return algos
