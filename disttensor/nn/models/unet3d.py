"""3D U-Net: an encoder/decoder with skip connections for per-voxel segmentation.

Encoder level ``i``: [Conv3d k3 'same' (no bias) -> BatchNorm3d -> LeakyReLU] x 2 with the widths
``encoder[i]``, then MaxPool3d 2; the bottom block has the widths ``bottom``; each decoder level
upsamples with ConvTranspose3d (k2, s2), concatenates the encoder's output of the same level
along the channels and applies two conv blocks of that level's width; a 1x1x1 Conv3d maps to
``classes`` logits (train with :class:`~disttensor.nn.CrossEntropyLoss`; softmax at
inference).  Defaults are the DESIGN's 3 levels ([32, 64], [64, 128], [128, 256]) and bottom
[256, 512]; every spatial extent must be divisible by ``2**levels``.
"""
from __future__ import annotations

from ..layers import BatchNorm3d, Conv3d, ConvTranspose3d, LeakyReLU, MaxPool3d
from ..module import Module, ModuleList, Sequential
from .. import functional as F
from .blocks import spatial_size

__all__ = ["UNet3D", "unet3d"]


def _block(cin, cout, slope, stats, kw):
    # no conv bias: the batch norm right after removes any per-channel constant
    return Sequential(Conv3d(cin, cout, 3, padding=1, bias=False, **kw),
                      BatchNorm3d(cout, stats=stats, dtype=kw["dtype"], device=kw["device"]),
                      LeakyReLU(slope))


class UNet3D(Module):
    """See the module docstring."""

    def __init__(self, in_channels: int = 1, classes: int = 3,
                 encoder=((32, 64), (64, 128), (128, 256)), bottom=(256, 512),
                 negative_slope: float = 0.01, bn_stats: str = "global", input_size=None,
                 *, dtype="float32", device: str = "cpu", rng=None):
        super().__init__()
        kw = dict(dtype=dtype, device=device, rng=rng)
        self.in_channels, self.classes, self.levels = in_channels, classes, len(encoder)
        self.input_size = None if input_size is None else spatial_size(input_size)
        if self.input_size is not None:
            self._check_size(self.input_size)
        self.down = ModuleList()
        c = in_channels
        skips = []
        for w1, w2 in encoder:
            self.down.append(Sequential(_block(c, w1, negative_slope, bn_stats, kw),
                                        _block(w1, w2, negative_slope, bn_stats, kw)))
            skips.append(w2)
            c = w2
        self.pool = MaxPool3d(2)
        b1, b2 = bottom
        self.bottom = Sequential(_block(c, b1, negative_slope, bn_stats, kw),
                                 _block(b1, b2, negative_slope, bn_stats, kw))
        c = b2
        self.up = ModuleList()
        self.dec = ModuleList()
        for skip in reversed(skips):
            self.up.append(ConvTranspose3d(c, c, 2, stride=2, **kw))
            self.dec.append(Sequential(_block(c + skip, skip, negative_slope, bn_stats, kw),
                                       _block(skip, skip, negative_slope, bn_stats, kw)))
            c = skip
        self.out = Conv3d(c, classes, 1, **kw)

    def _check_size(self, size):
        need = 2 ** self.levels
        if any(n % need for n in size):
            raise ValueError(f"UNet3D with {self.levels} levels needs spatial extents "
                             f"divisible by {need}, got {tuple(size)}")

    def forward(self, x):
        if len(x.shape) != 5 or x.shape[1] != self.in_channels:
            raise ValueError(f"UNet3D expects (N, {self.in_channels}, D, H, W) input, got "
                             f"shape {x.shape}")
        self._check_size(x.shape[2:])
        if self.input_size is not None and tuple(x.shape[2:]) != self.input_size:
            raise ValueError(f"UNet3D was built for samples of spatial size {self.input_size}, "
                             f"got {tuple(x.shape[2:])}")
        skips = []
        for block in self.down:
            x = block(x)
            skips.append(x)
            x = self.pool(x)
        x = self.bottom(x)
        for up, dec, skip in zip(self.up, self.dec, reversed(skips)):
            x = dec(F.cat([up(x), skip]))
        return self.out(x)


def unet3d(**kwargs) -> UNet3D:
    """:class:`UNet3D` with the DESIGN's defaults; keyword arguments override them."""
    return UNet3D(**kwargs)
