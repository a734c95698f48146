"""Pure descriptions of a model's layers, for planning models too large to build here.

A :class:`LayerSpec` carries what :func:`~.geometry.analyze_layers` and the compute model of
:mod:`.machine` read from a layer (its type name, channels, kernel, stride, padding, features,
parameter bytes) and nothing else: no parameter arrays are allocated, so CosmoFlow at 512^3
(39 M parameters) or a 3D U-Net at 256^3 are described in microseconds.

* :func:`cosmoflow_layers` -- exactly the layers of :class:`~disttensor.nn.models.CosmoFlow`
  in forward order (:func:`~disttensor.nn.module.sequential_layers` of the built model gives
  the same geometry; a unit test holds the two together);
* :func:`unet_layers` -- :class:`~disttensor.nn.models.UNet3D` unrolled into a sequence:
  each decoder level's ``ConvTranspose3d`` (kernel = stride = 2) followed by a ``Concat``
  that appends the encoder's channels of that level (the skip tensor itself stays alive from
  the encoder on; it is counted where the encoder's pooling saves it).

Nothing here communicates or allocates arrays.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["LayerSpec", "cosmoflow_layers", "unet_layers", "spec_param_bytes", "levels_of",
           "materialize", "cosmoflow_sample_bytes", "unet_sample_bytes"]


@dataclass(frozen=True)
class LayerSpec:
    """One layer, described (pure).  ``layer_type``: the name of the :mod:`disttensor.nn`
    layer it stands for (``Conv3d``, ``ConvTranspose3d``, ``MaxPool3d``, ``AvgPool3d``,
    ``LeakyReLU``, ``BatchNorm3d``, ``Flatten``, ``Linear``, ``ScaledTanh``) or ``Concat``
    (a skip connection adding ``skip_channels``); ``params``: its parameter count (float32
    parameters: ``param_bytes = 4 * params``)."""
    layer_type: str
    in_channels: int = 0
    out_channels: int = 0
    kernel_size: tuple = (1, 1, 1)
    stride: tuple | None = (1, 1, 1)
    padding: tuple = (0, 0, 0)
    dilation: tuple = (1, 1, 1)
    padding_mode: str = "zeros"
    groups: int = 1
    in_features: int = 0
    out_features: int = 0
    stats: str = "global"
    skip_channels: int = 0
    params: int = 0

    @property
    def param_bytes(self) -> int:
        return 4 * int(self.params)

    def parameters(self):
        """No arrays: a description has none (its size is ``param_bytes``)."""
        return iter(())

    def modules(self):
        return iter((self,))


def spec_param_bytes(layers) -> int:
    """Total parameter bytes of a list of :class:`LayerSpec`."""
    return sum(l.param_bytes for l in layers)


def _conv(cin, cout, k=3, pad=1, bias=True):
    return LayerSpec("Conv3d", cin, cout, (k,) * 3, (1,) * 3, (pad,) * 3,
                     params=cin * cout * k ** 3 + (cout if bias else 0))


def cosmoflow_layers(size: int = 128, in_channels: int = 4,
                     widths=(32, 64, 128, 256, 512), dense=(128, 64),
                     outputs: int = 4) -> list:
    """The layers of :class:`~disttensor.nn.models.CosmoFlow` (same arguments; dropout off):
    per width ``Conv3d k3 'same' -> LeakyReLU -> MaxPool3d 2``, then ``Flatten``, ``Linear
    -> LeakyReLU`` per dense size, the output ``Linear`` and ``ScaledTanh``."""
    size, widths, dense = int(size), tuple(int(w) for w in widths), tuple(int(d) for d in dense)
    if not widths or size < 2 ** len(widths):
        raise ValueError(f"cosmoflow_layers: input size {size} too small for {len(widths)} "
                         f"pooling stages (>= {2 ** len(widths)})")
    out, c, s = [], int(in_channels), size
    for w in widths:
        out += [_conv(c, w), LayerSpec("LeakyReLU"),
                LayerSpec("MaxPool3d", kernel_size=(2,) * 3, stride=(2,) * 3)]
        c, s = w, s // 2
    out.append(LayerSpec("Flatten"))
    f = c * s ** 3
    for d in dense:
        out += [LayerSpec("Linear", in_features=f, out_features=d, params=f * d + d),
                LayerSpec("LeakyReLU")]
        f = d
    out += [LayerSpec("Linear", in_features=f, out_features=outputs,
                      params=f * outputs + outputs), LayerSpec("ScaledTanh")]
    return out


def unet_layers(in_channels: int = 1, classes: int = 3,
                encoder=((32, 64), (64, 128), (128, 256)), bottom=(256, 512),
                stats: str = "global") -> list:
    """:class:`~disttensor.nn.models.UNet3D` (same arguments) unrolled: per block ``Conv3d
    k3 (no bias) -> BatchNorm3d -> LeakyReLU``; two blocks and ``MaxPool3d 2`` per encoder
    level; the bottom's two blocks; per decoder level ``ConvTranspose3d k2 s2``, ``Concat``
    of the encoder's channels and two blocks; the 1x1x1 output ``Conv3d``."""
    def block(cin, cout):
        return [_conv(cin, cout, bias=False),
                LayerSpec("BatchNorm3d", cout, cout, stats=stats, params=2 * cout),
                LayerSpec("LeakyReLU")]
    out, c, skips = [], int(in_channels), []
    for w1, w2 in encoder:
        out += block(c, w1) + block(w1, w2)
        out.append(LayerSpec("MaxPool3d", kernel_size=(2,) * 3, stride=(2,) * 3))
        skips.append(w2)
        c = w2
    b1, b2 = bottom
    out += block(c, b1) + block(b1, b2)
    c = b2
    for skip in reversed(skips):
        out.append(LayerSpec("ConvTranspose3d", c, c, (2,) * 3, (2,) * 3,
                             params=c * c * 8 + c))
        out.append(LayerSpec("Concat", skip_channels=skip))
        out += block(c + skip, skip) + block(skip, skip)
        c = skip
    out.append(_conv(c, classes, k=1, pad=0))
    return out


def cosmoflow_sample_bytes(shape) -> int:
    """Bytes of one CosmoFlow sample ``(C, D, H, W)`` on storage: int16 counts per channel
    (the published data set: 512^3 x 4 channels is 1 GiB)."""
    return 2 * math.prod(int(v) for v in shape)


def unet_sample_bytes(shape) -> int:
    """Bytes of one U-Net sample ``(C, D, H, W)`` on storage: a float32 input and a one-byte
    class label per voxel (assumption: labels stored as uint8)."""
    return 4 * math.prod(int(v) for v in shape) + math.prod(int(v) for v in shape[1:])


def levels_of(layers) -> int:
    """Pooling stages of a layer list (the divisibility a U-Net needs: ``2**levels``)."""
    return sum(1 for l in layers if getattr(l, "layer_type", "").startswith("MaxPool"))



def materialize(spec: LayerSpec, rng=None):
    """The :mod:`disttensor.nn` layer a description stands for (its parameters allocated and
    drawn from ``rng``), to time it on a small block; ``None`` for ``Concat`` (a copy, not a
    layer).  Only for small models: this allocates what the description avoids."""
    from .. import layers as L
    t = spec.layer_type
    kw = dict(rng=rng if rng is not None else np.random.default_rng(0))
    if t == "Conv3d":
        bias = spec.params != spec.in_channels * spec.out_channels * math.prod(spec.kernel_size)
        return L.Conv3d(spec.in_channels, spec.out_channels, spec.kernel_size, spec.stride,
                        spec.padding, spec.dilation, spec.groups, bias, spec.padding_mode, **kw)
    if t == "ConvTranspose3d":
        return L.ConvTranspose3d(spec.in_channels, spec.out_channels, spec.kernel_size,
                                 spec.stride, **kw)
    if t == "Linear":
        return L.Linear(spec.in_features, spec.out_features, **kw)
    if t == "BatchNorm3d":
        return L.BatchNorm3d(spec.out_channels, stats=spec.stats)
    if t in ("MaxPool3d", "AvgPool3d"):
        return getattr(L, t)(spec.kernel_size, spec.stride, spec.padding)
    if t == "Concat":
        return None
    return getattr(L, t)()
