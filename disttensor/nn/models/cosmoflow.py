"""CosmoFlow (MLPerf HPC): a 3D CNN regressing cosmological parameters from a universe cube.

MLPerf HPC's layout: a ``(4, 128, 128, 128)`` input, five stages of [Conv3d k3 'same' ->
LeakyReLU -> MaxPool3d 2] with 32, 64, 128, 256, 512 filters, flatten, dense 128 -> 64 -> 4
with LeakyReLU (and optional dropout) between them, and ``1.2 * tanh`` on the output; trained
with the mean squared error.  Input size, channels, widths (hence the number of stages), dense
sizes and outputs are arguments, so a 32^3 model trains in minutes on a CPU.
"""
from __future__ import annotations

from ..layers import Conv3d, Dropout, Flatten, LeakyReLU, Linear, MaxPool3d, ScaledTanh
from ..module import Module, Sequential

__all__ = ["CosmoFlow", "cosmoflow"]


class CosmoFlow(Module):
    """See the module docstring.  ``input_size``: spatial extent ``S`` (cube) or ``(D, H,
    W)``; every extent must survive the pooling stages (``>= 2**len(widths)``)."""

    def __init__(self, input_size=128, in_channels: int = 4,
                 widths=(32, 64, 128, 256, 512), dense=(128, 64), outputs: int = 4,
                 negative_slope: float = 0.3, dropout: float = 0.0, output_scale: float = 1.2,
                 *, dtype="float32", device: str = "cpu", rng=None, seed: int = 0):
        super().__init__()
        size = tuple(input_size) if isinstance(input_size, (tuple, list)) else (input_size,) * 3
        widths = tuple(int(w) for w in widths)
        if len(size) != 3 or not widths:
            raise ValueError("CosmoFlow needs a 3-d input_size and at least one stage")
        need = 2 ** len(widths)
        if any(n < need for n in size):
            raise ValueError(f"CosmoFlow: input of spatial size {size} is too small for "
                             f"{len(widths)} pooling stages (each extent must be >= {need})")
        self.input_shape = (in_channels,) + size
        kw = dict(dtype=dtype, device=device, rng=rng)
        convs = []
        c, s = in_channels, size
        for w in widths:
            convs += [Conv3d(c, w, 3, padding=1, **kw), LeakyReLU(negative_slope),
                      MaxPool3d(2)]
            c, s = w, tuple(n // 2 for n in s)
        self.features = Sequential(*convs)
        head = [Flatten()]
        f = c * s[0] * s[1] * s[2]
        for i, d in enumerate(dense):
            head += [Linear(f, d, **kw), LeakyReLU(negative_slope)]
            if dropout:
                head.append(Dropout(dropout, seed=seed + i))
            f = d
        head += [Linear(f, outputs, **kw), ScaledTanh(output_scale)]
        self.head = Sequential(*head)

    def forward(self, x):
        if tuple(x.shape[1:]) != self.input_shape:
            raise ValueError(f"CosmoFlow expects samples of shape {self.input_shape} "
                             f"(C, D, H, W), got {tuple(x.shape[1:])}")
        return self.head(self.features(x))

    def pipeline_layers(self) -> list:
        """The layers in forward order (:func:`~disttensor.nn.module.sequential_layers`)."""
        return [self.features, self.head]


def cosmoflow(**kwargs) -> CosmoFlow:
    """:class:`CosmoFlow` with MLPerf HPC's defaults; keyword arguments override them."""
    return CosmoFlow(**kwargs)
