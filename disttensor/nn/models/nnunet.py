"""An nnU-Net-style 3D U-Net (Isensee et al., "nnU-Net", Nature Methods 2021: the
"PlainConvUNet" of nnU-Net v2) and its deep-supervision loss.

Stage ``s`` of the encoder: ``convs_per_stage`` blocks of [Conv3d k3 'same' (bias) ->
InstanceNorm3d(affine) -> LeakyReLU(0.01)] of width ``features[s]``; stages after the first
downsample with a stride-2 first convolution (no pooling).  The decoder goes back up stage by
stage: ConvTranspose3d(k2, s2) to the skip's width, concatenation with the encoder output of
that resolution, ``convs_per_stage`` conv blocks, and a 1x1x1 segmentation head.  With
``deep_supervision`` (training only, as nnU-Net) ``forward`` returns the logits of every decoder
stage, full resolution first; in eval mode (or without it) the full-resolution logits.

:class:`DeepSupervisionLoss` trains it as nnU-Net does: the loss (Dice over the foreground
classes + cross-entropy, :class:`~disttensor.nn.DiceCELoss`) of each output against the labels
subsampled to its resolution (nearest neighbour: every ``2**i``-th voxel), weighted
``1 / 2**i`` with the lowest resolution's weight 0, the weights normalized to sum to 1.

Every extent must be divisible by ``2**(len(features) - 1)``.  Everything is collective over
the activations' grid (any sample x spatial grid).
"""
from __future__ import annotations

from ..layers import Conv3d, ConvTranspose3d, LeakyReLU
from ..module import Module, ModuleList, Sequential
from .. import functional as F
from .blocks import spatial_size

__all__ = ["NNUNet3D", "nnunet3d", "DeepSupervisionLoss", "deep_supervision_weights"]


def _conv_block(cin, cout, stride, slope, kw):
    from .. import InstanceNorm3d  # nn's public name (imported late: nn/__init__ loads us)
    return Sequential(Conv3d(cin, cout, 3, stride=stride, padding=1, **kw),
                      InstanceNorm3d(cout, affine=True, dtype=kw["dtype"],
                                     device=kw["device"]),
                      LeakyReLU(slope))


def _stage(cin, cout, stride, n, slope, kw):
    blocks = [_conv_block(cin, cout, stride, slope, kw)]
    blocks += [_conv_block(cout, cout, 1, slope, kw) for _ in range(n - 1)]
    return Sequential(*blocks)


class NNUNet3D(Module):
    """See the module docstring.  ``features``: the width of each resolution stage (nnU-Net:
    32, 64, 128, 256, 320, 320 capped at 320); ``input_size``: optional spatial size checked
    in ``forward``."""

    def __init__(self, in_channels: int = 1, classes: int = 3,
                 features=(32, 64, 128, 256, 320), convs_per_stage: int = 2,
                 negative_slope: float = 0.01, deep_supervision: bool = True,
                 input_size=None, *, dtype="float32", device: str = "cpu", rng=None):
        super().__init__()
        features = tuple(int(f) for f in features)
        if len(features) < 2 or min(features) < 1 or convs_per_stage < 1:
            raise ValueError(f"NNUNet3D needs at least two positive stage widths and one "
                             f"conv per stage, got features={features}, "
                             f"convs_per_stage={convs_per_stage}")
        kw = dict(dtype=dtype, device=device, rng=rng)
        self.in_channels, self.classes = in_channels, classes
        self.deep_supervision, self.levels = deep_supervision, len(features)
        self.input_size = None if input_size is None else spatial_size(input_size)
        if self.input_size is not None:
            self._check_size(self.input_size)
        self.encoder = ModuleList()
        c = in_channels
        for s, f in enumerate(features):
            self.encoder.append(_stage(c, f, 1 if s == 0 else 2, convs_per_stage,
                                       negative_slope, kw))
            c = f
        self.up, self.decoder, self.heads = ModuleList(), ModuleList(), ModuleList()
        for skip in reversed(features[:-1]):
            self.up.append(ConvTranspose3d(c, skip, 2, stride=2, **kw))
            self.decoder.append(_stage(2 * skip, skip, 1, convs_per_stage, negative_slope,
                                       kw))
            self.heads.append(Conv3d(skip, classes, 1, **kw))
            c = skip

    @property
    def num_outputs(self) -> int:
        """How many logits ``forward`` returns in training with deep supervision."""
        return self.levels - 1

    def _check_size(self, size):
        need = 2 ** (self.levels - 1)
        if any(n % need for n in size):
            raise ValueError(f"NNUNet3D with {self.levels} stages needs spatial extents "
                             f"divisible by {need}, got {tuple(size)}")

    def forward(self, x):
        if len(x.shape) != 5 or x.shape[1] != self.in_channels:
            raise ValueError(f"NNUNet3D expects (N, {self.in_channels}, D, H, W) input, got "
                             f"shape {tuple(x.shape)}")
        self._check_size(x.shape[2:])
        if self.input_size is not None and tuple(x.shape[2:]) != self.input_size:
            raise ValueError(f"NNUNet3D was built for samples of spatial size "
                             f"{self.input_size}, got {tuple(x.shape[2:])}")
        skips = []
        for stage in self.encoder:
            x = stage(x)
            skips.append(x)
        x = skips.pop()
        outputs = []
        for up, dec, head in zip(self.up, self.decoder, self.heads):
            x = dec(F.cat([up(x), skips.pop()]))
            if self.deep_supervision and self.training:
                outputs.append(head(x))
        if self.deep_supervision and self.training:
            return outputs[::-1]
        return self.heads[-1](x)


def nnunet3d(**kwargs) -> NNUNet3D:
    """:class:`NNUNet3D` with nnU-Net's 3d_fullres widths for 5 stages; keyword arguments
    override them."""
    return NNUNet3D(**kwargs)


def deep_supervision_weights(n: int) -> list[float]:
    """nnU-Net's weights of ``n`` outputs (full resolution first): ``1 / 2**i``, the lowest
    resolution's set to 0 (when ``n > 1``), normalized to sum to 1."""
    w = [1.0 / 2 ** i for i in range(n)]
    if n > 1:
        w[-1] = 0.0
    total = sum(w)
    return [v / total for v in w]


class DeepSupervisionLoss(Module):
    """``sum_i w_i * loss(outputs[i], labels subsampled to outputs[i])``; a single output
    (eval mode) is ``loss(output, labels)``.  ``loss`` default: Dice (softmax, foreground
    classes) + cross-entropy, nnU-Net v2's ``DC_and_CE_loss``
    (``DiceCELoss(include_background=False, softmax=True)``); ``weights`` default:
    :func:`deep_supervision_weights`.  Collective over the activations' grid."""

    def __init__(self, loss=None, weights=None):
        super().__init__()
        if loss is None:
            from .. import DiceCELoss
            loss = DiceCELoss(include_background=False, softmax=True)
        self.loss = loss
        self.weights = None if weights is None else [float(w) for w in weights]

    def forward(self, outputs, labels):
        if not isinstance(outputs, (list, tuple)):
            return self.loss(outputs, labels)
        weights = self.weights or deep_supervision_weights(len(outputs))
        if len(weights) != len(outputs):
            raise ValueError(f"DeepSupervisionLoss has {len(weights)} weights for "
                             f"{len(outputs)} outputs")
        total = None
        for i, (out, w) in enumerate(zip(outputs, weights)):
            if w == 0.0:
                continue
            term = self.loss(out, _subsampled(labels, out, 2 ** i)) * w
            total = term if total is None else total + term
        return total


def _subsampled(labels, like, step: int):
    """Every ``step``-th voxel of the ``(N, *S)`` labels along each spatial axis (the nearest
    neighbour of ``like``'s resolution); a Tensor's data or a DistArray."""
    from ...autograd.tensor import Tensor, unwrap
    if step == 1:
        return labels
    lab = unwrap(labels)
    sub = lab[(slice(None),) + (slice(None, None, step),) * (lab.ndim - 1)]
    expect = (like.shape[0],) + tuple(like.shape[2:])
    if tuple(sub.shape) != expect:
        raise ValueError(f"DeepSupervisionLoss: labels of shape {tuple(lab.shape)} subsampled "
                         f"by {step} give {tuple(sub.shape)}, the output needs {expect}")
    return Tensor(sub) if isinstance(labels, Tensor) else sub
