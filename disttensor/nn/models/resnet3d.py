"""3D ResNet (He et al., "Deep residual learning"; the 3D form of Hara et al.): a stem, four
stages of residual blocks, global average pooling and a linear head.

Stem: Conv3d(k ``stem_kernel``, stride ``stem_stride``, no bias) -> BatchNorm3d -> ReLU, then
MaxPool3d(3, stride 2, padding 1) when ``stem_pool``.  Stage ``i`` has ``layers[i]`` blocks of
width ``widths[i]``; its first block has stride 2 (stage 0: stride 1) and, where the stride or
the width changes, a projection shortcut Conv3d(1x1x1, stride) -> BatchNorm3d (torchvision's
"option B").  :class:`BasicBlock`: two 3x3x3 convolutions (expansion 1); :class:`Bottleneck`:
1x1x1 -> 3x3x3 (the stride) -> 1x1x1 with expansion 4 (torchvision's ResNet v1.5).  Then
AdaptiveAvgPool3d(1), flatten and Linear(``widths[-1] * expansion``, ``outputs``).  Weights as
torchvision: Kaiming-normal (fan_out, relu) convolutions, unit/zero batch norms,
``zero_init_residual`` zeroes the last batch norm of each block.

Every layer is a distributed op, so the model trains on any sample x spatial grid: the
shortcut's output is distributed like the block's main path (both are convolutions of the same
input with the same stride), the pooling is the global mean over the spatial blocks.
"""
from __future__ import annotations

from .. import init
from ..layers import BatchNorm3d, Conv3d, Linear, MaxPool3d, ReLU
from ..module import Module, Sequential
from .blocks import check_samples, spatial_size

__all__ = ["BasicBlock", "Bottleneck", "ResNet3D", "resnet3d", "resnet18_3d", "resnet50_3d"]


def _conv(cin, cout, k, stride, kw):
    return Conv3d(cin, cout, k, stride=stride, padding=k // 2, bias=False, **kw)


def _bn(c, kw, stats):
    return BatchNorm3d(c, stats=stats, dtype=kw["dtype"], device=kw["device"])


class BasicBlock(Module):
    """``relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))`` with 3x3x3 convolutions."""
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int = 1, *, bn_stats="global", **kw):
        super().__init__()
        self.conv1, self.bn1 = _conv(cin, width, 3, stride, kw), _bn(width, kw, bn_stats)
        self.conv2, self.bn2 = _conv(width, width, 3, 1, kw), _bn(width, kw, bn_stats)
        self.relu = ReLU()
        self.downsample = _shortcut(cin, width, stride, kw, bn_stats)

    def last_norm(self):
        return self.bn2

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class Bottleneck(Module):
    """1x1x1 (``width``) -> 3x3x3 (``width``, the stride) -> 1x1x1 (``4 * width``) with batch
    norms, plus the shortcut, then ReLU."""
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1, *, bn_stats="global", **kw):
        super().__init__()
        out = width * self.expansion
        self.conv1, self.bn1 = _conv(cin, width, 1, 1, kw), _bn(width, kw, bn_stats)
        self.conv2, self.bn2 = _conv(width, width, 3, stride, kw), _bn(width, kw, bn_stats)
        self.conv3, self.bn3 = _conv(width, out, 1, 1, kw), _bn(out, kw, bn_stats)
        self.relu = ReLU()
        self.downsample = _shortcut(cin, out, stride, kw, bn_stats)

    def last_norm(self):
        return self.bn3

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


def _shortcut(cin, cout, stride, kw, bn_stats):
    if stride == 1 and cin == cout:
        return None
    return Sequential(_conv(cin, cout, 1, stride, kw), _bn(cout, kw, bn_stats))


BLOCKS = {"basic": BasicBlock, "bottleneck": Bottleneck}


class ResNet3D(Module):
    """See the module docstring.  ``block``: ``'basic'``/``'bottleneck'`` or the class;
    ``input_size``: the spatial extent (cube) or ``(D, H, W)``, checked in ``forward`` when
    given; ``outputs``: regression targets or class logits."""

    def __init__(self, block="basic", layers=(2, 2, 2, 2), widths=(64, 128, 256, 512),
                 in_channels: int = 1, outputs: int = 4, stem_kernel: int = 7,
                 stem_stride: int = 2, stem_pool: bool = True, zero_init_residual: bool = False,
                 bn_stats: str = "global", input_size=None, *, dtype="float32",
                 device: str = "cpu", rng=None):
        super().__init__()
        block = BLOCKS.get(block, block) if isinstance(block, str) else block
        if block not in BLOCKS.values():
            raise ValueError(f"ResNet3D block must be 'basic' or 'bottleneck', got {block!r}")
        layers, widths = tuple(int(n) for n in layers), tuple(int(w) for w in widths)
        if len(layers) != len(widths) or not layers or min(layers) < 1:
            raise ValueError(f"ResNet3D needs one positive block count per width, got "
                             f"layers={layers}, widths={widths}")
        kw = dict(dtype=dtype, device=device, rng=rng)
        self.in_channels = in_channels
        self.input_shape = None if input_size is None else \
            (in_channels,) + spatial_size(input_size)
        stem = [_conv(in_channels, widths[0], stem_kernel, stem_stride, kw),
                _bn(widths[0], kw, bn_stats), ReLU()]
        if stem_pool:
            stem.append(MaxPool3d(3, stride=2, padding=1))
        self.stem = Sequential(*stem)
        c = widths[0]
        stages = []
        for i, (n, w) in enumerate(zip(layers, widths)):
            blocks = []
            for j in range(n):
                stride = 2 if (i > 0 and j == 0) else 1
                blocks.append(block(c, w, stride, bn_stats=bn_stats, **kw))
                c = w * block.expansion
            stages.append(Sequential(*blocks))
        self.stages = Sequential(*stages)
        from .. import AdaptiveAvgPool3d, Flatten  # nn's public names
        self.pool = AdaptiveAvgPool3d(1)
        self.flatten = Flatten()
        self.fc = Linear(c, outputs, **kw)
        self._init_weights(zero_init_residual, rng)

    def _init_weights(self, zero_init_residual: bool, rng) -> None:
        for m in self.modules():
            if isinstance(m, Conv3d):
                init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu", rng=rng)
            elif isinstance(m, BatchNorm3d):
                init.ones_(m.weight)
                init.zeros_(m.bias)
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, (BasicBlock, Bottleneck)):
                    init.zeros_(m.last_norm().weight)

    def forward(self, x):
        if len(x.shape) != 5 or x.shape[1] != self.in_channels:
            raise ValueError(f"ResNet3D expects (N, {self.in_channels}, D, H, W) input, got "
                             f"shape {tuple(x.shape)}")
        if self.input_shape is not None:
            check_samples("ResNet3D", x, self.input_shape)
        return self.fc(self.flatten(self.pool(self.stages(self.stem(x)))))


def resnet3d(**kwargs) -> ResNet3D:
    """:class:`ResNet3D` (ResNet-18's layout by default); keyword arguments override it."""
    return ResNet3D(**kwargs)


def resnet18_3d(**kwargs) -> ResNet3D:
    """ResNet-18: basic blocks (2, 2, 2, 2)."""
    return ResNet3D(**{"block": "basic", "layers": (2, 2, 2, 2), **kwargs})


def resnet50_3d(**kwargs) -> ResNet3D:
    """ResNet-50: bottleneck blocks (3, 4, 6, 3)."""
    return ResNet3D(**{"block": "bottleneck", "layers": (3, 4, 6, 3), **kwargs})
