"""Degenerate inputs of the distributed CNN ops follow PyTorch / NumPy (``docs/ops.md``,
"Degenerate inputs"), raising the same error on every rank where they refuse:

* an empty batch (N = 0) goes through every op but batch norm in training (which raises: no
  statistics): empty outputs of the right shape, zero parameter gradients; the mean losses of
  nothing are NaN, the sums 0;
* batch norm in training refuses exactly one value per channel (PyTorch's
  ``_verify_batch_size``): over the whole array for ``stats='global'``, per block for
  ``'local'``; two values work (unbiased running variance finite); inference takes anything;
* a zero spatial extent with samples and channels is refused by the window ops (PyTorch's
  convolution: "only zero batch or zero channel inputs are supported");
* kernel, stride, dilation below 1, negative padding and a kernel longer than the padded input
  raise ``ValueError``;
* ranks owning empty blocks (explicit sizes with zeros) take part and the result equals the
  serial reference.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

import disttensor as dt
from disttensor import ops
from conftest import assert_all_ranks, assert_allclose_all, assert_raises_all

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import reference as ref  # noqa: E402

COMM = MPI.COMM_WORLD
SIZE = COMM.Get_size()
_GRID: list = []


def grid() -> dt.ProcessGrid:
    if not _GRID:
        _GRID.append(dt.ProcessGrid((SIZE,)))
    return _GRID[0]


def ncw(a, split=(None, None, 0), sizes=None) -> dt.DistArray:
    return dt.from_global(np.asarray(a), grid=grid(), split=split, sizes=sizes)


def in_step() -> None:
    assert_all_ranks(COMM, COMM.allreduce(1) == SIZE, "ranks out of step")


def all_on_first(n: int):
    """Explicit sizes putting an axis of extent ``n`` on the first rank (the others own empty
    blocks)."""
    return (n,) + (0,) * (SIZE - 1)


# -- an empty batch -------------------------------------------------------------------------------
@pytest.mark.parametrize("split", [(None, None, 0), (0, None, None)])
def test_empty_batch_goes_through_every_op(split):
    x = ncw(np.zeros((0, 3, 4 * SIZE)), split)
    w = np.ones((2, 3, 3))
    y, saved = ops.conv_forward(x, w, np.ones(2), padding=1)
    assert_all_ranks(COMM, y.shape == (0, 2, 4 * SIZE), f"conv {y.shape}")
    dx, dw, db = ops.conv_backward(saved, y)
    assert_all_ranks(COMM, dx.shape == x.shape and not dw.any() and not db.any(),
                     "conv backward of an empty batch")
    yt, tsaved = ops.conv_transpose_forward(x, np.ones((3, 2, 2)), stride=2)
    assert_all_ranks(COMM, yt.shape == (0, 2, 8 * SIZE), f"conv_transpose {yt.shape}")
    ops.conv_transpose_backward(tsaved, yt)
    for mode in ("max", "avg"):
        p, psaved = ops.pool_forward(x, mode, 3, 2, 1)
        assert_all_ranks(COMM, p.shape == (0, 3, 2 * SIZE), f"{mode} pool {p.shape}")
        assert_all_ranks(COMM, ops.pool_backward(psaved, p).shape == x.shape, "pool backward")
    u, usaved = ops.upsample_forward(x, 2, "linear")
    assert_all_ranks(COMM, u.shape == (0, 3, 8 * SIZE), f"upsample {u.shape}")
    ops.upsample_backward(usaved, u)
    rm, rv = np.full(3, 0.5), np.full(3, 2.0)
    # training: no statistics can be computed from nothing (issue 11; PyTorch returns early)
    assert_raises_all(COMM, ValueError, "no values per channel",
                      lambda: ops.batch_norm_forward(x, np.ones(3), np.zeros(3), rm, rv, True))
    assert_raises_all(COMM, ValueError, "no values per channel",
                      lambda: ops.batch_norm_forward(x, np.ones(3), np.zeros(3), stats="local"))
    b, bsaved = ops.batch_norm_forward(x, np.ones(3), np.zeros(3), rm, rv, False)
    dxb, dg, dbeta = ops.batch_norm_backward(bsaved, b)
    assert_all_ranks(COMM, b.shape == x.shape and dxb.shape == x.shape
                     and not dg.any() and not dbeta.any(), "batch norm inference")
    np.testing.assert_array_equal(rm, np.full(3, 0.5))  # untouched
    np.testing.assert_array_equal(rv, np.full(3, 2.0))
    for act in (ops.relu(x), ops.leaky_relu(x, 0.1), ops.softmax(x),
                ops.dropout_forward(x, 0.5, 1)[0]):
        assert_all_ranks(COMM, act.shape == x.shape, "elementwise op of an empty batch")
    f, fsaved = ops.flatten_forward(x)
    d, dsaved = ops.dense_forward(f, np.ones((5, f.shape[1])), np.ones(5))
    _, dw, db = ops.dense_backward(dsaved, d)
    assert_all_ranks(COMM, d.shape == (0, 5) and not dw.any() and not db.any(), "dense")
    loss, msaved = ops.mse_forward(x, x)
    assert_all_ranks(COMM, np.isnan(loss), f"mean of nothing {loss} (NumPy: nan)")
    assert_all_ranks(COMM, ops.mse_forward(x, x, "sum")[0] == 0.0, "sum of nothing")
    assert_all_ranks(COMM, ops.mse_backward(msaved).shape == x.shape, "mse backward")
    labels = dt.from_global(np.zeros((0, 4 * SIZE), dtype=np.int64), grid=grid(),
                            split=split[:1] + split[2:])
    ce, csaved = ops.cross_entropy_forward(x, labels)
    assert_all_ranks(COMM, np.isnan(ce), f"cross-entropy mean of nothing {ce}")
    assert_all_ranks(COMM, ops.cross_entropy_backward(csaved).shape == x.shape, "ce backward")
    in_step()


# -- batch norm: values per channel ---------------------------------------------------------------
@pytest.mark.parametrize("shape", [(1, 3, 1), (1, 2, 1, 1), (1, 2, 1, 1, 1)])
def test_batch_norm_one_value_per_channel_refused_in_training(shape):
    """PyTorch: "Expected more than 1 value per channel when training"; inference is fine."""
    x = dt.from_global(np.ones(shape), grid=grid(), split=(None,) * len(shape))
    c = shape[1]
    rm, rv = np.zeros(c), np.ones(c)
    assert_raises_all(COMM, ValueError, r"Expected more than 1 value per channel when training",
                      lambda: ops.batch_norm_forward(x, np.ones(c), np.zeros(c), rm, rv))
    np.testing.assert_array_equal(rm, np.zeros(c))
    y, _ = ops.batch_norm_forward(x, np.ones(c), np.zeros(c), rm, rv, training=False)
    assert_allclose_all(COMM, y.to_numpy(), ref.batch_norm_eval(np.ones(shape), rm, rv,
                                                                np.ones(c), np.zeros(c)))
    in_step()


def test_batch_norm_two_values_on_one_rank():
    """Two values per channel, all on the first rank (the others own empty blocks): PyTorch's
    result, unbiased running variance included."""
    a = np.arange(6.0).reshape(2, 3, 1)
    x = ncw(a, split=(0, None, None), sizes=[all_on_first(2), None, None])
    rm, rv = np.zeros(3), np.ones(3)
    y, saved = ops.batch_norm_forward(x, np.ones(3), np.zeros(3), rm, rv)
    yref, mean, _, var_u = ref.batch_norm_train(a, np.ones(3), np.zeros(3))
    assert_allclose_all(COMM, y.to_numpy(), yref, atol=1e-12)
    assert_allclose_all(COMM, rv, 0.9 + 0.1 * var_u, rtol=1e-12)
    assert_allclose_all(COMM, rm, 0.1 * mean, rtol=1e-12)
    in_step()


@pytest.mark.skipif(SIZE == 1, reason="a block of one value needs another block beside it")
def test_batch_norm_local_stats_block_of_one_value():
    """``stats='local'``: a block with one value per channel is refused on every rank (its
    statistics would be a single value); the same layout with global statistics is fine."""
    a = np.random.default_rng(1).standard_normal((1, 2, 2 * SIZE))
    x = ncw(a, sizes=[None, None, (1,) + (2 * SIZE - 1,) + (0,) * (SIZE - 2)])
    assert_raises_all(COMM, ValueError, "Expected more than 1 value per channel",
                      lambda: ops.batch_norm_forward(x, np.ones(2), np.zeros(2),
                                                     stats="local"))
    y, _ = ops.batch_norm_forward(x, np.ones(2), np.zeros(2))
    assert_allclose_all(COMM, y.to_numpy(), ref.batch_norm_train(a, np.ones(2), np.zeros(2))[0],
                        atol=1e-10)
    in_step()


# -- refused geometry -----------------------------------------------------------------------------
def test_zero_spatial_extent_refused_by_window_ops():
    x = ncw(np.zeros((2, 3, 0)))
    msg = "spatial extent 0"
    assert_raises_all(COMM, ValueError, msg,
                      lambda: ops.conv_forward(x, np.ones((2, 3, 1)), padding=1))
    assert_raises_all(COMM, ValueError, msg,
                      lambda: ops.conv_transpose_forward(x, np.ones((3, 2, 4)), stride=2))
    assert_raises_all(COMM, ValueError, msg, lambda: ops.pool_forward(x, "max", 2, 1, 1))
    assert_raises_all(COMM, ValueError, msg, lambda: ops.upsample_forward(x, 2))
    # batch norm in inference mode and the elementwise ops take it (an empty output); in
    # training there are no statistics
    y, _ = ops.batch_norm_forward(x, np.ones(3), np.zeros(3), np.zeros(3), np.ones(3), False)
    assert_all_ranks(COMM, y.shape == x.shape, "batch norm of an empty input")
    assert_raises_all(COMM, ValueError, "no values per channel",
                      lambda: ops.batch_norm_forward(x, np.ones(3), np.zeros(3)))
    in_step()


def test_bad_window_geometry_refused():
    x = ncw(np.ones((1, 3, 4 * SIZE)))
    w = np.ones((2, 3, 3))
    ve = ValueError
    assert_raises_all(COMM, ve, "stride must be >= 1", lambda: ops.conv_forward(x, w, stride=0))
    assert_raises_all(COMM, ve, "dilation must be >= 1",
                      lambda: ops.conv_forward(x, w, dilation=0))
    assert_raises_all(COMM, ve, "kernel must be >= 1",
                      lambda: ops.conv_forward(x, np.ones((2, 3, 0))))
    assert_raises_all(COMM, ve, "padding must be >= 0", lambda: ops.conv_forward(x, w, padding=-1))
    assert_raises_all(COMM, ve, "shorter than the window span",
                      lambda: ops.conv_forward(x, np.ones((2, 3, 4 * SIZE + 3)), padding=1))
    assert_raises_all(COMM, ve, "kernel must be >= 1", lambda: ops.pool_forward(x, "max", 0))
    assert_raises_all(COMM, ve, "stride must be >= 1", lambda: ops.pool_forward(x, "max", 2, 0))
    assert_raises_all(COMM, ve, "shorter than the window span",
                      lambda: ops.pool_forward(x, "avg", 4 * SIZE + 1))
    assert_raises_all(COMM, ve, "bias must have shape",
                      lambda: ops.conv_forward(x, w, np.ones(3)))
    in_step()


# -- ranks with nothing ---------------------------------------------------------------------------
def test_ranks_owning_empty_blocks():
    """Everything on the first rank: the others own empty blocks of input and output and
    still take part in every exchange."""
    rng = np.random.default_rng(5)
    a = rng.standard_normal((2, 3, 7))
    w = rng.standard_normal((2, 3, 3))
    x = ncw(a, sizes=[None, None, all_on_first(7)])
    y, saved = ops.conv_forward(x, w, None, 2, 1)
    assert_allclose_all(COMM, y.to_numpy(), ref.conv(a, w, None, 2, 1), atol=1e-12)
    dy = rng.standard_normal(y.shape)
    dx, dw, _ = ops.conv_backward(saved, dt.from_global(dy, grid=grid(), split=y.split,
                                                        sizes=y.distribution.split_sizes))
    rdx, rdw, _ = ref.conv_backward(a, w, dy, 2, 1)
    assert_allclose_all(COMM, dx.to_numpy(), rdx, atol=1e-12)
    assert_allclose_all(COMM, dw, rdw, atol=1e-12)
    p, _ = ops.pool_forward(x, "max", 3, 2, 1)
    assert_allclose_all(COMM, p.to_numpy(), ref.pool(a, "max", 3, 2, 1))
    b, _ = ops.batch_norm_forward(x, np.ones(3), np.zeros(3))
    assert_allclose_all(COMM, b.to_numpy(), ref.batch_norm_train(a, np.ones(3), np.zeros(3))[0],
                        atol=1e-10)
    assert_allclose_all(COMM, ops.mse_forward(x, x)[0], 0.0)
    in_step()
