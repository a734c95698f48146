"""Parameter initialisation, as PyTorch's ``torch.nn.init``, on NumPy or CuPy arrays in place.

Every function fills an array (or a parameter's ``.data``) in place and returns it. Random
values are drawn on the host with a :class:`numpy.random.Generator` in float64, then cast to
the array's dtype and copied to its device. So a seed gives the same global weights whatever
the process grid or the device; parameters are replicated, and every rank that draws from a
generator seeded alike gets the same values. Pass ``rng`` (a ``numpy.random.Generator``);
without it the module's default generator is used, seeded by :func:`manual_seed` (0 at import).

Fans follow PyTorch's ``_calculate_fan_in_and_fan_out`` on the weight's shape
``(out, in, *kernel)``: ``fan_in = shape[1] * prod(kernel)``, ``fan_out = shape[0] *
prod(kernel)``. A transposed convolution's weight ``(in, out, *kernel)`` is taken the same way
(so its ``fan_in`` is ``out * prod(kernel)``), exactly as PyTorch does.
"""
from __future__ import annotations

import math
import numbers
from statistics import NormalDist

import numpy as np

from ..core.backend import array_module

__all__ = ["calculate_gain", "calculate_fan_in_and_fan_out", "manual_seed", "resolve_rng",
           "uniform_",
           "normal_", "constant_", "zeros_", "ones_", "xavier_uniform_", "xavier_normal_",
           "kaiming_uniform_", "kaiming_normal_", "trunc_normal_", "orthogonal_", "eye_",
           "dirac_", "sparse_", "default_conv_init", "default_linear_init"]

_default_rng = np.random.default_rng(0)


def manual_seed(seed: int) -> np.random.Generator:
    """Reseed (replace) the module's default generator and return it."""
    global _default_rng
    _default_rng = np.random.default_rng(seed)
    return _default_rng


def resolve_rng(rng=None) -> np.random.Generator:
    """``rng`` itself, or the module's default generator when ``rng`` is None."""
    if rng is None:
        return _default_rng
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    return rng


def _array(x):
    """The array to fill: ``x`` itself, or a parameter's ``.data``."""
    if isinstance(x, np.ndarray) or type(x).__module__.startswith("cupy"):
        return x
    data = getattr(x, "data", None)
    if isinstance(data, np.ndarray) or type(data).__module__.startswith("cupy"):
        return data
    raise TypeError(f"expected a NumPy or CuPy array or a parameter, got {type(x).__name__}")


def _fill(arr, values: np.ndarray):
    """Copy host ``values`` (float64) into ``arr``, cast on the host to ``arr``'s dtype."""
    xp = array_module(arr)
    values = np.asarray(values).astype(arr.dtype, copy=False)
    arr[...] = values if xp is np else xp.asarray(values)
    return arr


def calculate_gain(nonlinearity: str, param=None) -> float:
    """PyTorch's recommended gain for a nonlinearity: 1 for linear, conv and sigmoid, 5/3 for
    tanh, sqrt(2) for relu, sqrt(2 / (1 + negative_slope**2)) for leaky_relu (slope ``param``,
    default 0.01) and 3/4 for selu."""
    linear = ["linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
              "conv_transpose3d"]
    if nonlinearity in linear or nonlinearity == "sigmoid":
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            slope = 0.01
        elif isinstance(param, numbers.Real) and not isinstance(param, bool):
            slope = float(param)
        else:
            raise ValueError(f"negative_slope {param} not a valid number")
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"Unsupported nonlinearity {nonlinearity}")


def calculate_fan_in_and_fan_out(shape) -> tuple[int, int]:
    """``(fan_in, fan_out)`` of a weight of ``shape`` (an array or a shape tuple)."""
    if not isinstance(shape, tuple):
        shape = tuple(_array(shape).shape)
    if len(shape) < 2:
        raise ValueError("Fan in and fan out can not be computed for tensor with fewer than 2 "
                         "dimensions")
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def _fan(shape, mode: str) -> int:
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"Mode {mode} not supported, please use one of ['fan_in', 'fan_out']")
    fan_in, fan_out = calculate_fan_in_and_fan_out(shape)
    return fan_in if mode == "fan_in" else fan_out


def uniform_(x, a: float = 0.0, b: float = 1.0, *, rng=None):
    """Fill with values drawn uniformly from ``[a, b)``."""
    arr = _array(x)
    if not a <= b:
        raise ValueError(f"uniform_ expects a <= b, got a={a}, b={b}")
    return _fill(arr, resolve_rng(rng).uniform(float(a), float(b), size=arr.shape))


def normal_(x, mean: float = 0.0, std: float = 1.0, *, rng=None):
    """Fill with values drawn from the normal distribution N(mean, std**2)."""
    arr = _array(x)
    if not std >= 0:
        raise ValueError(f"normal_ expects std >= 0, got {std}")
    return _fill(arr, resolve_rng(rng).normal(float(mean), float(std), size=arr.shape))


def constant_(x, val: float):
    """Fill with ``val``."""
    arr = _array(x)
    arr.fill(val)
    return arr


def zeros_(x):
    """Fill with 0."""
    return constant_(x, 0)


def ones_(x):
    """Fill with 1."""
    return constant_(x, 1)


def xavier_uniform_(x, gain: float = 1.0, *, rng=None):
    """Glorot uniform: U(-a, a) with ``a = gain * sqrt(6 / (fan_in + fan_out))``."""
    arr = _array(x)
    fan_in, fan_out = calculate_fan_in_and_fan_out(tuple(arr.shape))
    if arr.size == 0:
        return arr
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    a = math.sqrt(3.0) * std
    return uniform_(arr, -a, a, rng=rng)


def xavier_normal_(x, gain: float = 1.0, *, rng=None):
    """Glorot normal: N(0, std**2) with ``std = gain * sqrt(2 / (fan_in + fan_out))``."""
    arr = _array(x)
    fan_in, fan_out = calculate_fan_in_and_fan_out(tuple(arr.shape))
    if arr.size == 0:
        return arr
    return normal_(arr, 0.0, gain * math.sqrt(2.0 / float(fan_in + fan_out)), rng=rng)


def _kaiming_std(arr, a, mode, nonlinearity) -> float | None:
    fan = _fan(tuple(arr.shape), mode)
    if arr.size == 0:
        return None  # PyTorch: initialising a zero-element tensor is a no-op
    return calculate_gain(nonlinearity, a) / math.sqrt(fan)


def kaiming_uniform_(x, a: float = 0.0, mode: str = "fan_in",
                     nonlinearity: str = "leaky_relu", *, rng=None):
    """He uniform: U(-bound, bound) with ``bound = gain * sqrt(3 / fan)``, ``gain =
    calculate_gain(nonlinearity, a)`` and ``fan`` by ``mode`` ('fan_in' or 'fan_out')."""
    arr = _array(x)
    std = _kaiming_std(arr, a, mode, nonlinearity)
    if std is None:
        return arr
    bound = math.sqrt(3.0) * std
    return uniform_(arr, -bound, bound, rng=rng)


def kaiming_normal_(x, a: float = 0.0, mode: str = "fan_in",
                    nonlinearity: str = "leaky_relu", *, rng=None):
    """He normal: N(0, std**2) with ``std = gain / sqrt(fan)`` (see :func:`kaiming_uniform_`)."""
    arr = _array(x)
    std = _kaiming_std(arr, a, mode, nonlinearity)
    if std is None:
        return arr
    return normal_(arr, 0.0, std, rng=rng)


def _real(name, v) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(v).__name__}")
    return float(v)


def trunc_normal_(x, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0,
                  *, rng=None):
    """Fill with values from N(mean, std**2) truncated to ``[a, b]`` (the bounds are absolute
    values, not multiples of ``std``, as in PyTorch).  Drawn by rejection from the normal
    distribution while the interval holds at least 1 % of its mass (redrawing only the
    rejected values, in order), by the inverse CDF of uniform draws otherwise; so the values
    are not PyTorch's for a seed (they never are: other generator), the distribution is."""
    arr = _array(x)
    mean, std, a, b = _real("mean", mean), _real("std", std), _real("a", a), _real("b", b)
    if not std > 0 or not a < b:
        raise ValueError(f"trunc_normal_ expects std > 0 and a < b, got std={std}, a={a}, "
                         f"b={b}")
    rng = resolve_rng(rng)
    n = arr.size
    unit = NormalDist()
    lo, hi = unit.cdf((a - mean) / std), unit.cdf((b - mean) / std)
    if hi - lo >= 0.01:
        out = rng.normal(mean, std, size=n)
        bad = np.flatnonzero((out < a) | (out > b))
        while bad.size:
            out[bad] = rng.normal(mean, std, size=bad.size)
            bad = bad[(out[bad] < a) | (out[bad] > b)]
    else:
        u = rng.uniform(lo, hi, size=n)
        out = mean + std * np.array([unit.inv_cdf(min(max(v, 1e-300), 1 - 1e-16)) for v in u])
        np.clip(out, a, b, out=out)
    return _fill(arr, out.reshape(arr.shape))


def orthogonal_(x, gain: float = 1.0, *, rng=None):
    """Fill with a (semi-)orthogonal matrix (Saxe et al.), as PyTorch: the array viewed as
    ``(shape[0], prod(shape[1:]))``, the Q of the QR decomposition of a standard normal
    matrix (of its transpose when it is wide) with signs making R's diagonal positive, times
    ``gain``.  Needs ``ndim >= 2``."""
    arr = _array(x)
    if arr.ndim < 2:
        raise ValueError("Only tensors with 2 or more dimensions are supported")
    if arr.size == 0:
        return arr
    rows = arr.shape[0]
    cols = arr.size // rows
    flat = resolve_rng(rng).normal(0.0, 1.0, size=(rows, cols))
    if rows < cols:
        flat = flat.T
    q, r = np.linalg.qr(flat)
    q *= np.sign(np.diag(r))
    if rows < cols:
        q = q.T
    return _fill(arr, (q * _real("gain", gain)).reshape(arr.shape))


def eye_(x):
    """Fill a 2-D array with the identity (ones on the diagonal, zeros elsewhere)."""
    arr = _array(x)
    if arr.ndim != 2:
        raise ValueError("Only tensors with 2 dimensions are supported")
    return _fill(arr, np.eye(*arr.shape))


def dirac_(x, groups: int = 1):
    """Fill a 3-, 4- or 5-D convolution weight ``(out, in, *kernel)`` with the Dirac delta
    (identity convolution): for each of ``groups`` groups of ``out // groups`` output
    channels, output channel ``d`` takes input channel ``d`` at the kernel's centre
    (``k // 2`` per axis), for ``d < min(out // groups, in)``."""
    arr = _array(x)
    if arr.ndim not in (3, 4, 5):
        raise ValueError("Only tensors with 3, 4, or 5 dimensions are supported")
    if isinstance(groups, bool) or not isinstance(groups, numbers.Integral) or groups < 1:
        raise ValueError(f"groups must be a positive integer, got {groups!r}")
    if arr.shape[0] % groups != 0:
        raise ValueError("dim 0 must be divisible by groups")
    per_group = arr.shape[0] // groups
    values = np.zeros(arr.shape)
    centre = tuple(k // 2 for k in arr.shape[2:])
    for g in range(groups):
        for d in range(min(per_group, arr.shape[1])):
            values[(g * per_group + d, d) + centre] = 1.0
    return _fill(arr, values)


def sparse_(x, sparsity: float, std: float = 0.01, *, rng=None):
    """Fill a 2-D array with N(0, std**2) values, then zero ``ceil(sparsity * rows)`` entries
    of each column, at rows chosen by a random permutation per column (Martens, 2010), as
    PyTorch's ``sparse_``."""
    arr = _array(x)
    if arr.ndim != 2:
        raise ValueError("Only tensors with 2 dimensions are supported")
    sparsity = _real("sparsity", sparsity)
    if not 0.0 <= sparsity <= 1.0:
        raise ValueError(f"sparsity must be in [0, 1], got {sparsity}")
    rows, cols = arr.shape
    rng = resolve_rng(rng)
    values = rng.normal(0.0, _real("std", std), size=(rows, cols))
    zeros = int(math.ceil(sparsity * rows))
    for c in range(cols):
        values[rng.permutation(rows)[:zeros], c] = 0.0
    return _fill(arr, values)


def default_linear_init(weight, bias=None, rng=None):
    """PyTorch's ``reset_parameters`` of ``Linear`` and of every convolution (``_ConvNd``,
    transposed ones included): ``kaiming_uniform_(weight, a=sqrt(5))``, i.e. U(-1/sqrt(fan_in),
    1/sqrt(fan_in)), then, when ``bias`` is given, ``bias`` from U(-1/sqrt(fan_in),
    1/sqrt(fan_in)) too. Weight first, then bias, from the same generator."""
    w = _array(weight)
    rng = resolve_rng(rng)
    kaiming_uniform_(w, a=math.sqrt(5), rng=rng)
    if bias is not None:
        fan_in, _ = calculate_fan_in_and_fan_out(tuple(w.shape))
        if fan_in != 0:
            bound = 1.0 / math.sqrt(fan_in)
            uniform_(bias, -bound, bound, rng=rng)
    return weight, bias


def default_conv_init(weight, bias=None, rng=None):
    """PyTorch's default initialisation of a (transposed) convolution: the same as
    :func:`default_linear_init`, on the weight shape ``(out, in/groups, *kernel)`` (or ``(in,
    out/groups, *kernel)`` for a transposed convolution, whose fan_in is then
    ``out/groups * prod(kernel)`` as in PyTorch)."""
    return default_linear_init(weight, bias, rng)
