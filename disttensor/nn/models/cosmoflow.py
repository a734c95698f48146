"""CosmoFlow (MLPerf HPC): a 3D CNN regressing cosmological parameters from a universe cube.

MLPerf HPC's layout: a ``(4, 128, 128, 128)`` input, five stages of [Conv3d k3 'same' ->
LeakyReLU -> MaxPool3d 2] with 32, 64, 128, 256, 512 filters, flatten, dense 128 -> 64 -> 4
with LeakyReLU (and optional dropout) between them, and ``1.2 * tanh`` on the output; trained
with the mean squared error.  Input size, channels, widths (hence the number of stages), dense
sizes and outputs are arguments, so a 32^3 model trains in minutes on a CPU.
"""
from __future__ import annotations

from ..layers import Conv3d, LeakyReLU, MaxPool3d, ScaledTanh
from ..module import Module, Sequential
from .blocks import check_pool_stages, check_samples, dense_head, spatial_size

__all__ = ["CosmoFlow", "cosmoflow"]


class CosmoFlow(Module):
    """See the module docstring.  ``input_size``: spatial extent ``S`` (cube) or ``(D, H,
    W)``; every extent must survive the pooling stages (``>= 2**len(widths)``)."""

    def __init__(self, input_size=128, in_channels: int = 4,
                 widths=(32, 64, 128, 256, 512), dense=(128, 64), outputs: int = 4,
                 negative_slope: float = 0.3, dropout: float = 0.0, output_scale: float = 1.2,
                 *, dtype="float32", device: str = "cpu", rng=None, seed: int = 0):
        super().__init__()
        size = spatial_size(input_size)
        widths = tuple(int(w) for w in widths)
        if len(size) != 3 or not widths:
            raise ValueError("CosmoFlow needs a 3-d input_size and at least one stage")
        check_pool_stages("CosmoFlow", size, len(widths))
        self.input_shape = (in_channels,) + size
        kw = dict(dtype=dtype, device=device, rng=rng)
        convs = []
        c, s = in_channels, size
        for w in widths:
            convs += [Conv3d(c, w, 3, padding=1, **kw), LeakyReLU(negative_slope),
                      MaxPool3d(2)]
            c, s = w, tuple(n // 2 for n in s)
        self.features = Sequential(*convs)
        head = dense_head(c, s, dense, outputs, lambda: LeakyReLU(negative_slope), dropout,
                          seed, **kw)
        self.head = Sequential(*head, ScaledTanh(output_scale))

    def forward(self, x):
        check_samples("CosmoFlow", x, self.input_shape)
        return self.head(self.features(x))

    def pipeline_layers(self) -> list:
        """The layers in forward order (:func:`~disttensor.nn.module.sequential_layers`)."""
        return [self.features, self.head]


def cosmoflow(**kwargs) -> CosmoFlow:
    """:class:`CosmoFlow` with MLPerf HPC's defaults; keyword arguments override them."""
    return CosmoFlow(**kwargs)
