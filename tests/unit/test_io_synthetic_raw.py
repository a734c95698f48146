"""The raw CosmoFlow format of the synthetic generator: int16 D,H,W,C counts from a log-normal
field whose four parameters can be learnt; the command line writes it and SampleDataset reads
it with channels_last, log1p and crops."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from disttensor.io.synthetic_raw import RAW_PARAM_NAMES, synthetic_raw_sample

h5py = pytest.importorskip("h5py")
ROOT = Path(__file__).resolve().parents[2]


def test_raw_sample_shape_dtype_and_determinism():
    x, y = synthetic_raw_sample(3, 8, 4, 1)
    assert x.shape == (8, 8, 8, 4) and x.dtype == np.int16
    assert y.shape == (len(RAW_PARAM_NAMES),) == (4,) and y.dtype == np.float32
    assert np.all(np.abs(y) <= 1) and x.min() >= 0
    x2, y2 = synthetic_raw_sample(3, 8, 4, 1)
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_array_equal(y, y2)
    assert not np.array_equal(x, synthetic_raw_sample(4, 8, 4, 1)[0])
    with pytest.raises(ValueError):
        synthetic_raw_sample(-1, 8)


def _features(x):
    f = []
    for c in range(x.shape[-1]):
        v = np.log1p(x[..., c].astype(np.float64))
        var = v.var()
        f += [v.mean(), np.log(var)]
        for s in (1, 2):
            g = sum(((np.roll(v, -s, a) - v) ** 2).mean() for a in range(3))
            f.append(np.log(g / var))
    return f


def test_raw_targets_can_be_learnt():
    """A linear model on summary statistics of log(1 + x) predicts every target on held-out
    samples (R^2 > 0.8 each)."""
    samples = [synthetic_raw_sample(i, 16, 4, 7) for i in range(200)]
    X = np.array([_features(x) + [1.0] for x, _ in samples])
    Y = np.array([y for _, y in samples], dtype=np.float64)
    W, *_ = np.linalg.lstsq(X[:150], Y[:150], rcond=None)
    pred = X[150:] @ W
    r2 = 1 - ((pred - Y[150:]) ** 2).sum(0) / ((Y[150:] - Y[150:].mean(0)) ** 2).sum(0)
    assert np.all(r2 > 0.8), r2


def test_raw_command_line_and_dataset(tmp_path):
    env = dict(os.environ)
    env.pop("PMI_RANK", None)
    out = tmp_path / "raw"
    r = subprocess.run([sys.executable, "-m", "disttensor.io.synthetic", "--out", str(out),
                        "--samples", "3", "--size", "8", "--channels", "2", "--seed", "4",
                        "--layout", "raw"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "int16 D,H,W,C counts" in r.stdout
    files = sorted(out.glob("*.h5"))
    assert [f.name for f in files] == [f"sample_{i:06d}.h5" for i in range(3)]
    for i, f in enumerate(files):
        with h5py.File(f, "r") as h:
            x, y = synthetic_raw_sample(i, 8, 2, 4)
            np.testing.assert_array_equal(h["full"][...], x)
            np.testing.assert_array_equal(h["unitPar"][...], y)
            assert h.attrs["axes"] == "D,H,W,C"
    import disttensor as dt
    from disttensor import io
    with io.SampleDataset(out, dt.ProcessGrid((1,)), batch_size=3, shuffle=False,
                          channels_last=True, dtype="float32", log1p=True, crop=6,
                          random_crop=False) as ds:
        (x, y), = list(ds.epoch(0))
        want = np.stack([np.log1p(np.moveaxis(synthetic_raw_sample(i, 8, 2, 4)[0], -1, 0)
                                  .astype(np.float32))[:, 1:7, 1:7, 1:7] for i in range(3)])
        np.testing.assert_allclose(x.to_numpy(), want, rtol=1e-6)
        assert x.dtype == np.float32 and y.shape == (3, 4)
    with pytest.raises(ValueError, match="regression"):
        from disttensor.io.synthetic import generate_synthetic
        generate_synthetic(tmp_path / "bad", 1, 4, layout="raw", task="segmentation")
