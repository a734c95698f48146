"""The synthetic dataset generator (serial parts and the command line)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from disttensor.io.synthetic import (PARAM_NAMES, PARAM_RANGES, synthetic_params,
                                     synthetic_sample, transfer_functions)

ROOT = Path(__file__).resolve().parents[2]


def test_sample_shape_dtype_and_determinism():
    x, y = synthetic_sample(3, size=8, channels=4, seed=5)
    assert x.shape == (4, 8, 8, 8) and x.dtype == np.float32
    assert y.shape == (3,) and y.dtype == np.float32
    x2, y2 = synthetic_sample(3, size=8, channels=4, seed=5)
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_array_equal(y, y2)
    x3, _ = synthetic_sample(4, size=8, channels=4, seed=5)
    x4, _ = synthetic_sample(3, size=8, channels=4, seed=6)
    assert not np.array_equal(x, x3) and not np.array_equal(x, x4)
    x64, _ = synthetic_sample(3, size=8, channels=4, seed=5, dtype="float64")
    np.testing.assert_allclose(x64, x, rtol=1e-6, atol=1e-7)


def test_targets_are_the_normalized_parameters():
    for i in range(20):
        params, y, _ = synthetic_params(i, 1)
        assert np.all(np.abs(y) <= 1)
        for name, t in zip(PARAM_NAMES, y):
            lo, hi = PARAM_RANGES[name]
            assert lo <= params[name] <= hi
            assert abs(lo + (t + 1) / 2 * (hi - lo) - params[name]) < 1e-12


@pytest.mark.parametrize("size", [7, 8])
def test_transfer_functions_give_unit_variance(size):
    tf = transfer_functions(size, 3, 1.5, -1.0)
    assert tf.shape == (3, size, size, size // 2 + 1)
    assert np.all(tf[:, 0, 0, 0] == 0)
    # expected variance of the filtered unit white noise is exactly sum |T|^2 / N^3 over the
    # full grid; check it by filtering a delta (the impulse response's energy)
    delta = np.zeros((size,) * 3)
    delta[0, 0, 0] = 1.0
    for c in range(3):
        h = np.fft.irfftn(np.fft.rfftn(delta) * tf[c], s=delta.shape, axes=(0, 1, 2))
        assert abs((h ** 2).sum() - 1.0) < 1e-9


def test_values_are_roughly_in_unit_range():
    xs = np.stack([synthetic_sample(i, 12, 2, 0)[0] for i in range(10)])
    assert 0.1 < xs.std() < 0.6
    assert np.mean(np.abs(xs) < 1) > 0.95


def _features(x):
    f = []
    for c in range(x.shape[0]):
        v = x[c].astype(np.float64)
        var = v.var()
        f.append(np.log(var))
        for s in (1, 2):
            g = sum(((np.roll(v, -s, a) - v) ** 2).mean() for a in range(3))
            f.append(np.log(g / var))
    return f


def test_targets_can_be_learnt():
    """A linear model on nine summary statistics predicts every target on held-out samples
    (a CNN sees much more than these statistics)."""
    samples = [synthetic_sample(i, 16, 4, 7) for i in range(240)]
    X = np.array([_features(x) + [1.0] for x, _ in samples])
    Y = np.array([y for _, y in samples], dtype=np.float64)
    W, *_ = np.linalg.lstsq(X[:180], Y[:180], rcond=None)
    pred = X[180:] @ W
    r2 = 1 - ((pred - Y[180:]) ** 2).sum(0) / ((Y[180:] - Y[180:].mean(0)) ** 2).sum(0)
    assert np.all(r2 > 0.9), r2


def test_command_line(tmp_path):
    env = dict(os.environ)
    env.pop("PMI_RANK", None)
    out = tmp_path / "ds"
    r = subprocess.run([sys.executable, "-m", "disttensor.io.synthetic", "--out", str(out),
                        "--samples", "3", "--size", "6", "--channels", "2", "--seed", "4"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "wrote 3 samples" in r.stdout
    files = sorted(out.glob("*.h5"))
    assert [f.name for f in files] == [f"sample_{i:06d}.h5" for i in range(3)]
    for i, f in enumerate(files):
        with h5py.File(f, "r") as h:
            x, y = synthetic_sample(i, 6, 2, 4)
            np.testing.assert_array_equal(h["full"][...], x)
            np.testing.assert_array_equal(h["unitPar"][...], y)
    stacked = tmp_path / "s.h5"
    r = subprocess.run([sys.executable, "-m", "disttensor.io.synthetic", "--out", str(stacked),
                        "--samples", "2", "--size", "6", "--channels", "1", "--layout",
                        "stacked", "--driver", "independent"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    with h5py.File(stacked, "r") as h:
        assert h["full"].shape == (2, 1, 6, 6, 6) and h["unitPar"].shape == (2, 3)
        for i in range(2):
            x, y = synthetic_sample(i, 6, 1, 0)
            np.testing.assert_array_equal(h["full"][i], x)
            np.testing.assert_array_equal(h["unitPar"][i], y)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "s.h5"]  # no temporary files
