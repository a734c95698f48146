"""A 3D U-Net level composed from the distributed ops, forward and backward by hand, against
the same chain of serial float64 reference ops.

conv 3x3x3 'same' -> batch norm -> leaky ReLU -> max-pool 2 -> conv 3x3x3 -> transposed conv
k=2 s=2 (up path) -> channel concat with the skip connection -> conv 1x1x1 -> cross-entropy
with channel softmax.  The ops hand each other their outputs as they come (strided outputs
with explicit ownership, the transposed conv's derived ownership, concat redistributing the
operand that does not line up), so this checks that the distributions compose and that every
backward returns its gradient where the previous op expects it.  Layouts: sample and spatial
axes split, including odd block sizes (the up path then does not line up with the skip
connection and concat redistributes)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import disttensor as dt
from disttensor import ops
from checks import COMM, SIZE, grid
from conftest import assert_allclose_all

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import reference as ref  # noqa: E402

SLOPE = 0.1


def _layouts():
    """(dims, split, sizes) for (N, C, D, H, W) arrays on SIZE ranks."""
    out = [((SIZE,), (None, None, 0, None, None), None)]
    if SIZE >= 2:
        odd = [5] + [(12 - 5) // (SIZE - 1)] * (SIZE - 1)
        odd[-1] += 12 - sum(odd)
        out.append(((SIZE,), (None, None, None, 0, None), (None, None, None, odd, None)))
    if SIZE == 4:
        out.append(((2, 2), (0, None, 1, None, None), None))
        out.append(((2, 2), (None, None, 0, None, 1), None))
    return out


def _reference(x, w1, b1, gamma, beta, w2, wt, w3, labels):
    """Serial float64 chain; returns the loss and the gradients of x, w1, b1, gamma, w2, wt,
    w3."""
    a1 = ref.conv(x, w1, b1, 1, 1)
    a2, _, _, _ = ref.batch_norm_train(a1, gamma, beta)
    a3 = ref.activation("leaky_relu", a2, SLOPE)
    a4 = ref.pool(a3, "max", 2)
    a5 = ref.conv(a4, w2, None, 1, 1)
    a6 = ref.conv_transpose(a5, wt, None, 2)
    a7 = np.concatenate([a6, a3], axis=1)
    a8 = ref.conv(a7, w3)
    loss = ref.cross_entropy(a8, labels)
    g8 = ref.cross_entropy_backward(a8, labels)
    g7, dw3, _ = ref.conv_backward(a7, w3, g8)
    g6, g3_skip = g7[:, :a6.shape[1]], g7[:, a6.shape[1]:]
    g5, dwt, _ = ref.conv_transpose_backward(a5, wt, g6, 2)
    g4, dw2, _ = ref.conv_backward(a4, w2, g5, 1, 1)
    g3 = ref.pool_backward(a3, g4, "max", 2) + g3_skip
    g2 = ref.activation_backward("leaky_relu", a2, g3, SLOPE)
    g1, dgamma, _ = ref.batch_norm_train_backward(a1, gamma, g2)
    g0, dw1, db1 = ref.conv_backward(x, w1, g1, 1, 1)
    return loss, g0, dw1, db1, dgamma, dw2, dwt, dw3


def _distributed(x, w1, b1, gamma, beta, w2, wt, w3, labels):
    a1, s1 = ops.conv_forward(x, w1, b1, 1, 1)
    a2, s2 = ops.batch_norm_forward(a1, gamma, beta)
    a3 = ops.leaky_relu(a2, SLOPE)
    a4, s4 = ops.pool_forward(a3, "max", 2)
    a5, s5 = ops.conv_forward(a4, w2, None, 1, 1)
    a6, s6 = ops.conv_transpose_forward(a5, wt, None, 2)
    a7, s7 = ops.concat_channels([a6, a3])
    a8, s8 = ops.conv_forward(a7, w3)
    loss, sl = ops.cross_entropy_forward(a8, labels)
    g8 = ops.cross_entropy_backward(sl)
    g7, dw3, _ = ops.conv_backward(s8, g8)
    g6, g3_skip = ops.concat_channels_backward(s7, g7)
    g5, dwt, _ = ops.conv_transpose_backward(s6, g6)  # back in a5's distribution
    g4, dw2, _ = ops.conv_backward(s5, g5)
    g3 = ops.pool_backward(s4, g4) + g3_skip
    g2 = ops.activation_backward("leaky_relu", g3, a2, a3, SLOPE)
    g1, dgamma, _ = ops.batch_norm_backward(s2, g2)
    g0, dw1, db1 = ops.conv_backward(s1, g1)
    return loss, g0, dw1, db1, dgamma, dw2, dwt, dw3


@pytest.mark.parametrize("layout", _layouts(), ids=lambda v: str(v))
def test_unet_level_forward_backward(layout):
    dims, split, sizes = layout
    rng = np.random.default_rng(4)
    n, c, k = 2, 2, 3
    x = rng.standard_normal((n, c, 12, 12, 8))
    w1 = rng.standard_normal((4, c, 3, 3, 3)) * 0.3
    b1 = rng.standard_normal(4) * 0.1
    gamma, beta = 1 + 0.1 * rng.standard_normal(4), 0.1 * rng.standard_normal(4)
    w2 = rng.standard_normal((6, 4, 3, 3, 3)) * 0.2
    wt = rng.standard_normal((6, 4, 2, 2, 2)) * 0.3
    w3 = rng.standard_normal((k, 8, 1, 1, 1))
    labels = rng.integers(0, k, (n, 12, 12, 8))
    want = _reference(x, w1, b1, gamma, beta, w2, wt, w3, labels)
    g = grid(dims)
    xd = dt.from_global(x, grid=g, split=split, sizes=sizes)
    lsplit = split[:1] + split[2:]
    lsizes = None if sizes is None else sizes[:1] + sizes[2:]
    ld = dt.from_global(labels, grid=g, split=lsplit, sizes=lsizes)
    got = _distributed(xd, w1, b1, gamma, beta, w2, wt, w3, ld)
    names = ("loss", "dx", "dw1", "db1", "dgamma", "dw2", "dwt", "dw3")
    for name, a, b in zip(names, got, want):
        if isinstance(a, dt.DistArray):
            assert_allclose_all(COMM, a.distribution == xd.distribution, True, err_msg=name)
            a = a.to_numpy()
        assert_allclose_all(COMM, np.asarray(a), np.asarray(b), rtol=1e-8, atol=1e-10,
                            err_msg=name)
