"""disttensor.nn.init: gains, fans, distributions, reproducibility, dtypes."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disttensor.nn import init


class P:
    """Stand-in for disttensor.nn.Parameter."""

    def __init__(self, data):
        self.data = data
        self.grad = None
        self.requires_grad = True


def test_calculate_gain():
    assert init.calculate_gain("linear") == 1.0
    assert init.calculate_gain("conv3d") == 1.0
    assert init.calculate_gain("conv_transpose3d") == 1.0
    assert init.calculate_gain("sigmoid") == 1.0
    assert init.calculate_gain("tanh") == 5.0 / 3
    assert init.calculate_gain("relu") == math.sqrt(2.0)
    assert init.calculate_gain("leaky_relu") == math.sqrt(2.0 / (1 + 0.01 ** 2))
    assert init.calculate_gain("leaky_relu", 0.2) == math.sqrt(2.0 / 1.04)
    assert init.calculate_gain("leaky_relu", math.sqrt(5)) == math.sqrt(1.0 / 3)
    assert init.calculate_gain("selu") == 0.75
    with pytest.raises(ValueError, match="Unsupported nonlinearity"):
        init.calculate_gain("gelu")
    with pytest.raises(ValueError, match="not a valid number"):
        init.calculate_gain("leaky_relu", "0.1")


@pytest.mark.parametrize("shape, fans", [
    ((10, 20), (20, 10)),                   # Linear (out, in)
    ((16, 4, 3, 3, 3), (4 * 27, 16 * 27)),  # Conv3d (out, in, k, k, k)
    ((4, 16, 2, 2, 2), (16 * 8, 4 * 8)),    # ConvTranspose3d (in, out, k, k, k): PyTorch's fans
    ((8, 2, 5), (10, 40)),                  # Conv1d
    ((3, 0, 2), (0, 6)),
])
def test_fans(shape, fans):
    assert init.calculate_fan_in_and_fan_out(shape) == fans
    assert init.calculate_fan_in_and_fan_out(np.zeros(shape)) == fans


def test_fans_need_two_dims():
    with pytest.raises(ValueError, match="fewer than 2 dimensions"):
        init.calculate_fan_in_and_fan_out((5,))


def test_uniform_and_normal_statistics():
    rng = np.random.default_rng(1)
    a = init.uniform_(np.empty((200, 500)), -0.3, 0.7, rng=rng)
    assert a.min() >= -0.3 and a.max() < 0.7
    assert abs(a.mean() - 0.2) < 0.005 and abs(a.std() - 1 / math.sqrt(12)) < 0.005
    n = init.normal_(np.empty((200, 500)), 2.0, 0.5, rng=rng)
    assert abs(n.mean() - 2.0) < 0.005 and abs(n.std() - 0.5) < 0.005


@pytest.mark.parametrize("shape", [(64, 32, 3, 3, 3), (32, 64, 2, 2, 2), (300, 400)])
def test_xavier_and_kaiming_statistics(shape):
    rng = np.random.default_rng(2)
    fan_in, fan_out = init.calculate_fan_in_and_fan_out(shape)
    tol = 0.02  # relative, on > 1e5 samples
    w = init.xavier_uniform_(np.empty(shape), gain=2.0, rng=rng)
    bound = 2.0 * math.sqrt(6.0 / (fan_in + fan_out))
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.99 * bound
    assert abs(w.std() / (bound / math.sqrt(3)) - 1) < tol
    w = init.xavier_normal_(np.empty(shape), rng=rng)
    assert abs(w.std() / math.sqrt(2.0 / (fan_in + fan_out)) - 1) < tol
    for mode, fan in (("fan_in", fan_in), ("fan_out", fan_out)):
        w = init.kaiming_uniform_(np.empty(shape), a=0.1, mode=mode, rng=rng)
        bound = init.calculate_gain("leaky_relu", 0.1) * math.sqrt(3.0 / fan)
        assert np.abs(w).max() <= bound and np.abs(w).max() > 0.99 * bound
        w = init.kaiming_normal_(np.empty(shape), mode=mode, nonlinearity="relu", rng=rng)
        assert abs(w.std() / (math.sqrt(2.0) / math.sqrt(fan)) - 1) < tol
        assert abs(w.mean()) < 0.05 * w.std()


@pytest.mark.parametrize("fn", [init.uniform_, init.normal_, init.xavier_uniform_,
                                init.xavier_normal_, init.kaiming_uniform_,
                                init.kaiming_normal_])
@settings(max_examples=10)
@given(seed=st.integers(0, 2**32 - 1),
       shape=st.lists(st.integers(1, 5), min_size=2, max_size=5).map(tuple))
def test_same_seed_same_values_and_dtype_kept(fn, seed, shape):
    ref = fn(np.empty(shape), rng=np.random.default_rng(seed))
    for dtype in (np.float64, np.float32, np.float16):
        arr = np.empty(shape, dtype)
        out = fn(arr, rng=np.random.default_rng(seed))
        assert out is arr and arr.dtype == dtype
        np.testing.assert_array_equal(arr, ref.astype(dtype))  # cast of the float64 draw


def test_default_generator_and_manual_seed():
    init.manual_seed(7)
    a = init.normal_(np.empty((4, 5)))
    init.manual_seed(7)
    b = init.normal_(np.empty((4, 5)))
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, np.random.default_rng(7).normal(size=(4, 5)))
    assert init.resolve_rng(None) is init.resolve_rng()
    with pytest.raises(TypeError):
        init.normal_(np.empty(3), rng=np.random.RandomState(0))


def test_constant_zeros_ones_and_parameters():
    p = P(np.empty((2, 3), np.float32))
    assert init.constant_(p, 0.25) is p.data and (p.data == 0.25).all()
    init.zeros_(p.data)
    assert not p.data.any()
    init.ones_(p)
    assert (p.data == 1).all() and p.data.dtype == np.float32
    init.uniform_(p, rng=np.random.default_rng(0))
    assert p.data.dtype == np.float32 and 0 <= p.data.min() and p.data.max() < 1
    with pytest.raises(TypeError):
        init.zeros_([1.0, 2.0])


def test_bad_mode_and_zero_elements():
    with pytest.raises(ValueError, match="Mode fan_avg not supported"):
        init.kaiming_uniform_(np.empty((3, 4)), mode="fan_avg")
    empty = np.empty((0, 4))
    for fn in (init.kaiming_uniform_, init.kaiming_normal_, init.xavier_uniform_,
               init.xavier_normal_):
        assert fn(empty, rng=np.random.default_rng(0)) is empty


@pytest.mark.parametrize("shape", [(32, 16, 3, 3, 3), (16, 32, 2, 2, 2), (64, 100)])
def test_default_init_is_pytorchs(shape):
    """PyTorch's reset_parameters: weight U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (kaiming_uniform_
    with a=sqrt(5)), then bias from the same bound, in that order from one generator."""
    fan_in = init.calculate_fan_in_and_fan_out(shape)[0]
    bound = 1 / math.sqrt(fan_in)
    w, b = np.empty(shape, np.float32), np.empty(shape[0], np.float32)
    fn = init.default_linear_init if len(shape) == 2 else init.default_conv_init
    fn(w, b, np.random.default_rng(3))
    rng = np.random.default_rng(3)
    ew = rng.uniform(-bound, bound, size=shape).astype(np.float32)
    eb = rng.uniform(-bound, bound, size=shape[0]).astype(np.float32)
    kb = math.sqrt(3.0) * init.calculate_gain("leaky_relu", math.sqrt(5)) / math.sqrt(fan_in)
    assert math.isclose(kb, bound, rel_tol=1e-15)
    np.testing.assert_allclose(w, ew, rtol=1e-6)
    np.testing.assert_array_equal(b, eb)
    w2 = np.empty(shape, np.float32)
    fn(w2, None, np.random.default_rng(3))  # no bias: the weight draw is the same
    np.testing.assert_array_equal(w2, w)
