"""disttensor.nn.init's trunc_normal_, orthogonal_, eye_, dirac_ and sparse_: their defining
properties and statistics against closed forms (truncated-normal moments from the normal pdf
and cdf), reproducibility for a seed, dtypes, errors."""
from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest

from disttensor.nn import init


def truncated_moments(mean, std, a, b):
    """Mean and standard deviation of N(mean, std**2) truncated to [a, b]."""
    n = NormalDist()
    al, be = (a - mean) / std, (b - mean) / std
    z = n.cdf(be) - n.cdf(al)
    pa, pb = n.pdf(al), n.pdf(be)
    m = mean + std * (pa - pb) / z
    var = std ** 2 * (1 + (al * pa - be * pb) / z - ((pa - pb) / z) ** 2)
    return m, math.sqrt(var)


@pytest.mark.parametrize("mean, std, a, b", [(0.0, 1.0, -2.0, 2.0), (0.5, 0.02, 0.47, 0.6),
                                             (0.0, 1.0, 2.5, 4.0), (1.0, 3.0, -1.0, 0.5)])
def test_trunc_normal_statistics(mean, std, a, b):
    x = np.empty((400, 500))
    init.trunc_normal_(x, mean, std, a, b, rng=np.random.default_rng(1))
    assert x.min() >= a and x.max() <= b
    m, s = truncated_moments(mean, std, a, b)
    se = s / math.sqrt(x.size)
    assert abs(x.mean() - m) < 6 * se
    assert abs(x.std() - s) < 0.01 * s
    # the histogram follows the truncated density (coarse bins)
    edges = np.linspace(a, b, 9)
    counts, _ = np.histogram(x, edges)
    n = NormalDist(mean, std)
    z = n.cdf(b) - n.cdf(a)
    expect = np.array([(n.cdf(hi) - n.cdf(lo)) / z for lo, hi in zip(edges[:-1], edges[1:])])
    np.testing.assert_allclose(counts / x.size, expect, atol=5e-3)


def test_trunc_normal_defaults_seed_dtype():
    a = init.trunc_normal_(np.empty((30, 7), np.float32), rng=np.random.default_rng(4))
    b = init.trunc_normal_(np.empty((30, 7), np.float32), rng=np.random.default_rng(4))
    assert a.dtype == np.float32 and np.array_equal(a, b)
    assert np.abs(a).max() <= 2.0
    with pytest.raises(ValueError, match="a < b"):
        init.trunc_normal_(np.empty(3), a=1.0, b=1.0)
    with pytest.raises(ValueError, match="std > 0"):
        init.trunc_normal_(np.empty(3), std=0.0)


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (4, 2, 3, 3), (6, 6), (2, 8, 1)])
@pytest.mark.parametrize("gain", [1.0, 2.5])
def test_orthogonal(shape, gain):
    x = init.orthogonal_(np.empty(shape), gain=gain, rng=np.random.default_rng(0))
    m = x.reshape(shape[0], -1) / gain
    rows, cols = m.shape
    if rows >= cols:
        np.testing.assert_allclose(m.T @ m, np.eye(cols), atol=1e-12)
    else:
        np.testing.assert_allclose(m @ m.T, np.eye(rows), atol=1e-12)
    y = init.orthogonal_(np.empty(shape), gain=gain, rng=np.random.default_rng(0))
    assert np.array_equal(x, y)
    # the sign convention: Q R with R's diagonal positive, i.e. Q = the normalised columns'
    # Gram-Schmidt of the draw; its first column is the first drawn column normalised
    draw = np.random.default_rng(0).normal(size=(rows, cols))
    first = draw[:, 0] if rows >= cols else draw[0]
    got = m[:, 0] if rows >= cols else m[0]
    np.testing.assert_allclose(got, first / np.linalg.norm(first), atol=1e-12)


def test_orthogonal_errors_and_empty():
    with pytest.raises(ValueError, match="2 or more dimensions"):
        init.orthogonal_(np.empty(4))
    assert init.orthogonal_(np.empty((0, 3))).shape == (0, 3)


def test_eye():
    x = init.eye_(np.full((3, 5), 7.0, np.float32))
    assert x.dtype == np.float32 and np.array_equal(x, np.eye(3, 5))
    with pytest.raises(ValueError, match="2 dimensions"):
        init.eye_(np.empty((2, 2, 2)))


@pytest.mark.parametrize("shape, groups", [((4, 4, 3), 1), ((6, 2, 3, 3), 2), ((4, 3, 3, 5, 2), 1),
                                           ((8, 2, 1, 1, 1), 4), ((3, 5, 4), 1)])
def test_dirac_is_an_identity_convolution(shape, groups):
    w = init.dirac_(np.full(shape, 3.0), groups)
    out, cin = shape[:2]
    per = out // groups
    k = shape[2:]
    # convolve a random input with w at the kernel centre ('same' positions): y[o] = x[i(o)]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(cin * groups,) + tuple(s + 6 for s in k))
    for o in range(out):
        g, d = divmod(o, per)
        patch = x[g * cin:(g + 1) * cin][(slice(None),) + tuple(slice(0, s) for s in k)]
        y = float((w[o] * patch).sum())
        expect = patch[(d,) + tuple(s // 2 for s in k)] if d < cin else 0.0
        assert y == expect
    assert w.sum() == groups * min(per, cin)
    with pytest.raises(ValueError, match="divisible by groups"):
        init.dirac_(np.empty((3, 2, 3)), groups=2)
    with pytest.raises(ValueError, match="3, 4, or 5"):
        init.dirac_(np.empty((3, 3)))


@pytest.mark.parametrize("sparsity", [0.0, 0.1, 0.5, 1.0])
def test_sparse(sparsity):
    x = init.sparse_(np.empty((40, 300)), sparsity, std=0.5, rng=np.random.default_rng(2))
    zeros = math.ceil(sparsity * 40)
    assert all(int((x[:, c] == 0).sum()) == zeros for c in range(300))
    nz = x[x != 0]
    if nz.size:
        assert abs(nz.std() - 0.5) < 0.03
    with pytest.raises(ValueError, match="2 dimensions"):
        init.sparse_(np.empty(3), 0.1)
