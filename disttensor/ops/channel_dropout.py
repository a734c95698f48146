"""Channel dropout (PyTorch's ``Dropout1d/2d/3d``): every ``(n, c)`` feature map of an
``(N, C, *S)`` array is zeroed as a whole with probability ``p``, the others scaled by
``1 / (1 - p)``; forward and backward.

The ``(N, C)`` keep-mask is one draw of the counter-based :mod:`disttensor.random` generator,
replicated on every rank (``u[n, c] >= p`` keeps the map), so every rank holding a part of a
map applies the same decision, and a seed gives the same masks on any grid.  No data move
(the draw makes the op collective: the ranks agree on ``p``, ``training`` and the generator's
seed and stream).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.array import DistArray
from ..core.entry import agreed, collective_entry
from ..random import Generator
from ._spatial import check_gradient_layout, check_layout, meaning

__all__ = ["channel_dropout_forward", "channel_dropout_backward", "ChannelDropoutSaved"]


@dataclass
class ChannelDropoutSaved:
    scale: object     # (n_block, C, 1, ...) keep-mask / (1 - p) in x's dtype; None: identity
    dist: object


@collective_entry
def channel_dropout_forward(x: DistArray, p: float, rng: Generator | int,
                            training: bool = True):
    """Zero whole ``(n, c)`` maps of ``x`` ``(N, C, *S)`` with probability ``p`` (``0 <= p <=
    1``; ``p == 1`` zeroes everything, as PyTorch) and scale the kept ones by ``1/(1-p)``;
    the identity when not training.  ``rng``: a generator (advanced by one draw) or a seed.
    Collective.  Returns ``(y, saved)``."""
    seed, stream = (rng.seed, rng.counter) if isinstance(rng, Generator) else (rng, 0)
    with agreed(x.grid.cart, "channel_dropout_forward", x=x, p=meaning(float, p),
                training=bool(training), seed=meaning(int, seed), stream=stream):
        check_layout(x, "channel dropout")
        if not 0.0 <= float(p) <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0:
        return x.copy(), ChannelDropoutSaved(None, x.distribution)
    if not isinstance(rng, Generator):
        rng = Generator(int(rng))
    u = rng.random(x.shape[:2], dtype="float64", grid=x.grid, split=(None, None),
                   device=x.device)
    a, b = x.distribution.block_range(0, x.distribution.axis_coord(0, x.grid.coords))
    xp = x.xp
    keep = u.local[a:b] >= p
    factor = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
    scale = (keep.astype(x.dtype) * xp.asarray(factor, dtype=x.dtype)).reshape(
        (b - a, x.shape[1]) + (1,) * (x.ndim - 2))
    return DistArray(x.local * scale, x.distribution, x.grid), \
        ChannelDropoutSaved(scale, x.distribution)


@collective_entry
def channel_dropout_backward(saved: ChannelDropoutSaved, dy: DistArray) -> DistArray:
    """Gradient with respect to the channel-dropout input (collective only to agree on
    ``dy``)."""
    with agreed(dy.grid.cart, "channel_dropout_backward", dy=dy,
                masked=saved.scale is not None):
        check_gradient_layout(dy, saved.dist, "channel dropout")
    if saved.scale is None:
        return dy.copy()
    return DistArray(dy.local * saved.scale, dy.distribution, dy.grid)
