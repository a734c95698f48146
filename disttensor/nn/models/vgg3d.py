"""VGG3D: a VGG-like 3D classifier/regressor whose large dense layers hold most parameters.

Stage ``i`` applies ``convs_per_stage[i]`` x [Conv3d k3 'same' -> (BatchNorm3d) -> ReLU] with
``widths[i]`` filters, then MaxPool3d 2; then flatten and the dense layers ``dense`` with
ReLU (and optional dropout) between them, and a last Linear to ``outputs``.  As in VGG, the
first dense layer (``widths[-1] * prod(input_size // 2**stages)`` inputs) dominates the
parameter count while the convolutions dominate the compute: the case where a model does
not fit one device because of its weights, and where a pipeline must balance stages of very
different compute/memory profiles.  Every conv, activation, pool and dense layer is its own
entry of :meth:`VGG3D.pipeline_layers`, so partitions can cut between any two of them.

Train it with the mean squared error on ``(N, outputs)`` targets (a regression like
CosmoFlow's) or with cross-entropy on class indices.
"""
from __future__ import annotations

from ..layers import BatchNorm3d, Conv3d, MaxPool3d, ReLU
from ..module import Module, Sequential
from .blocks import check_pool_stages, check_samples, dense_head, spatial_size

__all__ = ["VGG3D", "vgg3d"]


class VGG3D(Module):
    """See the module docstring.  ``input_size``: spatial extent (cube) or ``(D, H, W)``;
    each extent must be ``>= 2**len(widths)`` (checked at construction).
    ``convs_per_stage``: one count per entry of ``widths`` (or one int for all stages).
    ``batch_norm``: a BatchNorm3d after each conv (the conv then has no bias)."""

    def __init__(self, input_size=32, in_channels: int = 1, widths=(16, 32, 64, 128),
                 convs_per_stage=(1, 1, 2, 2), dense=(1024, 1024), outputs: int = 4,
                 dropout: float = 0.0, batch_norm: bool = False, *, dtype="float32",
                 device: str = "cpu", rng=None, seed: int = 0):
        super().__init__()
        size = spatial_size(input_size)
        widths = tuple(int(w) for w in widths)
        if isinstance(convs_per_stage, int):
            convs_per_stage = (convs_per_stage,) * len(widths)
        convs_per_stage = tuple(int(c) for c in convs_per_stage)
        if len(size) != 3 or not widths:
            raise ValueError("VGG3D needs a 3-d input_size and at least one stage")
        if len(convs_per_stage) != len(widths) or any(c < 1 for c in convs_per_stage):
            raise ValueError(f"VGG3D: convs_per_stage {convs_per_stage} must give one count "
                             f">= 1 per stage of widths {widths}")
        check_pool_stages("VGG3D", size, len(widths))
        self.input_shape = (in_channels,) + size
        kw = dict(dtype=dtype, device=device, rng=rng)
        feats = []
        c, s = in_channels, size
        for w, k in zip(widths, convs_per_stage):
            for _ in range(k):
                feats.append(Conv3d(c, w, 3, padding=1, bias=not batch_norm, **kw))
                if batch_norm:
                    feats.append(BatchNorm3d(w, dtype=dtype, device=device))
                feats.append(ReLU())
                c = w
            feats.append(MaxPool3d(2))
            s = tuple(n // 2 for n in s)
        self.features = Sequential(*feats)
        self.head = Sequential(*dense_head(c, s, dense, outputs, ReLU, dropout, seed, **kw))

    def forward(self, x):
        check_samples("VGG3D", x, self.input_shape)
        return self.head(self.features(x))

    def pipeline_layers(self) -> list:
        """The layers in forward order (:func:`~disttensor.nn.module.sequential_layers`
        expands them to single convs, activations, pools and dense layers)."""
        return [self.features, self.head]


def vgg3d(**kwargs) -> VGG3D:
    """:class:`VGG3D` with its defaults; keyword arguments override them."""
    return VGG3D(**kwargs)
