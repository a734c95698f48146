"""What each layer does to the slowest rank's block on one grid ``(sample, d, h, w)``:
:func:`analyze_layers` (pure, window math of :mod:`disttensor.ops.window` only) gives one
:class:`LayerGeometry` per layer (the block shape to time it on, its input/output/halo bytes,
flatten's gather, what it saves for backward); :func:`timing_layer` the layer to time on that
block.

Validity (:func:`analyze_layers`): the sample axis must divide the batch; a spatial split is
*too fine* when some block of some layer's input is empty or narrower than the halo it must
send (the halo would reach past the direct neighbour); such a grid raises
:class:`InvalidGrid`.  Nothing here communicates.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Sequence

from ...ops.window import AxisWindow, normalize_padding, normalize_tuple

__all__ = ["LayerGeometry", "InvalidGrid", "analyze_layers", "timing_layer", "layer_type",
           "layer_param_bytes"]


_POINTWISE = ("ReLU", "LeakyReLU", "ELU", "Sigmoid", "Tanh", "ScaledTanh", "Softmax",
              "LogSoftmax", "Dropout", "Identity", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d")


def _balanced(n: int, p: int) -> list[int]:
    """Offsets ``(0, ..., n)`` of a balanced split (remainder to the low coordinates)."""
    off = [0]
    for c in range(p):
        off.append(off[-1] + n // p + (c < n % p))
    return off


def layer_type(layer) -> str:
    """The layer's type name: ``layer.layer_type`` for a pure description
    (:class:`~.layerspec.LayerSpec`), else its class name."""
    return getattr(layer, "layer_type", None) or type(layer).__name__


def layer_param_bytes(layer) -> int:
    """Bytes of the layer's parameters (``layer.param_bytes`` for a pure description)."""
    pb = getattr(layer, "param_bytes", None)
    if pb is not None:
        return int(pb)
    return int(sum(p.data.nbytes for p in layer.parameters()))


def _upsampling(layer) -> int | None:
    """The factor of a transposed convolution whose kernel equals its stride (no overlap, no
    padding: each input cell writes its own ``k^3`` output cells, so a split needs no halo),
    or ``None``."""
    if not layer_type(layer).startswith("ConvTranspose"):
        return None
    k = normalize_tuple(layer.kernel_size, 3, "kernel_size")
    st = normalize_tuple(layer.stride, 3, "stride")
    pad = normalize_tuple(getattr(layer, "padding", 0) or 0, 3, "padding")
    opad = normalize_tuple(getattr(layer, "output_padding", 0) or 0, 3, "output_padding")
    dil = normalize_tuple(getattr(layer, "dilation", 1) or 1, 3, "dilation")
    if k == st and len(set(k)) == 1 and not any(pad) and not any(opad) and set(dil) == {1}:
        return k[0]
    return None


def _windows(layer, nd: int):
    """The per-axis windows of a convolution or pooling layer, or ``None``."""
    name = layer_type(layer)
    if name.startswith("Conv") and "Transpose" not in name:
        k, st, dl = layer.kernel_size, layer.stride, layer.dilation
        pads = normalize_padding(layer.padding, nd, k, dl)
        periodic = getattr(layer, "padding_mode", "zeros") == "circular"
        return tuple(AxisWindow(k[i], st[i], dl[i], pads[i][0], pads[i][1], periodic)
                     for i in range(nd))
    if name.startswith(("MaxPool", "AvgPool")):
        k = normalize_tuple(layer.kernel_size, nd, "kernel_size")
        st = normalize_tuple(layer.stride if layer.stride is not None else layer.kernel_size,
                             nd, "stride")
        pads = normalize_padding(layer.padding, nd, k)
        return tuple(AxisWindow(k[i], st[i], 1, pads[i][0], pads[i][1]) for i in range(nd))
    return None


@dataclass(frozen=True)
class LayerGeometry:
    """What one layer does to the slowest rank's block on one grid (pure result of
    :func:`analyze_layers`).

    ``kind``: ``window``, ``pointwise``, ``upsample`` (a transposed convolution with kernel =
    stride), ``concat`` (a skip connection's channels appended), ``flatten``, ``dense`` or
    ``opaque``;
    ``time_shape``: the input shape to time the layer on (one rank, ``COMM_SELF``), ``()``
    when the rank owns no output; ``time_pads``: for windowed layers, the ``(lo, hi)``
    padding per spatial axis of that local problem (:func:`timing_layer`);
    ``in_bytes``/``out_bytes``: the slowest rank's input (with halo) and output block bytes;
    ``halo_bytes``/``halo_pieces``: what its halo exchange receives (forward; the reverse
    exchange sends the same back);
    ``gather_bytes``/``gather_peers``: flatten's gather; ``allreduces``: extra small
    all-reduces per pass (global batch norm); ``param_bytes``: its parameters;
    ``saved_bytes``: what it keeps for backward (approximation)."""
    name: str
    kind: str
    time_shape: tuple
    in_bytes: int
    out_bytes: int
    halo_bytes: int = 0
    halo_pieces: int = 0
    gather_bytes: int = 0
    gather_peers: int = 0
    allreduces: int = 0
    param_bytes: int = 0
    saved_bytes: int = 0
    time_pads: tuple | None = None


def timing_layer(layer, geom: LayerGeometry):
    """The layer to time on ``geom.time_shape``: ``layer`` itself, or for a windowed layer a
    shallow copy (sharing the parameters) whose padding is the slowest block's local padding
    (``geom.time_pads``: padding at global boundaries only, the halo being part of the
    block), so the local kernel solves exactly the problem that block solves; for an
    opaque layer (a whole model) a copy whose ``input_size``/``input_shape`` check, if any,
    accepts the local block."""
    if geom.kind == "opaque" and geom.time_shape:
        # a whole model checking its sample shape (U-Net's input_size, CosmoFlow's
        # input_shape): let the copy accept the local block
        clone = copy.copy(layer)
        for attr, val in (("input_size", tuple(geom.time_shape[2:])),
                          ("input_shape", tuple(geom.time_shape[1:]))):
            if getattr(clone, attr, None) is not None:
                object.__setattr__(clone, attr, val)
        return clone
    if geom.time_pads is None:
        return layer
    clone = copy.copy(layer)
    clone.padding = tuple(geom.time_pads)
    return clone


class InvalidGrid(ValueError):
    """The grid cannot run the model (raised by :func:`analyze_layers`)."""


def analyze_layers(layers: Sequence, input_shape: Sequence[int], batch: int,
                   grid: Sequence[int], itemsize: int = 4) -> list[LayerGeometry]:
    """The geometry of every layer on ``grid`` ``(s, d, h, w)`` for a global batch ``batch``
    of samples of shape ``input_shape`` ``(C, D, H, W)`` (pure, window math only).

    Raises :class:`InvalidGrid` (a ``ValueError``) when the sample axis does not divide the
    batch, an axis has more ranks than cells, or the split is too fine for a layer's halo (a
    block of a windowed layer's input empty or narrower than the halo it must send), and
    ``ValueError`` for a layer that cannot be modelled before the last position."""
    s, *sp = (int(g) for g in grid)
    C, *ext = (int(v) for v in input_shape)
    if len(sp) != 3 or len(ext) != 3:
        raise ValueError(f"analyze_layers: grid (s, d, h, w) and input_shape (C, D, H, W) "
                         f"expected, got {tuple(grid)} and {tuple(input_shape)}")
    if batch % s:
        raise InvalidGrid(f"the batch {batch} is not divisible by the {s} ranks of the sample "
                          "axis")
    for p, n, ax in zip(sp, ext, "dhw"):
        if p > n:
            raise InvalidGrid(f"{p} ranks along {ax} for an extent of {n}")
    b = batch // s
    offs = [_balanced(n, p) for n, p in zip(ext, sp)]
    chans, flat = C, None     # flat: features per sample once flattened
    out = []
    layers = list(layers)
    for i, layer in enumerate(layers):
        tname = layer_type(layer)
        name = f"{i}:{tname}"
        pbytes = layer_param_bytes(layer)
        blocks = [max(o[j + 1] - o[j] for j in range(len(o) - 1)) for o in offs]
        vol = b * chans * math.prod(blocks) * itemsize if flat is None else b * flat * itemsize
        win = _windows(layer, 3) if flat is None else None
        if win is not None:
            new, tshape, tpads, hbox, pieces = [], [], [], [], 1
            for ax, (w, o) in enumerate(zip(win, offs)):
                n = o[-1]
                oo = w.output_offsets(o)
                lo, hi = w.halo(o) if len(o) > 2 else (0, 0)
                sizes = [o[j + 1] - o[j] for j in range(len(o) - 1)]
                if len(o) > 2 and (min(sizes) == 0 or
                                   (lo and min(sizes[:-1]) < lo) or (hi and min(sizes[1:]) < hi)):
                    raise InvalidGrid(f"layer {name}: a split of {n} cells into "
                                      f"{len(sizes)} blocks {sizes} is too fine for its halo "
                                      f"({lo}, {hi})")
                # the slowest block: most outputs, then the widest read window; its local
                # problem is the read window with padding at global boundaries only
                best = (0, 0, (0, 0))
                for j in range(len(sizes)):
                    o0, o1 = oo[j], oo[j + 1]
                    if o1 > o0:
                        rlo, rhi = w.read_range(o0, o1, n)
                        best = max(best, (o1 - o0, rhi - rlo, w.local_pads(o0, o1, n)))
                if w.periodic:  # the halo carries the wrapped cells: time the layer's own
                    m = best[0]
                    best = (m, max((m - 1) * w.stride + w.span - w.pad_lo - w.pad_hi, 1),
                            (w.pad_lo, w.pad_hi))
                tshape.append(best[1] if best[0] else 0)
                tpads.append(tuple(best[2]))
                box, j = max((sizes[j] + (lo if j > 0 else 0)
                              + (hi if j < len(sizes) - 1 else 0), j) for j in range(len(sizes)))
                hbox.append(box)
                # neighbour pieces along this axis of the block with the largest halo'd box
                pieces *= 1 + (lo > 0 and j > 0) + (hi > 0 and j < len(sizes) - 1)
                new.append(list(oo))
            cout = getattr(layer, "out_channels", None) or chans
            in_vol = b * chans * math.prod(hbox) * itemsize
            halo_b = in_vol - vol
            outb = b * cout * math.prod(max(o[j + 1] - o[j] for j in range(len(o) - 1))
                                        for o in new) * itemsize
            empty = any(v == 0 for v in tshape)
            out.append(LayerGeometry(name, "window", () if empty else (b, chans, *tshape),
                                     in_vol, outb, halo_b, pieces - 1 if halo_b else 0,
                                     param_bytes=pbytes, saved_bytes=in_vol,
                                     time_pads=tuple(tpads)))
            offs, chans = new, cout
        elif flat is None and _upsampling(layer) is not None:
            f = _upsampling(layer)
            offs = [[v * f for v in o] for o in offs]
            cout = layer.out_channels
            outb = vol // chans * cout * f ** 3
            out.append(LayerGeometry(name, "upsample", (b, chans, *blocks), vol, outb,
                                     param_bytes=pbytes, saved_bytes=vol))
            chans = cout
        elif tname == "Concat" and flat is None:
            # a skip connection (pure descriptions only): the block grows by the skip's
            # channels, kept alive since the encoder (counted where the encoder saved it)
            cout = chans + int(layer.skip_channels)
            out.append(LayerGeometry(name, "concat", (b, chans, *blocks), vol,
                                     vol // chans * cout))
            chans = cout
        elif tname in _POINTWISE:
            shape = (b, chans, *blocks) if flat is None else (b, flat)
            bn = tname.startswith("BatchNorm") and getattr(layer, "stats", "global") == "global"
            out.append(LayerGeometry(name, "pointwise", shape, vol, vol,
                                     allreduces=2 if bn else 0, param_bytes=pbytes,
                                     saved_bytes=vol))
        elif tname == "Flatten":
            if flat is not None:
                out.append(LayerGeometry(name, "pointwise", (b, flat), vol, vol))
                continue
            peers = math.prod(sp)
            cur = [o[-1] for o in offs]
            full = b * chans * math.prod(cur) * itemsize
            out.append(LayerGeometry(name, "flatten", (b, chans, *cur), vol, full,
                                     gather_bytes=full - vol if peers > 1 else 0,
                                     gather_peers=peers - 1))
            flat = chans * math.prod(cur)
        elif tname == "Linear":
            if flat is None or flat != layer.in_features:
                raise ValueError(f"analyze_layers: layer {name} takes {layer.in_features} "
                                 f"features, the input has "
                                 f"{'a spatial shape' if flat is None else flat}")
            outb = b * layer.out_features * itemsize
            out.append(LayerGeometry(name, "dense", (b, flat), vol, outb, param_bytes=pbytes,
                                     saved_bytes=vol))
            flat = layer.out_features
        else:
            if i != len(layers) - 1:
                raise ValueError(f"analyze_layers: cannot model layer {name} before the last "
                                 "position (only convolution, pooling, pointwise, transposed "
                                 "convolution with kernel = stride, flatten and linear layers "
                                 "are modelled; an unknown layer must be last)")
            # a model that needs extents divisible by 2**levels (U-Net) is timed on the block
            # rounded up to that (the distributed ops themselves take any split)
            q = 2 ** int(getattr(layer, "levels", 0) or 0)
            shape = (b, chans, *(-(-n // q) * q for n in blocks)) if flat is None else (b, flat)
            leaves = max(sum(1 for m in layer.modules() if not getattr(m, "_modules", None)), 1)
            out.append(LayerGeometry(name, "opaque", shape, vol, vol, param_bytes=pbytes,
                                     saved_bytes=vol * leaves))
    return out
